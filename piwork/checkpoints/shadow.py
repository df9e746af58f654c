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
Sub-folders holding their own git repository are skipped and noted instead of
being recorded as gitlinks; files above a size cap are skipped and noted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
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

_ATTRIBUTES = (
    "# written by piwork: the folder's .gitattributes must not change bytes or run anything\n"
    "* -text -ident -filter !eol !working-tree-encoding !diff !merge\n"
)

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


@dataclass(frozen=True)
class RawChange:
    path: str
    status: str  # added | modified | deleted | type_changed
    old_mode: str
    new_mode: str


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
    def run(
        self,
        *args: str,
        stdin: bytes | None = None,
        check: bool = True,
        ok_codes: tuple[int, ...] = (0,),
    ) -> bytes:
        cmd = [self._git, f"--git-dir={self.git_dir}", f"--work-tree={self.work}"]
        for c in _CONFIG:
            cmd += ["-c", c]
        cmd += ["--literal-pathspecs", "--no-replace-objects", *args]
        proc = subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            env=_env(self.git_dir),
            cwd=self.git_dir,
            check=False,
        )
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
        (info / "exclude").write_text("# piwork: the folder's own .gitignore files apply\n")
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

        Incremental: only paths git reports as changed, new or gone are
        looked at (``ls-files`` uses the index's stat cache).
        """
        if not self.work.is_dir():
            raise CheckpointError(f"the working folder {self.work} is gone")
        out = self.run(
            "ls-files", "-z", "--others", "--modified", "--deleted", "--exclude-standard"
        )
        snap = Snapshot(tree="")
        to_add: list[str] = []
        to_drop: list[str] = []
        to_remove: list[str] = []
        real_dirs: dict[str, bool] = {"": True}
        seen: set[str] = set()
        for raw in out.split(b"\0"):
            if not raw:
                continue
            path = os.fsdecode(raw)
            if path in seen:
                continue
            seen.add(path)
            if path.endswith("/"):
                # ls-files shows a sub-folder holding its own repository as "dir/".
                snap.skipped.append(path.rstrip("/"))
                snap.notes.append(f"{path.rstrip('/')}: a git repository of its own, not recorded")
                continue
            if not self._real_dirs(path, real_dirs):
                to_remove.append(path)  # its folder is gone or now a link: never look through
                continue
            try:
                st = os.lstat(self.work / path)
            except FileNotFoundError:
                to_remove.append(path)
                continue
            except OSError as exc:
                snap.skipped.append(path)
                snap.notes.append(f"{path}: unreadable ({exc.strerror}), not recorded")
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size > self.max_file_bytes:
                snap.skipped.append(path)
                snap.notes.append(
                    f"{path}: {st.st_size} bytes, over the {self.max_file_bytes}-byte "
                    "checkpoint limit (tasks.checkpointMaxFileBytes), not recorded"
                )
                to_drop.append(path)
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                if stat.S_ISDIR(st.st_mode):
                    # Only a tracked path is listed as a directory: a file (or
                    # link) that became one. Its contents come as other paths.
                    to_remove.append(path)
                    continue
                snap.skipped.append(path)
                snap.notes.append(f"{path}: not a regular file or link, not recorded")
                continue
            to_add.append(path)
        if to_drop:
            self.run(
                "rm",
                "-q",
                "--cached",
                "--ignore-unmatch",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul(to_drop),
            )
        if to_remove:
            self.run("update-index", "-z", "--force-remove", "--stdin", stdin=_nul(to_remove))
        if to_add:
            self.run(
                "add",
                "-A",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul(to_add),
            )
        gitlinks = self._gitlinks()
        if gitlinks:
            self.run(
                "rm",
                "-q",
                "--cached",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul(gitlinks),
            )
            for g in gitlinks:
                snap.skipped.append(g)
                snap.notes.append(f"{g}: a git repository of its own, not recorded")
        snap.tree = self.run("write-tree").decode().strip()
        del snap.notes[MAX_NOTES:]
        return snap

    def _real_dirs(self, path: str, cache: dict[str, bool]) -> bool:
        """Is every parent folder of ``path`` a real directory (no link on the way)?"""
        parent = path.rpartition("/")[0]
        if parent in cache:
            return cache[parent]
        ok = self._real_dirs(parent, cache)
        if ok:
            try:
                ok = stat.S_ISDIR(os.lstat(self.work / parent).st_mode)
            except OSError:
                ok = False
        cache[parent] = ok
        return ok

    def _gitlinks(self) -> list[str]:
        out = self.run("ls-files", "-z", "-s")
        links = []
        for entry in out.split(b"\0"):
            if entry.startswith(b"160000 "):
                links.append(os.fsdecode(entry.split(b"\t", 1)[1]))
        return links

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
            changes.append(RawChange(path, status, fields[0], fields[1]))
            i += 2
        return changes

    def file_diff(self, old: str, new: str, path: str) -> tuple[bool, str | None]:
        """(binary, unified diff or None) for one path between two trees."""
        num = self.run("diff", "--numstat", "--no-renames", "-z", old, new, "--", path)
        binary = num.startswith(b"-\t-\t")
        if binary:
            return True, None
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
        )
        if len(text) > MAX_DIFF_BYTES:
            return False, None
        return False, text.decode("utf-8", "replace")

    def tree_of(self, rev: str) -> str:
        return self.run("rev-parse", rev + "^{tree}").decode().strip()

    # ------------------------------------------------------------ restoring
    def restore(self, target: str, paths: Iterable[str]) -> tuple[list[str], list[str]]:
        """Make ``paths`` in the folder what they are in ``target``: (restored, removed)."""
        listing = self.run("ls-tree", "-r", "-z", "--name-only", target)
        present = {os.fsdecode(p) for p in listing.split(b"\0") if p}
        restore: list[str] = []
        remove: list[str] = []
        for p in paths:
            (restore if p in present else remove).append(p)
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
        return restore, remove

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


def _nul(paths: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def _parse(sha: str, tree: str, ct: float, body: str) -> Commit:
    label = body.split("\n", 1)[0].strip()
    turn: int | None = None
    created = ct
    notes: tuple[str, ...] = ()
    for line in body.splitlines():
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
