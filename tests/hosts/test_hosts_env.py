"""The workbench environment of a ``--host`` task: its disk and layers go to the host,
the disk comes back, and the folder's next task starts from what was installed there.

The remote is this machine through a real sshd, so the test can see which disk files
the remote QEMU has open (never this machine's task dir or layers) and plant a
hostile header in the disk a host sends back.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from pathlib import Path

import orjson
import pytest

from piwork.config import get_paths
from piwork.env import store_for
from piwork.hosts import envdisk, store
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, bash
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from tests.helpers.vm import scripted_provider

pytestmark = pytest.mark.vm


def open_disks(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(".qcow2"):
            out.append(target)
    return out


class Runs:
    """Tasks on one folder, each running one bash command; what the command printed."""

    def __init__(self, host: store.Host, folder: Path) -> None:
        self.host, self.folder = host, folder
        self.command = ""
        self.results: list[str] = []
        self.task_ids: list[str] = []

    def step(self, req: ChatRequest) -> Text | ToolCalls:
        if req.assistant_turns_since_user == 0:
            return ToolCalls([bash(self.command)])
        self.results.append(req.tool_exchanges()[-1].result or "")
        return Text("done")

    async def run(
        self, server: ScriptedModelServer, command: str, *, resume: str | None = None
    ) -> tuple[list[str], list[str]]:
        """(notices, qcow2 files the remote QEMU had open); ``resume``: that task again."""
        self.command = command
        events: list[RunEvent] = []
        req = RunRequest(
            prompt=None,
            folder=self.folder if resume is None else None,
            task_id=resume,
            model="scripted/scripted",
            extra_providers=(scripted_provider(server),),  # type: ignore[arg-type]
            host=self.host.name,
            assume_yes=True,
        )
        async with TaskSession(req, events.append, paths=get_paths()) as session:
            assert session.agent is not None and session.task is not None
            self.task_ids.append(session.task.id)
            pid = session.agent.qemu_pid
            assert pid is not None
            outcome = await session.run_prompt("run it")
            disks = await asyncio.to_thread(open_disks, pid)
        assert outcome.ok, [e.to_json() for e in events][-6:]
        notices = [str(e.data.get("message", "")) for e in events if e.kind == EventKind.NOTICE]
        return notices, disks


async def test_installs_made_on_the_host_come_back_and_the_next_task_starts_from_them(
    box: store.Host, short_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    mark = "installed-there-" + secrets.token_hex(6)
    runs = Runs(box, folder)
    data = get_paths().data
    async with ScriptedModelServer(runs.step, model_id="scripted") as server:
        # 1. A task installs something into the workbench root on the host.
        notices, disks = await runs.run(server, f"echo {mark} > /opt/mark && cat /opt/mark")
        assert mark in runs.results[0], runs.results
        assert disks and all(d.startswith(f"{short_root}/") for d in disks), disks
        assert not any("could not bring the environment disk back" in n for n in notices)
        assert any("0 layer(s)" in n for n in notices), notices

        # 2. The folder's next task (on the host again) starts from it: the first task's
        # disk is frozen here into a layer, sent once, and chained there under the new disk.
        notices, disks = await runs.run(server, "cat /opt/mark")
        assert mark in runs.results[1], runs.results
        assert any("1 layer(s)" in n and "bytes of layers sent" in n for n in notices), notices
        assert any(d.startswith(f"{short_root}/envs/layers/") for d in disks), disks
        assert all(d.startswith(f"{short_root}/") for d in disks), disks
        assert not any(str(data) in d for d in disks), disks

        envs = store_for(get_paths())
        rec = envs.folder(folder)
        assert rec is not None and rec.head is not None
        first_layer = rec.head

        # 3. A third task: the second task's disk becomes a layer on top of the first, and
        # only that new one is sent; the first is there already (verified by sha256 there).
        notices, disks = await runs.run(server, "cat /opt/mark")
        assert mark in runs.results[2], runs.results
        assert any("2 layer(s)" in n for n in notices), notices
        sent = [n for n in notices if n.startswith("environment layer ")]
        assert len(sent) == 1 and first_layer not in sent[0], (first_layer, sent)
        assert f"{short_root}/envs/layers/{first_layer}.qcow2" in disks, disks

        # 4. `piwork resume --host` of the first task: its disk (an overlay on the layer
        # its own installs became) goes there again, nothing of the layer is sent.
        notices, _ = await runs.run(server, "cat /opt/mark", resume=runs.task_ids[0])
        assert mark in runs.results[3], runs.results
        assert any("1 layer(s), 0 bytes of layers sent" in n for n in notices), notices
    rec = envs.folder(folder)
    assert rec is not None and rec.head is not None and len(envs.chain(rec.head)) == 2


def test_a_disk_coming_back_with_a_planted_backing_file_is_rewritten_or_refused(
    tmp_path: Path,
) -> None:
    """A host could send back a qcow2 whose header names any file here as its backing
    file or data file: the next local QEMU would open it for the guest."""
    secret = tmp_path / "secret-here"
    secret.write_text("the person's private file\n")
    layer = tmp_path / "layer.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(layer), "1M"], check=True)

    planted = tmp_path / "back.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", str(secret),
                    "-F", "raw", str(planted), "1M"], check=True)  # fmt: skip
    envdisk.accept_returned(planted, str(layer))
    info = orjson.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", str(planted)],
                                       capture_output=True, check=True).stdout)  # fmt: skip
    assert info["backing-filename"] == str(layer)
    assert info["backing-filename-format"] == "qcow2"

    envdisk.accept_returned(planted, None)  # a task with no layer: no backing at all
    info = orjson.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", str(planted)],
                                       capture_output=True, check=True).stdout)  # fmt: skip
    assert "backing-filename" not in info

    with_data = tmp_path / "data.qcow2"
    target = tmp_path / "data-target"  # (create makes the data file: not the secret itself)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={target}",
                    str(with_data), "1M"], check=True)  # fmt: skip
    with pytest.raises(envdisk.EnvDiskError, match="external data file"):
        envdisk.accept_returned(with_data, None)

    raw = tmp_path / "raw.img"
    raw.write_bytes(b"\0" * 4096)
    with pytest.raises(envdisk.EnvDiskError, match="not a qcow2"):
        envdisk.accept_returned(raw, None)
