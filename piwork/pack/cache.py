"""The pack cache: where packs live, how they are found, locked, checked and listed.

``<packs>/<pack_id>/`` exists only for a finished pack: builds happen in
``<packs>/.tmp-<pack_id>-<random>/`` and are renamed into place after
``manifest.json`` (written last) is on disk. A build holds
``<packs>/.lock-<pack_id>`` (``flock``) so two builds of the same pack never
race; a build that dies leaves at most a ``.tmp-*`` dir, removed by the next
build once no one holds its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from piwork.config import get_paths
from piwork.pack.errors import ManifestError
from piwork.pack.manifest import MANIFEST_NAME, Manifest, sha256_file

TMP_PREFIX = ".tmp-"
LOCK_PREFIX = ".lock-"


def packs_dir() -> Path:
    return get_paths().packs


def pack_path(pack_id: str, packs: Path | None = None) -> Path:
    return (packs or packs_dir()) / pack_id


def load_manifest(pack_dir: Path) -> Manifest:
    """Read and validate ``<pack_dir>/manifest.json``.

    Raises :class:`ManifestError` naming the file and the fix: a pack whose
    manifest cannot be trusted is rebuilt, never patched.
    """
    path = pack_dir / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{path} does not exist: {pack_dir} is not a finished pack (run `piwork pack build`)"
        ) from exc
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        raise ManifestError(
            f"{path} is corrupt ({exc.error_count()} problem(s); first: "
            f"{exc.errors()[0]['msg']}). Delete {pack_dir} and run `piwork pack build`."
        ) from exc
    if manifest.pack_id != pack_dir.name and not pack_dir.name.startswith(TMP_PREFIX):
        raise ManifestError(
            f"{path} says pack_id={manifest.pack_id!r} but lives in "
            f"{pack_dir.name!r}; delete {pack_dir} and rebuild"
        )
    return manifest


@dataclass
class VerifyResult:
    """What :func:`verify` found; ``ok`` when nothing is wrong."""

    pack_dir: Path
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing or self.extra)

    def problems(self) -> list[str]:
        return (
            [f"mismatch: {p}" for p in self.mismatched]
            + [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
        )

    def to_json(self) -> dict[str, object]:
        return {
            "pack_dir": str(self.pack_dir),
            "ok": self.ok,
            "checked": self.checked,
            "mismatched": self.mismatched,
            "missing": self.missing,
            "extra": self.extra,
        }


def _pack_files(pack_dir: Path) -> set[str]:
    found: set[str] = set()
    for dirpath, _dirs, files in os.walk(pack_dir):
        for f in files:
            rel = (Path(dirpath) / f).relative_to(pack_dir).as_posix()
            if rel != MANIFEST_NAME:
                found.add(rel)
    return found


def verify(pack_dir: Path) -> VerifyResult:
    """Re-hash every file of the pack against its manifest (size first, then sha256)."""
    manifest = load_manifest(pack_dir)
    result = VerifyResult(pack_dir)
    listed = {f.path for f in manifest.files}
    for f in manifest.files:
        path = pack_dir / f.path
        if not path.is_file():
            result.missing.append(f.path)
            continue
        result.checked += 1
        if path.stat().st_size != f.size or sha256_file(path) != f.sha256:
            result.mismatched.append(f.path)
    result.extra = sorted(_pack_files(pack_dir) - listed)
    return result


@dataclass(frozen=True)
class PackInfo:
    """An installed pack as ``piwork pack list`` shows it."""

    pack_id: str
    path: Path
    created_at: str
    versions: dict[str, str]
    size: int
    complete: bool  # every file the manifest lists is present with the right size
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "pack_id": self.pack_id,
            "path": str(self.path),
            "created_at": self.created_at,
            "versions": self.versions,
            "size": self.size,
            "complete": self.complete,
            "error": self.error,
        }


def list_packs(packs: Path | None = None) -> list[PackInfo]:
    """Installed packs, newest first. Cheap: checks presence and sizes, not hashes."""
    root = packs or packs_dir()
    if not root.is_dir():
        return []
    infos: list[PackInfo] = []
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue
        size = sum((d / f).stat().st_size for f in _pack_files(d))
        try:
            m = load_manifest(d)
        except ManifestError as exc:
            infos.append(PackInfo(d.name, d, "", {}, size, False, str(exc)))
            continue
        complete = all(
            (d / f.path).is_file() and (d / f.path).stat().st_size == f.size for f in m.files
        )
        infos.append(PackInfo(m.pack_id, d, m.created_at, m.versions, size, complete))
    infos.sort(key=lambda i: i.created_at, reverse=True)
    return infos


# --- locking and scratch dirs ---------------------------------------------------------


@contextlib.contextmanager
def pack_lock(packs: Path, pack_id: str) -> Iterator[None]:
    """Hold ``<packs>/.lock-<pack_id>`` exclusively (blocks while another build runs)."""
    packs.mkdir(parents=True, exist_ok=True)
    fd = os.open(packs / f"{LOCK_PREFIX}{pack_id}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _lock_is_free(packs: Path, pack_id: str) -> bool:
    try:
        fd = os.open(packs / f"{LOCK_PREFIX}{pack_id}", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return True


def clean_stale_tmp(packs: Path, holding: str | None = None) -> list[Path]:
    """Remove ``.tmp-*`` dirs left by dead builds.

    A dir belongs to a live build iff that build holds the pack's lock; the
    caller's own pack (``holding``, whose lock it already has) counts as dead
    since the caller has not made its scratch dir yet.
    """
    removed: list[Path] = []
    if not packs.is_dir():
        return removed
    for d in sorted(packs.iterdir()):
        if not d.name.startswith(TMP_PREFIX):
            continue
        pack_id = d.name[len(TMP_PREFIX) :].rsplit("-", 1)[0]
        if pack_id == holding or _lock_is_free(packs, pack_id):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def finished_manifest(pack_dir: Path) -> Manifest | None:
    """The manifest of a finished pack at ``pack_dir``, or None if there is none."""
    if not (pack_dir / MANIFEST_NAME).is_file():
        return None
    return load_manifest(pack_dir)


def remove_pack(pack_dir: Path) -> None:
    """Move a pack out of the way atomically, then delete it."""
    if not pack_dir.exists():
        return
    doomed = pack_dir.with_name(f"{TMP_PREFIX}{pack_dir.name}-old{os.getpid()}")
    os.rename(pack_dir, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
