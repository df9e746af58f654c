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

from piwork.env import ENV_DISK, EnvBusy, EnvError, EnvStore
from piwork.env.store import MAX_CHAIN_LAYERS, check_layer_header, create_disk, hold_lock

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


# ---------------------------------------------------------------- a bounded chain

MIB = 1 << 20


def guest_writes(disk: Path, byte: int, offset: int) -> None:
    """What a guest does to its block device: a MiB of ``byte`` at ``offset``."""
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", f"write -P {byte:#x} {offset} {MIB}", str(disk)],
        check=True,
        capture_output=True,
    )


def reads_back(disk: Path, byte: int, offset: int) -> bool:
    proc = subprocess.run(
        ["qemu-io", "-r", "-f", "qcow2", "-c", f"read -P {byte:#x} {offset} {MIB}", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Pattern verification failed" in proc.stdout or proc.returncode == 0, proc.stderr
    return proc.returncode == 0 and "verification failed" not in proc.stdout


def header_chain(disk: Path) -> list[str]:
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", "--backing-chain", "-U", str(disk)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [str(c["filename"]) for c in json.loads(out)]


def test_many_tasks_on_a_folder_keep_the_chain_bounded_and_every_tasks_data(
    world: World,
) -> None:
    """Each task freezes the last one's disk into a layer; past MAX_CHAIN_LAYERS the chain
    is merged into one standalone layer. Every earlier task's writes stay readable from
    the newest task's disk, and each earlier task still has its own (for a resume)."""
    store, tasks, folder = world
    n = 2 * MAX_CHAIN_LAYERS + 3
    dirs: list[Path] = []
    merges = 0
    for i in range(n):
        d = task_dir(tasks, f"t{i:02d}")
        env = store.prepare(d, folder, size=SIZE)
        assert env.note is None
        dirs.append(d)
        chain = store.chain(env.base)
        assert len(chain) <= MAX_CHAIN_LAYERS
        # QEMU follows the headers: they name exactly the recorded chain, no more.
        assert header_chain(env.disk) == [str(env.disk)] + [str(la.path) for la in chain]
        merges += bool(chain and chain[-1].merged)
        for j in range(i):  # everything the earlier tasks wrote, in the new task's disk
            assert reads_back(env.disk, 0x10 + j, j * MIB), (i, j)
        assert reads_back(env.disk, 0, i * MIB)  # and nothing else
        guest_writes(env.disk, 0x10 + i, i * MIB)
    assert merges >= 2
    # Each earlier task resumes with exactly what it had.
    for j, d in enumerate(dirs):
        env_j = store.task_env(d)
        assert env_j is not None
        assert all(reads_back(env_j.disk, 0x10 + k, k * MIB) for k in range(j + 1))
        assert reads_back(env_j.disk, 0, (j + 1) * MIB)
    # A merged layer is a standalone, read-only qcow2.
    merged = [la for la in map(store.layer, (p.stem for p in store.layers_dir.glob("*.json")))
              if la is not None and la.merged]  # fmt: skip
    assert merged and all(backing(la.path) is None for la in merged)
    assert all(stat.S_IMODE(la.path.stat().st_mode) == 0o400 for la in merged)
    # Once the old tasks are gone, only what the folder's head needs is left.
    head = store.folder(folder).head  # type: ignore[union-attr]
    for d in dirs[:-1]:
        shutil.rmtree(d)
    store.gc()
    kept = sorted(p.stem for p in store.layers_dir.glob("*.qcow2"))
    last_base = store.task_env(dirs[-1]).base  # type: ignore[union-attr]
    assert kept == sorted(
        {la.id for la in store.chain(head)} | {la.id for la in store.chain(last_base)}
    )
    assert len(kept) <= MAX_CHAIN_LAYERS
    assert not list(store.layers_dir.glob(".*"))  # no merge left a file behind


def _grow_chain(store: EnvStore, tasks: Path, folder: Path, count: int) -> list[Path]:
    dirs = []
    for i in range(count):
        d = task_dir(tasks, f"g{i:02d}")
        env = store.prepare(d, folder, size=SIZE)
        guest_writes(env.disk, 0x10 + i, i * MIB)
        dirs.append(d)
    return dirs


def test_a_merge_follows_the_recorded_chain_never_a_backing_file_named_in_a_layer(
    world: World, tmp_path: Path
) -> None:
    """A layer whose header names some other file as its backing (planted, or from a
    bug) is merged over its *recorded* parent: the planted file's bytes never reach
    the merged layer, so never a later guest."""
    store, tasks, folder = world
    _grow_chain(store, tasks, folder, MAX_CHAIN_LAYERS + 1)
    head = store.folder(folder).head  # type: ignore[union-attr]
    chain = store.chain(head)
    assert len(chain) == MAX_CHAIN_LAYERS
    # Host data a merge must never copy: where the bottom layer holds task 0's bytes.
    lure = tmp_path / "host-secret.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(lure), str(SIZE)], check=True)
    guest_writes(lure, 0xEE, 0)
    guest_writes(lure, 0xEE, 40 * MIB)
    victim = chain[-2].path  # its recorded parent is the bottom layer
    victim.chmod(0o600)
    subprocess.run(
        ["qemu-img", "rebase", "-u", "-f", "qcow2", "-b", str(lure), "-F", "qcow2", str(victim)],
        check=True,
    )
    victim.chmod(0o400)
    assert backing(victim) == str(lure)
    # The next task makes the chain too long: it is merged.
    env = store.prepare(task_dir(tasks, "next"), folder, size=SIZE)
    assert env.note is None
    top = store.layer(env.base)  # type: ignore[arg-type]
    assert top is not None and top.merged and backing(top.path) is None
    assert reads_back(top.path, 0x10, 0)  # task 0's bytes, from the recorded bottom layer
    assert reads_back(top.path, 0, 40 * MIB)  # not the lure's
    assert not reads_back(top.path, 0xEE, 0)


def test_a_layer_naming_an_external_data_file_is_never_merged(world: World, tmp_path: Path) -> None:
    """qcow2 opens a data file its header names by itself: a layer asking for one was
    not made by piwork. The merge is refused, said, and the task starts on the chain as
    it is (nothing lost, nothing of the named file copied)."""
    store, tasks, folder = world
    _grow_chain(store, tasks, folder, MAX_CHAIN_LAYERS + 1)
    chain = store.chain(store.folder(folder).head)  # type: ignore[union-attr]
    secret = tmp_path / "host-secret.raw"
    secret.write_bytes(b"\xee" * MIB)
    bad = tmp_path / "bad.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={secret}", str(bad),
         str(SIZE)],
        check=True,
    )  # fmt: skip
    victim = chain[-1].path
    victim.chmod(0o600)
    shutil.copyfile(bad, victim)
    victim.chmod(0o400)
    before = sorted(p.name for p in store.layers_dir.iterdir())
    env = store.prepare(task_dir(tasks, "next"), folder, size=SIZE)
    assert env.note is not None and "external data file" in env.note
    assert not any(la.merged for la in store.chain(env.base))
    after = sorted(p.name for p in store.layers_dir.iterdir())
    # The frozen layer (disk, record and the record's last good copy), no merge.
    assert len(after) == len(before) + 3
    with pytest.raises(EnvError, match="not a qcow2"):
        check_layer_header(secret)


def test_a_merge_keeps_the_settings_of_a_built_layer_it_replaces(world: World) -> None:
    store, tasks, folder = world
    build_disk = folder.parent / "build.qcow2"
    create_disk(build_disk, SIZE, None)
    guest_writes(build_disk, 0x42, 0)
    meta = {"file": "piwork.Dockerfile", "env": [["A", "1"]], "workdir": "/srv"}
    store.add_built_layer(build_disk, "b-123", None, folder, meta)
    dirs = []
    for i in range(MAX_CHAIN_LAYERS + 1):
        d = task_dir(tasks, f"t{i}")
        env = store.prepare(d, folder, size=SIZE)
        dirs.append(d)
    assert any(la.merged for la in store.chain(env.base))
    assert store.build_settings(env.base) == ({"A": "1"}, "/srv")
    assert reads_back(env.disk, 0x42, 0)
    # The built layer stays while a task sits on it, so a cached build still finds it.
    assert store.layer("b-123") is not None


def test_a_merge_that_fails_leaves_the_chain_as_it_was_and_says_so(world: World) -> None:
    """A layer qemu-img cannot read (damaged, or the copy runs out of room): the task
    starts on the unmerged chain with a note; no half-written layer is left."""
    store, tasks, folder = world
    _grow_chain(store, tasks, folder, MAX_CHAIN_LAYERS + 1)
    chain = store.chain(store.folder(folder).head)  # type: ignore[union-attr]
    victim = chain[2].path
    victim.chmod(0o600)
    with victim.open("r+b") as f:
        f.seek(40)  # the header's L1 table offset: unaligned, so qemu-img refuses the layer
        f.write((12345).to_bytes(8, "big"))
    victim.chmod(0o400)
    env = store.prepare(task_dir(tasks, "next"), folder, size=SIZE)
    assert env.note is not None and "were not merged into one" in env.note
    assert "qemu-img convert" in env.note
    assert len(store.chain(env.base)) == MAX_CHAIN_LAYERS + 1
    assert not any(la.merged for la in store.chain(env.base))
    assert not list(store.layers_dir.glob(".*"))


def test_a_damaged_folder_record_starts_nothing_and_collects_nothing(world: World) -> None:
    """Read as "no environment", a damaged record used to start the folder clean and let
    gc delete every layer its tasks sit on; now nothing runs or goes until it is restored."""
    from piwork.env.store import EnvDamaged, folder_key, record_file

    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    layers = sorted(p.name for p in store.layers_dir.glob("*.qcow2"))
    assert layers and t2.base is not None
    record = store.folders_dir / f"{folder_key(folder)}.json"
    record.write_bytes(record.read_bytes()[:10])
    shutil.rmtree(tasks / "t2")  # the task that pinned the layer goes (piwork tasks rm)
    with pytest.raises(EnvDamaged) as caught:
        store.prepare(task_dir(tasks, "t3"), folder, size=SIZE)
    assert str(record) in str(caught.value) and "piwork restore" in str(caught.value)
    assert "piwork env reset" in str(caught.value) or "last good" in str(caught.value)
    assert not (tasks / "t3" / ENV_DISK).exists()
    with pytest.raises(EnvDamaged):
        store.gc()
    assert sorted(p.name for p in store.layers_dir.glob("*.qcow2")) == layers
    # A task on another folder still starts (it needs nothing of that record), and the
    # collector it runs keeps everything while the record is damaged.
    other = folder.parent / "other"
    other.mkdir()
    store.prepare(task_dir(tasks, "o1"), other, size=SIZE)
    assert sorted(p.name for p in store.layers_dir.glob("*.qcow2")) == layers
    # Restored, the folder's next task starts from its environment again.
    record_file(record).restore()
    t3 = store.prepare(tasks / "t3", folder, size=SIZE)
    assert t3.base is not None and t3.base in {la.id for la in store.chain(t3.base)}


def test_a_damaged_task_record_is_refused_on_resume_and_keeps_its_layers(world: World) -> None:
    from piwork.env.store import EnvDamaged

    store, tasks, folder = world
    store.prepare(task_dir(tasks, "t1"), folder, size=SIZE)
    t2 = store.prepare(task_dir(tasks, "t2"), folder, size=SIZE)
    store.reset(folder)  # only t2's own record still pins its base layer
    (tasks / "t2" / "env.json").write_bytes(b"{")
    with pytest.raises(EnvDamaged, match=r"env\.json is damaged"):
        store.prepare(tasks / "t2", folder, size=SIZE)  # a resume: never a fresh disk
    assert backing(t2.disk) is not None, "the task's own disk is untouched"
    with pytest.raises(EnvDamaged):
        store.gc()
    assert t2.base is not None and store.layer(t2.base) is not None
