"""The installs of a ``--host`` run whose piwork died before its VM stopped: kept, brought back.

A task's environment disk lives in the remote run dir while its VM runs and is
brought back here at stop (:func:`piwork.hosts.envdisk.bring_back`). If piwork
is killed (or crashes, or this machine reboots, or the host is lost for longer
than the reconnect) before then, the watchdog ends QEMU after the lease and
the next connection's sweep (:func:`piwork.hosts.watchdog.sweep`) removes the
run dir, but first moves its disk to ``<root>/envs/orphans/<task>.qcow2``
(with ``<task>.run``: the run dir it came from). The run dir says which task
it belongs to in a small file written at setup (``task``).

Here, the task dir keeps a record of the run it sent its disk to
(``env.remote.json``: the host, the run dir, the disk's identity and the
backing it was sent on top of), written before the upload and removed once
the disk is back. The task's next ``--host`` start on that host, with the
task's ``env.lock`` held, finds the record and:

- ends that run's QEMU if it still runs (a piwork killed less than a lease
  ago: the lock here says no piwork runs the task now), and sweeps;
- brings the kept disk back into the task dir when it is from that run *and*
  the task's disk here is still the one that run started from (same file,
  size, mtime and backing): otherwise something ran or froze the disk here
  since, and grafting the remote one would throw that away, so it is kept
  there and the person told;
- checks it as :func:`piwork.hosts.envdisk.accept_returned` does, and more
  strictly: its header must name the backing file it was sent with, nothing
  else (a disk that sat on another machine for a while is refused, not mended).

Everything read from the remote (the kept disk, its ``.run`` file) is untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import orjson

from piwork.env import TaskEnv
from piwork.fsutil import atomic_write_bytes
from piwork.hosts import envdisk
from piwork.hosts.packs import Progress
from piwork.hosts.remote import run
from piwork.hosts.watchdog import TASK_FILE, sweep

log = logging.getLogger(__name__)

RECORD = "env.remote.json"
"""In the task dir: the run its environment disk was last sent to, until it came back."""
TASK_ID_RE = re.compile(r"^[0-9a-z][0-9a-z_-]{0,63}$")
"""A task id as piwork.tasks.store makes and accepts them (the sweep checks the same)."""


class OrphanError(envdisk.EnvDiskError):
    """A kept disk could not be brought back; the message says why and where it is."""


@dataclass(frozen=True)
class RunRecord:
    host: str
    rundir: str
    disk: tuple[int, int, int]
    """(inode, size, mtime in ns) of the task's disk when it was sent."""
    backing: str | None

    def to_json(self) -> bytes:
        return orjson.dumps({
            "host": self.host, "rundir": self.rundir, "disk": list(self.disk),
            "backing": self.backing,
        })  # fmt: skip


def task_id(env: TaskEnv) -> str:
    """The id of the task whose disk this is (its task dir's name), checked."""
    name = env.disk.parent.name
    if not TASK_ID_RE.match(name):
        raise envdisk.EnvDiskError(f"{env.disk.parent} is not a task dir (its name is no task id)")
    return name


def disk_identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def record_path(env: TaskEnv) -> Path:
    return env.disk.with_name(RECORD)


def write_record(env: TaskEnv, record: RunRecord) -> None:
    atomic_write_bytes(record_path(env), record.to_json())


def read_record(env: TaskEnv) -> RunRecord | None:
    """This machine's own record (a broken one is treated as none, and logged)."""
    path = record_path(env)
    try:
        data = orjson.loads(path.read_bytes())
        disk = data["disk"]
        backing = data["backing"]
        if not (
            isinstance(disk, list) and len(disk) == 3 and all(isinstance(x, int) for x in disk)
        ):
            raise ValueError("disk")
        return RunRecord(
            str(data["host"]), str(data["rundir"]), (disk[0], disk[1], disk[2]),
            str(backing) if backing is not None else None,
        )  # fmt: skip
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable %s: %s", path, exc)
        return None


def clear_record(env: TaskEnv) -> None:
    record_path(env).unlink(missing_ok=True)


async def mark_run(
    conn: asyncssh.SSHClientConnection, host: str, rundir: str, env: TaskEnv, backing: str | None
) -> None:
    """Before the disk is sent: the run dir's ``task`` file (whose disk a sweep keeps), and
    the record here of what the run starts from (``backing``: the disk's, from local_chain)."""
    tid = task_id(env)
    task_file = shlex.quote(posixpath.join(rundir, TASK_FILE))
    await run(
        conn,
        f"umask 077 && mkdir -p -- {shlex.quote(rundir)} && "
        f"printf '%s\\n' {shlex.quote(tid)} > {task_file}",
    )
    write_record(env, RunRecord(host, rundir, disk_identity(env.disk), backing))


def orphan_paths(root: str, tid: str) -> tuple[str, str]:
    top = posixpath.join(root, "envs", "orphans")
    return posixpath.join(top, f"{tid}.qcow2"), posixpath.join(top, f"{tid}.run")


_END_RUN = r"""
# End the QEMU of an interrupted run (its piwork is dead): TERM, then KILL; wait for its exit.
d=$1
p=$(cat "$d/qemu.pid" 2>/dev/null) || exit 0
case $p in ''|*[!0-9]*) exit 0;; esac
kill -0 "$p" 2>/dev/null || exit 0
grep -qaF -- "$d/" "/proc/$p/cmdline" 2>/dev/null || exit 0
kill -TERM "$p"
n=0
while [ ! -f "$d/qemu.exit" ] && kill -0 "$p" 2>/dev/null && [ "$n" -lt 15 ]; do
  sleep 1; n=$((n + 1))
done
kill -KILL "$p" 2>/dev/null
n=0
while [ ! -f "$d/qemu.exit" ] && [ "$n" -lt 5 ]; do sleep 1; n=$((n + 1)); done
echo ended
"""


async def recover(
    conn: asyncssh.SSHClientConnection,
    root: str,
    host: str,
    env: TaskEnv,
    progress: Progress | None,
) -> bool:
    """Bring the installs of this task's interrupted run on ``host`` back (see module).

    Called with the task's ``env.lock`` held, before its disk is sent. True if
    the task's disk was replaced. Never raises for what the remote holds: a disk
    that cannot be grafted is reported through ``progress`` and left as it was.
    """
    record = read_record(env)
    if record is None or record.host != host:
        return False
    say = progress or (lambda _m: None)
    tid = task_id(env)
    disk, run_file = orphan_paths(root, tid)
    if posixpath.dirname(record.rundir) != posixpath.join(root, "run"):
        clear_record(env)  # a record of another root (the host's root was changed)
        return False
    out = await conn.run(
        f"sh -s -- {shlex.quote(record.rundir)}", input=_END_RUN, check=False, timeout=60
    )
    if "ended" in str(out.stdout or ""):
        log.info("ended the QEMU of the interrupted run %s on %s", record.rundir, host)
    await sweep(conn, root)
    probe = await conn.run(
        f"[ -f {shlex.quote(disk)} ] && [ ! -L {shlex.quote(disk)} ] && "
        f"head -c 200 {shlex.quote(run_file)}",
        check=False,
    )
    if probe.exit_status != 0:
        say(
            f"the interrupted run on {host} left no environment disk to bring back: "
            "the task's disk here is as it was before it"
        )
        clear_record(env)
        return False
    from_run = str(probe.stdout or "").strip()
    if posixpath.basename(record.rundir) != posixpath.basename(from_run):
        say(
            f"the environment disk kept on {host} ({disk}) is from another run of this task "
            "than the one this machine sent: not brought back, left there"
        )
        clear_record(env)
        return False
    now_backing = (await asyncio.to_thread(envdisk.local_chain, env))[1]
    if disk_identity(env.disk) != record.disk or now_backing != record.backing:
        say(
            f"the installs of the interrupted run on {host} were not brought back: the task's "
            f"environment here changed since that run started; they are kept there ({disk})"
        )
        clear_record(env)
        return False
    try:
        size = await envdisk.bring_back(conn, disk, env, record.backing, strict=True)
    except envdisk.EnvDiskError as exc:
        say(
            f"the installs of the interrupted run on {host} were refused: {exc}; "
            "the task's disk here is as it was before that run (the disk there is deleted)"
        )
        await _remove(conn, disk, run_file)
        clear_record(env)
        return False
    clear_record(env)
    await _remove(conn, disk, run_file)
    log.info("brought back %d bytes of the interrupted run %s on %s", size, record.rundir, host)
    say(f"brought back the installs of the interrupted run on {host}")
    return True


async def _remove(conn: asyncssh.SSHClientConnection, *paths: str) -> None:
    with contextlib.suppress(asyncssh.Error, OSError):
        await conn.run("rm -f -- " + shlex.join(list(paths)), check=False)
