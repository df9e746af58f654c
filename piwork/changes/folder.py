"""The person's folder as piwork reads and writes it: beneath the root, never through a link.

Every path is resolved one component at a time from an open directory
(:mod:`piwork.sharefs`); a link is an entry, read as a link, replaced or removed,
never followed. Writes are a temp file renamed into place; a folder removed is
walked by descriptor. The person's own files may change under piwork at any
time (they keep working during a run): each operation re-reads what it needs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from piwork import sharefs
from piwork.changes.entry import Change, Kind
from piwork.sharefs import UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_WALK = 1_000_000


@dataclass(frozen=True)
class Seen:
    """A path's state in the folder and the stat that identifies that state."""

    change: Change
    dev: int = 0
    ino: int = 0
    ctime_ns: int = 0
    mtime_ns: int = 0

    @property
    def signature(self) -> tuple[int, int, int, int, int]:
        return (self.dev, self.ino, self.ctime_ns, self.mtime_ns, self.change.size)


def _kind(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISLNK(mode):
        return Kind.LINK
    return Kind.OTHER


class Dirs:
    """Open directories of the folder, reached without following a link, kept open while
    a change set is applied (one walk per directory instead of one per file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}

    def __enter__(self) -> Dirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget(self, rel: str) -> None:
        """``rel`` and what is under it were removed or replaced: open them afresh."""
        for key in [k for k in self._fds if k == rel or k.startswith(rel + "/")]:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(key))

    def dir(self, rel: str, *, create: bool) -> int:
        """An fd of the directory ``rel`` ("" is the root); owned by this cache."""
        if rel in self._fds:
            return self._fds[rel]
        if rel == "":
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            parent, _, name = rel.rpartition("/")
            # one component beneath the parent's fd, never through a link (sharefs)
            fd = sharefs._walk_dirs(self.dir(parent, create=create), [name], create=create)
        self._fds[rel] = fd
        return fd

    def parent(self, rel: str, *, create: bool = False) -> tuple[int, str] | None:
        """(fd of ``rel``'s directory, its last name), or None when that directory is missing
        or not a real one (a link, a file)."""
        sharefs.split_relative(rel)
        parent, _, name = rel.rpartition("/")
        try:
            return self.dir(parent, create=create), name
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            if create:
                raise
            return None


def look(
    root: Path | Dirs,
    rel: str,
    *,
    max_hash_bytes: int | None = None,
    keep: list[bytes] | None = None,
) -> Seen:
    """What the folder holds at ``rel`` now (a file's sha256 when it is not over
    ``max_hash_bytes``; a parent that is a link or a file counts as nothing there).
    ``keep``: the file's bytes are appended to it (read once for the hash and the store)."""
    with _view(root) as dirs:
        return _look(dirs, rel, max_hash_bytes, keep)


def _look(root: Dirs, rel: str, max_hash_bytes: int | None, keep: list[bytes] | None) -> Seen:
    got = root.parent(rel)
    if got is None:
        return Seen(Change(rel, Kind.GONE))
    dir_fd, name = got
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Seen(Change(rel, Kind.GONE))
    kind = _kind(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    sig = {"dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
           "mtime_ns": st.st_mtime_ns}  # fmt: skip
    if kind is Kind.LINK:
        return Seen(Change(rel, kind, mode, target=os.readlink(name, dir_fd=dir_fd)), **sig)
    if kind is not Kind.FILE:
        return Seen(Change(rel, kind, mode), **sig)
    if max_hash_bytes is not None and st.st_size > max_hash_bytes:
        return Seen(Change(rel, kind, mode, st.st_size), **sig)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            return Seen(Change(rel, Kind.OTHER, mode), **sig)  # replaced meanwhile
        h = hashlib.sha256()
        size = 0
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
            if keep is not None:
                chunks.append(chunk)
        if keep is not None:
            keep.append(b"".join(chunks))
    finally:
        os.close(fd)
    return Seen(Change(rel, kind, mode, size, h.hexdigest()), **sig)


def signature(root: Dirs, rel: str) -> tuple[int, int, int, int, int] | None:
    """The stat that identifies what is at ``rel`` now (None: nothing there)."""
    got = root.parent(rel)
    if got is None:
        return None
    dir_fd, name = got
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, size)


def missing_parents(root: Dirs, rel: str) -> list[str]:
    """The folders on the way to ``rel`` that do not exist yet (outermost first)."""
    parts = rel.split("/")[:-1]
    out: list[str] = []
    for i in range(1, len(parts) + 1):
        p = "/".join(parts[:i])
        if out or signature(root, p) is None:
            out.append(p)
    return out


def remove_empty_dir(root: Path | Dirs, rel: str) -> bool:
    """Remove the folder ``rel`` if it is empty (False: it holds something, or is gone)."""
    with _view(root) as dirs:
        got = dirs.parent(rel)
        if got is None:
            return False
        dir_fd, name = got
        dirs.forget(rel)
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            return False
        return True


def read_file(root: Path | Dirs, rel: str, max_bytes: int) -> bytes | None:
    """A regular file's bytes (None if it is not one, or over ``max_bytes``)."""
    if isinstance(root, Dirs):
        root = root.root
    try:
        fd = sharefs.open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, UnsafePathError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    finally:
        os.close(fd)


def _make_parents(dirs: Dirs, rel: str) -> tuple[int, str]:
    """The fd of ``rel``'s directory, made as needed (a link or a file in the way: refused)."""
    try:
        got = dirs.parent(rel, create=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise UnsafePathError(
            errno.ENOTDIR, f"something that is not a folder is in the way of {rel}"
        ) from exc
    assert got is not None
    return got


@contextlib.contextmanager
def _view(root: Path | Dirs) -> Iterator[Dirs]:
    """``root``'s open directories: the caller's cache, or a one-off one for a path."""
    if isinstance(root, Dirs):
        yield root
        return
    with Dirs(root) as dirs:
        yield dirs


def _clear(dir_fd: int, name: str) -> None:
    """Remove whatever stands at ``name`` (a folder with all it holds; links never followed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _rmtree_at(dir_fd, name)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _rmtree_at(dir_fd: int, name: str) -> None:
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for de in entries:
            if de.is_dir(follow_symlinks=False):
                _rmtree_at(fd, de.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(de.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _write_file(root: Dirs, rel: str, data: bytes, *, mode: int = 0o644) -> Seen:
    """Put ``data`` at ``rel`` with permission bits ``mode`` (never set-uid, set-gid or
    sticky), replacing what is there, a folder included. Not fsynced: the caller syncs
    the filesystem once for the whole change set."""
    mode &= 0o777
    dir_fd, name = _make_parents(root, rel)
    root.forget(rel)
    tmp = f".{name[:200]}.piwork-{secrets.token_hex(4)}"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # whatever the umask
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    st2 = _put_in_place(dir_fd, tmp, name)
    sha = hashlib.sha256(data).hexdigest()
    mode = stat.S_IMODE(st2.st_mode)
    return Seen(
        Change(rel, Kind.FILE, mode, len(data), sha),
        st2.st_dev, st2.st_ino, st2.st_ctime_ns, st2.st_mtime_ns,
    )  # fmt: skip


def _put_in_place(dir_fd: int, tmp: str, name: str) -> os.stat_result:
    """Rename ``tmp`` over ``name`` (a folder standing there is removed first); a failure
    removes ``tmp``. Returns the new entry's own stat."""
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _rmtree_at(dir_fd, name)
        except FileNotFoundError:
            pass
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _make_link(root: Dirs, rel: str, target: str) -> Seen:
    """A symlink at ``rel`` holding ``target`` (never followed by piwork)."""
    dir_fd, name = _make_parents(root, rel)
    root.forget(rel)
    tmp = f".{name[:200]}.piwork-{secrets.token_hex(4)}"
    os.symlink(target, tmp, dir_fd=dir_fd)
    st2 = _put_in_place(dir_fd, tmp, name)
    return Seen(Change(rel, Kind.LINK, 0o777, target=target), st2.st_dev, st2.st_ino,
                st2.st_ctime_ns, st2.st_mtime_ns)  # fmt: skip


def _make_dir(root: Dirs, rel: str) -> Seen:
    """A folder at ``rel`` (a file or link standing there is replaced)."""
    dir_fd, name = _make_parents(root, rel)
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            root.forget(rel)
            os.unlink(name, dir_fd=dir_fd)
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileNotFoundError:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return Seen(Change(rel, Kind.DIR, stat.S_IMODE(st.st_mode)), st.st_dev, st.st_ino,
                st.st_ctime_ns, st.st_mtime_ns)  # fmt: skip


def _remove(root: Dirs, rel: str) -> None:
    """Remove ``rel`` (a folder with everything in it); nothing there is not an error."""
    got = root.parent(rel)
    if got is None:
        return
    dir_fd, name = got
    root.forget(rel)
    _clear(dir_fd, name)


def write_file(root: Path | Dirs, rel: str, data: bytes, *, mode: int = 0o644) -> Seen:
    """Put ``data`` at ``rel`` with permission bits ``mode`` (never set-uid, set-gid or
    sticky), replacing what is there, a folder included. Not fsynced: the caller syncs
    the filesystem once for the whole change set."""
    with _view(root) as dirs:
        return _write_file(dirs, rel, data, mode=mode)


def make_link(root: Path | Dirs, rel: str, target: str) -> Seen:
    """A symlink at ``rel`` holding ``target`` (never followed by piwork)."""
    with _view(root) as dirs:
        return _make_link(dirs, rel, target)


def make_dir(root: Path | Dirs, rel: str) -> Seen:
    """A folder at ``rel`` (a file or link standing there is replaced)."""
    with _view(root) as dirs:
        return _make_dir(dirs, rel)


def remove(root: Path | Dirs, rel: str) -> None:
    """Remove ``rel`` (a folder with everything in it); nothing there is not an error."""
    with _view(root) as dirs:
        _remove(dirs, rel)


def walk(root: Path | Dirs, rel: str, *, max_entries: int = MAX_WALK) -> Iterator[sharefs.Entry]:
    """Every entry beneath the folder ``rel`` (paths relative to the root), links not entered."""
    if isinstance(root, Dirs):
        root = root.root
    try:
        for e in sharefs.walk_beneath(root, under=rel, max_entries=max_entries):
            yield sharefs.Entry(f"{rel}/{e.path}", e.stat)
    except (FileNotFoundError, NotADirectoryError, UnsafePathError):
        return
