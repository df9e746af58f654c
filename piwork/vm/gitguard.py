"""The person's git metadata in a shared folder: read-only for QEMU, new ones moved aside.

Host git runs programs named in a repository's metadata (``core.fsmonitor``,
hooks, ``diff.external``, ...). If the guest could write the working folder's
``.git``, the person's next ``git status`` would run the guest's code on the
host (SECURITY-REVIEW.md finding 1). A read-only mount inside the guest does
not hold against guest root, so the protection is made on the host:

* :func:`scan` finds every git metadata entry in a writable share before QEMU
  starts: ``.git`` directories and ``.git`` files (gitlinks) at any depth,
  the directory a gitlink points to when it is inside the share, and bare
  repositories (a directory holding ``HEAD``, ``objects/`` and ``refs/``, as
  git's own discovery checks); :func:`hooks_entries` adds a hooks directory
  that ``core.hooksPath`` puts inside the share (``.githooks``);
* :func:`launch_argv` runs QEMU through ``confine.py``, which bind-mounts each
  of them read-only onto itself in a mount namespace only QEMU is in, so the
  9p server answers EROFS, EBUSY (rename/remove of a mount point) whatever
  the guest does;
* the guest can still *create* a new ``.git`` (or a bare-looking directory)
  where there was none: :func:`move_aside_new` moves every entry that was not
  there at launch (by device and inode, so a directory the guest renamed is
  still recognised as the person's) out of the folder once the VM has stopped.

Nothing here follows a link: the scan lists with ``follow_symlinks=False``,
and with 9p ``mapped-xattr`` a link the guest makes is a plain host file.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from piwork.errors import VmError
from piwork.textsafe import sanitize

CONFINE_SCRIPT = Path(__file__).with_name("confine.py")
MAX_PROTECTED = 4096
"""More git entries than this in one folder: refuse (each is one mount in QEMU's namespace)."""
GITLINK_MAX_BYTES = 4096


class GitGuardError(RuntimeError, VmError):
    """The folder's git metadata cannot be protected: the VM is not started."""


@dataclass(frozen=True)
class GitEntry:
    path: Path
    kind: str  # "dir" (.git dir), "file" (.git gitlink), "gitdir" (its target), "bare", "hooks"
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


def _gitlink_target(link: Path, root: Path) -> Path | None:
    """The directory a ``.git`` file names, if it is a directory inside ``root``."""
    try:
        fd = os.open(link, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, GITLINK_MAX_BYTES)
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip()
    if not text.startswith("gitdir:"):
        return None
    target = Path(os.path.realpath(link.parent / text[len("gitdir:") :].strip()))
    real_root = Path(os.path.realpath(root))
    if target != real_root and real_root not in target.parents:
        return None
    return target if target.is_dir() and not target.is_symlink() else None


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
                if kind == "file":
                    target = _gitlink_target(path, root)
                    entry = _entry(target, "gitdir") if target is not None else None
                    if entry is not None:
                        found.append(entry)
            elif e.is_dir(follow_symlinks=False):
                stack.append(path)
    return found


def outermost(entries: Iterable[GitEntry]) -> list[Path]:
    """The paths to mount read-only: one per entry, none inside another, sorted, unique."""
    paths = sorted({e.path for e in entries})
    kept: list[Path] = []
    for p in paths:
        if not any(k in p.parents for k in kept):
            kept.append(p)
    return kept


@dataclass(frozen=True)
class Protection:
    """What one QEMU launch protects: the entries found, and the mounts made."""

    roots: tuple[Path, ...]
    entries: tuple[GitEntry, ...]
    readonly: tuple[Path, ...]
    scan_seconds: float


def _git_config_get(args: list[str]) -> str | None:
    """One value read by host git's own config parser (it only parses: nothing runs)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        proc = subprocess.run(
            [git, "config", *args, "--get", "core.hooksPath"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    value = proc.stdout.strip()
    return value if proc.returncode == 0 and value else None


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == r or r in real.parents for r in (Path(os.path.realpath(x)) for x in roots))


def hooks_entries(entries: Sequence[GitEntry], roots: Sequence[Path]) -> list[GitEntry]:
    """Hooks directories that ``core.hooksPath`` puts inside a share (e.g. ``.githooks``).

    Git runs the executables there like those in ``.git/hooks``; without this an
    existing executable hook in the working tree could be rewritten (9p keeps
    the host mode). Read from each repository's own config and the person's
    global one; a relative path is relative to the repository's working tree.
    """
    found: list[GitEntry] = []
    if not any(e.kind == "dir" for e in entries):
        return found
    global_value = _git_config_get(["--global"])
    for e in entries:
        if e.kind != "dir":
            continue
        value = _git_config_get(["--file", str(e.path / "config")]) or global_value
        if value is None:
            continue
        hooks = Path(os.path.expanduser(value))
        hooks = hooks if hooks.is_absolute() else e.path.parent / hooks
        if hooks.is_dir() and not hooks.is_symlink() and _inside(hooks, roots):
            entry = _entry(Path(os.path.realpath(hooks)), "hooks")
            if entry is not None:
                found.append(entry)
    return found


def protect(roots: Sequence[Path]) -> Protection:
    """Scan the writable shares; raise :class:`GitGuardError` if there are too many entries."""
    t = time.monotonic()
    entries = [e for r in roots for e in scan(r)]
    entries += hooks_entries(entries, roots)
    readonly = outermost(entries)
    if len(readonly) > MAX_PROTECTED:
        raise GitGuardError(
            f"the folder holds {len(readonly)} git repositories (more than {MAX_PROTECTED}); "
            "piwork mounts each one read-only for the VM and will not make that many mounts. "
            "Give the task a smaller folder."
        )
    return Protection(tuple(roots), tuple(entries), tuple(readonly), time.monotonic() - t)


def readonly_notice(protection: Protection) -> str:
    """What the person is told at start: the agent cannot commit, and why."""
    n = len(protection.readonly)
    what = "the folder's .git is" if n == 1 else f"the folder's git metadata ({n} entries) is"
    return (
        f"{what} read-only for the agent (so nothing in the VM can change what host git "
        "runs): it cannot commit, branch or change git config there; you commit on your machine"
    )


@functools.cache
def unavailable_reason() -> str | None:
    """Why QEMU cannot be confined on this host (None: it can). Asked once per process."""
    if not sys.platform.startswith("linux"):
        return f"mount namespaces are a Linux feature and this is {sys.platform}"
    try:
        proc = subprocess.run(
            [sys.executable, "-I", str(CONFINE_SCRIPT), "--check"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the namespace check could not run: {exc}"
    if proc.returncode != 0:
        return proc.stderr.strip().removeprefix("piwork-confine: ")[:300] or "unknown error"
    return None


def launch_argv(argv: list[str], protection: Protection) -> list[str]:
    """``argv`` run inside QEMU's own mount namespace with the git entries read-only.

    With nothing to protect and no namespaces on this host, ``argv`` runs as it
    is (there is nothing a namespace would hold); with something to protect and
    no namespaces, :class:`GitGuardError` (fail closed) says what to do.
    """
    reason = unavailable_reason()
    if reason is not None:
        if not protection.readonly:
            return list(argv)
        first = protection.readonly[0]
        more = len(protection.readonly) - 1
        raise GitGuardError(
            f"the working folder has git metadata ({first}"
            + (f" and {more} more" if more else "")
            + ") that the VM must not be able to change, and piwork protects it by "
            "running QEMU in a Linux user and mount namespace, which this host cannot "
            f"make ({reason}). Allow unprivileged user namespaces (Debian: "
            "`sysctl -w kernel.unprivileged_userns_clone=1`; Ubuntu 24.04: "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`), or give the "
            "task a copy of the folder without its .git"
        )
    out = [sys.executable, "-I", str(CONFINE_SCRIPT), "--parent", str(os.getpid())]
    for path in protection.readonly:
        out += ["--ro", str(path)]
    return [*out, "--", *argv]


def move_aside_new(protection: Protection, dest: Path) -> tuple[list[MovedAside], list[str]]:
    """Move git metadata that appeared since launch out of the shares, into ``dest``.

    Returns what moved, and what could not be moved (each with the reason).
    An entry is the person's when its device and inode were seen at launch,
    wherever it is now (the guest may rename a directory holding a repository;
    it cannot move the mounted entry itself), and it is never touched.
    Everything else is moved: into ``dest`` when it is on the same file system,
    else renamed in place to a name git does not look for (a bare-looking
    directory loses its ``HEAD`` instead), so nothing is copied or lost.

    Safe while the VM runs: each move goes through directory fds opened
    without following links, and renames the entry only if it is still the
    inode the scan found (a guest swapping names in between makes it skip
    that entry until the next call; the person's entries cannot be swapped
    in, they are mount points in QEMU's namespace).
    """
    known = {(e.dev, e.ino) for e in protection.entries}
    moved: list[MovedAside] = []
    failed: list[str] = []
    batch = dest / time.strftime("%Y%m%d-%H%M%S")
    for root in protection.roots:
        for entry in scan(root):
            if (entry.dev, entry.ino) in known or entry.kind == "gitdir":
                continue
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
