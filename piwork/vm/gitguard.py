"""A ``.git`` the guest makes in a share the host keeps (the task's outputs) is moved aside.

Host git runs programs named in a repository's metadata (``core.fsmonitor``,
hooks, ...): a repository the guest made in a folder the person opens would
run the guest's code at their next ``git status`` (or their editor's). The
working folder needs nothing of this any more: the guest never writes it
(piwork.changes: its changes arrive as change sets, and what is git metadata
waits for the person). What is left is the task's outputs share, which the
guest writes directly: :func:`move_aside` moves every ``.git`` (directory or
file) and bare-looking directory (``HEAD`` + ``objects/`` + ``refs/``, git's own
test) found there out of it, before each model call and once QEMU has stopped.

Nothing here follows a link: the scan lists with ``follow_symlinks=False``,
moves go through directory fds opened with ``O_NOFOLLOW``, and with 9p
``mapped-xattr`` a link the guest makes is a plain host file.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from piwork.textsafe import sanitize


@dataclass(frozen=True)
class GitEntry:
    path: Path
    kind: str  # "dir" (.git dir), "file" (.git gitlink), "bare"
    dev: int
    ino: int


@dataclass(frozen=True)
class MovedAside:
    original: Path
    now: Path
    kind: str

    def note(self) -> str:
        """One line for the person; the guest chose the names, so they are made inert."""
        was, now = (sanitize(str(p), one_line=True) for p in (self.original, self.now))
        return (
            f"moved aside git metadata the agent created: {was} is now {now} "
            "(host git would run programs its config names; look at it before using it)"
        )


def _is_bare(names: dict[str, os.DirEntry[str]]) -> bool:
    """What git's ``is_git_directory`` looks for: HEAD, objects/ and refs/."""
    head, objects, refs = names.get("HEAD"), names.get("objects"), names.get("refs")
    return (
        head is not None
        and objects is not None
        and refs is not None
        and objects.is_dir(follow_symlinks=False)
        and refs.is_dir(follow_symlinks=False)
    )


def _entry(path: Path, kind: str) -> GitEntry | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return GitEntry(path, kind, st.st_dev, st.st_ino)


def scan(root: Path) -> list[GitEntry]:
    """Every git metadata entry under ``root`` (not descending into them), links not followed.

    Unreadable directories are skipped: QEMU runs as the same user, so the
    guest cannot list them either.
    """
    found: list[GitEntry] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                names = {e.name: e for e in it}
        except OSError:
            continue
        if _is_bare(names):
            entry = _entry(folder, "bare")
            if entry is not None:
                found.append(entry)
            continue
        for name, e in names.items():
            path = folder / name
            if name == ".git":
                if e.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif e.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    continue  # a host link: QEMU refuses to follow it (O_NOFOLLOW)
                entry = _entry(path, kind)
                if entry is not None:
                    found.append(entry)
            elif e.is_dir(follow_symlinks=False):
                stack.append(path)
    return found


def move_aside(roots: Sequence[Path], dest: Path) -> tuple[list[MovedAside], list[str]]:
    """Move every git metadata entry under ``roots`` into ``dest``.

    Returns what moved, and what could not be moved (each with the reason).
    Into ``dest`` when it is on the same file system, else renamed in place to
    a name git does not look for (a bare-looking directory loses its ``HEAD``
    instead), so nothing is copied or lost. Safe while the VM runs: each move
    goes through directory fds opened without following links, and renames the
    entry only if it is still the inode the scan found (a guest swapping names
    in between makes it skip that entry until the next call).
    """
    moved: list[MovedAside] = []
    failed: list[str] = []
    batch = dest / time.strftime("%Y%m%d-%H%M%S")
    for root in roots:
        for entry in scan(root):
            try:
                now = _move_one(root, entry, batch / root.name)
            except OSError as exc:
                failed.append(f"{sanitize(str(entry.path), one_line=True)}: {exc.strerror or exc}")
                continue
            if now is not None:
                moved.append(MovedAside(entry.path, now, entry.kind))
    return moved, failed


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_beneath(root: Path, parts: Sequence[str]) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError:
        os.close(fd)
        raise
    return fd


def _move_one(root: Path, entry: GitEntry, dest: Path) -> Path | None:
    rel = entry.path.relative_to(root)
    if not rel.parts:  # the share itself was made to look like a bare repository
        fd = _open_beneath(root, ())
        try:
            return _disarm_bare(fd, entry.path)
        finally:
            os.close(fd)
    parent = _open_beneath(root, rel.parts[:-1])
    try:
        st = os.stat(rel.name, dir_fd=parent, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (entry.dev, entry.ino):
            return None  # changed since the scan: the next call looks again
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.rename(rel.name, target.name, src_dir_fd=parent, dst_dir_fd=out)
            return target
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        finally:
            os.close(out)
        # Another file system: never copy, disarm in place.
        if entry.kind == "bare":
            fd = os.open(rel.name, _DIR_FLAGS, dir_fd=parent)
            try:
                return _disarm_bare(fd, entry.path)
            finally:
                os.close(fd)
        n = 0
        while True:
            name = f".git.piwork-moved-{n}"
            try:
                os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(rel.name, name, src_dir_fd=parent, dst_dir_fd=parent)
                return entry.path.with_name(name)
            n += 1
    finally:
        os.close(parent)


def _disarm_bare(fd: int, path: Path) -> Path:
    """Without ``HEAD``, git does not take the directory for a repository."""
    os.rename("HEAD", "HEAD.piwork-moved", src_dir_fd=fd, dst_dir_fd=fd)
    return path / "HEAD.piwork-moved"
