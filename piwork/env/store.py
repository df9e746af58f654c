"""Persistent environments: each task's writable disk, and what a folder's next task starts from.

The guest's workbench root is an overlay of the pack's read-only Debian image
and a writable disk (runtime-pack/workbench/setup.sh). That disk is
``<task dir>/env.qcow2``: sparse, capped at its virtual size, kept with the
task, so ``apt-get``/``pip``/``npm -g`` installs survive ``piwork resume``, a
VM crash and a host reboot.

A new task on a folder starts from the environment the folder's last task
left, copy-on-write: the last task's disk is *frozen* into a read-only layer
(``<data>/envs/layers/<id>.qcow2``), the old task gets a fresh overlay on it
(so it can still be resumed, with everything it had) and the new task gets
another overlay on the same layer. A layer never changes once frozen, which
is what a qcow2 backing file needs; a task's disk is frozen only while no VM
uses it (``env.lock``, held by ``piwork.agent`` for the VM's life). When it is
in use, the new task starts from the folder's previous layer and says so.

Each new task on a folder adds one layer under the next, so the qcow2 backing
chain would grow by one per task (every read walks it, and every layer stays
open in QEMU). Past ``MAX_CHAIN_LAYERS`` the chain is *merged*: ``qemu-img
convert`` reads it as one block device and writes a standalone layer with the
same contents, which the folder's next task (and the task just frozen) sit on
instead; the layers it replaces go once no task uses them.

Trust: every disk here is written by a guest. The host never mounts one or
reads a file system on it; it only creates empty qcow2 files, renames them,
merges a chain block by block (qcow2 read as a block format, its file system
never looked at) and gives them to QEMU as block devices (docs/security.md).
``qemu-img create`` is called with ``-u`` so it does not even open a backing
file. Every backing path is one the host derived from its own records (a
layer's id), never one read from an image: a merge names each layer of the
chain explicitly to ``qemu-img`` (``json:`` with ``backing`` node by node), and
refuses a layer whose header asks for an external data file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from piwork.config import Paths, get_paths
from piwork.errors import PersonError
from piwork.fsutil import fsync_dir, fsync_file
from piwork.jsonstore import DamagedFile, JsonFile

log = logging.getLogger(__name__)

ENV_DISK = "env.qcow2"
ENV_META = "env.json"
ENV_LOCK = "env.lock"
IMAGE_GRACE_SECONDS = 3600
"""An imported image is never collected within this long of its import."""
DEFAULT_SIZE_BYTES = 16 << 30
"""Virtual size of a new task's disk: the cap on what it can hold, not space used."""
MAX_CHAIN_LAYERS = 6
"""A folder's chain of layers is merged into one when it would grow past this: short
enough that reads stay cheap, long enough that a merge (a full copy) is rare."""
MERGE_TIMEOUT_SECONDS = 3600
"""A merge copies the whole environment: allow for many GB on a slow disk."""


class EnvError(PersonError):
    """An environment problem, said so the person knows what to do."""


class EnvBusy(EnvError):
    """Another VM uses this task's environment disk."""


BUILD_ENV_FILE = "/etc/piwork/env.sh"
"""Where a built layer keeps its ENV and WORKDIR in the guest's root; tasks' bash reads
it through ``BASH_ENV`` (piwork.agent sets it for a workbench pack)."""


@dataclass(frozen=True)
class Layer:
    id: str
    parent: str | None
    folder: str | None
    from_task: str | None
    created_at: float
    path: Path
    build: dict[str, Any] | None = None
    """For a layer ``piwork env build`` made: its file, ENV, WORKDIR (None: a task's)."""
    image: str | None = None
    """The imported image this layer sits on (None: the pack's Debian workbench)."""
    merged: tuple[str, ...] = ()
    """For a layer made by merging a chain: the ids it replaced, newest first."""

    @property
    def bytes(self) -> int:
        return allocated_bytes(self.path)


@dataclass(frozen=True)
class FolderEnv:
    key: str
    folder: str
    head: str | None
    """The layer a new task here starts from (None: clean)."""
    last_task_dir: str | None
    """The last task that made a disk here: frozen into the next head when a task starts."""
    image: str | None = None
    """An imported image (``piwork env import``) tasks here use instead of the pack's Debian."""


@dataclass(frozen=True)
class TaskEnv:
    disk: Path
    base: str | None
    size: int
    note: str | None = None
    """Why this task did not start from the folder's latest environment, if it did not."""
    image: Path | None = None
    """The imported image (read-only erofs) under the disk, instead of the pack's Debian."""

    @contextlib.contextmanager
    def lock(self, wait: float = 5.0) -> Iterator[None]:
        """Held while a VM uses the disk: the folder's next task will not freeze it meanwhile.

        Waits a little: a new task on the folder may be freezing it right now."""
        deadline = time.monotonic() + wait
        while True:
            with hold_lock(self.disk.parent) as ok:
                if ok:
                    yield
                    return
            if time.monotonic() > deadline:
                raise EnvBusy(
                    f"the environment disk {self.disk} is in use by another VM "
                    "(is this task running elsewhere?)"
                )
            time.sleep(0.1)


def allocated_bytes(path: Path) -> int:
    """Space the sparse file really takes on the host."""
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


@contextlib.contextmanager
def hold_lock(task_dir: Path) -> Iterator[bool]:
    fd = os.open(task_dir / ENV_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _qemu_img(*args: str, timeout: float = 60) -> None:
    try:
        proc = subprocess.run(
            ["qemu-img", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise EnvError(
            "qemu-img not found: task environments are qcow2 disks "
            "(Debian/Ubuntu: apt-get install qemu-utils, or run scripts/setup.sh)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EnvError(f"qemu-img {args[0]} took longer than {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise EnvError(f"qemu-img {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")


def create_disk(path: Path, size: int, backing: Path | None) -> None:
    """An empty qcow2 (the guest formats a blank one), or an overlay on ``backing``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    args = ["create", "-q", "-f", "qcow2"]
    if backing is not None:
        # -u: do not open the backing file (no need; its size is given).
        args += ["-u", "-b", str(backing), "-F", "qcow2"]
    _qemu_img(*args, str(tmp), str(size))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    fsync_dir(path.parent)


QCOW2_MAGIC = b"QFI\xfb"
QCOW2_INCOMPAT_DATA_FILE = 1 << 2


def check_layer_header(path: Path) -> None:
    """Refuse a layer that is not qcow2 or whose header asks for an external data file.

    The qcow2 driver opens a data file named in the image's header by itself; no
    layer piwork makes has one, so one that does was not made here. Only the
    fixed header is read (the version and the incompatible-feature bits, qcow2
    spec), never the image's contents.
    """
    try:
        with path.open("rb") as f:
            head = f.read(80)
    except OSError as exc:
        raise EnvError(f"cannot read the environment layer {path}: {exc.strerror}") from exc
    if len(head) < 72 or head[:4] != QCOW2_MAGIC:
        raise EnvError(f"the environment layer {path} is not a qcow2 image")
    version = int.from_bytes(head[4:8], "big")
    if version not in (2, 3):
        raise EnvError(f"the environment layer {path} has qcow2 version {version}")
    if version == 3:
        if len(head) < 80:
            raise EnvError(f"the environment layer {path} has a truncated header")
        if int.from_bytes(head[72:80], "big") & QCOW2_INCOMPAT_DATA_FILE:
            raise EnvError(
                f"the environment layer {path} names an external data file; piwork never "
                "makes one, so it is not used (piwork env reset FOLDER starts clean)"
            )


def chain_spec(paths: list[Path]) -> dict[str, Any]:
    """QEMU block options for ``paths`` (newest first) as one chain, every backing given.

    ``"backing": None`` under the oldest layer: with a backing named explicitly at
    every level, QEMU opens no backing file named in any header.
    """
    spec: dict[str, Any] | None = None
    for path in reversed(paths):
        spec = {
            "driver": "qcow2",
            "file": {"driver": "file", "filename": str(path)},
            "backing": spec,
        }
    assert spec is not None
    return spec


def merge_chain(paths: list[Path], dest: Path) -> None:
    """Write the contents of the chain ``paths`` (newest first) to ``dest``: one standalone
    qcow2, sparse, 0400, in place only once whole (written beside it, fsynced, renamed)."""
    for path in paths:
        check_layer_header(path)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    source = "json:" + orjson.dumps(chain_spec(paths)).decode()
    try:
        # No -f: a json: source names its own driver; -O qcow2 without -B: no backing file.
        _qemu_img("convert", "-q", "-O", "qcow2", source, str(tmp), timeout=MERGE_TIMEOUT_SECONDS)
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o400)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(dest.parent)


def _settings(record: dict[str, Any]) -> tuple[dict[str, str], str]:
    """``env`` pairs and ``workdir`` from a record piwork wrote (a build's, an image's)."""
    env = record.get("env")
    pairs = [p for p in env if isinstance(p, list) and len(p) == 2] if isinstance(env, list) else []
    return {str(k): str(v) for k, v in pairs}, str(record.get("workdir") or "/")


def folder_key(folder: Path) -> str:
    return hashlib.sha256(str(folder).encode()).hexdigest()[:16]


class EnvDamaged(DamagedFile, EnvError):
    """A record of the environments cannot be read: no task starts on a guess of what it
    said, and no layer is collected while it might be the one it names."""


def _parse_record(raw: bytes) -> dict[str, Any]:
    data = orjson.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


def record_file(path: Path) -> JsonFile[dict[str, Any]]:
    """One record (a folder's, a layer's, an image's, a task's ``env.json``): written
    durably with its last good copy, refused when damaged (:mod:`piwork.jsonstore`)."""
    fresh = None
    if path.parent.name == "folders":
        fresh = "start the folder clean: `piwork env reset FOLDER`"
    return JsonFile(
        path,
        _parse_record,
        what="environment record",
        restore_command=f"piwork restore {path}",
        fresh=fresh,
        error=EnvDamaged,
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    """The record, None if there is none; :class:`EnvDamaged` if it cannot be read."""
    return record_file(path).read()


def write_record(path: Path, record: dict[str, Any]) -> None:
    record_file(path).write(orjson.dumps(record))


def _forget(path: Path) -> None:
    record_file(path).remove()


class EnvStore:
    """``<data>/envs``: frozen layers and one record per folder."""

    def __init__(self, root: Path, tasks_root: Path) -> None:
        self.root = root
        self.tasks_root = tasks_root
        self.layers_dir = root / "layers"
        self.folders_dir = root / "folders"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.layers_dir.mkdir(parents=True, exist_ok=True)
        self.folders_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------ records
    def layer(self, layer_id: str) -> Layer | None:
        meta = _read_json(self.layers_dir / f"{layer_id}.json")
        path = self.layers_dir / f"{layer_id}.qcow2"
        if meta is None or not path.is_file():
            return None
        return Layer(
            id=layer_id,
            parent=meta.get("parent"),
            folder=meta.get("folder"),
            from_task=meta.get("from_task"),
            created_at=float(meta.get("created_at", 0)),
            path=path,
            build=meta["build"] if isinstance(meta.get("build"), dict) else None,
            image=meta["image"] if isinstance(meta.get("image"), str) else None,
            merged=tuple(str(m) for m in meta.get("merged") or () if isinstance(m, str)),
        )

    def build_settings(self, layer_id: str | None) -> tuple[dict[str, str], str]:
        """The ENV and WORKDIR a build on ``layer_id`` starts from: those of the newest
        built layer in its chain (a task's layer on top keeps them: its disk holds the file),
        else those of the imported image the chain sits on."""
        chain = self.chain(layer_id)
        for layer in chain:
            if layer.build is not None:
                return _settings(layer.build)
        if chain and chain[0].image is not None:
            return self.image_settings(chain[0].image)
        return {}, "/"

    def image_settings(self, image_id: str) -> tuple[dict[str, str], str]:
        """The Env and WorkingDir an imported image's config gave (checked at import)."""
        meta = _read_json(self.images_dir / f"{image_id}.json")
        return _settings(meta or {})

    def chain(self, layer_id: str | None) -> list[Layer]:
        """The layer and its parents, newest first."""
        out: list[Layer] = []
        seen: set[str] = set()
        while layer_id is not None and layer_id not in seen:
            seen.add(layer_id)
            layer = self.layer(layer_id)
            if layer is None:
                break
            out.append(layer)
            layer_id = layer.parent
        return out

    def folder(self, folder: Path) -> FolderEnv | None:
        key = folder_key(folder)
        data = _read_json(self.folders_dir / f"{key}.json")
        if data is None:
            return None
        return FolderEnv(
            key, str(data["folder"]), data.get("head"), data.get("last_task_dir"), data.get("image")
        )

    def folders(self) -> list[FolderEnv]:
        out = []
        for p in sorted(self.folders_dir.glob("*.json")) if self.folders_dir.is_dir() else []:
            data = _read_json(p)
            if data is not None and "folder" in data:
                out.append(
                    FolderEnv(
                        p.stem,
                        str(data["folder"]),
                        data.get("head"),
                        data.get("last_task_dir"),
                        data.get("image"),
                    )
                )
        return out

    def _save_folder(self, rec: FolderEnv) -> None:
        payload = {
            "folder": rec.folder,
            "head": rec.head,
            "last_task_dir": rec.last_task_dir,
            "image": rec.image,
            "updated_at": time.time(),
        }
        write_record(self.folders_dir / f"{rec.key}.json", payload)

    def task_env(self, task_dir: Path) -> TaskEnv | None:
        meta = _read_json(task_dir / ENV_META)
        disk = task_dir / ENV_DISK
        if meta is None or not disk.is_file():
            return None
        image = meta.get("image")
        return TaskEnv(
            disk,
            meta.get("base"),
            int(meta.get("size", DEFAULT_SIZE_BYTES)),
            image=self.image_path(image) if isinstance(image, str) else None,
        )

    @staticmethod
    def _write_task_meta(
        task_dir: Path, base: str | None, size: int, folder: str | None, image: str | None = None
    ) -> None:
        payload = {
            "base": base,
            "size": size,
            "folder": folder,
            "image": image,
            "updated_at": time.time(),
        }
        write_record(task_dir / ENV_META, payload)

    # ------------------------------------------------------------ imported images
    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    def image_path(self, image_id: str) -> Path:
        return self.images_dir / f"{image_id}.erofs"

    def use_image(self, folder: Path, image_id: str) -> None:
        """The folder's next task runs on the imported image, from a blank disk over it."""
        with self._locked():
            self._save_folder(FolderEnv(folder_key(folder), str(folder), None, None, image_id))

    # ------------------------------------------------------------ the life of a disk
    def prepare(
        self,
        task_dir: Path,
        folder: Path | None,
        *,
        clean: bool = False,
        size: int = DEFAULT_SIZE_BYTES,
    ) -> TaskEnv:
        """This task's disk: the one it has (a resume), else a new one (see the module doc)."""
        existing = self.task_env(task_dir)
        if existing is not None:
            return existing
        with self._locked():
            note = None
            head: str | None = None
            rec = self.folder(folder) if folder is not None else None
            if folder is not None and not clean:
                head, note = self._freeze_last(rec)
                if head is not None:
                    # A head that did not come from a freeze (a build stacked on layers,
                    # a running last task) can be long too.
                    head, merge_note = self._bounded(head)
                    note = note or merge_note
            base_layer = self.layer(head) if head is not None else None
            image = rec.image if rec is not None and not clean else None
            if image is not None and not self.image_path(image).is_file():
                raise EnvError(
                    f"the folder's imported image {image} is gone; import it again "
                    "(piwork env import IMAGE.tar FOLDER) or start clean (piwork env reset FOLDER)"
                )
            create_disk(
                task_dir / ENV_DISK, size, base_layer.path if base_layer is not None else None
            )
            self._write_task_meta(task_dir, head, size, str(folder) if folder else None, image)
            if folder is not None:
                self._save_folder(
                    FolderEnv(folder_key(folder), str(folder), head, str(task_dir), image)
                )
            # Layers left only by deleted tasks (`piwork tasks rm`) go now; while another
            # record is damaged nothing is collected (it may name any layer), and this task
            # does not depend on that.
            try:
                self._gc()
            except EnvDamaged as exc:
                log.warning("environment layers not collected: %s", exc)
            return TaskEnv(
                task_dir / ENV_DISK,
                head,
                size,
                note,
                image=self.image_path(image) if image is not None else None,
            )

    def _freeze_last(self, rec: FolderEnv | None) -> tuple[str | None, str | None]:
        """Freeze the folder's last task disk into a layer; return (the head, a note)."""
        if rec is None:
            return None, None
        if rec.last_task_dir is None:
            return rec.head, None
        last = Path(rec.last_task_dir)
        env = self.task_env(last)
        if env is None:
            return rec.head, None  # that task (or its disk) was deleted
        with hold_lock(last) as ok:
            if not ok:
                return rec.head, (
                    f"the folder's last task ({last.name}) is running: this task starts from "
                    "the environment before it"
                )
            layer_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
            path = self.layers_dir / f"{layer_id}.qcow2"
            meta = {
                "parent": env.base,
                "folder": rec.folder,
                "from_task": last.name,
                "created_at": time.time(),
                "image": env.image.stem if env.image is not None else None,
            }
            write_record(self.layers_dir / f"{layer_id}.json", meta)
            fsync_file(env.disk)  # QEMU's writes, on disk before the layer is named
            os.rename(env.disk, path)
            os.chmod(path, 0o400)
            fsync_dir(self.layers_dir)
            # The old task keeps what it had, on top of the frozen copy.
            create_disk(env.disk, env.size, path)
            image = env.image.stem if env.image is not None else None
            self._write_task_meta(last, layer_id, env.size, rec.folder, image)
            top, note = self._bounded(layer_id)
            if top != layer_id:
                # Its overlay is still empty (made above, its lock held): the same
                # contents on the merged layer, so the replaced chain can go.
                merged = self.layer(top)
                assert merged is not None
                create_disk(env.disk, env.size, merged.path)
                self._write_task_meta(last, top, env.size, rec.folder, image)
        return top, note

    def _bounded(self, layer_id: str) -> tuple[str, str | None]:
        """``layer_id``, or a layer merged from its chain when that is longer than
        ``MAX_CHAIN_LAYERS`` (and a note when a merge was needed but failed: the
        task then starts on the chain as it is, nothing lost)."""
        chain = self.chain(layer_id)
        if len(chain) <= MAX_CHAIN_LAYERS:
            return layer_id, None
        if chain[-1].parent is not None:
            return layer_id, (
                f"the folder's environment is missing layer {chain[-1].parent}; its "
                f"{len(chain)} layers were not merged (piwork env reset FOLDER starts clean)"
            )
        merged_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        meta_path = self.layers_dir / f"{merged_id}.json"
        meta = {
            "parent": None,
            "folder": chain[0].folder,
            "from_task": chain[0].from_task,
            "created_at": time.time(),
            # What build_settings finds first in the chain it replaces.
            "build": next((la.build for la in chain if la.build is not None), None),
            "image": chain[0].image,
            "merged": [la.id for la in chain],
        }
        # The record first: a crash before the disk is in place leaves a record
        # without a disk, which layer() ignores and gc removes.
        write_record(meta_path, meta)
        try:
            merge_chain([la.path for la in chain], self.layers_dir / f"{merged_id}.qcow2")
        except (EnvError, OSError) as exc:  # e.g. no room for the copy: nothing lost
            _forget(meta_path)
            return layer_id, (
                f"the folder's {len(chain)} environment layers were not merged into one "
                f"({exc}); this task starts on them as they are"
            )
        return merged_id, None

    # ------------------------------------------------------------ built layers
    def add_built_layer(
        self,
        disk: Path,
        layer_id: str,
        parent: str | None,
        folder: Path,
        build: dict[str, Any],
        image: str | None = None,
    ) -> Layer:
        """Freeze a build VM's disk (it has stopped) into the read-only layer ``layer_id``,
        and make it the folder's head: the next task there starts from it."""
        with self._locked():
            path = self.layers_dir / f"{layer_id}.qcow2"
            meta = {
                "parent": parent,
                "folder": str(folder),
                "from_task": None,
                "created_at": time.time(),
                "build": build,
                "image": image,
            }
            write_record(self.layers_dir / f"{layer_id}.json", meta)
            fsync_file(disk)
            os.rename(disk, path)
            os.chmod(path, 0o400)
            fsync_dir(self.layers_dir)
            self._set_head(folder, layer_id, image)
        layer = self.layer(layer_id)
        assert layer is not None
        return layer

    def use_layer(self, folder: Path, layer_id: str) -> None:
        """The folder's next task starts from ``layer_id`` (a cached build)."""
        with self._locked():
            layer = self.layer(layer_id)
            self._set_head(folder, layer_id, layer.image if layer is not None else None)

    def _set_head(self, folder: Path, layer_id: str, image: str | None) -> None:
        # No last task: what earlier tasks left is not frozen over the build (their own
        # disks still have it, for a resume).
        self._save_folder(FolderEnv(folder_key(folder), str(folder), layer_id, None, image))

    # ------------------------------------------------------------ management
    def reset(self, folder: Path) -> bool:
        """The folder's next task starts clean; layers no task uses any more are deleted."""
        with self._locked():
            try:
                rec = self.folder(folder)
            except EnvDamaged:  # the person chose to start clean: a copy of it is kept
                rec = FolderEnv(folder_key(folder), str(folder), None, None, None)
            if rec is None:
                return False
            self._save_folder(FolderEnv(rec.key, rec.folder, None, None, None))
            self._gc()
        return True

    def rm(self, folder: Path) -> bool:
        """Forget the folder's environment entirely (and delete the layers only it used)."""
        with self._locked():
            record = record_file(self.folders_dir / f"{folder_key(folder)}.json")
            if not record.path.exists() and not record.last_good.exists():
                return False
            record.remove()  # damaged or not: the person chose to forget it
            self._gc()
        return True

    def gc(self) -> list[str]:
        with self._locked():
            return self._gc()

    def _task_bases(self) -> Iterator[str]:
        if not self.tasks_root.is_dir():
            return
        for task_dir in self.tasks_root.iterdir():
            meta = _read_json(task_dir / ENV_META)
            if meta is not None and isinstance(meta.get("base"), str):
                yield meta["base"]

    def users(self, layer_id: str) -> list[str]:
        """Task ids whose disk sits (directly or further up) on this layer."""
        out = []
        if self.tasks_root.is_dir():
            for task_dir in sorted(self.tasks_root.iterdir()):
                meta = _read_json(task_dir / ENV_META)
                base = meta.get("base") if meta else None
                if isinstance(base, str) and layer_id in {la.id for la in self.chain(base)}:
                    out.append(task_dir.name)
        return out

    def _gc(self) -> list[str]:
        roots = {rec.head for rec in self.folders() if rec.head} | set(self._task_bases())
        keep: set[str] = set()
        for r in roots:
            keep |= {la.id for la in self.chain(r)}
        removed = []
        # A merge's file not yet in place: any one found under the lock was left by a
        # merge that died (merges run under it).
        for tmp in self.layers_dir.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        for meta in sorted(self.layers_dir.glob("*.json")):
            if meta.stem not in keep:
                with contextlib.suppress(FileNotFoundError):
                    (self.layers_dir / f"{meta.stem}.qcow2").unlink()
                _forget(meta)
                removed.append(meta.stem)
        removed += self._gc_images(keep)
        return removed

    def _gc_images(self, kept_layers: set[str]) -> list[str]:
        """Imported images no folder, kept layer or task uses any more.

        One just imported is kept for a while whatever uses it: ``piwork env import``
        makes the image before it points the folder at it (outside this lock).
        """
        if not self.images_dir.is_dir():
            return []
        used = {rec.image for rec in self.folders() if rec.image}
        used |= {la.image for la in map(self.layer, kept_layers) if la is not None and la.image}
        if self.tasks_root.is_dir():
            for task_dir in self.tasks_root.iterdir():
                meta = _read_json(task_dir / ENV_META)
                if meta is not None and isinstance(meta.get("image"), str):
                    used.add(meta["image"])
        removed = []
        for meta_path in sorted(self.images_dir.glob("*.json")):
            image_id = meta_path.stem
            young = time.time() - meta_path.stat().st_mtime < IMAGE_GRACE_SECONDS
            if image_id in used or young:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.image_path(image_id).unlink()
            _forget(meta_path)
            removed.append(image_id)
        return removed


def store_for(paths: Paths) -> EnvStore:
    return EnvStore(paths.data / "envs", paths.tasks)


def default_store() -> EnvStore:
    return store_for(get_paths())
