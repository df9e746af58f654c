"""The folder's history as people use it: checkpoints, each turn's changes, undo.

Built on the change-set journal (:mod:`piwork.changes.journal`): a checkpoint
is one change set piwork applied (or one undo), and holds the previous version
of every path it touched, so its cost follows the change, not the folder, and
no folder is too big for undo. ``piwork changes`` / ``piwork undo`` and the
app's Turns view use these functions (re-exported by :mod:`piwork.checkpoints`).

All functions block (file reads, ``git diff`` for diffs); the app calls them
from a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from piwork.changes import folder as fs
from piwork.changes.engine import CHANGES_DIR, status_of
from piwork.changes.entry import Change, Kind, display
from piwork.changes.errors import CheckpointError, TaskRunning, UndoConflict
from piwork.changes.journal import Journal, Pending, Touch
from piwork.changes.store import ObjectStore, StoreMissing, sync_filesystem
from piwork.config import Paths, get_paths
from piwork.tasks.model import ACTIVE_STATUSES
from piwork.tasks.store import Task, TaskBusy, TaskStore

MAX_DIFFS = 200
MAX_DIFF_INPUT_BYTES = 1024 * 1024
MAX_DIFF_BYTES = 256 * 1024
DIFF_TIMEOUT = 5.0
DIFF_BUDGET_SECONDS = 20.0
MAX_FILES = 1_000_000
"""Kept for callers that show the old per-task cap: checkpoints have no file-count cap now."""


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the working folder, posix
    status: str  # "added" | "modified" | "deleted" | "type_changed"
    binary: bool
    diff: str | None  # unified diff text (None if binary, too big or not asked for)
    note: str | None = None  # why there is no diff, when it is not simply binary


@dataclass(frozen=True)
class Checkpoint:
    id: str
    turn: int | None
    """The agent turn whose changes this holds (None: task start, task end, undo)."""
    label: str  # "task start", "turn 3", "task end", "before undo", "undo turn 3", ...
    created_at: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class UndoResult:
    restored: list[str]
    removed: list[str]
    checkpoint_before: str
    """The checkpoint just before this undo: ``undo --to`` it undoes the undo."""
    skipped: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)
    aside_dir: str | None = None


# --------------------------------------------------------------------------- locating


def _store(paths: Paths | None = None) -> TaskStore:
    return TaskStore((paths or get_paths()).tasks)


def _journal_path(task: Task) -> Path:
    return task.dir / CHANGES_DIR / "journal.sqlite"


@contextlib.contextmanager
def _open(task: Task) -> Iterator[Journal | None]:
    path = _journal_path(task)
    if task.record.working_folder is None or not path.is_file():
        yield None
        return
    journal = Journal(path)
    try:
        yield journal
    finally:
        journal.close()


def _task(task_id: str, paths: Paths | None) -> Task:
    with _store(paths) as store:
        return store.get(task_id)


def _to_public(cp: object) -> Checkpoint:
    from piwork.changes.journal import Checkpoint as Row

    assert isinstance(cp, Row)
    return Checkpoint(cp.id, cp.turn, cp.label, cp.created, cp.notes)


# --------------------------------------------------------------------------- reading


def list_checkpoints(task_id: str, *, paths: Paths | None = None) -> list[Checkpoint]:
    """The task's checkpoints, oldest first."""
    with _open(_task(task_id, paths)) as journal:
        return [_to_public(c) for c in journal.checkpoints()] if journal is not None else []


def _net(touches: list[Touch]) -> dict[str, tuple[Change, Change]]:
    """Per path: the state before the first touch and after the last one."""
    out: dict[str, tuple[Change, Change]] = {}
    for t in touches:
        if t.path in out:
            out[t.path] = (out[t.path][0], t.after)
        else:
            out[t.path] = (t.before, t.after)
    return {p: ba for p, ba in out.items() if not ba[0].same_as(ba[1]) or ba[0].mode != ba[1].mode}


def task_changes(
    task_id: str, *, turn: int | None = None, paths: Paths | None = None, diffs: bool = True
) -> list[FileChange]:
    """What piwork changed in the folder for the task (all of it), or for one turn."""
    task = _task(task_id, paths)
    with _open(task) as journal:
        if journal is None:
            return []
        cps = journal.checkpoints()
        if turn is not None:
            seqs = [c.seq for c in cps if c.turn == turn]
            if not seqs:
                turns = sorted({c.turn for c in cps if c.turn is not None})
                raise CheckpointError(
                    f"no changes recorded for turn {turn}; this task has turns {turns or 'none'}"
                )
            touches = journal.touches(seqs)
        else:
            touches = journal.touches()
        net = _net(touches)
    # Folders are the containers of what changed: listed only when one replaced a file.
    net = {p: ba for p, ba in net.items() if Kind.FILE in (ba[0].kind, ba[1].kind)
           or Kind.LINK in (ba[0].kind, ba[1].kind)}  # fmt: skip
    store = ObjectStore(task.dir / CHANGES_DIR / "objects")
    return describe(store, net, diffs=MAX_DIFFS if diffs else 0)


def describe(
    store: ObjectStore,
    net: dict[str, tuple[Change, Change]],
    *,
    diffs: int = MAX_DIFFS,
    budget: float = DIFF_BUDGET_SECONDS,
) -> list[FileChange]:
    """Each path's change with a text diff within bounds (size, count, time)."""
    deadline = time.monotonic() + budget
    out = []
    for n, (path, (before, after)) in enumerate(sorted(net.items())):
        binary, text, note = False, None, None
        if n >= diffs:
            note = f"no diff: only the first {diffs} files get one" if diffs else None
        elif Kind.DIR in (before.kind, after.kind):
            note = "a folder"
        elif (left := deadline - time.monotonic()) <= 0:
            note = f"no diff: the {budget:.0f} s allowed for diffs ran out"
        else:
            binary, text, note = file_diff(
                store, path, before, after, timeout=min(DIFF_TIMEOUT, left)
            )
        out.append(FileChange(path, status_of(before, after), binary, text, note))
    return out


def _side(store: ObjectStore, c: Change) -> bytes | None:
    if c.kind is Kind.FILE and c.sha256:
        if store.size(c.sha256) > MAX_DIFF_INPUT_BYTES:
            return None
        try:
            return store.get(c.sha256)
        except StoreMissing:
            return b""
    if c.kind is Kind.LINK:
        return f"(a link to {c.target})\n".encode("utf-8", "surrogateescape")
    return b""


def file_diff(
    store: ObjectStore, path: str, before: Change, after: Change, *, timeout: float = DIFF_TIMEOUT
) -> tuple[bool, str | None, str | None]:
    """(binary, unified diff or None, why there is no diff): ``git diff --no-index`` on two
    temporary files outside any repository, with no configuration, killed after ``timeout``
    (git's diff is superlinear on crafted text; inputs over 1 MiB get no diff)."""
    a, b = _side(store, before), _side(store, after)
    if a is None or b is None:
        return False, None, f"no text diff: the file is over {MAX_DIFF_INPUT_BYTES // 1048576} MiB"
    if b"\0" in a[:8000] or b"\0" in b[:8000]:
        return True, None, None
    with tempfile.TemporaryDirectory(prefix="piwork-diff-") as tmp:
        ta, tb = Path(tmp, "a"), Path(tmp, "b")
        ta.write_bytes(a)
        tb.write_bytes(b)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LC_ALL": "C",
               "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
               "GIT_ATTR_NOSYSTEM": "1"}  # fmt: skip
        try:
            proc = subprocess.run(
                ["git", "diff", "--no-index", "--no-ext-diff", "--no-textconv", "--no-color",
                 "--text", "--", "a", "b"],
                cwd=tmp, env=env, capture_output=True, timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return False, None, f"no text diff: git took longer than {timeout:.0f} s"
        except OSError as exc:
            return False, None, f"no text diff: {exc}"
    text = proc.stdout
    if len(text) > MAX_DIFF_BYTES:
        return False, None, f"no text diff: it is over {MAX_DIFF_BYTES // 1024} KiB"
    shown = display(path)
    lines = text.split(b"\n")
    # git names the temporary files: show the folder's path instead.
    head = [f"--- {'/dev/null' if before.kind is Kind.GONE else 'a/' + shown}",
            f"+++ {'/dev/null' if after.kind is Kind.GONE else 'b/' + shown}"]  # fmt: skip
    body = [ln for ln in lines if not ln.startswith((b"diff --git", b"index ", b"--- ", b"+++ "))]
    while body and body[0] and not body[0].startswith(b"@@"):
        body.pop(0)
    return (
        False,
        "\n".join(
            [f"diff a/{shown} b/{shown}", *head, b"\n".join(body).decode("utf-8", "replace")]
        ).rstrip("\n")
        + "\n",
        None,
    )


# --------------------------------------------------------------------------- undo


def _norm(path: str) -> str:
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts:
        raise CheckpointError(f"{path!r}: give paths relative to the working folder")
    return str(p).strip("/")


def _select(paths: list[str], files: list[str] | None) -> list[str]:
    if not files:
        return paths
    wanted = [_norm(f) for f in files]
    if any(w in (".", "") for w in wanted):
        return paths
    return [p for p in paths if any(p == w or p.startswith(w + "/") for w in wanted)]


def undo(
    task_id: str,
    *,
    turn: int | None = None,
    to: str | None = None,
    files: list[str] | None = None,
    force: bool = False,
    paths: Paths | None = None,
) -> UndoResult:
    """Undo one turn's changes (``turn``), or go back to a checkpoint (``to``, default: the
    task's first), optionally only for ``files``. Refuses while the task runs; files the
    person changed since piwork wrote them raise :class:`UndoConflict` unless ``force``.
    The undo is a checkpoint too: ``to=result.checkpoint_before`` undoes it."""
    if turn is not None and to is not None:
        raise CheckpointError("give --turn or --to, not both")
    with claimed_task(task_id, paths, "stop it before undoing its changes") as task:
        if task.record.working_folder is None:
            raise CheckpointError(f"task {task.id} has no working folder, so no checkpoints")
        with _open(task) as journal:
            if journal is None:
                raise CheckpointError("this task has no checkpoints: nothing to undo")
            objects = ObjectStore(task.dir / CHANGES_DIR / "objects")
            return _undo(journal, objects, Path(task.record.working_folder),
                         turn=turn, to=to, files=files, force=force)  # fmt: skip


@contextlib.contextmanager
def claimed_task(task_id: str, paths: Paths | None, why: str) -> Iterator[Task]:
    """The task, claimed for this process: no run of it can change its folder meanwhile.
    Refused (:class:`TaskRunning`, saying ``why``) while it runs."""
    with _store(paths) as store:
        store.mark_interrupted()
        task = store.get(task_id)
        try:
            lease = store.claim(task.id, timeout=0.0)
        except TaskBusy as exc:
            raise TaskRunning(f"task {task.id} is running ({exc}); {why}") from exc
        with lease:
            if store.get(task.id).record.status in ACTIVE_STATUSES:
                raise TaskRunning(f"task {task.id} is active; {why}")
            yield task


def _undo(
    journal: Journal,
    objects: ObjectStore,
    folder: Path,
    *,
    turn: int | None,
    to: str | None,
    files: list[str] | None,
    force: bool,
) -> UndoResult:
    cps = journal.checkpoints()
    if not cps:
        raise CheckpointError("this task has no checkpoints: nothing to undo")
    reasons: dict[str, str] = {}
    if turn is not None:
        seqs = [c.seq for c in cps if c.turn == turn]
        if not seqs:
            raise CheckpointError(f"no changes recorded for turn {turn}")
        net = _net(journal.touches(seqs))
        later = {t.path for t in journal.touches([c.seq for c in cps if c.seq > max(seqs)])}
        for p in net:
            if p in later:
                reasons[p] = "changed again after that turn"
        what = f"undo turn {turn}"
    else:
        after_seq = journal.resolve(to).seq if to is not None else 0
        net = _net(journal.touches([c.seq for c in cps if c.seq > after_seq]))
        what = f"undo to {to}" if to is not None else "undo to task start"
    chosen = _select(sorted(net), files)
    now = {p: fs.look(folder, p) for p in chosen}
    for p in chosen:
        after = net[p][1]
        cur = now[p].change
        if not cur.same_as(after) and p not in reasons:
            reasons[p] = "changed outside the task after piwork's last change to it"
    conflicts = sorted(p for p in chosen if p in reasons)
    if conflicts and not force:
        raise UndoConflict(conflicts, reasons)
    # What the undo replaces is kept first (its versions into the store).
    for p in chosen:
        cur = now[p].change
        if cur.kind is Kind.FILE and cur.sha256 and not objects.has(cur.sha256):
            data = fs.read_file(folder, p, 1 << 30)
            if data is not None:
                objects.put(data)
    objects.sync()
    marker = journal.add(Pending(None, "before undo"))
    restored: list[str] = []
    removed: list[str] = []
    skipped: list[str] = []
    touches: list[tuple[str, Change, Change]] = []

    # Folders first (parents before children), files, then removals deepest first.
    def order(p: str) -> tuple[int, int, str]:
        b = net[p][0]
        if b.kind is Kind.GONE:
            return (2, -p.count("/"), p)
        return (0 if b.kind is Kind.DIR else 1, p.count("/"), p)

    for p in sorted(chosen, key=order):
        before = net[p][0]
        cur = now[p].change
        if cur.same_as(before) and cur.kind is before.kind:
            continue
        try:
            if before.kind is Kind.GONE and cur.kind is Kind.DIR:
                # a folder piwork made: removed only if nothing is left in it (what the
                # undo removes from it went first: deepest first)
                if not fs.remove_empty_dir(folder, p):
                    skipped.append(p)
                    continue
                removed.append(p)
            elif before.kind is Kind.GONE:
                fs.remove(folder, p)
                removed.append(p)
            elif before.kind is Kind.DIR:
                fs.make_dir(folder, p)
                restored.append(p)
            elif before.kind is Kind.LINK:
                fs.make_link(folder, p, before.target or "")
                restored.append(p)
            elif before.kind is Kind.FILE and before.sha256:
                fs.write_file(folder, p, objects.get(before.sha256), mode=before.mode or 0o644)
                restored.append(p)
            else:
                continue
        except (OSError, StoreMissing) as exc:
            raise CheckpointError(f"undo stopped at {display(p)}: {exc}") from exc
        touches.append((p, cur, before))
    with contextlib.suppress(OSError):
        sync_filesystem(folder)
    journal.add(Pending(None, what, touches=touches))
    return UndoResult(sorted(restored), sorted(removed), marker.id, skipped=sorted(skipped))


# --------------------------------------------------------------------------- retention


@dataclass(frozen=True)
class GcResult:
    task_id: str
    bytes_before: int
    bytes_after: int
    dropped: int


def checkpoints_size(task: Task) -> int:
    """Bytes the task's change history uses on disk (0 if it has none)."""
    return tree_size(task.dir / CHANGES_DIR)


def tree_size(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (links not followed)."""
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


def gc_task(store: TaskStore, task: Task, max_bytes: int | None = None) -> GcResult | None:
    """Remove stored versions no record names any more. Checkpoints themselves are
    kept: their cost already follows what changed. Skips (None) a task in use."""
    if task.record.working_folder is None or not _journal_path(task).is_file():
        return None
    if store.owner(task.id) is not None or task.record.status in ACTIVE_STATUSES:
        return None
    before = checkpoints_size(task)
    with _open(task) as journal:
        assert journal is not None
        used = journal.objects()
    ObjectStore(task.dir / CHANGES_DIR / "objects").remove_unused(used)
    return GcResult(task.id, before, checkpoints_size(task), 0)
