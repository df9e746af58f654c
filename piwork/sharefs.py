"""File access beneath a share root that never follows a link the guest planted.

The guest runs as root and can write every share (task state, working folder,
outputs). Anything the host opens, writes, lists or removes there may have
been replaced by a symlink, so every path is resolved one component at a time
with ``O_NOFOLLOW`` relative to an open directory descriptor (the openat-style
walk; Linux ``openat2(RESOLVE_BENEATH)`` is not exposed by Python). ``..``,
absolute paths and empty components are refused before any lookup.

Writes are atomic (temp file + ``rename`` within the same directory fd), so a
crash leaves the old or the new content and a planted link at the target name
is replaced, not written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from piwork.errors import ProtocolError
from piwork.fsutil import fsync_fd

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(OSError, ProtocolError):
    """A path inside a share is malformed, escapes the share, or crosses a symlink."""


def split_relative(rel: str | PurePosixPath) -> list[str]:
    """Validate ``rel`` as a path beneath a root and return its components.

    Refuses absolute paths, ``..``, NUL bytes and empty paths: these come from
    guest text or from listings and must never leave the root.
    """
    text = str(rel)
    if not text or "\0" in text:
        raise UnsafePathError(errno.EINVAL, f"not a relative path inside the share: {text!r}")
    p = PurePosixPath(text)
    if p.is_absolute():
        raise UnsafePathError(errno.EINVAL, f"absolute path, a relative one is needed: {text!r}")
    parts = [part for part in p.parts if part != "."]
    if not parts or any(part == ".." for part in parts):
        raise UnsafePathError(errno.EINVAL, f"path leaves the share or names its root: {text!r}")
    return parts


def _open_root(root: Path) -> int:
    # The root itself is chosen by the host (task dir, bound folder); it may
    # legitimately be reached through host-side links, so it is resolved once
    # here and everything below it is walked without following links.
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _walk_dirs(root_fd: int, parts: list[str], *, create: bool) -> int:
    """Open the directory ``parts`` beneath ``root_fd`` (a new fd; caller closes)."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(
                        exc.errno, f"refusing to follow a link or non-directory at {name!r}"
                    ) from exc
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _parent_beneath(root: Path, rel: str | PurePosixPath, *, create: bool) -> tuple[int, str]:
    """An fd of ``rel``'s directory beneath ``root`` (caller closes) and its last component."""
    parts = split_relative(rel)
    root_fd = _open_root(root)
    try:
        return _walk_dirs(root_fd, parts[:-1], create=create), parts[-1]
    finally:
        os.close(root_fd)


def open_beneath(root: Path, rel: str | PurePosixPath, flags: int = os.O_RDONLY) -> int:
    """Open ``root/rel`` without following any link below ``root``; returns an fd.

    A symlink at the final component fails with :class:`UnsafePathError`
    (``ELOOP``) instead of being followed.
    """
    dir_fd, name = _parent_beneath(root, rel, create=False)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, f"refusing to follow a symlink: {rel}") from exc
        raise
    finally:
        os.close(dir_fd)


def read_beneath(root: Path, rel: str | PurePosixPath, *, max_bytes: int) -> bytes:
    """Read at most ``max_bytes`` of a regular file beneath ``root`` (no links, no FIFOs)."""
    fd = open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(errno.EINVAL, f"not a regular file: {rel}")
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic_beneath(
    root: Path, rel: str | PurePosixPath, data: bytes, *, mode: int = 0o600, make_dirs: bool = True
) -> None:
    """Atomically replace ``root/rel`` with ``data``.

    Intermediate directories are created (never followed through a link). A
    symlink or any other entry at the target name is replaced by the new file,
    so a planted link can never redirect the write.
    """
    dir_fd, name = _parent_beneath(root, rel, create=make_dirs)
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dir_fd,
        )
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            fsync_fd(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError as exc:
            raise UnsafePathError(errno.EISDIR, f"a directory stands at {rel}") from exc
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)


def lstat_beneath(root: Path, rel: str | PurePosixPath) -> os.stat_result:
    """``lstat`` of ``root/rel``, resolving the directories on the way without links."""
    dir_fd, name = _parent_beneath(root, rel, create=False)
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class Entry:
    """One entry of a listing: its path relative to the root and its own ``lstat``."""

    path: str
    stat: os.stat_result

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.stat.st_mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.stat.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.stat.st_mode)


def walk_beneath(
    root: Path,
    *,
    max_entries: int = 100_000,
    skip_dirs: frozenset[str] = frozenset(),
    under: str | PurePosixPath | None = None,
) -> Iterator[Entry]:
    """Every entry beneath ``root``, depth first, never descending through a link.

    Links are reported as links (``lstat``), not followed. Stops after
    ``max_entries`` so a guest that made a million files cannot stall the host.
    Directory names in ``skip_dirs`` (e.g. ``.git``) are reported but not entered.
    ``under``: walk only that folder beneath ``root`` (reached without following a
    link; entries' paths are relative to it).
    """
    root_fd = _open_root(root)
    if under is not None:
        try:
            sub_fd = _walk_dirs(root_fd, split_relative(under), create=False)
        finally:
            os.close(root_fd)
        root_fd = sub_fd
    count = 0
    stack: list[tuple[int, str]] = [(root_fd, "")]
    try:
        while stack:
            fd, prefix = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                for de in entries:
                    st = de.stat(follow_symlinks=False)
                    rel = f"{prefix}{de.name}"
                    yield Entry(rel, st)
                    count += 1
                    if count >= max_entries:
                        return
                    if stat.S_ISDIR(st.st_mode) and de.name not in skip_dirs:
                        try:
                            child = os.open(de.name, _DIR_FLAGS, dir_fd=fd)
                        except OSError:
                            continue  # replaced by a link or removed meanwhile
                        stack.append((child, rel + "/"))
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def mkdir_beneath(root: Path, rel: str | PurePosixPath, *, mode: int = 0o755) -> None:
    """Make the directory ``root/rel`` (and its parents) without following any link.

    An entry already standing at the name (a directory, or anything the guest
    put there, a link included) is left alone and never followed: the host
    only needs the name to exist for the guest.
    """
    dir_fd, name = _parent_beneath(root, rel, create=True)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def unlink_beneath(root: Path, rel: str | PurePosixPath) -> None:
    """Remove the non-directory entry ``root/rel`` (a planted link is removed, not followed)."""
    dir_fd, name = _parent_beneath(root, rel, create=False)
    try:
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def rename_beneath(root: Path, rel: str | PurePosixPath, new_name: str) -> None:
    """Rename the entry ``root/rel`` (whatever it is: a planted link is renamed, not
    followed) to ``new_name`` in the same directory."""
    if not new_name or "/" in new_name or new_name in (".", ".."):
        raise UnsafePathError(f"not a plain name: {new_name!r}")
    dir_fd, name = _parent_beneath(root, rel, create=False)
    try:
        os.rename(name, new_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def replace_beneath(
    root: Path, rel: str | PurePosixPath, data: bytes, *, mode: int = 0o644
) -> bool:
    """:func:`write_atomic_beneath` for a host-made file in a share the guest can write.

    A link (or file) the guest put where a directory of ours belongs is removed,
    never followed, and the write tried again. Returns True when one was removed,
    so the caller can say so.
    """
    try:
        write_atomic_beneath(root, rel, data, mode=mode)
        return False
    except UnsafePathError:
        parent = str(PurePosixPath(rel).parent)
        if parent == "." or stat.S_ISDIR(lstat_beneath(root, parent).st_mode):
            raise
        unlink_beneath(root, parent)
        write_atomic_beneath(root, rel, data, mode=mode)
        return True


def readlink_beneath(root: Path, rel: str | PurePosixPath) -> str:
    """The text of the link ``root/rel`` (read, never followed)."""
    dir_fd, name = _parent_beneath(root, rel, create=False)
    try:
        return os.readlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
