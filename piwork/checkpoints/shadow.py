"""A shadow git repository that records one working folder.

The repository lives in the task directory (``<task dir>/checkpoints``), never
in the folder or in any share the guest mounts; the folder is only ever its
*work tree*. Everything in the folder is attacker-influenced (the agent writes
there), so every git call is hardened:

* a scrubbed environment: no ``GIT_*`` from ours, ``GIT_CONFIG_NOSYSTEM=1``,
  ``GIT_CONFIG_GLOBAL=/dev/null``, ``HOME`` pointing at the shadow repository;
* ``-c`` settings that switch off hooks, fsmonitor, the untracked cache,
  external diff, textconv, CRLF conversion and keep ``core.symlinks=true``
  (links are recorded as links, never followed);
* ``info/attributes`` in the shadow repository (the highest-precedence
  attributes file) unsets ``filter``/``text``/``eol``/``ident``/
  ``working-tree-encoding``/``diff``/``merge`` for every path, so a hostile
  ``.gitattributes`` in the folder cannot run a filter, rewrite bytes or
  choose a diff driver;
* ``--literal-pathspecs`` so a file name is never a pathspec pattern.

The folder's own ``.git`` is never read or written (git never tracks a path
named ``.git`` and our ``GIT_DIR`` is explicit, so no discovery happens).

What a snapshot records is *everything* in the folder, ignored files included:
no ``.gitignore`` is honoured, because the guest can write one (``*`` would hide
every new file) and because the person's own ignored ``.env``, ``data/`` or
``.venv/`` are exactly what an agent must not change unseen. The bounds are
caps instead, each shown as a note when it bites: a per-file size cap (checked
on the stored blob too, so a file grown after ``lstat`` is not recorded past it),
a cap on how many files the shadow index holds, and git's own limits (names it
refuses, such as ``.GIT`` or ``git~1``; folders nested deeper than the system's
path limit). Nothing the guest can create makes a snapshot fail: what cannot be
recorded becomes a note and a "skipped" path that undo leaves alone.
Sub-folders holding their own git repository are skipped and noted instead of
being recorded as gitlinks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from piwork.errors import StoreError

REF = "refs/heads/checkpoints"
META_PREFIX = "piwork-checkpoint: "
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
MAX_NOTES = 200
MAX_DIFF_BYTES = 256 * 1024
#: How many files one task's checkpoints hold at most (the shadow index's entries).
#: New files beyond it are not recorded, each with a note, and undo leaves them alone.
MAX_FILES = 100_000
#: Blobs larger than this get no text diff: git's diff costs about N^1.5 on crafted
#: text (4 MiB took 19 s), and such a diff is too long to read anyway.
MAX_DIFF_INPUT_BYTES = 1024 * 1024
#: Seconds one text diff may take before it is given up (it is then shown as skipped).
DIFF_TIMEOUT = 5.0
#: git opens folders by their path relative to the work tree: deeper ones are
#: invisible to it, so they are found by a walk of our own and noted.
PATH_MAX = 4096

_ATTRIBUTES = (
    "# written by piwork: the folder's .gitattributes must not change bytes or run anything\n"
    "* -text -ident -filter !eol !working-tree-encoding !diff !merge\n"
)

_EXCLUDE = "# piwork: nothing is excluded; no .gitignore is honoured (the guest can write one)\n"

_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.symlinks=true",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.eol=lf",
    "core.filemode=true",
    "core.ignoreCase=false",
    "core.precomposeUnicode=false",
    "core.protectNTFS=true",
    "core.protectHFS=true",
    "core.quotePath=false",
    "core.bare=false",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.sparseCheckout=false",
    "core.splitIndex=false",
    "core.commitGraph=false",
    "diff.external=",
    "diff.renames=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "submodule.recurse=false",
    "protocol.allow=never",
    "gc.auto=0",
    "maintenance.auto=false",
    "commit.gpgSign=false",
    "safe.directory=*",
    "user.name=piwork",
    "user.email=piwork@localhost",
    "advice.addEmbeddedRepo=false",
    "advice.detachedHead=false",
    "index.threads=true",
)


class CheckpointError(RuntimeError, StoreError):
    """Recording or restoring failed; ``str()`` says what to do."""


class GitTimeout(CheckpointError):
    """A git call ran past its time limit and was killed."""


@dataclass(frozen=True)
class Commit:
    id: str
    tree: str
    label: str
    turn: int | None
    created_at: float
    notes: tuple[str, ...] = ()


@dataclass
class Snapshot:
    tree: str
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class _Notes:
    """A snapshot's notes and skipped paths: one note per path, at most MAX_NOTES."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self._paths: set[str] = set()
        self._more = 0

    def add(self, path: str, why: str) -> None:
        if path in self._paths:
            return
        self._paths.add(path)
        self.snap.skipped.append(path)
        self.note(f"{display_path(path)}: {why}")

    def note(self, text: str) -> None:
        if len(self.snap.notes) < MAX_NOTES - 1:
            self.snap.notes.append(text)
        else:
            self._more += 1

    def close(self) -> None:
        if self._more:
            self.snap.notes.append(f"... and {self._more} more path(s) not recorded")


@dataclass(frozen=True)
class Restored:
    restored: list[str]
    removed: list[str]
    moved_aside: list[str]  # relative paths, now under the aside folder


@dataclass(frozen=True)
class RawChange:
    path: str
    status: str  # added | modified | deleted | type_changed
    old_mode: str
    new_mode: str
    old_blob: str = ""
    new_blob: str = ""


# Code points HFS+ ignores in names (git's is_hfs_dotgit skips them too).
_HFS_IGNORABLE = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")
_SHORT_NAME = re.compile(r"git~[0-9]+")
_GITMODULES_SHORT = re.compile(r"gitmod~[0-9]+")


def _git_alias(name: str, *, link: bool) -> bool:
    """Would git's index refuse this one path component (``core.protectNTFS/HFS``)?

    A superset of git's ``verify_path``: ``.git`` in any case, with trailing dots
    or spaces, an NTFS stream suffix (``:...``) or HFS-ignorable characters;
    the 8.3 short name ``git~1``; and, for links, the same forms of ``.gitmodules``.
    """
    if name in ("", ".", ".."):
        return True
    n = _HFS_IGNORABLE.sub("", name).lower().split(":", 1)[0].rstrip(". ")
    if n == ".git" or _SHORT_NAME.fullmatch(n):
        return True
    return link and (n == ".gitmodules" or bool(_GITMODULES_SHORT.fullmatch(n)))


def refused_prefix(path: str, *, link: bool = False) -> str | None:
    """The part of ``path`` up to the first component git would refuse, or None.

    Such a path can never enter a checkpoint (``git add`` used to abort the whole
    snapshot on it); it is noted instead. Backslashes count as separators, as
    git's NTFS protection treats them.
    """
    parts = path.split("/")
    for i, comp in enumerate(parts):
        subs = comp.split("\\")
        for j, sub in enumerate(subs):
            leaf = i == len(parts) - 1 and j == len(subs) - 1
            if _git_alias(sub, link=link and leaf):
                return "/".join(parts[: i + 1])
    return None


def git_binary() -> str:
    found = shutil.which("git")
    if found is None:
        raise CheckpointError(
            "git is not installed; checkpoints need it (Debian: apt-get install git)"
        )
    return found


def _env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "LANG": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_ATTR_NOSYSTEM": "1",
    }


class ShadowRepo:
    """One shadow repository (``git_dir``) recording one folder (``work``)."""

    def __init__(self, git_dir: Path, work: Path, *, max_file_bytes: int) -> None:
        self.git_dir = git_dir
        self.work = work
        self.max_file_bytes = max_file_bytes
        self._git = git_binary()

    # ------------------------------------------------------------ plumbing
    def _proc(
        self, *args: str, stdin: bytes | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = [self._git, f"--git-dir={self.git_dir}", f"--work-tree={self.work}"]
        for c in _CONFIG:
            cmd += ["-c", c]
        cmd += ["--literal-pathspecs", "--no-replace-objects", *args]
        try:
            return subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                env=_env(self.git_dir),
                cwd=self.git_dir,
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise GitTimeout(f"git {args[0]} took longer than {timeout:.0f} s") from exc

    def run(
        self,
        *args: str,
        stdin: bytes | None = None,
        check: bool = True,
        ok_codes: tuple[int, ...] = (0,),
        timeout: float | None = None,
    ) -> bytes:
        proc = self._proc(*args, stdin=stdin, timeout=timeout)
        if check and proc.returncode not in ok_codes:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise CheckpointError(f"git {args[0]} failed in {self.git_dir}: {err}")
        return proc.stdout

    @property
    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    def init(self) -> None:
        if self.exists:
            return
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.git_dir.with_name(self.git_dir.name + f".init-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(
            [self._git, "init", "-q", "--bare", str(tmp)],
            env=_env(tmp.parent),
            cwd=tmp.parent,
            capture_output=True,
            check=True,
        )
        info = tmp / "info"
        info.mkdir(exist_ok=True)
        (info / "attributes").write_text(_ATTRIBUTES)
        (info / "exclude").write_text(_EXCLUDE)
        hooks = tmp / "hooks"
        shutil.rmtree(hooks, ignore_errors=True)
        try:
            os.rename(tmp, self.git_dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not self.exists:
                raise

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise writers (runner, CLI undo, gc) across processes."""
        self.init()
        fd = os.open(self.git_dir / "piwork.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------ recording
    def snapshot(self) -> Snapshot:
        """Bring the shadow index up to date with the folder; return its tree.

        Incremental: only paths git reports as changed, new or gone are looked
        at (``ls-files`` uses the index's stat cache). Never fails because of
        what the folder holds: paths that cannot be recorded become notes and
        ``skipped`` entries (see the module docstring).
        """
        if not self.work.is_dir():
            raise CheckpointError(f"the working folder {self.work} is gone")
        # -t tags each path: "? " new, "C " changed, "R " gone. No --exclude-standard:
        # ignored files are recorded too (a .gitignore is the guest's to write).
        out = self.run("ls-files", "-z", "-t", "--others", "--modified", "--deleted")
        snap = Snapshot(tree="")
        notes = _Notes(snap)
        to_add: list[str] = []
        to_remove: list[str] = []
        real_dirs: dict[str, bool] = {"": True}
        seen: set[str] = set()
        budget = MAX_FILES - self._index_entries()
        over_count: list[str] = []
        dir_fd = os.open(self.work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for raw in out.split(b"\0"):
                if len(raw) < 3:
                    continue
                tag, path = raw[:1], os.fsdecode(raw[2:])
                if path in seen:
                    continue
                seen.add(path)
                if path.endswith("/"):
                    # ls-files shows a sub-folder holding its own repository as "dir/".
                    notes.add(path.rstrip("/"), "a git repository of its own, not recorded")
                    continue
                if not self._real_dirs(path, real_dirs, dir_fd):
                    to_remove.append(path)  # its folder is gone or now a link: never look through
                    continue
                try:
                    st = os.lstat(path, dir_fd=dir_fd)
                except FileNotFoundError:
                    to_remove.append(path)
                    continue
                except OSError as exc:
                    notes.add(path, f"unreadable ({exc.strerror}), not recorded")
                    continue
                refused = refused_prefix(path, link=stat.S_ISLNK(st.st_mode))
                if refused is not None:
                    notes.add(refused, "a name git cannot record (it could pass for .git)")
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size > self.max_file_bytes:
                    notes.add(path, self._over_cap(st.st_size))
                    to_remove.append(path)
                    continue
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    if stat.S_ISDIR(st.st_mode):
                        # Only a tracked path is listed as a directory: a file (or
                        # link) that became one. Its contents come as other paths.
                        to_remove.append(path)
                        continue
                    notes.add(path, "not a regular file or link, not recorded")
                    continue
                if tag == b"?":
                    if budget <= 0:
                        over_count.append(path)
                        continue
                    budget -= 1
                to_add.append(path)
            for deep in self._too_deep(dir_fd):
                notes.add(deep, "nested deeper than the system's path limit, not recorded")
        finally:
            os.close(dir_fd)
        if over_count:
            snap.skipped.extend(over_count)
            notes.note(
                f"{len(over_count)} new file(s) not recorded: over the {MAX_FILES}-file "
                f"checkpoint limit (first: {display_path(over_count[0])})"
            )
        if to_remove:
            self.run("update-index", "-z", "--force-remove", "--stdin", stdin=_nul(to_remove))
        if to_add:
            self._add(to_add, notes)
        self._verify_index(set(to_add), notes)
        snap.tree = self.run("write-tree").decode().strip()
        notes.close()
        return snap

    def _over_cap(self, size: int) -> str:
        return (
            f"{size} bytes, over the {self.max_file_bytes}-byte checkpoint limit "
            "(tasks.checkpointMaxFileBytes), not recorded"
        )

    def _index_entries(self) -> int:
        """How many entries the shadow index holds (from its header: no git call)."""
        try:
            with open(self.git_dir / "index", "rb") as f:
                head = f.read(12)
        except FileNotFoundError:
            return 0
        if len(head) < 12 or head[:4] != b"DIRC":
            return 0
        return int.from_bytes(head[8:12], "big")

    def _add(self, paths: list[str], notes: _Notes) -> None:
        """Hash ``paths`` into the index; a path that changes kind under us is noted.

        ``update-index --add --remove`` skips names git refuses and drops paths
        that vanished, but dies on a path that became a folder since we looked
        (the VM is running): then the batch is halved until that path is found.
        """
        proc = self._proc("update-index", "-z", "--add", "--remove", "--stdin", stdin=_nul(paths))
        if proc.returncode == 0:
            return
        if b"Unable to process path" not in proc.stderr:
            # Not one path's fault (a stale index.lock, a full disk): a real failure.
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise CheckpointError(f"git update-index failed in {self.git_dir}: {err}")
        if len(paths) == 1:
            notes.add(paths[0], "changed while it was recorded (now a folder or unreadable)")
            self._proc("update-index", "-z", "--force-remove", "--stdin", stdin=_nul(paths))
            return
        half = len(paths) // 2
        self._add(paths[:half], notes)
        self._add(paths[half:], notes)

    def _verify_index(self, added: set[str], notes: _Notes) -> None:
        """Drop from the index what must not be recorded after all.

        Gitlinks (a folder that became a repository while we looked), blobs over
        the size cap (the file grew between our ``lstat`` and git's read: the cap
        is checked on what was stored), and, by their absence, paths git refused
        that :func:`refused_prefix` did not foresee.
        """
        out = self.run("ls-files", "-z", "-s")
        drop: list[str] = []
        blobs: dict[str, list[str]] = {}
        present: set[str] = set()
        for entry in out.split(b"\0"):
            if not entry:
                continue
            meta, _, raw_path = entry.partition(b"\t")
            path = os.fsdecode(raw_path)
            present.add(path)
            mode, sha = meta.split(b" ")[:2]
            if mode == b"160000":
                drop.append(path)
                notes.add(path, "a git repository of its own, not recorded")
            elif path in added:
                blobs.setdefault(sha.decode(), []).append(path)
        for blob, size in self.blob_sizes(blobs).items():
            if size > self.max_file_bytes:
                for path in blobs[blob]:
                    drop.append(path)
                    notes.add(path, self._over_cap(size))
        for path in sorted(added - present):
            with contextlib.suppress(OSError):
                os.lstat(self.work / path)
                notes.add(path, "a name git refused, not recorded")
        if drop:
            self.run("update-index", "-z", "--force-remove", "--stdin", stdin=_nul(drop))

    def _too_deep(self, dir_fd: int) -> list[str]:
        """Folders git cannot open (relative path at or past PATH_MAX): walked by fd."""
        found: list[str] = []
        limit = PATH_MAX - 1
        for top, dirs, _files, _fd in os.fwalk(".", dir_fd=dir_fd):
            base = "" if top == "." else top[2:] + "/"
            keep = []
            for d in dirs:
                rel = base + d
                if top == "." and d == ".git":
                    continue  # the folder's own repository is never looked into
                if len(os.fsencode(rel)) + 1 >= limit:
                    found.append(rel)
                else:
                    keep.append(d)
            dirs[:] = keep
        return found

    def _real_dirs(self, path: str, cache: dict[str, bool], dir_fd: int) -> bool:
        """Is every parent folder of ``path`` a real directory (no link on the way)?"""
        parent = path.rpartition("/")[0]
        if parent in cache:
            return cache[parent]
        ok = self._real_dirs(parent, cache, dir_fd)
        if ok:
            try:
                ok = stat.S_ISDIR(os.lstat(parent, dir_fd=dir_fd).st_mode)
            except OSError:
                ok = False
        cache[parent] = ok
        return ok

    def head(self) -> str | None:
        out = self.run("rev-parse", "-q", "--verify", REF + "^{commit}", ok_codes=(0, 1))
        return out.decode().strip() or None

    def commit(
        self, snap: Snapshot, label: str, turn: int | None, *, reuse_same: bool = True
    ) -> Commit:
        """Record ``snap`` as a checkpoint (reusing the last one if it is identical)."""
        parent = self.head()
        if parent is not None and reuse_same:
            last = self.get(parent)
            if last.tree == snap.tree and last.label == label and last.turn == turn:
                return last
        created = time.time()
        meta = {"label": label, "turn": turn, "createdAt": created, "notes": snap.notes}
        message = f"{label}\n\n{META_PREFIX}{orjson.dumps(meta).decode()}\n"
        args = ["commit-tree", snap.tree, "-F", "-"]
        if parent is not None:
            args[2:2] = ["-p", parent]
        sha = self.run(*args, stdin=message.encode()).decode().strip()
        self.run("update-ref", REF, sha, parent or "0" * 40)
        return Commit(sha, snap.tree, label, turn, created, tuple(snap.notes))

    # ------------------------------------------------------------ reading
    def log(self) -> list[Commit]:
        """Every checkpoint, oldest first."""
        if not self.exists or self.head() is None:
            return []
        out = self.run("log", "--first-parent", "-z", "--format=%H%x1f%T%x1f%ct%x1f%B", REF)
        commits = []
        for rec in out.split(b"\0"):
            if not rec.strip():
                continue
            sha, tree, ct, body = rec.decode("utf-8", "replace").split("\x1f", 3)
            commits.append(_parse(sha.strip(), tree, float(ct), body))
        commits.reverse()
        return commits

    def get(self, rev: str) -> Commit:
        out = self.run("log", "-1", "--format=%H%x1f%T%x1f%ct%x1f%B", rev + "^{commit}", "--")
        sha, tree, ct, body = out.decode("utf-8", "replace").split("\x1f", 3)
        return _parse(sha.strip(), tree, float(ct), body)

    def resolve(self, rev: str) -> str:
        if not rev or rev.startswith("-") or any(c in rev for c in " \t\n:^~@{}"):
            raise CheckpointError(f"{rev!r} is not a checkpoint id (see `piwork changes`)")
        out = self.run("rev-parse", "-q", "--verify", rev + "^{commit}", ok_codes=(0, 1)).strip()
        if not out:
            raise CheckpointError(f"no checkpoint {rev!r} (see `piwork changes TASK --json`)")
        sha = out.decode()
        if sha not in {c.id for c in self.log()}:
            raise CheckpointError(f"{rev!r} is not one of this task's checkpoints")
        return sha

    def diff(self, old: str, new: str) -> list[RawChange]:
        out = self.run("diff-tree", "-r", "-z", "--no-renames", "--raw", old, new)
        parts = out.split(b"\0")
        changes: list[RawChange] = []
        i = 0
        while i + 1 < len(parts):
            head = parts[i].decode()
            if not head.startswith(":"):
                i += 1
                continue
            fields = head[1:].split()
            path = os.fsdecode(parts[i + 1])
            code = fields[4][0]
            status = {"A": "added", "D": "deleted", "M": "modified", "T": "type_changed"}.get(
                code, "modified"
            )
            changes.append(RawChange(path, status, fields[0], fields[1], fields[2], fields[3]))
            i += 2
        return changes

    def blob_sizes(self, blobs: Iterable[str]) -> dict[str, int]:
        """Size in bytes of each blob id (absent ids, such as the zero id, are left out)."""
        wanted = [b for b in dict.fromkeys(blobs) if b and b.strip("0")]
        if not wanted:
            return {}
        query = "".join(f"{b}\n" for b in wanted).encode()
        out = self.run("cat-file", "--batch-check=%(objectname) %(objectsize)", stdin=query)
        sizes = {}
        for line in out.decode().splitlines():
            name, _, size = line.partition(" ")
            if size.isdigit():
                sizes[name] = int(size)
        return sizes

    def file_diff(
        self, old: str, new: str, path: str, *, timeout: float = DIFF_TIMEOUT
    ) -> tuple[bool, str | None, str | None]:
        """(binary, unified diff or None, why there is no diff) for one path.

        One ``git diff`` (binary files show as git's own "Binary files ... differ"
        line, which no content line can fake: those start with +, - or space),
        killed after ``timeout`` seconds. Callers skip blobs over
        MAX_DIFF_INPUT_BYTES before asking (see ``api.describe``).
        """
        try:
            text = self.run(
                "diff",
                "--no-ext-diff",
                "--no-textconv",
                "--no-color",
                "--no-renames",
                old,
                new,
                "--",
                path,
                timeout=timeout,
            )
        except GitTimeout:
            return False, None, f"no text diff: git took longer than {timeout:.0f} s"
        head = text.split(b"\n@@", 1)[0]
        if any(
            ln.startswith(b"Binary files ") and ln.endswith(b" differ") for ln in head.split(b"\n")
        ):
            return True, None, None
        if len(text) > MAX_DIFF_BYTES:
            return False, None, f"no text diff: it is over {MAX_DIFF_BYTES // 1024} KiB"
        return False, text.decode("utf-8", "replace"), None

    def tree_of(self, rev: str) -> str:
        return self.run("rev-parse", rev + "^{tree}").decode().strip()

    # ------------------------------------------------------------ restoring
    def paths_in(self, tree: str) -> set[str]:
        """Every file path a tree (or checkpoint) records."""
        listing = self.run("ls-tree", "-r", "-z", "--name-only", tree)
        return {os.fsdecode(p) for p in listing.split(b"\0") if p}

    def restore(self, target: str, paths: Iterable[str], aside: Path) -> Restored:
        """Make ``paths`` in the folder what they are in ``target``.

        The shadow index must be a fresh snapshot of the folder (undo takes one
        first): git then deletes or overwrites only what that snapshot holds,
        except where a restored file's place is taken by something the snapshot
        could not record (a folder holding skipped or over-cap files, a nested
        repository, a name git refuses): git's checkout would delete it with no
        copy anywhere. Those are moved into ``aside`` first, keeping their paths.
        """
        present = self.paths_in(target)
        indexed = {os.fsdecode(p) for p in self.run("ls-files", "-z").split(b"\0") if p}
        restore: list[str] = []
        remove: list[str] = []
        for p in paths:
            if p in present:
                restore.append(p)
            elif p in indexed:
                remove.append(p)  # recorded now, so removing it can be undone
        moved = self._move_aside(self.unrecorded_in_the_way(restore, indexed), aside)
        if remove:
            self.run(
                "rm",
                "-q",
                "-f",
                "--ignore-unmatch",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul(remove),
            )
        if restore:
            self.run(
                "checkout",
                "-q",
                "--no-overlay",
                target,
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul(restore),
            )
        return Restored(restore, remove, moved)

    def unrecorded_in_the_way(self, restore: Iterable[str], recorded: set[str]) -> list[str]:
        """What restoring files at ``restore`` would delete that ``recorded`` lacks.

        A leading folder of a restored path that is now a file or link, and the
        restored path itself when it is now a folder (git removes the whole
        subtree). Unrecorded folders are returned whole, so a nested repository
        moves as one piece.
        """
        recorded_dirs: set[str] = set()
        for r in recorded:
            parts = r.split("/")
            recorded_dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        found: set[str] = set()
        for p in restore:
            parts = p.split("/")
            blocked = False
            for i in range(1, len(parts)):
                q = "/".join(parts[:i])
                try:
                    st = os.lstat(self.work / q)
                except OSError:
                    break  # missing: git creates it
                if stat.S_ISDIR(st.st_mode):
                    continue
                if q not in recorded:
                    found.add(q)
                blocked = True
                break
            if blocked:
                continue
            try:
                st = os.lstat(self.work / p)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                found.update(self._unrecorded_under(p, recorded, recorded_dirs))
            elif p not in recorded:
                found.add(p)
        return sorted(found)

    def _unrecorded_under(self, top: str, recorded: set[str], dirs: set[str]) -> list[str]:
        if top not in dirs:
            return [top]
        try:
            entries = list(os.scandir(self.work / top))
        except OSError:
            return [top]  # cannot look inside: keep all of it
        out = []
        for e in entries:
            rel = f"{top}/{e.name}"
            if e.is_dir(follow_symlinks=False):
                out.extend(self._unrecorded_under(rel, recorded, dirs))
            elif rel not in recorded:
                out.append(rel)
        return out

    def _move_aside(self, rels: list[str], aside: Path) -> list[str]:
        """Move each of ``rels`` (relative to the folder) to the same path under ``aside``."""
        moved: list[str] = []
        for rel in rels:
            src = self.work / rel
            dest = aside / rel
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(os.fspath(src), os.fspath(dest))
            except OSError as exc:
                done = f" (already moved there: {', '.join(moved)})" if moved else ""
                raise CheckpointError(
                    f"undo stopped before restoring anything: {rel} is in no checkpoint and "
                    f"could not be moved to {dest} ({exc.strerror or exc}){done}; move it "
                    "out of the folder, then undo again"
                ) from exc
            moved.append(rel)
        return moved

    def size_bytes(self) -> int:
        return self.size_of(self.git_dir)

    @staticmethod
    def size_of(path: Path) -> int:
        """Disk usage of a directory tree (links not followed)."""
        total = 0
        for root, _dirs, files in os.walk(path):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, f)).st_blocks * 512
        return total


def display_path(path: str) -> str:
    """``path`` as text JSON can carry: bytes that are not UTF-8 (``os.fsdecode``
    turned them into lone surrogates) become ``\\xff``. For notes and events only;
    git is always given the exact name (``_nul``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _nul(paths: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def _parse(sha: str, tree: str, ct: float, body: str) -> Commit:
    label = body.split("\n", 1)[0].strip()
    turn: int | None = None
    created = ct
    notes: tuple[str, ...] = ()
    # split("\n"), not splitlines(): a note may hold U+2028 or other characters
    # Python counts as line breaks (orjson leaves them unescaped), which would cut
    # the metadata line in two and lose the turn and the notes.
    for line in body.split("\n"):
        if line.startswith(META_PREFIX):
            try:
                meta = orjson.loads(line[len(META_PREFIX) :])
            except orjson.JSONDecodeError:
                continue
            label = str(meta.get("label", label))
            t = meta.get("turn")
            turn = t if isinstance(t, int) else None
            c = meta.get("createdAt")
            created = float(c) if isinstance(c, (int, float)) else ct
            n = meta.get("notes")
            notes = tuple(str(x) for x in n) if isinstance(n, list) else ()
    return Commit(sha, tree, label, turn, created, notes)


EMPTY_TREE = _EMPTY_TREE


def compact(repo: ShadowRepo, max_bytes: int | None) -> tuple[int, int, int]:
    """Pack the repository; while it is over ``max_bytes``, drop the oldest half of
    the checkpoints (the newest two always stay). Returns (bytes before, after,
    checkpoints dropped). Kept checkpoints get new ids (their history is rewritten).
    """
    before = repo.size_bytes()
    dropped = 0
    repo.run("gc", "-q", "--prune=now")
    while max_bytes is not None and repo.size_bytes() > max_bytes:
        commits = repo.log()
        if len(commits) <= 2:
            break
        drop = max(1, (len(commits) - 2) // 2)
        keep = commits[drop:]
        parent: str | None = None
        for c in keep:
            body = repo.run("log", "-1", "--format=%B", c.id)
            args = ["commit-tree", c.tree, "-F", "-"]
            if parent is not None:
                args[2:2] = ["-p", parent]
            parent = repo.run(*args, stdin=body).decode().strip()
        assert parent is not None
        repo.run("update-ref", REF, parent)
        repo.run("reflog", "expire", "--expire=now", "--all")
        repo.run("gc", "-q", "--prune=now")
        dropped += drop
    return before, repo.size_bytes(), dropped
