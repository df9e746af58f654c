"""Durable file writes shared by every store: a crash leaves old or new, never half.

One implementation of "write to a temp file, fsync, rename over, fsync the
directory", so the task store, the policy store, the key file and the pack
builder cannot drift apart on what durable means.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import tempfile
from pathlib import Path


def fsync_fd(fd: int) -> None:
    """Flush a file to stable storage (``F_FULLFSYNC`` on macOS, where fsync is not enough)."""
    if sys.platform == "darwin":
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_FULLFSYNC", 51))
            return
        except OSError:
            pass
    os.fsync(fd)


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``; the file is 0600 from its first byte.

    A crash at any point leaves either the old content or the new one, and the
    temp file (``.<name>.*.tmp`` beside it) is removed on any failure.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            fsync_fd(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
