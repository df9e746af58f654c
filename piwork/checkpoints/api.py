"""Checkpoints of a task's working folder: list, review, undo, and record during a run.

All functions here block (git runs as a subprocess); the runner calls them
through :func:`asyncio.to_thread`, the GUI from a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from piwork.checkpoints.shadow import (
    DIFF_TIMEOUT,
    MAX_DIFF_INPUT_BYTES,
    CheckpointError,
    Commit,
    RawChange,
    ShadowRepo,
    compact,
    display_path,
)
from piwork.config import Paths, get_paths
from piwork.errors import PersonError
from piwork.tasks.model import ACTIVE_STATUSES
from piwork.tasks.settings import load_task_settings
from piwork.tasks.store import Task, TaskBusy, TaskStore

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
MAX_EVENT_FILES = 200
MAX_DIFFS = 200
#: Seconds one ``describe`` may spend on text diffs in all (``changes``, the app's
#: Turns view): a crafted folder must not make a review take minutes.
DIFF_BUDGET_SECONDS = 20.0
ASIDE_DIR = "undo-aside"


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the working folder, posix
    status: str  # "added" | "modified" | "deleted" | "type_changed"
    binary: bool
    diff: str | None  # unified diff text (None if binary or too big)
    note: str | None = None  # why there is no diff, when it is not simply binary


@dataclass(frozen=True)
class Checkpoint:
    id: str  # the shadow repository's commit sha
    turn: int | None  # the agent turn this checkpoint precedes (None: start/end/undo)
    label: str  # "task start", "before turn 3", "task end", "before undo", ...
    created_at: float  # unix time
    notes: tuple[str, ...] = ()  # files skipped (size cap, nested repositories, ...)


@dataclass(frozen=True)
class UndoResult:
    restored: list[str]
    removed: list[str]
    checkpoint_before: str  # id of the pre-undo checkpoint: `--to` it to undo the undo
    # Left alone: files the folder holds now that cannot be checkpointed (over the
    # size cap, nested repositories), so overwriting them could not be undone.
    skipped: list[str] = field(default_factory=list)
    # In no checkpoint but in the way of a restored file (a folder where the file
    # was): moved, with their relative paths, under ``aside_dir`` (in the task dir).
    moved_aside: list[str] = field(default_factory=list)
    aside_dir: str | None = None


class UndoConflict(CheckpointError, PersonError):
    """Files the undo would overwrite were changed after the agent's last checkpoint."""

    def __init__(self, conflicts: list[str], reasons: dict[str, str]) -> None:
        self.conflicts = conflicts
        self.reasons = reasons
        lines = "\n".join(f"  {p}: {reasons.get(p, 'changed')}" for p in conflicts)
        super().__init__(
            f"undo would overwrite {len(conflicts)} file(s) changed since the agent's "
            f"changes:\n{lines}\nLook at them, then repeat with --force to overwrite them "
            "(the current state is checkpointed first, so that can be undone too)."
        )


class TaskRunning(CheckpointError, PersonError):
    """The task's VM is running (or another piwork process owns the task)."""


# --------------------------------------------------------------------------- locating


def _store(paths: Paths | None = None) -> TaskStore:
    return TaskStore((paths or get_paths()).tasks)


def repo_for(task: Task) -> ShadowRepo:
    folder = task.record.working_folder
    if folder is None:
        raise CheckpointError(f"task {task.id} has no working folder, so no checkpoints")
    limit = load_task_settings().checkpoint_max_file_bytes
    return ShadowRepo(task.dir / CHECKPOINTS_DIR, Path(folder), max_file_bytes=limit)


def _open_optional(task_id: str, paths: Paths | None = None) -> tuple[Task, ShadowRepo | None]:
    """Like _open, but a task without a working folder has no repository (None)."""
    with _store(paths) as store:
        task = store.get(task_id)
    return task, repo_for(task) if task.record.working_folder is not None else None


def _to_checkpoint(c: Commit) -> Checkpoint:
    return Checkpoint(c.id, c.turn, c.label, c.created_at, c.notes)


# --------------------------------------------------------------------------- reading


def list_checkpoints(task_id: str, *, paths: Paths | None = None) -> list[Checkpoint]:
    """The task's checkpoints, oldest first (``paths``: another piwork home, as the app's)."""
    _task, repo = _open_optional(task_id, paths)
    return [_to_checkpoint(c) for c in repo.log()] if repo is not None else []


def turn_range(commits: list[Commit], turn: int | None) -> tuple[Commit, Commit | None]:
    """(before, after) checkpoints of one turn (or of the whole task for ``None``).

    ``after`` is None when the turn has no later checkpoint yet (the run died).
    """
    if not commits:
        raise CheckpointError("this task has no checkpoints yet")
    if turn is None:
        return commits[0], commits[-1]
    idx = [i for i, c in enumerate(commits) if c.turn == turn]
    if not idx:
        turns = sorted({c.turn for c in commits if c.turn is not None})
        raise CheckpointError(
            f"no checkpoint before turn {turn}; this task has turns {turns or 'none'}"
        )
    # A turn runs from its first checkpoint (a retried model call records the
    # same turn again) to the first checkpoint of anything else.
    i = idx[0]
    after = next((c for c in commits[i + 1 :] if c.turn != turn), None)
    return commits[i], after


def describe(
    repo: ShadowRepo,
    old: str,
    new: str,
    *,
    diffs: int = MAX_DIFFS,
    budget: float = DIFF_BUDGET_SECONDS,
) -> list[FileChange]:
    """The changes between two checkpoints, with text diffs within bounds.

    Bounded work whatever the folder holds: no text diff for blobs over
    MAX_DIFF_INPUT_BYTES (git's diff is superlinear on crafted text), each diff
    killed after DIFF_TIMEOUT, all of them within ``budget`` seconds, and only
    the first ``diffs`` files. Each skipped diff says why (``FileChange.note``).
    """
    raw = repo.diff(old, new)
    sizes = repo.blob_sizes(b for ch in raw[:diffs] for b in (ch.old_blob, ch.new_blob))
    deadline = time.monotonic() + budget
    out = []
    for n, ch in enumerate(raw):
        binary, text, note = False, None, None
        if n >= diffs:
            note = f"no diff: only the first {diffs} files get one"
        elif max(sizes.get(ch.old_blob, 0), sizes.get(ch.new_blob, 0)) > MAX_DIFF_INPUT_BYTES:
            note = f"no text diff: the file is over {MAX_DIFF_INPUT_BYTES // 1048576} MiB"
        elif (left := deadline - time.monotonic()) <= 0:
            note = f"no diff: the {budget:.0f} s allowed for diffs ran out"
        else:
            binary, text, note = repo.file_diff(old, new, ch.path, timeout=min(DIFF_TIMEOUT, left))
        out.append(FileChange(ch.path, ch.status, binary, text, note))
    return out


def task_changes(
    task_id: str, *, turn: int | None = None, paths: Paths | None = None
) -> list[FileChange]:
    """What the agent changed in the task (first to last checkpoint) or in one turn."""
    _task, repo = _open_optional(task_id, paths)
    commits = repo.log() if repo is not None else []
    if repo is None or not commits:
        return []
    before, after = turn_range(commits, turn)
    if after is None:
        with repo.locked():
            new = repo.snapshot().tree
    else:
        new = after.id
    return describe(repo, before.id, new)


def summarise(changes: list[RawChange], limit: int = MAX_EVENT_FILES) -> dict[str, Any]:
    """Counts and a bounded file list, the shape of the runner's ``changes`` event."""
    counts = {"added": 0, "modified": 0, "deleted": 0, "type_changed": 0}
    for ch in changes:
        counts[ch.status] = counts.get(ch.status, 0) + 1
    # display_path: the event goes to the transcript as JSON, which cannot hold
    # a name that is not UTF-8.
    files = [{"path": display_path(ch.path), "status": ch.status} for ch in changes[:limit]]
    return {**counts, "files": files, "truncated": max(0, len(changes) - limit)}


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
    """Undo one turn's changes (``turn``), or go back to a checkpoint (``to``, default:
    the task's first), optionally only for ``files``.

    Refuses while the task runs (:class:`TaskRunning`). Checkpoints the current
    folder first ("before undo"), so the undo itself can be undone with
    ``to=result.checkpoint_before``. Files changed after the agent's last
    checkpoint (by the person) or by a later turn raise :class:`UndoConflict`
    unless ``force``.
    """
    if turn is not None and to is not None:
        raise CheckpointError("give --turn or --to, not both")
    with _store(paths) as store:
        store.mark_interrupted()
        task = store.get(task_id)
        try:
            lease = store.claim(task.id, timeout=0.0)
        except TaskBusy as exc:
            raise TaskRunning(
                f"task {task.id} is running ({exc}); stop it before undoing its changes"
            ) from exc
        with lease:
            if store.get(task.id).record.status in ACTIVE_STATUSES:
                raise TaskRunning(f"task {task.id} is active; stop it before undoing")
            repo = repo_for(task)
            with repo.locked():
                return _undo_locked(repo, turn=turn, to=to, files=files, force=force)


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _undo_locked(
    repo: ShadowRepo, *, turn: int | None, to: str | None, files: list[str] | None, force: bool
) -> UndoResult:
    commits = repo.log()
    if not commits:
        raise CheckpointError("this task has no checkpoints: nothing to undo")
    last = commits[-1]
    now = repo.snapshot()
    outside = {c.path for c in repo.diff(last.tree, now.tree)}
    reasons: dict[str, str] = {}
    if turn is not None:
        before, after = turn_range(commits, turn)
        if after is None:
            raise CheckpointError(f"turn {turn} has no checkpoint after it; use --to instead")
        target = before.id
        paths = [c.path for c in repo.diff(before.id, after.id)]
        later = {c.path for c in repo.diff(after.id, last.id)}
        for p in paths:
            if p in later:
                reasons[p] = "changed again after that turn"
        what = f"undo turn {turn}"
    else:
        target = repo.resolve(to) if to is not None else commits[0].id
        paths = [c.path for c in repo.diff(target, last.id)]
        what = f"undo to {target[:12]}"
    paths = _select(paths, files)
    # Left alone: what the folder holds now but no checkpoint can (over the cap, a
    # name git refuses), and everything under a folder that cannot be recorded (a
    # nested repository). A skipped *file* where a folder is to be restored is
    # moved aside by restore() instead, so the folder's recorded files come back.
    unrecordable = set(now.skipped)
    unrecordable_dirs = [s for s in unrecordable if _is_real_dir(repo.work / s)]
    skipped = sorted(
        p
        for p in paths
        if p in unrecordable or any(p.startswith(d + "/") for d in unrecordable_dirs)
    )
    paths = [p for p in paths if p not in skipped]
    for p in paths:
        if p in outside:
            reasons[p] = "changed outside the task after its last checkpoint"
    conflicts = sorted(p for p in paths if p in reasons)
    if conflicts and not force:
        raise UndoConflict(conflicts, reasons)
    before_undo = repo.commit(now, "before undo", None, reuse_same=False)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = repo.git_dir.parent / ASIDE_DIR / f"{stamp}-{before_undo.id[:12]}"
    done = repo.restore(target, paths, aside)
    after_snap = repo.snapshot()
    repo.commit(after_snap, what, None, reuse_same=False)
    return UndoResult(
        sorted(done.restored),
        sorted(done.removed),
        before_undo.id,
        skipped,
        sorted(done.moved_aside),
        str(aside) if done.moved_aside else None,
    )


# --------------------------------------------------------------------------- retention


@dataclass(frozen=True)
class GcResult:
    task_id: str
    bytes_before: int
    bytes_after: int
    dropped: int  # oldest checkpoints removed to fit the bound


def checkpoints_size(task: Task) -> int:
    """Bytes the task's checkpoints use on disk (0 if it has none)."""
    git_dir = task.dir / CHECKPOINTS_DIR
    if not git_dir.is_dir():
        return 0
    return ShadowRepo.size_of(git_dir)


def gc_task(store: TaskStore, task: Task, max_bytes: int | None = None) -> GcResult | None:
    """Pack a stopped task's checkpoints and bound their size (default: the
    ``tasks.checkpointMaxBytes`` setting). Skips (None) a task that is in use."""
    if task.record.working_folder is None or not (task.dir / CHECKPOINTS_DIR).is_dir():
        return None
    if store.owner(task.id) is not None or task.record.status in ACTIVE_STATUSES:
        return None
    if max_bytes is None:
        max_bytes = load_task_settings().checkpoint_max_bytes
    repo = repo_for(task)
    with repo.locked():
        before, after, dropped = compact(repo, max_bytes)
    return GcResult(task.id, before, after, dropped)


# --------------------------------------------------------------------------- during a run


ChangesSink = Callable[[dict[str, Any]], None]


class RunRecorder:
    """Takes a task's checkpoints during a run, off the event loop.

    ``before_model_call`` is awaited by the model gateway before it forwards a
    model request: the guest cannot run the tools of a turn before the model's
    reply reaches it, so a checkpoint taken there always precedes that turn's
    effects (a ``tool_execution_start`` event or the gate's prompt would race
    the tool). The turn number comes from pi's ``turn_start``, which pi emits
    just before the request; if that event has not arrived yet we wait for it
    briefly.
    """

    def __init__(
        self,
        repo: ShadowRepo,
        on_changes: ChangesSink,
        *,
        turn_start_wait: float = 1.0,
    ) -> None:
        self.repo = repo
        self.on_changes = on_changes
        self.turn_start_wait = turn_start_wait
        self.timings: list[float] = []
        self._lock = asyncio.Lock()
        self._base = 0
        self._started = 0
        self._turn_seen = asyncio.Event()
        self._last_turn = 0
        self._open_turn: tuple[int, str] | None = None
        self._starting: asyncio.Future[Commit] | None = None
        self.disabled = False

    @classmethod
    def for_task(cls, task: Task, on_changes: ChangesSink) -> RunRecorder | None:
        if task.record.working_folder is None:
            return None
        return cls(repo_for(task), on_changes)

    def _record(self, label: str, turn: int | None) -> tuple[Commit, dict[str, Any] | None]:
        t = time.monotonic()
        with self.repo.locked():
            snap = self.repo.snapshot()
            commit = self.repo.commit(snap, label, turn)
            event = None
            if self._open_turn is not None and (turn is None or turn != self._open_turn[0]):
                n, before = self._open_turn
                changes = self.repo.diff(before, commit.id)
                event = {"turn": n, "checkpoint": before, **summarise(changes)}
                self._open_turn = None
            if turn is not None and self._open_turn is None:
                self._open_turn = (turn, commit.id)
        self.timings.append(time.monotonic() - t)
        return commit, event

    async def record(self, label: str, turn: int | None = None) -> Commit:
        async with self._lock:
            commit, event = await asyncio.to_thread(self._record, label, turn)
        if event is not None:
            self.on_changes(event)
        return commit

    async def start(self) -> Commit:
        def base() -> int:
            with self.repo.locked():
                return max((c.turn or 0 for c in self.repo.log()), default=0)

        self._base = self._last_turn = await asyncio.to_thread(base)
        return await self.record("task start" if self._base == 0 else "task resumed")

    def begin(self) -> None:
        """Start the task-start checkpoint in the background (it overlaps the VM boot).

        The first model call and the end wait for it: the agent cannot act on
        the folder before its first model reply, which the gateway holds back.
        """
        self._starting = asyncio.ensure_future(self.start())

    async def _started_ok(self) -> bool:
        """Wait for :meth:`begin`'s checkpoint; raise its error once, then stay off."""
        task, self._starting = self._starting, None
        if task is not None:
            try:
                await task
            except Exception:
                self.disabled = True
                raise
        return not self.disabled

    def turn_started(self) -> None:
        self._started += 1
        self._turn_seen.set()

    async def before_model_call(self) -> None:
        if not await self._started_ok():
            return
        if self._base + self._started <= self._last_turn:
            self._turn_seen.clear()
            # No new turn_start within the wait: a retry or a compaction call (same turn).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._turn_seen.wait(), self.turn_start_wait)
        turn = max(self._base + self._started, self._last_turn, self._base + 1)
        self._last_turn = turn
        await self.record(f"before turn {turn}", turn)

    async def end(self) -> Commit | None:
        if not await self._started_ok():
            return None
        return await self.record("task end")
