"""The remote watchdog over a real sshd, with real QEMU (``-machine none``: nothing to boot).

The "remote" is this machine, so the tests look at its /proc directly to see
what runs there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncssh

from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.remote import remote_root
from piwork.hosts.watchdog import RemoteQemu, sweep
from tests.helpers.holder import IDLE_QEMU
from tests.helpers.hosts import Sshd
from tests.helpers.procs import alive, cmdline, parents, wait_gone


def command_of(pid: int) -> str:
    """argv[0] once the exec chain (sh, setpriv, qemu) has settled: empty mid-exec."""
    for _ in range(50):
        name = cmdline(pid)[0] if alive(pid) else ""
        if name not in ("", "sh", "setpriv"):
            return name
        time.sleep(0.1)
    return name


async def _conn(sshd: Sshd) -> asyncssh.SSHClientConnection:
    return await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))


async def test_measured_a_remote_process_outlives_the_ssh_connection(sshd: Sshd) -> None:
    """Why the watchdog exists: without it, a lost piwork leaves the remote process running."""
    conn = await _conn(sshd)
    proc = await conn.create_process("sh -c 'echo $$; exec sleep 600'")
    pid = int(await proc.stdout.readline())
    assert alive(pid)
    conn.abort()  # as a killed piwork's connection ends: no channel close, no signal
    await conn.wait_closed()
    waited = await asyncio.to_thread(wait_gone, pid, 3)
    try:
        survived = alive(pid)
        print(
            f"\nmeasured: `sleep` still running {waited:.1f} s after the "
            f"SSH connection closed: {survived}"
        )
        assert survived and cmdline(pid)[0] == "sleep"
    finally:
        os.kill(pid, signal.SIGKILL)


async def test_qemu_runs_under_the_watchdog_and_close_stops_it(sshd: Sshd) -> None:
    conn = await _conn(sshd)
    try:
        root = await remote_root(conn, sshd.host(), create=True)
        qemu = RemoteQemu(conn, root, IDLE_QEMU, lease=5)
        await qemu.start()
        assert qemu.pid is not None and alive(qemu.pid)
        assert await asyncio.to_thread(command_of, qemu.pid) == "qemu-system-x86_64"
        chain = parents(qemu.pid)
        assert chain[1] == "sh" and "sshd" in chain, chain  # watchdog, then the session
        await asyncio.sleep(8)  # past the lease: the heartbeat keeps it alive
        assert alive(qemu.pid) and qemu.beats >= 2
        await qemu.close()
        assert not alive(qemu.pid)
        assert qemu.returncode == -9 or qemu.returncode == 137
    finally:
        conn.close()
        await conn.wait_closed()


async def test_kill_9_of_piwork_leaves_no_qemu_after_the_lease(sshd: Sshd) -> None:
    lease = 5
    holder = subprocess.Popen(  # noqa: ASYNC220 (a process to SIGKILL, read in a thread)
        [sys.executable, "-m", "tests.helpers.holder", sshd.host().model_dump_json(),
         sshd.fingerprint, str(lease)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 60)
        pid_s, rundir = line.split()
        pid = int(pid_s)
        assert await asyncio.to_thread(command_of, pid) == "qemu-system-x86_64"
    except BaseException:
        holder.kill()
        raise
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    gone_after = await asyncio.to_thread(wait_gone, pid, lease + 30)
    print(f"\nmeasured: remote QEMU gone {gone_after:.1f} s after kill -9 (lease {lease} s)")
    assert not alive(pid), "the remote QEMU outlived piwork"
    log = await asyncio.to_thread(Path(rundir, "watchdog.log").read_text)
    assert "lease expired" in log  # the watchdog stopped it, not the SSH close


async def test_sweep_removes_only_run_dirs_whose_qemu_is_gone(sshd: Sshd) -> None:
    """A killed piwork leaves its run dir (a copy of the folder): the next connect removes it."""
    conn = await _conn(sshd)
    try:
        root = await remote_root(conn, sshd.host(), create=True)
        run = Path(root, "run")
        dead = await asyncio.create_subprocess_exec("true")
        await dead.wait()
        layout = {
            "exited": ("qemu.exit", "0"),
            "dead-pid": ("qemu.pid", str(dead.pid)),
            "live-pid": ("qemu.pid", str(os.getpid())),
            "setting-up": ("beat", "1"),
        }
        for name, (fname, content) in layout.items():
            (run / name / "share").mkdir(parents=True)
            (run / name / fname).write_text(content)
        removed = (await sweep(conn, root)).removed
    finally:
        conn.close()
        await conn.wait_closed()
    assert sorted(removed) == ["dead-pid", "exited"]
    assert sorted(os.listdir(run)) == ["live-pid", "setting-up"]
