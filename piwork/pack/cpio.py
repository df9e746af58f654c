"""A small, deterministic writer (and reader) for the ``newc`` cpio format.

The kernel unpacks an initramfs from a "new ASCII" (``070701``) cpio archive.
Each member is a 110-byte ASCII header, the NUL-terminated name, padding to a
4-byte boundary, the data, padding again; the archive ends with a member named
``TRAILER!!!``. This module writes exactly that, in the spirit of virtme-ng's
``mkinitramfs``: plain Python, no shell pipeline.

Determinism: members are written in sorted order, with mtime fixed, uid/gid 0
and inode numbers counted from 1, so the same tree always yields the same
bytes (and the same sha256 in the pack manifest). File data is streamed in
chunks, never held in memory whole.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

MAGIC = b"070701"
TRAILER = "TRAILER!!!"
HEADER_LEN = 110
_CHUNK = 1 << 20

EntryKind = Literal["file", "dir", "symlink", "chardev"]


@dataclass(frozen=True)
class CpioEntry:
    """One archive member. ``name`` is relative, '/'-separated, no leading '/'."""

    name: str
    kind: EntryKind
    mode: int = 0o755  # permission bits only; the type bits come from ``kind``
    source: Path | None = None  # file: where to read the data from
    data: bytes | None = None  # file: inline data (small generated files)
    target: str = ""  # symlink: link target
    rdev: tuple[int, int] = (0, 0)  # chardev: (major, minor)

    def type_bits(self) -> int:
        return {
            "file": stat.S_IFREG,
            "dir": stat.S_IFDIR,
            "symlink": stat.S_IFLNK,
            "chardev": stat.S_IFCHR,
        }[self.kind]


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def _header(
    *,
    ino: int,
    mode: int,
    nlink: int,
    mtime: int,
    filesize: int,
    rdev: tuple[int, int],
    namesize: int,
) -> bytes:
    fields = (
        ino,
        mode,
        0,  # uid
        0,  # gid
        nlink,
        mtime,
        filesize,
        0,  # devmajor
        0,  # devminor
        rdev[0],
        rdev[1],
        namesize,
        0,  # check (unused for 070701)
    )
    return MAGIC + b"".join(b"%08X" % f for f in fields)


def entries_from_tree(root: Path) -> list[CpioEntry]:
    """Describe every file, directory and symlink under ``root`` (not root itself).

    File modes keep only whether the file is executable (0755 vs 0644), so the
    host's umask and ownership never leak into the archive.
    """
    entries: list[CpioEntry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in (*dirnames, *filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append(CpioEntry(rel, "symlink", 0o777, target=os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(CpioEntry(rel, "dir", 0o755))
            elif stat.S_ISREG(st.st_mode):
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                entries.append(CpioEntry(rel, "file", mode, source=path))
            else:
                raise ValueError(f"cannot archive {path}: not a file, directory or symlink")
    return entries


def _sorted_with_parents(entries: Iterable[CpioEntry]) -> list[CpioEntry]:
    """Sort by path components so every directory precedes what it holds."""
    by_name: dict[str, CpioEntry] = {}
    for e in entries:
        name = e.name.strip("/")
        if not name or name in (".", TRAILER):
            raise ValueError(f"invalid cpio member name {e.name!r}")
        if name in by_name:
            raise ValueError(f"duplicate cpio member {name!r}")
        by_name[name] = e
    # Implicit parent directories, so the kernel never has to guess.
    for name in list(by_name):
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            by_name.setdefault(parent, CpioEntry(parent, "dir", 0o755))
    return [by_name[n] for n in sorted(by_name, key=lambda n: n.split("/"))]


def _copy_stream(src: Path, out: BinaryIO, expected: int) -> None:
    written = 0
    with src.open("rb") as fh:
        while block := fh.read(_CHUNK):
            out.write(block)
            written += len(block)
    if written != expected:
        raise OSError(f"{src} changed size while being archived ({expected} -> {written})")


def write_newc(entries: Iterable[CpioEntry], out: BinaryIO, *, mtime: int = 0) -> int:
    """Write ``entries`` (plus missing parent dirs) as a newc archive; return its size."""
    total = 0
    for ino, e in enumerate(_sorted_with_parents(entries), start=1):
        name = e.name.strip("/").encode()
        if e.kind == "file":
            if e.data is not None:
                size = len(e.data)
            elif e.source is not None:
                size = e.source.stat().st_size
            else:
                raise ValueError(f"file member {e.name!r} has neither source nor data")
        elif e.kind == "symlink":
            size = len(e.target.encode())
        else:
            size = 0
        head = _header(
            ino=ino,
            mode=e.type_bits() | (e.mode & 0o7777),
            nlink=2 if e.kind == "dir" else 1,
            mtime=mtime,
            filesize=size,
            rdev=e.rdev if e.kind == "chardev" else (0, 0),
            namesize=len(name) + 1,
        )
        head += name + b"\0"
        head += _pad(len(head))
        out.write(head)
        total += len(head)
        if e.kind == "file":
            if e.data is not None:
                out.write(e.data)
            else:
                assert e.source is not None
                _copy_stream(e.source, out, size)
        elif e.kind == "symlink":
            out.write(e.target.encode())
        out.write(_pad(size))
        total += size + len(_pad(size))
    trailer = _header(
        ino=0, mode=0, nlink=1, mtime=0, filesize=0, rdev=(0, 0), namesize=len(TRAILER) + 1
    )
    trailer += TRAILER.encode() + b"\0"
    trailer += _pad(len(trailer))
    out.write(trailer)
    total += len(trailer)
    return total


def write_tree(root: Path, dest: Path, *, extra: Iterable[CpioEntry] = (), mtime: int = 0) -> int:
    """Archive the tree at ``root`` plus ``extra`` members into ``dest``.

    A member of ``extra`` replaces the tree's member of the same name (e.g. to
    give ``tmp`` mode 1777 whatever the host's umask made of it).
    """
    members = {e.name: e for e in entries_from_tree(root)}
    members.update({e.name.strip("/"): e for e in extra})
    with dest.open("wb") as out:
        size = write_newc(members.values(), out, mtime=mtime)
        out.flush()
        os.fsync(out.fileno())
    return size


@dataclass(frozen=True)
class CpioMember:
    """A member as read back from an archive (for tests and inspection)."""

    name: str
    mode: int
    uid: int
    gid: int
    nlink: int
    mtime: int
    rdev: tuple[int, int]
    data: bytes


def read_newc(stream: BinaryIO) -> Iterator[CpioMember]:
    """Parse a newc archive, yielding members up to (not including) the trailer."""
    offset = 0

    def read_exact(n: int) -> bytes:
        nonlocal offset
        buf = stream.read(n)
        if len(buf) != n:
            raise ValueError(f"truncated cpio archive at offset {offset}")
        offset += n
        return buf

    while True:
        head = read_exact(HEADER_LEN)
        if head[:6] != MAGIC:
            raise ValueError(f"bad cpio magic {head[:6]!r} at offset {offset - HEADER_LEN}")
        f = [int(head[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = f[11], f[6]
        name = read_exact(namesize)[:-1].decode()
        read_exact((4 - offset % 4) % 4)
        if name == TRAILER:
            return
        data = read_exact(filesize)
        read_exact((4 - offset % 4) % 4)
        yield CpioMember(
            name=name,
            mode=f[1],
            uid=f[2],
            gid=f[3],
            nlink=f[4],
            mtime=f[5],
            rdev=(f[9], f[10]),
            data=data,
        )
