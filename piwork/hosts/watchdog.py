"""QEMU on a remote host, under a small uploaded watchdog tied to this machine's heartbeat.

A process started over SSH outlives the SSH connection (no pty, no SIGHUP:
measured in tests/hosts/test_hosts_watchdog.py), so a ``kill -9`` of piwork
would leave the remote QEMU running for ever. The watchdog, a POSIX ``sh``
script (needs only what ``piwork hosts check`` verifies: sh, setsid/setpriv
from util-linux, /proc), starts QEMU and kills it once the heartbeat file has
not changed for ``lease`` seconds. This machine rewrites that file over SFTP
every ``lease / 6`` seconds; only a change counts, so the two clocks never
have to agree. QEMU gets ``PR_SET_PDEATHSIG`` (``setpriv``), so killing the
watchdog takes QEMU with it.

The watchdog runs in the foreground of an SSH session (its parent chain goes
through sshd) and ignores SIGPIPE, so a dropped connection leaves it running
until the lease says otherwise; a reconnect just resumes the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncssh

from piwork.hosts.remote import RemoteError, run

log = logging.getLogger(__name__)

LEASE_SECONDS = 30
WATCHDOG = r"""#!/bin/sh
# piwork watchdog: runs QEMU, kills it when the heartbeat file stops changing.
# usage: sh watchdog.sh RUNDIR LEASE_SECONDS -- QEMU ARGV...
set -u
umask 077
dir=$1 lease=$2
shift 3
cd "$dir" || exit 97
trap '' PIPE HUP
if command -v setpriv >/dev/null 2>&1; then
  setpriv --pdeathsig KILL -- "$@" </dev/null >qemu.log 2>&1 &
else
  "$@" </dev/null >qemu.log 2>&1 &
fi
qpid=$!
echo "$qpid" >qemu.pid
echo "qemu $qpid"
alive() {
  [ -r "/proc/$1/stat" ] || return 1
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
last=$(cat beat 2>/dev/null || true)
quiet=0
while alive "$qpid"; do
  sleep 1
  now=$(cat beat 2>/dev/null || true)
  if [ "$now" != "$last" ]; then
    last=$now quiet=0
  else
    quiet=$((quiet + 1))
  fi
  if [ "$quiet" -ge "$lease" ]; then
    echo "lease expired: no heartbeat for ${lease}s, stopping QEMU $qpid" >>watchdog.log
    kill -TERM "$qpid" 2>/dev/null
    n=0
    while alive "$qpid" && [ "$n" -lt 5 ]; do sleep 1; n=$((n + 1)); done
    kill -KILL "$qpid" 2>/dev/null
    break
  fi
done
wait "$qpid"
code=$?
echo "$code" >qemu.exit
echo "exit $code"
"""
WATCHDOG_SHA = hashlib.sha256(WATCHDOG.encode()).hexdigest()


ORPHANS_KEPT = 8
"""At most this many interrupted runs' environment disks are kept on a host (one per task)."""
TASK_FILE = "task"
"""In a run dir: the id of the task it belongs to, written by this machine at setup."""

SWEEP = r"""
# Remove run dirs whose QEMU is gone: they hold a copy of a task's folder. A dead run's
# environment disk (the agent's installs) is first kept as envs/orphans/<task>.qcow2.
umask 077
root=$1 cap=$2
orphans="$root/envs/orphans"
keep() {  # $1: the run dir of a QEMU that ran and is gone
  [ -f "$1/env.qcow2" ] && [ ! -L "$1/env.qcow2" ] || return 0
  t=$(head -c 80 "$1/task" 2>/dev/null | head -n 1)
  case $t in
    ''|[!0-9a-z]*|*[!0-9a-z_-]*) echo "unowned $1"; return 0;;
  esac
  [ "${#t}" -le 64 ] || { echo "unowned $1"; return 0; }
  mkdir -p -- "$orphans" || return 0
  if [ -f "$orphans/$t.qcow2" ] && [ "$orphans/$t.qcow2" -nt "$1/env.qcow2" ]; then
    echo "older $1 $t"; return 0
  fi
  rm -f -- "$orphans/$t.run"
  mv -f -- "$1/env.qcow2" "$orphans/$t.qcow2" && printf '%s\n' "$1" >"$orphans/$t.run" &&
    echo "kept $1 $t"
}
gone() { rm -rf -- "$1"; echo "removed $1"; }
cd "$root/run" 2>/dev/null || exit 0
for d in */; do
  d=${d%/}
  [ -d "$d" ] || continue
  if [ -f "$d/qemu.exit" ]; then
    keep "$d"; gone "$d"
  elif [ -f "$d/qemu.pid" ]; then
    p=$(cat "$d/qemu.pid")
    if ! kill -0 "$p" 2>/dev/null; then keep "$d"; gone "$d"; fi
  elif [ -n "$(find "$d" -maxdepth 0 -mmin +10)" ]; then
    gone "$d"  # QEMU never started: its disk may be half sent, and nothing ran on it
  fi
done
# Bounded: the newest $cap kept, the older ones dropped (names are checked task ids).
cd "$orphans" 2>/dev/null || exit 0
ls -1t -- *.qcow2 2>/dev/null | tail -n +"$((cap + 1))" | while read -r f; do
  rm -f -- "$f" "${f%.qcow2}.run"; echo "dropped ${f%.qcow2}"
done
"""


@dataclass
class Swept:
    """What a sweep did: run dirs removed, environment disks kept (task -> run), dropped."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    unowned: list[str] = field(default_factory=list)
    """Run dirs whose disk named no valid task: removed with it (a run before the task file)."""


async def sweep(conn: asyncssh.SSHClientConnection, root: str, *, cap: int = ORPHANS_KEPT) -> Swept:
    """Remove the run dirs a killed piwork left (QEMU gone), keeping their environment disks.

    A run dir holds a copy of the task's folder: it must not outlive its VM.
    One with a running QEMU (another piwork's task) or just being set up (no
    QEMU yet, younger than 10 minutes) is kept. The environment disk of a run
    whose QEMU ran holds what the agent installed and exists nowhere else: it
    is moved to ``<root>/envs/orphans/<task>.qcow2`` (the newest per task, at
    most ``cap`` of them) for the task's next ``--host`` start to bring back
    (:mod:`piwork.hosts.orphans`).
    """
    result = await conn.run(
        f"sh -s -- {shlex.quote(root)} {int(cap)}", input=SWEEP, check=False, timeout=120
    )
    swept = Swept()
    for line in str(result.stdout or "").splitlines():
        word, _, rest = line.partition(" ")
        parts = rest.split()
        if word == "removed" and len(parts) == 1:
            swept.removed.append(parts[0])
        elif word == "kept" and len(parts) == 2:
            swept.kept[parts[1]] = parts[0]
        elif word == "dropped" and len(parts) == 1:
            swept.dropped.append(parts[0])
        elif word == "unowned" and len(parts) == 1:
            swept.unowned.append(parts[0])
    return swept


async def install(conn: asyncssh.SSHClientConnection, root: str) -> str:
    """Upload the watchdog once (content-addressed); its remote path."""
    path = posixpath.join(root, "bin", f"watchdog-{WATCHDOG_SHA[:16]}.sh")
    check = await conn.run(
        f"echo {WATCHDOG_SHA} {shlex.quote(path)} | sha256sum --quiet --strict -c - 2>/dev/null",
        check=False,
    )
    if check.exit_status == 0:
        return path
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    await run(conn, f"umask 077 && mkdir -p -- {shlex.quote(posixpath.dirname(path))}")
    async with conn.start_sftp_client() as sftp, sftp.open(tmp, "w") as fh:
        await fh.write(WATCHDOG)
    await run(conn, f"mv -f -- {shlex.quote(tmp)} {shlex.quote(path)}")
    return path


class RemoteQemu:
    """One QEMU on the remote, under the watchdog, in ``<root>/run/<id>/``."""

    def __init__(
        self,
        conn: asyncssh.SSHClientConnection | Callable[[], asyncssh.SSHClientConnection],
        root: str,
        argv: list[str] | Callable[[str], list[str]],
        *,
        lease: int = LEASE_SECONDS,
        run_id: str | None = None,
    ) -> None:
        if lease < 2:
            raise ValueError("the lease must be at least 2 seconds")
        self._conn = conn if callable(conn) else (lambda: conn)
        """The current connection: after an SSH reconnect, the new one."""
        self.root = root
        self.run_id = run_id or secrets.token_hex(4)
        self.rundir = posixpath.join(root, "run", self.run_id)
        self._argv = argv
        self.argv: list[str] = []
        self.lease = lease
        self.pid: int | None = None
        self.returncode: int | None = None
        self.beats = 0
        self._proc: asyncssh.SSHClientProcess[str] | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._exited = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @property
    def conn(self) -> asyncssh.SSHClientConnection:
        return self._conn()

    def path(self, name: str) -> str:
        return posixpath.join(self.rundir, name)

    async def start(self) -> None:
        script = await install(self.conn, self.root)
        # A run dir may be used again (a failed restore falls back to a cold boot in it):
        # a previous QEMU's exit status must not be read as this one's.
        stale = " ".join(shlex.quote(self.path(n)) for n in ("qemu.exit", "qemu.pid"))
        await run(
            self.conn, f"umask 077 && mkdir -p -- {shlex.quote(self.rundir)} && rm -f -- {stale}"
        )
        self.argv = self._argv(self.rundir) if callable(self._argv) else list(self._argv)
        await self._beat()  # the file exists before the watchdog reads it
        cmd = shlex.join(["sh", script, self.rundir, str(self.lease), "--", *self.argv])
        self._proc = await self.conn.create_process(cmd, stderr=asyncssh.STDOUT)
        line = await asyncio.wait_for(self._proc.stdout.readline(), 30)
        if not line.startswith("qemu "):
            rest = line + await self._drain()
            raise RemoteError(f"the remote watchdog did not start QEMU: {rest.strip()}")
        self.pid = int(line.split()[1])
        self._reader = asyncio.create_task(self._read_exit(), name="remote-qemu-exit")
        self._beat_task = asyncio.create_task(self._heartbeat(), name="remote-qemu-beat")

    async def _drain(self) -> str:
        assert self._proc is not None
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self._proc.stdout.read(), 5)
        return ""

    async def _read_exit(self) -> None:
        assert self._proc is not None
        with contextlib.suppress(asyncssh.Error, OSError):
            async for line in self._proc.stdout:
                if line.startswith("exit "):
                    self.returncode = int(line.split()[1])
        # The session that started the watchdog is gone (a dropped connection) but
        # QEMU may well run on: ask the run dir, through whatever connection is up.
        while self.returncode is None:
            self.returncode = await self._poll_exit()
            if self.returncode is None:
                await asyncio.sleep(1)
        self._exited.set()

    async def _poll_exit(self) -> int | None:
        exit_file = shlex.quote(self.path("qemu.exit"))
        cmd = (
            f"cat {exit_file} 2>/dev/null || {{ kill -0 {self.pid} 2>/dev/null && echo running; }}"
        )
        try:
            result = await self.conn.run(cmd, check=False, timeout=30)
        except (asyncssh.Error, OSError, TimeoutError):
            return None  # no connection now: try again
        out = str(result.stdout or "").strip()
        if out == "running":
            return None
        if not out:  # neither running nor an exit status: the watchdog itself was killed
            return -9
        try:
            return int(out)
        except ValueError:
            return -1

    async def _beat(self) -> None:
        self.beats += 1
        async with self.conn.start_sftp_client() as sftp, sftp.open(self.path("beat"), "w") as fh:
            await fh.write(f"{self.beats}\n")

    async def _heartbeat(self) -> None:
        interval = max(1.0, self.lease / 6)
        while not self._exited.is_set():
            await asyncio.sleep(interval)
            try:
                await self._beat()
            except (asyncssh.Error, OSError) as exc:  # a dropped link: the lease decides
                log.warning("remote heartbeat failed: %s", exc)

    @property
    def running(self) -> bool:
        return self.pid is not None and not self._exited.is_set()

    async def wait(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), timeout)
        return self.returncode

    async def kill(self) -> None:
        """SIGKILL QEMU (the watchdog then reports its exit and ends)."""
        if self.pid is not None and not self._exited.is_set():
            await self.conn.run(f"kill -KILL {self.pid}", check=False)
            await self.wait(10)

    async def close(self) -> None:
        """Stop beating and leave nothing running: kill QEMU if it still is."""
        await self.kill()
        for task in (self._beat_task, self._reader):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._proc is not None:
            self._proc.close()
