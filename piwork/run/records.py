"""What a run keeps on disk as it goes: the task's transcript and its folder's checkpoints.

Both are best effort in the same way: a failure is told to the person and
never crashes the run. A full disk is the one exception for the transcript:
going on would only pile records up in memory, so the run is asked to stop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from piwork.agent import Agent
from piwork.checkpoints import RunRecorder
from piwork.rpc.framing import MalformedLine
from piwork.run.digest import EventKind
from piwork.tasks import Task, TaskStore
from piwork.tasks.transcript import TranscriptFull, TranscriptWriteError, compact_pi_line


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
    """The working folder's history for one run (``piwork.checkpoints``).

    The folder is recorded at task start, before every model call (the gateway
    awaits :meth:`before_model_call` before forwarding, so a turn's tools cannot
    have run yet: they need the reply) and at the end of each run. A failed
    checkpoint is reported, not fatal: the task goes on without it.
    """

    def __init__(self, emit: Callable[..., None], note: Callable[[str, Any], None]) -> None:
        self._emit = emit
        self._note = note
        self._rec: RunRecorder | None = None

    def begin(self, task: Task) -> None:
        try:
            self._rec = RunRecorder.for_task(task, self._on_changes)
            if self._rec is not None:
                self._rec.begin()  # overlaps the boot; the first model call waits for it
        except Exception as exc:
            self._rec = None
            self._emit(EventKind.ERROR, message=f"checkpoints are off for this run: {exc}")

    def turn_started(self) -> None:
        if self._rec is not None:
            self._rec.turn_started()

    async def before_model_call(self) -> None:
        await self._step(lambda rec: rec.before_model_call())

    async def end(self, timings: dict[str, float]) -> None:
        await self._step(lambda rec: rec.end())
        if self._rec is not None and self._rec.timings:
            timings["checkpoint_max"] = max(self._rec.timings)

    async def _step(self, step: Callable[[RunRecorder], Awaitable[object]]) -> None:
        if self._rec is None:
            return
        try:
            await step(self._rec)
        except Exception as exc:
            self._emit(
                EventKind.ERROR,
                message=f"could not checkpoint the working folder ({exc}); "
                "changes made from here on may not be undoable",
            )

    def _on_changes(self, data: dict[str, Any]) -> None:
        self._note("changes", data)
        self._emit(EventKind.CHANGES, **data)


class FolderGuard:
    """What keeps the person's folder safe around each turn, through the agent door.

    Before a model call: a VM on another host brings its folder changes here
    (three-way, piwork.hosts.sync), and a ``.git`` the guest created is moved
    aside (piwork.vm.gitguard); both come before the checkpoint, so the turn's
    record sees the folder as the person will. Each move is told once.
    """

    def __init__(self, emit: Callable[..., None], note: Callable[[str, Any], None]) -> None:
        self._emit = emit
        self._note = note

    def started(self, agent: Agent, timings: dict[str, float]) -> None:
        if (scan := agent.git_scan_seconds) is not None:
            timings["git_scan"] = scan
        if (notice := agent.git_readonly_notice()) is not None:
            self._emit(EventKind.NOTICE, message=notice)

    async def before_model_call(self, agent: Agent) -> None:
        await agent.sync_folder()
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
