"""Durable file writes shared by every store: a crash leaves old or new, never half.

One implementation of "write to a temp file, fsync, rename over, fsync the
directory", so the task store, the policy store, the key file and the pack
builder cannot drift apart on what durable means.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_fd(fd: int) -> None:
    """Flush a file to stable storage (``F_FULLFSYNC`` on macOS, where fsync is not enough)."""
    if sys.platform == "darwin":
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_FULLFSYNC", 51))
            return
        except OSError:
            pass
    os.fsync(fd)


def fsync_file(path: Path) -> None:
    """Flush a file written elsewhere (by QEMU, mkfs, a copy) before it is named or used."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable. A no-op where dirs cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on a directory
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through a file object; it appears whole, or not at all.

    The temp file beside it is ``.<name>.<pid>.<random>.tmp``, 0600 from its
    first byte; it is fsynced, renamed over ``path``, and the directory is
    fsynced. On any failure (or a crash, for a sweeper that knows the pid is
    dead: ``piwork.tasks.store``) the temp file goes and ``path`` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            fsync_fd(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (see :func:`atomic_writer`)."""
    with atomic_writer(path) as fh:
        fh.write(data)


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read in chunks (packs, layers, images, templates)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
