"""``kill -9`` of piwork mid-run on a remote host loses none of the agent's installs.

The real CLI runs ``piwork run --host box`` (the "remote" is this machine through a
real sshd, with the real pack and QEMU); the scripted model has the agent write a
file under ``/usr/local`` (onto the task's environment disk, which is in the remote
run dir), then holds its next answer while the test SIGKILLs piwork. The watchdog
ends the remote QEMU once the heartbeat has stopped for a lease; ``piwork resume
--host box`` then brings the disk kept by the sweep back into the task dir, says so,
and the agent reads the file.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest

from piwork.config import get_paths
from piwork.hosts import orphans, store
from piwork.hosts.watchdog import LEASE_SECONDS
from piwork.models.scripted import ChatRequest, Delay, ScriptedModelServer, Text, ToolCalls, bash
from tests.helpers.cli import Cli, write_providers
from tests.helpers.procs import alive, wait_gone

pytestmark = pytest.mark.vm

CHECK = "CHECK-THE-MARK"


class Agent:
    """Install the mark, then hang (the kill comes then); on ``CHECK``, read it back."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.written = asyncio.Event()
        self.read_back: list[str] = []

    def step(self, req: ChatRequest) -> Text | ToolCalls | Delay:
        if CHECK in req.last_user_text:
            if req.assistant_turns_since_user == 0:
                return ToolCalls([bash("cat /usr/local/share/pw-mark/mark")])
            self.read_back.append(req.tool_exchanges()[-1].result or "")
            return Text("done")
        if req.assistant_turns_since_user == 0:
            return ToolCalls([bash(
                f"mkdir -p /usr/local/share/pw-mark && echo {self.mark} > "
                "/usr/local/share/pw-mark/mark && echo written"
            )])  # fmt: skip
        # The command has ended, so the bash wrapper has synced: the install is on the
        # disk there. Hold the answer: piwork is killed while it waits.
        if "written" in (req.tool_exchanges()[-1].result or ""):
            self.written.set()
        return Delay(900, Text("never"))


def qemu_pid_in(root: Path) -> tuple[int, Path]:
    pids = list(root.glob("run/*/qemu.pid"))
    assert len(pids) == 1, pids
    return int(pids[0].read_text()), pids[0].parent


async def test_installs_of_a_run_whose_piwork_was_killed_come_back_at_resume_on_the_host(
    box: store.Host, short_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    mark = "kept-through-kill-9-" + secrets.token_hex(6)
    agent = Agent(mark)
    env = dict(os.environ)  # HOME and PIWORK_HOME are the test's (the sshd fixture's)
    async with ScriptedModelServer(agent.step, model_id="scripted") as server:
        write_providers(get_paths().config, server)
        cli = await Cli.start(
            env, tmp_path / "run.log", "run", "--host", box.name, "--json", "--yes",
            "--model", "scripted/scripted", "--folder", str(folder), "install the mark",
        )  # fmt: skip
        drain = asyncio.create_task(cli.finish(1200))
        try:
            async with asyncio.timeout(900):
                while not agent.written.is_set():
                    if drain.done():
                        raise AssertionError(f"piwork ended first: {cli.stderr}")
                    await asyncio.sleep(0.2)
            task_id = next(e["task"] for e in cli.events if e.get("task"))
            qemu_pid, rundir = await asyncio.to_thread(qemu_pid_in, short_root)
            assert alive(qemu_pid)
        finally:
            cli.kill()  # SIGKILL: no stop, no bring-back, no cleanup
        await drain
        assert cli.proc.returncode == -9

        # The watchdog ends QEMU once the heartbeat has stopped for the lease.
        gone_after = await asyncio.to_thread(wait_gone, qemu_pid, LEASE_SECONDS + 60)
        print(f"\nmeasured: remote QEMU gone {gone_after:.1f} s after kill -9 of piwork")
        assert not alive(qemu_pid)
        log = await asyncio.to_thread((rundir / "watchdog.log").read_text)
        assert "lease expired" in log
        task_dir = get_paths().data / "tasks" / task_id
        assert await asyncio.to_thread((task_dir / orphans.RECORD).is_file)

        # piwork resume --host: the kept disk comes back first, and the agent sees the file.
        cli = await Cli.start(
            env, tmp_path / "resume.log", "resume", task_id, f"{CHECK}: is the mark there?",
            "--host", box.name, "--json", "--yes",
        )  # fmt: skip
        try:
            code = await cli.finish(1200)
        finally:
            cli.kill()
    notices = [str(e.get("message", "")) for e in cli.events if e["event"] == "notice"]
    assert code == 0, (cli.events[-5:], cli.stderr)
    assert f"brought back the installs of the interrupted run on {box.name}" in notices, notices
    assert agent.read_back and mark in agent.read_back[0], agent.read_back
    assert not await asyncio.to_thread((task_dir / orphans.RECORD).exists)
    kept = short_root / "envs" / "orphans"
    assert await asyncio.to_thread(lambda: list(kept.iterdir()) if kept.is_dir() else []) == []
    assert await asyncio.to_thread(lambda: list((short_root / "run").iterdir())) == []
