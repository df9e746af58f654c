"""No child outlives piwork, even on kill -9, and no Python runs between fork and exec."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from piwork.vm import machine

LAUNCHER = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    from piwork.vm.machine import tied_argv

    async def main() -> None:
        # A process with threads, like piwork (transcript sync, to_thread work).
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        proc = await asyncio.create_subprocess_exec(
            *tied_argv(["sleep", "600"]), start_new_session=True
        )
        print(proc.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _argv0(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().split(b"\0")[0]


def test_a_launched_child_dies_when_piwork_is_killed_9() -> None:
    for _ in range(3):
        parent = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True
        )
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        deadline = time.monotonic() + 5
        while _argv0(child) != b"sleep" and time.monotonic() < deadline:
            time.sleep(0.02)  # setpriv is between fork and its exec of the command
        assert _argv0(child) == b"sleep", "setpriv must exec the command, same pid"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived a kill -9 of its parent"


def test_the_vm_launch_uses_no_preexec_fn() -> None:
    import inspect

    source = inspect.getsource(machine.VirtualMachine.launch)
    assert "preexec_fn" not in source
    assert "start_new_session=True" in source
