"""The VM works: real QEMU (TCG here), the real kernel and pi from our own pack.

These tests share one booted VM (see conftest.shared_agent) except where a
test must own the VM's life (failure cleanup, host kill, boot watchdog).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from piwork.agent import GUEST_SESSION, AgentVm
from piwork.models.scripted import Delay, ScriptedModelServer, Text, ToolCalls, bash, write
from piwork.pack.manifest import Manifest
from piwork.rpc import models as m
from piwork.vm.accel import probe
from piwork.vm.command import VmSpec
from piwork.vm.machine import BootStalled, VirtualMachine
from tests.helpers.procs import alive
from tests.helpers.vm import (
    agent_config,
    apply_changes,
    make_task_dirs,
    per_prompt,
    prompt_events,
    write_models_json,
)

pytestmark = pytest.mark.vm


async def test_get_state_answers_with_the_stable_session_path(shared_agent: AgentVm) -> None:
    state = await shared_agent.rpc.get_state()
    assert state.session_file == GUEST_SESSION
    assert state.is_streaming is False
    assert isinstance(state.model, dict) and state.model.get("id") == "scripted"


async def test_a_file_the_agent_writes_appears_in_the_host_folder(
    shared_agent: AgentVm, model_server: ScriptedModelServer
) -> None:
    model_server.script = per_prompt(
        ToolCalls([write("from-guest.txt", "written inside the VM\n")]),
        ToolCalls([bash("cat from-guest.txt && uname -r")]),
        Text("done"),
    )
    events = await prompt_events(shared_agent, "write the file", timeout=120)
    work = shared_agent.cfg.dirs.work
    assert work is not None
    # The guest wrote its layer; the folder gets it as a change set (piwork.changes).
    assert not (work / "from-guest.txt").exists()
    await apply_changes(shared_agent, work.parent / "task-dir")
    assert (work / "from-guest.txt").read_text() == "written inside the VM\n"
    ends = [e for e in events if isinstance(e, m.ToolExecutionEnd)]
    assert [e.tool_name for e in ends] == ["write", "bash"]
    assert all(not e.is_error for e in ends)
    bash_out = m.tool_outcome(ends[1]).text
    assert "written inside the VM" in bash_out
    assert shared_agent.cfg.manifest.versions["kernel"] in bash_out  # it ran in the guest
    # pi's session reaches the host through the state share.
    assert (shared_agent.cfg.dirs.state / "session.jsonl").stat().st_size > 0


async def test_reconnecting_the_host_side_does_not_kill_pi(
    shared_agent: AgentVm, model_server: ScriptedModelServer
) -> None:
    before = await shared_agent.rpc.get_state()
    exits_before = shared_agent.pi_exit is not None and shared_agent.pi_exit.done()
    await shared_agent.channel.reconnect()
    after = await shared_agent.rpc.get_state()
    assert after.session_id == before.session_id
    assert after.message_count == before.message_count
    assert not exits_before and not (shared_agent.pi_exit and shared_agent.pi_exit.done())
    assert shared_agent.channel.reconnects >= 1


async def test_a_disconnect_mid_run_loses_no_event(
    shared_agent: AgentVm, model_server: ScriptedModelServer
) -> None:
    """The host drops its connection while pi streams; the replay fills the gap."""
    model_server.script = per_prompt(
        Delay(3.0, ToolCalls([bash("seq 1 200")])),
        Text("after the reconnect"),
    )
    events: list[object] = []
    unsubscribe = shared_agent.rpc.add_listener(events.append)
    try:
        await shared_agent.rpc.prompt("count")
        await asyncio.sleep(1.0)
        await shared_agent.channel.reconnect()  # while the model is still "thinking"
        await shared_agent.rpc.wait_idle(timeout=120)
    finally:
        unsubscribe()
    types = [getattr(e, "type", None) for e in events]
    assert types.count("agent_start") == 1 and types.count("agent_end") == 1
    assert types.count("tool_execution_start") == types.count("tool_execution_end") == 1
    texts = [m.assistant_outcome(e) for e in events if isinstance(e, m.MessageEnd)]
    assert any(t and "after the reconnect" in t.text for t in texts)
    assert shared_agent.channel.gaps == []


async def test_qemu_is_gone_after_a_failing_test(
    pack: tuple[Path, Manifest], tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    dirs = make_task_dirs(tmp_path / "task")
    write_models_json(dirs)
    agent = AgentVm(agent_config(pack, dirs, model_server, tmp_path / "logs"))
    pid = None
    with pytest.raises(RuntimeError, match="the test failed here"):
        async with agent:
            pid = agent.vm.pid
            assert pid is not None and alive(pid)
            raise RuntimeError("the test failed here")
    assert pid is not None and not alive(pid)


def test_qemu_dies_with_a_host_process_killed_with_sigkill(
    pack: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """No QEMU outlives piwork, even when piwork gets no chance to clean up."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from piwork.pack import load_manifest
        from piwork.vm.accel import probe
        from piwork.vm.command import VmSpec
        from piwork.vm.machine import VirtualMachine
        async def main():
            pack = Path({str(pack[0])!r})
            spec = VmSpec(pack_dir=pack, manifest=load_manifest(pack), accel=probe("tcg"),
                          qmp_socket=Path({str(tmp_path / "q.sock")!r}),
                          console_log=Path({str(tmp_path / "console.log")!r}),
                          rpc_socket=Path({str(tmp_path / "r.sock")!r}))
            vm = VirtualMachine(spec)
            await vm.launch()
            print(vm.pid, flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        qemu_pid = int(proc.stdout.readline())
        assert alive(qemu_pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while alive(qemu_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(qemu_pid), "QEMU outlived the process that started it"
    finally:
        proc.kill()


async def test_boot_watchdog_reports_a_silent_guest_with_the_command_line(
    pack: tuple[Path, Manifest], tmp_path: Path
) -> None:
    # A kernel image that is not a kernel: SeaBIOS gets nowhere and the
    # console stays silent. The watchdog must say so instead of waiting forever.
    bogus = tmp_path / "pack"
    bogus.mkdir()
    (bogus / pack[1].kernel).write_bytes(b"\0" * 4096)
    (bogus / pack[1].initrd).write_bytes(b"\0" * 4096)
    spec = VmSpec(
        pack_dir=bogus,
        manifest=pack[1],
        accel=probe("tcg"),
        qmp_socket=tmp_path / "q.sock",
        console_log=tmp_path / "console.log",
        rpc_socket=tmp_path / "r.sock",
    )
    vm = VirtualMachine(spec)
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        async with vm:
            await vm.wait_booted(stall_timeout=3)
    assert time.monotonic() - started < 60
    text = str(info.value)
    assert "qemu-system-x86_64" in text and "-kernel" in text
    assert isinstance(info.value, BootStalled) or "exit status" in text
    assert vm.pid is not None and not alive(vm.pid)
