"""Warm start on a remote host: the first ``--host`` task makes the saved VM there, the
next restores it (QEMU on the remote gets ``-incoming`` and the template's RAM file),
and a template damaged on the remote is found by its checksum and made again.

The remote is this machine through a real sshd, so the test reads the remote root
and the remote QEMU's /proc entries directly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from piwork.config import get_paths
from piwork.hosts import store
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, write
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from tests.helpers.hosts import files_holding
from tests.helpers.procs import cmdline
from tests.helpers.vm import scripted_provider

pytestmark = pytest.mark.vm


def boot_modes(events: list[RunEvent]) -> list[dict[str, object]]:
    """The boot-mode notices (building / restored / cold boot), as --json shows them."""
    return [e.data for e in events if e.kind == EventKind.NOTICE and "warm" in e.data]


async def one_run(
    host: store.Host, folder: Path, name: str
) -> tuple[list[RunEvent], list[str], str]:
    """A task that writes ``name`` into the folder; the remote QEMU's argv and the
    gateway token the guest was given (its models.json)."""

    def step(req: ChatRequest) -> Text | ToolCalls:
        if req.assistant_turns_since_user == 0:
            return ToolCalls([write(name, f"{name} from the restored VM\n")])
        return Text("done")

    events: list[RunEvent] = []
    async with ScriptedModelServer(step, model_id="scripted") as server:
        req = RunRequest(
            prompt=None,
            folder=folder,
            model="scripted/scripted",
            extra_providers=(scripted_provider(server),),  # type: ignore[arg-type]
            host=host.name,
            assume_yes=True,
        )
        async with TaskSession(req, events.append, paths=get_paths()) as session:
            assert session.agent is not None and session.task is not None
            pid = session.agent.qemu_pid
            assert pid is not None
            argv = await asyncio.to_thread(cmdline, pid)
            models = orjson.loads((session.task.state_dir / "agent" / "models.json").read_bytes())
            token = next(iter(models["providers"].values()))["apiKey"]
            outcome = await session.run_prompt(f"write {name}")
    assert outcome.ok, [e.to_json() for e in events][-6:]
    assert (folder / name).read_text() == f"{name} from the restored VM\n"
    return events, argv, token


def template_dirs(root: Path) -> list[Path]:
    top = root / "templates"
    return sorted(p for p in top.iterdir() if p.is_dir()) if top.is_dir() else []


def holds(path: Path, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in ``path`` (read in chunks: the RAM file is 1 GiB)."""
    tail = b""
    with path.open("rb") as fh:
        while chunk := fh.read(8 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


async def test_second_run_restores_the_saved_vm_and_a_corrupt_one_is_rebuilt(
    box: store.Host, short_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()

    # 1. No saved VM on the host: it is made there, then restored for this task.
    events, argv, token1 = await one_run(box, folder, "one.txt")
    modes = boot_modes(events)
    assert modes[0]["building"] is True and box.name in str(modes[0]["message"]), modes
    assert modes[-1]["warm"] is True and "template_built" in modes[-1], modes
    [tpl] = template_dirs(short_root)
    assert "-incoming" in argv and f"mem-path={tpl}/ram,share=off" in ",".join(argv)
    meta = orjson.loads((tpl / "meta.json").read_bytes())
    assert meta["key"]["pack"] and meta["key"]["qemu"].startswith("QEMU emulator")
    assert oct((tpl / "state").stat().st_mode & 0o777) == "0o400"

    # 2. The next task restores it: no build, QEMU there waits for the incoming state.
    events, argv, token2 = await one_run(box, folder, "two.txt")
    modes = boot_modes(events)
    assert [m["warm"] for m in modes] == [True] and "template_built" not in modes[0], modes
    i = argv.index("-incoming")
    assert argv[i + 1] == "defer"
    assert any(a.startswith("memory-backend-file") and f"mem-path={tpl}/ram" in a for a in argv)
    assert template_dirs(short_root) == [tpl]

    # Nothing of a task is in the saved VM: it was made before any task existed.
    for token in (token1, token2):
        assert not holds(tpl / "ram", token.encode())
        assert not holds(tpl / "state", token.encode())
    assert files_holding(short_root / "run", token2.encode()) == []  # run dirs are gone

    # 3. The state file is damaged on the host (same size, one byte changed): the
    # checksum finds it, it is made again, and the task still starts warm.
    state = tpl / "state"
    state.chmod(0o600)
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    events, argv, _ = await one_run(box, folder, "three.txt")
    modes = boot_modes(events)
    assert "unusable" in str(modes[0]["message"]) and "corrupt" in str(modes[0]["message"]), modes
    assert modes[-1]["warm"] is True and "template_built" in modes[-1], modes
    assert "-incoming" in argv
    [again] = template_dirs(short_root)
    assert bytes(data) != (again / "state").read_bytes()
    leftovers = [p.name for p in (short_root / "templates").iterdir() if p.name != again.name]
    assert all(n.endswith(".lock") for n in leftovers), leftovers
    assert oct((again / "state").stat().st_mode & 0o777) == "0o400"
