"""What a run keeps on disk as it goes: the task's transcript and its folder's checkpoints.

Both are best effort in the same way: a failure is told to the person and
never crashes the run. A full disk is the one exception for the transcript:
going on would only pile records up in memory, so the run is asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piwork.agent import Agent
from piwork.changes.engine import FolderChanges, Judge, Limits, Outcome, summary
from piwork.changes.entry import display
from piwork.changes.journal import Pending
from piwork.changes.patches import export_commits
from piwork.rpc.framing import MalformedLine
from piwork.run.digest import EventKind
from piwork.tasks import Task, TaskStore
from piwork.tasks.settings import load_task_settings
from piwork.tasks.transcript import TranscriptFull, TranscriptWriteError, compact_pi_line
from piwork.textsafe import sanitize


class TranscriptNotes:
    """Appends records to one task's transcript, from the loop or a worker thread."""

    def __init__(
        self,
        store: TaskStore,
        emit: Callable[..., None],
        on_disk_full: Callable[[str], None],
    ) -> None:
        self.store = store
        self.task_id: str | None = None
        self._emit = emit
        self._on_disk_full = on_disk_full
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def bind_loop(self) -> None:
        """Failures seen on other threads are handled on the running loop from now on."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()

    def note(self, kind: str, data: Any) -> None:
        """Append to the task transcript; a disk error becomes a task error, not a crash."""
        if self.task_id is None:
            return
        try:
            self.store.append_event(self.task_id, kind, data)
        except Exception as exc:
            if self._loop is not None and threading.get_ident() != self._loop_thread:
                # A big pi line is recorded from a worker thread (the loop waits for
                # it): what follows touches loop objects, so it runs on the loop.
                self._loop.call_soon_threadsafe(self._failed, exc)
            else:
                self._failed(exc)

    def pi_line(self, raw: bytes, parsed: dict[str, Any] | MalformedLine) -> None:
        """Every line pi wrote, parsed once by the RPC client, stored as deltas."""
        if isinstance(parsed, MalformedLine):
            data: Any = {"malformed": raw[:2000].decode("utf-8", "replace")}
        else:
            data = compact_pi_line(parsed)
        self.note("pi", data)

    def _failed(self, exc: Exception) -> None:
        self._emit(EventKind.ERROR, message=f"cannot write the transcript: {exc}")
        if not isinstance(exc, TranscriptWriteError):
            return
        if isinstance(exc, TranscriptFull) or exc.errno == errno.ENOSPC:
            why = os.strerror(exc.errno or errno.ENOSPC)
            self._on_disk_full(
                f"the disk is full, so the task's transcript cannot be saved "
                f"({exc.path}: {why}); free some space, then "
                f"`piwork resume {self.task_id or '<task>'}` continues the task"
            )


class FolderCheckpoints:
    """The working folder's change sets for one run (:mod:`piwork.changes`).

    The guest never writes the person's folder; what the agent changed in its
    layer is taken, decided, checkpointed and applied here: before every model
    call (the gateway awaits :meth:`before_model_call` before forwarding, so the
    turn's tools have run and the next turn's cannot have started: they need the
    reply), at the end of each run and before a finished task's VM is kept warm
    (:meth:`end`). A failure is reported, not fatal: what was not taken stays in
    the agent's layer and is taken with the next change set.

    The changes taken at a model call are the previous turn's: a checkpoint
    ``turn N`` holds what turn N's tools did.
    """

    def __init__(
        self,
        emit: Callable[..., None],
        note: Callable[[str, Any], None],
        judge: Callable[[], Judge],
        *,
        turn_start_wait: float = 1.0,
    ) -> None:
        self._emit = emit
        self._note = note
        self._judge = judge
        self.turn_start_wait = turn_start_wait
        self.engine: FolderChanges | None = None
        self._task_dir: Path | None = None
        self._since_ns: int | None = None
        self.timings: list[float] = []
        self._base = 0
        self._started = 0
        self._last_turn = 0
        self._turn_seen = asyncio.Event()
        self._told_waiting: set[str] = set()

    def begin(self, task: Task) -> None:
        folder = task.record.working_folder
        if folder is None:
            return
        try:
            settings = load_task_settings()
            limits = Limits(max_before_bytes=settings.checkpoint_max_file_bytes)
            self.engine = FolderChanges(task.dir, Path(folder), limits=limits)
            self._task_dir = task.dir
            cps = self.engine.journal.checkpoints()
            self._base = self._last_turn = max((c.turn or 0 for c in cps), default=0)
            if not cps:
                cps = [self.engine.journal.add(Pending(None, "task start"))]
            self._since_ns = int(cps[0].created * 1e9)
        except Exception as exc:
            self.engine = None
            self._emit(
                EventKind.ERROR, message=f"the folder's change history is off for this run: {exc}"
            )

    def turn_started(self) -> None:
        self._started += 1
        self._turn_seen.set()

    async def before_model_call(self, agent: Agent) -> None:
        if self.engine is None:
            return
        if self._base + self._started <= self._last_turn:
            self._turn_seen.clear()
            # No new turn_start within the wait: a retry or a compaction call (same turn).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._turn_seen.wait(), self.turn_start_wait)
        turn = max(self._base + self._started, self._last_turn, self._base + 1)
        done = self._last_turn if self._last_turn > self._base else None
        self._last_turn = turn
        label = f"turn {done}" if done is not None else f"before turn {turn}"
        await self._take(agent, done, label)

    async def end(self, agent: Agent | None, timings: dict[str, float]) -> None:
        """The last turn's changes (a no-op when nothing changed since)."""
        if self.engine is not None and agent is not None:
            done = self._last_turn if self._last_turn > self._base else None
            if await self._take(agent, done, f"turn {done}" if done else "task end"):
                with contextlib.suppress(Exception):
                    self.engine.journal.add(Pending(None, "task end"))
            await self._patches(agent)
        if self.timings:
            timings["checkpoint_max"] = max(self.timings)

    async def _take(self, agent: Agent, turn: int | None, label: str) -> bool:
        assert self.engine is not None
        source = agent.folder_source()
        if source is None:
            return False
        if self._since_ns is not None and hasattr(source, "base_ns"):
            source.base_ns = self._since_ns  # the person's edits since the task began
        t = time.monotonic()
        try:
            out = await self.engine.take(source, self._judge(), turn=turn, label=label)
        except Exception as exc:
            self._emit(
                EventKind.ERROR,
                message=f"could not take the agent's changes to the folder ({exc}); they stay "
                "in its layer and are taken with the next change set",
            )
            return False
        finally:
            self.timings.append(time.monotonic() - t)
        self._report(out, turn)
        return out.checkpoint is not None and bool(out.applied)

    async def _patches(self, agent: Agent) -> None:
        """The agent's commits in the person's repositories, as patch files to apply."""
        source = agent.folder_source()
        if self.engine is None or source is None or self._task_dir is None:
            return
        try:
            made = await export_commits(self.engine, source, self._task_dir)
        except Exception as exc:
            self._emit(EventKind.ERROR, message=f"could not export the agent's commits: {exc}")
            return
        for p in made:
            where = sanitize(display(p.repo), one_line=True) or "the folder"
            data = {"repo": display(p.repo), "file": str(p.file), "commits": p.commits}
            self._note("patches", data)
            self._emit(
                EventKind.NOTICE,
                message=f"the agent made {p.commits} commit(s) in {where} (in its copy; your "
                f"repository is as it was): {p.file}; `git am {p.file}` applies them",
            )

    def _report(self, out: Outcome, turn: int | None) -> None:
        if out.empty and not out.kept and not out.notes:
            return
        data = {"turn": turn, "checkpoint": out.checkpoint.id if out.checkpoint else None,
                **summary(out)}  # fmt: skip
        self._note("changes", data)
        self._emit(EventKind.CHANGES, **data)
        # One path once (a move waits as its source and its destination's new file).
        fresh = list(dict.fromkeys(p for p, _s, _w in out.waiting if p not in self._told_waiting))
        if fresh:
            self._told_waiting.update(fresh)
            shown = ", ".join(sanitize(display(p), one_line=True) for p in fresh[:5])
            more = f" and {len(fresh) - 5} more" if len(fresh) > 5 else ""
            self._emit(
                EventKind.NOTICE,
                message=f"waiting for you, not in your folder yet: {shown}{more} "
                "(the agent keeps working with them; `piwork apply TASK` or the app applies them)",
            )
        for path, beside in out.conflicts:
            shown = sanitize(display(path), one_line=True)
            where = (
                f", the agent's is beside it as {sanitize(display(beside), one_line=True)}"
                if beside
                else "; the agent's change stays in its copy"
            )
            self._emit(
                EventKind.NOTICE,
                message=f"conflict: {shown} changed here and in the task; "
                f"your version stays{where}",
            )
        for note in out.notes:
            self._emit(EventKind.NOTICE, message=sanitize(note, one_line=True))


class FolderGuard:
    """The task's outputs share around each turn: a ``.git`` the guest made there is moved
    aside (piwork.vm.gitguard) before the model call, and told once.

    (The working folder needs nothing here: the guest never writes it; its changes
    are taken by :class:`FolderCheckpoints`.)"""

    def __init__(self, emit: Callable[..., None], note: Callable[[str, Any], None]) -> None:
        self._emit = emit
        self._note = note

    async def before_model_call(self, agent: Agent) -> None:
        await agent.move_aside_new_git()
        self.report(agent)

    def report(self, agent: Agent) -> None:
        """Say where a ``.git`` the guest created went, once each."""
        moved, error = agent.take_git_reports()
        for item in moved:
            self._note("git_moved_aside", {"from": str(item.original), "to": str(item.now)})
            self._emit(EventKind.NOTICE, message=item.note())
        if error is not None:
            self._emit(EventKind.ERROR, message=error)


__all__ = ["FolderCheckpoints", "FolderGuard", "TranscriptNotes"]
