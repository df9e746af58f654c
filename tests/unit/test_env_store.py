"""Task environments: a disk per task, and a folder's next task starting from the last one's.

Real qemu-img makes the disks; nothing here mounts or reads a file system on
one (the host never does: every environment disk is guest-written).
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from piwork.env import ENV_DISK, EnvBusy, EnvStore
from piwork.env.store import create_disk, hold_lock

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")

SIZE = 64 << 20
World = tuple[EnvStore, Path, Path]


def backing(disk: Path) -> str | None:
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", "-U", str(disk)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    info = json.loads(out)
    assert info["format"] == "qcow2"
    name = info.get("full-backing-filename") or info.get("backing-filename")
    return str(name) if name else None


@pytest.fixture
def world(tmp_path: Path) -> tuple[EnvStore, Path, Path]:
    tasks = tmp_path / "data" / "tasks"
    folder = tmp_path / "project"
    folder.mkdir()
    tasks.mkdir(parents=True)
    return EnvStore(tmp_path / "data" / "envs", tasks), tasks, folder


def task_dir(tasks: Path, name: str) -> Path:
    d = tasks / name
    d.mkdir()
    return d


def test_the_first_task_on_a_folder_gets_a_blank_sparse_capped_disk(world: World) -> None:
    store, tasks, folder = world
    env = store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    assert env.disk == tasks / "t1" / ENV_DISK and env.base is None and env.note is None
    assert backing(env.disk) is None
    assert env.disk.stat().st_size < 1 << 20  # sparse: nothing allocated for the cap
    assert stat.S_IMODE(env.disk.stat().st_mode) == 0o600


def test_a_resume_keeps_the_tasks_own_disk(world: World) -> None:
    store, tasks, folder = world
    d = task_dir(tasks, "t1")
    first = store.prepare(d, folder, size=SIZE)
    first.disk.write_bytes(first.disk.read_bytes() + b"guest data")  # stands for what it wrote
    again = store.prepare(d, folder, size=SIZE)
    assert again.disk == first.disk and again.base is None
    assert again.disk.read_bytes().endswith(b"guest data")
    assert store.folder(folder) is not None and store.folder(folder).head is None  # type: ignore[union-attr]


def test_a_new_task_starts_from_the_last_tasks_environment_copy_on_write(world: World) -> None:
    store, tasks, folder = world
    t1 = task_dir(tasks, "t1")
    store.prepare(t1, folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    assert t2.base is not None
    layer = store.layer(t2.base)
    assert layer is not None and layer.from_task == "t1" and layer.parent is None
    # The layer never changes again: read-only, and both tasks write their own overlay.
    assert stat.S_IMODE(layer.path.stat().st_mode) == 0o400
    assert backing(t2.disk) == str(layer.path)
    assert backing(t1 / ENV_DISK) == str(layer.path)
    assert store.task_env(t1) is not None and store.task_env(t1).base == t2.base  # type: ignore[union-attr]
    # A third task stacks on the second's.
    t3 = store.prepare(task_dir(tasks, "t3"), folder, size=SIZE)
    assert [la.from_task for la in store.chain(t3.base)] == ["t2", "t1"]


def test_a_running_tasks_disk_is_never_frozen_under_it(world: World) -> None:
    store, tasks, folder = world
    t1 = task_dir(tasks, "t1")
    env1 = store.prepare(t1, folder, size=SIZE)
    with env1.lock():
        t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
        assert t2.base is None and t2.note is not None and "t1" in t2.note
        assert env1.disk.exists() and backing(env1.disk) is None  # untouched
        with pytest.raises(EnvBusy), env1.lock(wait=0.2):
            pass


def test_clean_env_ignores_the_folders_environment(world: World) -> None:
    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, clean=True, size=SIZE)
    assert t2.base is None and backing(t2.disk) is None


def test_reset_starts_the_next_task_clean_and_keeps_layers_a_task_still_uses(world: World) -> None:
    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    assert store.reset(folder)
    assert store.folder(folder).head is None  # type: ignore[union-attr]
    assert store.layer(t2.base) is not None  # type: ignore[arg-type]  # t1 and t2 sit on it
    t3 = store.prepare(task_dir(tasks, "t3"), folder, size=SIZE)
    assert t3.base is None
    # Once no task uses it, the layer goes.
    shutil.rmtree(tasks / "t1")
    shutil.rmtree(tasks / "t2")
    assert store.gc() == [t2.base]
    assert not list(store.layers_dir.glob("*.qcow2"))


def test_rm_forgets_the_folder(world: World) -> None:
    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    assert store.rm(folder) and store.folder(folder) is None
    assert not store.rm(folder)


def test_a_deleted_last_task_leaves_the_folder_on_its_previous_layer(world: World) -> None:
    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    shutil.rmtree(tasks / "t2")
    t3 = store.prepare(task_dir(tasks, "t3"), folder, size=SIZE)
    assert t3.base == t2.base


def test_the_lock_is_per_task_and_released_with_the_holder(world: World) -> None:
    store, tasks, folder = world
    d = task_dir(tasks, "t1")
    env = store.prepare(d, folder, size=SIZE)
    with env.lock(), hold_lock(d) as ok:
        assert not ok
    with hold_lock(d) as ok:
        assert ok


def test_layers_only_deleted_tasks_used_go_when_the_next_task_starts(world: World) -> None:
    store, tasks, folder = world
    other = folder.parent / "other"
    other.mkdir()
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)  # freezes t1's disk
    store.prepare(task_dir(tasks, "t3"), other, clean=True, size=SIZE)
    assert store.layer(t2.base) is not None  # type: ignore[arg-type]  # the folder's head
    store.reset(folder)
    shutil.rmtree(tasks / "t1")
    shutil.rmtree(tasks / "t2")
    t4 = store.prepare(task_dir(tasks, "t4"), other, size=SIZE)  # any start sweeps
    assert store.layer(t2.base) is None  # type: ignore[arg-type]
    # What stays is the layer t4 starts from (t3's disk, frozen now).
    assert [p.stem for p in store.layers_dir.glob("*.qcow2")] == [t4.base]


def test_a_guest_writing_an_image_header_into_its_disk_never_changes_what_the_host_opens(
    world: World, tmp_path: Path
) -> None:
    """The guest owns its disk's *contents*: it can make them look like a qcow2 image
    whose backing file is a host secret. The host names every format (qcow2, never
    probed), so those bytes stay data: the chain is exactly the layers it recorded."""
    store, tasks, folder = world
    t1 = task_dir(tasks, "t1")
    env1 = store.prepare(t1, folder, size=SIZE)
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"host only")
    lure = tmp_path / "lure.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", str(secret), "-F", "raw",
         str(lure), "1M"],
        check=True,
    )  # fmt: skip
    # What a guest does to its block device: raw bytes at offset 0 of the virtual disk.
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", f"write -s {lure} 0 {lure.stat().st_size}",
         str(env1.disk)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    layer = store.layer(t2.base)  # type: ignore[arg-type]
    assert layer is not None
    chain = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", "--backing-chain", "-U", str(t2.disk)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert [c["filename"] for c in chain] == [str(t2.disk), str(layer.path)]
    assert all(c["format"] == "qcow2" for c in chain)
    assert str(secret) not in json.dumps(chain)


def test_a_built_layer_becomes_the_folders_head_and_is_kept(world: World) -> None:
    """``piwork env build``: the build's disk is frozen read-only, the folder's next task
    starts from it (not from what its last task left), and a child build inherits its
    ENV/WORKDIR through any task layers on top."""
    store, tasks, folder = world
    first = task_dir(tasks, "t1")
    store.prepare(first, folder, size=SIZE)  # a task ran here before the build
    build_disk = folder.parent / "build.qcow2"
    create_disk(build_disk, SIZE, None)
    meta = {"file": "piwork.Dockerfile", "env": [["A", "1"]], "workdir": "/srv"}
    layer = store.add_built_layer(build_disk, "b-123", None, folder, meta)
    assert not build_disk.exists()
    assert stat.S_IMODE(layer.path.stat().st_mode) == 0o400
    rec = store.folder(folder)
    assert rec is not None and rec.head == "b-123" and rec.last_task_dir is None
    second = task_dir(tasks, "t2")
    env = store.prepare(second, folder, size=SIZE)
    assert env.base == "b-123" and backing(env.disk) == str(layer.path)
    assert store.task_env(first) is not None  # the earlier task keeps its own disk
    # A third task freezes the second's disk over the build: the build's settings hold.
    env3 = store.prepare(task_dir(tasks, "t3"), folder, size=SIZE)
    assert env3.base is not None and env3.base != "b-123"
    assert store.build_settings(env3.base) == ({"A": "1"}, "/srv")
    assert store.build_settings(None) == ({}, "/")
    # A cached build only moves the head; gc keeps what a folder or task uses.
    store.reset(folder)
    store.use_layer(folder, "b-123")
    assert store.folder(folder).head == "b-123"  # type: ignore[union-attr]
    store.gc()
    assert store.layer("b-123") is not None
