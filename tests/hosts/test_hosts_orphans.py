"""The installs of an interrupted ``--host`` run: kept by the sweep, brought back at the
task's next start there, and refused when the kept disk is not what was sent.

Over a real sshd (the "remote" is this machine), with real QEMU (``-machine none``: the
run's VM only has to hold the run dir) and real qcow2 files; the agent's installs are
written into the remote copy of the disk with ``qemu-io``, as a guest's writes land.
A whole VM run killed with SIGKILL is tests/hosts/test_hosts_orphans_vm.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import orjson
import pytest

from piwork.env import TaskEnv
from piwork.env.store import create_disk
from piwork.hosts import envdisk, orphans
from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.remote import remote_root
from piwork.hosts.watchdog import TASK_FILE, RemoteQemu, sweep
from tests.helpers.holder import IDLE_QEMU
from tests.helpers.hosts import Sshd
from tests.helpers.procs import alive

TASK = "0a1b2c3d4e5f"
SIZE = 16 << 20


@pytest.fixture
async def conn(sshd: Sshd) -> AsyncIterator[asyncssh.SSHClientConnection]:
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    yield conn
    conn.close()
    await conn.wait_closed()


def task_env(tmp: Path) -> TaskEnv:
    """A task dir whose disk is an overlay on one frozen layer, as piwork.env makes them."""
    layer = tmp / "layers" / "L1.qcow2"
    layer.parent.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(layer), str(SIZE)], check=True)
    task_dir = tmp / "tasks" / TASK
    task_dir.mkdir(parents=True)
    create_disk(task_dir / "env.qcow2", SIZE, layer)
    return TaskEnv(task_dir / "env.qcow2", "L1", SIZE)


def qemu_io(path: Path | str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", command, str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def holds(path: Path, pattern: int) -> bool:
    """The disk reads back ``pattern`` in its first 64 KiB (qemu-io's -P check)."""
    out = qemu_io(path, f"read -P {pattern:#x} 0 64k")
    return out.returncode == 0 and "Pattern verification failed" not in out.stdout


def header(path: Path) -> dict[str, object]:
    out = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(path)],
                         capture_output=True, check=True)  # fmt: skip
    info = orjson.loads(out.stdout)
    assert isinstance(info, dict)
    return info


async def test_an_interrupted_runs_installs_come_back_at_the_next_start(
    conn: asyncssh.SSHClientConnection, sshd: Sshd, tmp_path: Path
) -> None:
    root = await remote_root(conn, sshd.host(), create=True)
    env = task_env(tmp_path)
    layers, backing = envdisk.local_chain(env)
    assert [x.id for x in layers] == ["L1"]
    # The run: its record here and its task file there, the disk sent, QEMU started.
    qemu = RemoteQemu(conn, root, lambda d: [*IDLE_QEMU, "-pidfile", f"{d}/own.pid"], lease=60)
    await orphans.mark_run(conn, "box", qemu.rundir, env, backing)
    assert await asyncio.to_thread(Path(qemu.rundir, TASK_FILE).read_text) == f"{TASK}\n"
    remote_disk = Path(qemu.rundir, "env.qcow2")
    shutil.copy(env.disk, remote_disk)
    assert qemu_io(remote_disk, "write -P 0xab 0 64k").returncode == 0  # the agent's installs
    await qemu.start()
    pid = qemu.pid
    assert pid is not None and alive(pid)
    assert not holds(env.disk, 0xAB)
    # piwork dies here (the lock on the task is free again) and is started again within
    # the lease: the old QEMU still runs, and is ended before its disk is taken.
    said: list[str] = []
    try:
        assert await orphans.recover(conn, root, "box", env, said.append)
    finally:
        await qemu.close()
    assert said == ["brought back the installs of the interrupted run on box"], said
    assert not alive(pid)
    assert holds(env.disk, 0xAB)
    info = header(env.disk)
    assert info["backing-filename"] == backing and info["backing-filename-format"] == "qcow2"
    assert not await asyncio.to_thread(Path(qemu.rundir).exists)  # the copy went with its VM
    assert os.listdir(Path(root, "envs", "orphans")) == []  # deleted there once here
    assert not orphans.record_path(env).exists()
    # A second start finds nothing to bring back and says nothing.
    assert not await orphans.recover(conn, root, "box", env, said.append)
    assert len(said) == 1


async def plant(
    conn: asyncssh.SSHClientConnection, root: str, env: TaskEnv, make: list[str]
) -> Path:
    """A run recorded here whose kept disk there is made by ``qemu-img create ARGS``."""
    backing = envdisk.local_chain(env)[1]
    rundir = f"{root}/run/deadbeef"
    await orphans.mark_run(conn, "box", rundir, env, backing)
    return await asyncio.to_thread(_plant_files, Path(root), make)


def _plant_files(root: Path, make: list[str]) -> Path:
    kept = root / "envs" / "orphans"
    kept.mkdir(parents=True, exist_ok=True)
    disk = kept / f"{TASK}.qcow2"
    disk.unlink(missing_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *make, str(disk), str(SIZE)],
                   check=True)  # fmt: skip
    (kept / f"{TASK}.run").write_text("deadbeef\n")
    return disk


async def test_a_planted_orphan_naming_a_data_file_or_another_backing_file_is_refused(
    conn: asyncssh.SSHClientConnection, sshd: Sshd, tmp_path: Path
) -> None:
    """The host could leave any qcow2 under the task's name: one that names a file of this
    machine as its data file or backing file would have the next local QEMU open it."""
    root = await remote_root(conn, sshd.host(), create=True)
    env = task_env(tmp_path)
    before = orphans.disk_identity(env.disk)
    secret = tmp_path / "secret-here"
    secret.write_text("the person's private file\n")
    cases = {
        "external data file": ["-o", f"data_file={tmp_path / 'data-target'}"],
        "names the backing file": ["-u", "-b", str(secret), "-F", "raw"],
    }
    for reason, make in cases.items():
        disk = await plant(conn, root, env, make)
        said: list[str] = []
        assert not await orphans.recover(conn, root, "box", env, said.append)
        assert len(said) == 1 and "were refused" in said[0] and reason in said[0], said
        assert "as it was before that run" in said[0]
        assert orphans.disk_identity(env.disk) == before  # not grafted
        assert header(env.disk)["backing-filename"] == str(tmp_path / "layers" / "L1.qcow2")
        assert not disk.exists()  # a refused disk is not kept to be refused again
        assert not orphans.record_path(env).exists()


async def test_an_orphan_is_not_grafted_over_a_disk_that_changed_here_since(
    conn: asyncssh.SSHClientConnection, sshd: Sshd, tmp_path: Path
) -> None:
    """A local run (or a freeze) after the interrupted one: its writes are not thrown away."""
    root = await remote_root(conn, sshd.host(), create=True)
    env = task_env(tmp_path)
    disk = await plant(conn, root, env, ["-u", "-b", str(tmp_path / "layers" / "L1.qcow2"),
                                         "-F", "qcow2"])  # fmt: skip
    assert qemu_io(env.disk, "write -P 0xcd 0 64k").returncode == 0  # a run here since
    said: list[str] = []
    assert not await orphans.recover(conn, root, "box", env, said.append)
    assert len(said) == 1 and "changed since that run started" in said[0], said
    assert str(disk) in said[0] and disk.exists()  # kept there, and where is said
    assert holds(env.disk, 0xCD)


async def test_sweep_keeps_dead_runs_disks_newest_per_task_and_at_most_cap(
    conn: asyncssh.SSHClientConnection, sshd: Sshd
) -> None:
    root = await remote_root(conn, sshd.host(), create=True)
    run = Path(root, "run")
    t0 = time.time() - 1000

    def dead_run(name: str, task: str, age: int, *, started: bool = True) -> None:
        d = run / name
        (d / "share").mkdir(parents=True)
        (d / "share" / "copy-of-folder.txt").write_text("x")
        (d / TASK_FILE).write_text(task + "\n")
        (d / "env.qcow2").write_text(name)
        os.utime(d / "env.qcow2", (t0 + age, t0 + age))
        if started:
            (d / "qemu.exit").write_text("137\n")
        else:
            os.utime(d, (t0, t0))  # set up long ago, QEMU never started

    dead_run("r1", "aaaa", 10)
    dead_run("r2", "aaaa", 20)  # newer run of the same task: it wins
    dead_run("r3", "bbbb", 5)
    dead_run("r4", "cccc", 30)
    dead_run("r5", "../../etc", 40)  # not a task id: nothing kept under that name
    dead_run("r6", "dddd", 50, started=False)  # maybe half sent: never kept
    swept = await sweep(conn, root, cap=2)
    assert sorted(swept.removed) == ["r1", "r2", "r3", "r4", "r5", "r6"]
    assert swept.unowned == ["r5"]
    assert swept.dropped == ["bbbb"]  # the oldest over the cap of 2
    kept = Path(root, "envs", "orphans")
    assert sorted(os.listdir(kept)) == ["aaaa.qcow2", "aaaa.run", "cccc.qcow2", "cccc.run"]
    assert (kept / "aaaa.qcow2").read_text() == "r2"
    assert (kept / "aaaa.run").read_text().strip() == "r2"
    assert os.listdir(run) == []
    assert "etc.qcow2" not in {
        p.name for p in await asyncio.to_thread(list, kept.parent.rglob("*"))
    }


async def test_record_and_task_file_refuse_a_dir_that_is_not_a_task(
    conn: asyncssh.SSHClientConnection, tmp_path: Path
) -> None:
    bad = tmp_path / "Not A Task"
    bad.mkdir()
    env = TaskEnv(bad / "env.qcow2", None, SIZE)
    with pytest.raises(envdisk.EnvDiskError, match="not a task dir"):
        await orphans.mark_run(conn, "box", "/nowhere/run/x", env, None)
    assert not (bad / orphans.RECORD).exists()


async def test_an_orphan_from_another_run_is_left_and_a_lost_one_is_said(
    conn: asyncssh.SSHClientConnection, sshd: Sshd, tmp_path: Path
) -> None:
    """Only the disk of the run this machine recorded is grafted; if none is there, the
    person is told the task's disk is as it was before that run."""
    root = await remote_root(conn, sshd.host(), create=True)
    env = task_env(tmp_path)
    layer = str(tmp_path / "layers" / "L1.qcow2")
    disk = await plant(conn, root, env, ["-u", "-b", layer, "-F", "qcow2"])
    await asyncio.to_thread(disk.with_suffix(".run").write_text, "another\n")
    before = orphans.disk_identity(env.disk)
    said: list[str] = []
    assert not await orphans.recover(conn, root, "box", env, said.append)
    assert len(said) == 1 and "from another run" in said[0], said
    assert await asyncio.to_thread(disk.exists) and orphans.disk_identity(env.disk) == before

    await asyncio.to_thread(disk.unlink)
    backing = envdisk.local_chain(env)[1]
    await orphans.mark_run(conn, "box", f"{root}/run/cafe0123", env, backing)
    assert not await orphans.recover(conn, root, "box", env, said.append)
    assert "left no environment disk" in said[1] and "as it was before" in said[1], said
    assert not orphans.record_path(env).exists()
    # A record for another host is not this host's business.
    await orphans.mark_run(conn, "elsewhere", f"{root}/run/cafe0124", env, backing)
    assert not await orphans.recover(conn, root, "box", env, said.append)
    assert len(said) == 2 and orphans.record_path(env).exists()


def test_a_local_run_says_installs_wait_on_the_host(tmp_path: Path) -> None:
    """A run here (no --host) of a task whose --host run was killed is told where its
    installs are and how to bring them back, rather than silently starting without them."""
    from piwork.hosts.orphans import RunRecord, clear_record, write_record
    from piwork.run.environment import remote_installs_waiting

    task_dir = tmp_path / "0123456789ab"
    task_dir.mkdir()
    env = TaskEnv(disk=task_dir / "env.qcow2", base=None, size=0)
    assert remote_installs_waiting(env) is None
    write_record(env, RunRecord("kvmbox", "/srv/piwork/run/abcd", (1, 2, 3), None))
    assert remote_installs_waiting(env) == "kvmbox"
    (task_dir / "env.remote.json").write_text("{not json")
    assert remote_installs_waiting(env) is None  # an unreadable record is no record
    clear_record(env)
    assert remote_installs_waiting(env) is None
