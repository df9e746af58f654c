"""A whole task with ``--host``: QEMU on the "remote" (this machine through a real sshd),
the model gateway, the egress proxy, the key and the folder here.

The remote is this machine, so the tests read its /proc and the remote root directly.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import orjson
import pytest

from piwork.auth import KeyStore
from piwork.config import get_paths
from piwork.hosts import store
from piwork.models.providers import Provider
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, write
from piwork.runner import RunEvent, RunRequest, TaskSession
from tests.helpers.hosts import files_holding, run_cli
from tests.helpers.procs import alive, cmdline, parents, wait_gone
from tests.helpers.vm import scripted_provider

pytestmark = pytest.mark.vm

SECRET = "sk-piwork-remote-" + secrets.token_hex(20)


async def test_keyed_task_on_a_remote_host_keeps_the_key_here(
    box: store.Host, short_root: Path, tmp_path: Path
) -> None:
    paths = get_paths()
    paths.config.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_bytes(orjson.dumps({"auth": {"fileBackend": True}}))
    assert KeyStore(paths=paths).set("scripted", SECRET).backend == "file"
    folder = tmp_path / "project"
    folder.mkdir()
    script: list[Text | ToolCalls] = [
        ToolCalls([write("from-remote.txt", "made on the remote VM\n")]),
        Text("done"),
    ]
    events: list[RunEvent] = []
    async with ScriptedModelServer(script, model_id="scripted", api_key=SECRET) as server:
        base = scripted_provider(server)
        assert isinstance(base, Provider)
        keyed = base.model_copy(update={"auth": "bearer", "key_required": True})
        req = RunRequest(
            prompt=None,
            folder=folder,
            model="scripted/scripted",
            extra_providers=(keyed,),
            host=box.name,
            assume_yes=True,
            warm_start=False,
        )
        async with TaskSession(req, events.append, paths=paths) as session:
            outcome = await session.run_prompt("make the file")
            assert session.agent is not None
            pid = session.agent.qemu_pid
            assert pid is not None and alive(pid)
            argv = cmdline(pid)
            environ = await asyncio.to_thread(Path(f"/proc/{pid}/environ").read_bytes)
            chain = parents(pid)
            assert SECRET.encode() not in environ
            assert SECRET not in " ".join(argv)
            assert files_holding(short_root, SECRET.encode()) == []
            assert files_holding(short_root, SECRET[-16:].encode()) == []
        chats = server.chat_requests
    assert outcome.ok, (outcome, [e.to_json() for e in events][-5:])
    assert len(chats) >= 2  # the model calls came through the gateway here, with the key
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" or
               r.headers.get("Authorization") == f"Bearer {SECRET}" for r in chats)  # fmt: skip
    paths_in_argv = [a for a in argv if a.startswith("/")]
    assert paths_in_argv and all(p.startswith(f"{short_root}/") for p in paths_in_argv)
    assert "sshd" in chain
    assert await asyncio.to_thread(wait_gone, pid, 30) < 30
    assert (folder / "from-remote.txt").read_text() == "made on the remote VM\n"
    assert files_holding(short_root, SECRET.encode()) == []
    notices = [e.data.get("message", "") for e in events if e.kind == "notice"]
    assert any(f"running on {box.name}" in n for n in notices), notices


def test_cli_demo_run_with_host_writes_locally_and_uploads_the_pack_once(
    box: store.Host, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("# A small project\n")
    notices = []
    for _ in range(2):
        proc = run_cli(
            "run", "Summarise this folder", "--folder", str(folder), "--model", "demo",
            "--json", "--host", box.name, "--yes",  # nothing to ask: no notes.txt
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert events[-1]["event"] == "done" and events[-1]["reason"] == "completed"
        notices.append(" ".join(e.get("message", "") for e in events if e["event"] == "notice"))
        demo = (folder / "PIWORK_DEMO.md").read_text()
        assert "README.md" in demo
    assert "pack uploaded" in notices[0] and "MiB" in notices[0]
    assert "0 bytes uploaded" in notices[1]
    print("\nfirst run:", notices[0], "\nsecond run:", notices[1])


async def test_folder_comes_back_each_turn_and_a_conflict_keeps_the_persons_edit(
    box: store.Host, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("v0\n")
    (folder / "plan.txt").write_text("plan v0\n")
    seen_here: list[str] = []

    def step(req: ChatRequest) -> Text | ToolCalls:
        turn = req.assistant_turns_since_user
        if turn == 0:
            (folder / "notes.txt").write_text("the person's edit\n")  # while the task runs
            return ToolCalls(
                [write("notes.txt", "the agent's edit\n"), write("plan.txt", "plan v1\n")]
            )
        # The gateway brought the folder back before forwarding this call:
        seen_here.append((folder / "plan.txt").read_text())
        return Text("done")

    events: list[RunEvent] = []
    async with ScriptedModelServer(step, model_id="scripted") as server:
        req = RunRequest(
            prompt=None,
            folder=folder,
            model="scripted/scripted",
            extra_providers=(scripted_provider(server),),  # type: ignore[arg-type]
            host=box.name,
            assume_yes=True,
            warm_start=False,
        )
        async with TaskSession(req, events.append, paths=get_paths()) as session:
            outcome = await session.run_prompt("edit the notes")
    assert outcome.ok, [e.to_json() for e in events][-5:]
    assert seen_here == ["plan v1\n"]  # synced after the turn, before the next model call
    assert (folder / "notes.txt").read_text() == "the person's edit\n"
    assert (folder / "notes.txt.agent-1").read_text() == "the agent's edit\n"
    notices = [str(e.data.get("message", "")) for e in events if e.kind == "notice"]
    assert any(n.startswith("conflict: notes.txt") for n in notices), notices
