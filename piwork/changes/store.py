"""Content-addressed file store in the task directory (``<task>/changes/objects``).

What the agent wrote (before it is applied or while it is held) and what the
folder held before piwork changed it (the checkpoints' previous versions) are
kept here by sha256, once each. A write is a temp file renamed into place;
durability is made once per batch (:meth:`ObjectStore.sync`) instead of one
fsync per file, because a change set of 10,000 files would otherwise spend
seconds in fsync. The journal records a checkpoint only after that sync.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import os
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path

from piwork.errors import StoreError
from piwork.fsutil import fsync_fd


class StoreMissing(OSError, StoreError):
    """An object the journal names is not in the store (deleted by hand, or a damaged disk)."""


@functools.cache
def _syncfs() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


def sync_filesystem(path: Path, written: Iterable[Path] = ()) -> None:
    """Make everything written under ``path`` durable: ``syncfs`` on Linux, else an fsync
    of each file in ``written`` and of ``path`` itself."""
    fn = _syncfs()
    if fn is not None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if fn(fd) == 0:  # type: ignore[operator]
                return
        finally:
            os.close(fd)
    for f in written:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fsync_fd(fd)
            finally:
                os.close(fd)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


class ObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._pending: list[Path] = []

    def path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha

    def has(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data``; returns its sha256. Not durable until :meth:`sync`."""
        sha = hashlib.sha256(data).hexdigest()
        dest = self.path(sha)
        if dest.is_file():
            return sha
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = dest.parent / f".{sha}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, dest)
        self._pending.append(dest)
        return sha

    def put_fd(self, fd: int, max_bytes: int) -> tuple[str, int] | None:
        """Copy an open file (at most ``max_bytes``) into the store: (sha256, size), or
        None when it is bigger than that."""
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > max_bytes:
                return None
            chunks.append(chunk)
        data = b"".join(chunks)
        return self.put(data), size

    def get(self, sha: str) -> bytes:
        try:
            data = self.path(sha).read_bytes()
        except FileNotFoundError as exc:
            raise StoreMissing(
                f"the stored version {sha[:12]} is missing from {self.root}"
            ) from exc
        if hashlib.sha256(data).hexdigest() != sha:
            raise StoreMissing(f"the stored version {sha[:12]} in {self.root} is damaged")
        return data

    def size(self, sha: str) -> int:
        try:
            return self.path(sha).stat().st_size
        except FileNotFoundError:
            return 0

    def sync(self) -> None:
        """Make every object put since the last sync durable."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        sync_filesystem(self.root, pending)

    def total_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
        return total

    def remove_unused(self, used: set[str]) -> int:
        """Delete objects no record names; returns how many went."""
        gone = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                if f not in used and not f.startswith("."):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(dirpath, f))
                        gone += 1
        return gone
