"""The task's recorded status across one run: written in order, said once, and how it ends.

A run moves its task between ``running``, ``paused`` and ``stopped`` from many
places (start, a prompt, a pause, a stop, close); :class:`StatusRecorder`
writes each change to ``task.json`` off the event loop, in the order asked,
and emits it. The pure functions below decide *what* to record when a run
ends in an unusual way (pi gone, the disk full, a session closed mid-run),
so the session only sequences.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Any

from piwork.run.digest import EventKind
from piwork.run.request import StopWhy, pi_gone_reason, transition
from piwork.tasks import StopReason, Task, TaskStatus, TaskStore, TaskWriteError
from piwork.tasks.model import LimitKind

log = logging.getLogger(__name__)

LEFT_RUNNING = "piwork stopped before the task finished"
LEFT_CANCELLED = "stopped by the person before the task finished"


class StatusRecorder:
    """Writes a task's status changes in the order they were asked for, and says each."""

    def __init__(self, store: TaskStore, emit: Callable[..., None]) -> None:
        self.store = store
        self.emit = emit
        self._lock = asyncio.Lock()

    async def set(
        self,
        task_id: str,
        status: TaskStatus,
        *,
        reason: StopReason | None = None,
        message: str | None = None,
        limit: LimitKind | None = None,
    ) -> Task | None:
        """The task after the change, or ``None`` if it already had ``status``."""
        # task.json is read and rewritten (lock wait, two fsyncs) off the event loop;
        # the lock keeps status changes in the order they were asked for.
        async with self._lock:
            task = await asyncio.to_thread(
                transition, self.store, task_id, status, reason, message, limit
            )
        if task is not None:
            self.emit(
                EventKind.STATUS,
                status=status.value,
                reason=reason.value if reason else None,
                message=message,
            )
        return task

    def current(self, task_id: str | None) -> TaskStatus | None:
        """The recorded status, or ``None`` (no task, or task.json unreadable: logged)."""
        if task_id is None:
            return None
        try:
            return self.store.get(task_id).record.status
        except Exception as exc:  # still release everything the caller holds
            log.error("cannot read the task's state while closing: %s", exc)
            return None


def run_ended_by(
    work: asyncio.Future[Any], pi_gone: asyncio.Future[Any], stderr_tail: list[str], task_id: str
) -> StopWhy | None:
    """Why a prompt's run ended other than by finishing or a stop asked for: pi (or its
    VM) went away, or the work failed. ``None``: nothing went wrong here."""
    failed = work.done() and not work.cancelled() and work.exception() is not None
    if pi_gone.done() and not pi_gone.cancelled() and (failed or not work.done()):
        # pi or its VM died: that (not the lost connection it caused) is the error.
        return pi_gone_reason(pi_gone.result(), stderr_tail, task_id)
    if failed:
        exc = work.exception()
        return StopReason.ERROR, f"{type(exc).__name__}: {exc}", None
    return None


def leaving_status(
    current: TaskStatus | None, *, cancelled: bool, start_failure: str | None
) -> tuple[StopReason, str] | None:
    """How a task still live when its session closes is recorded (``None``: as it is).

    Leaving it live on purpose (a crash, Ctrl-C twice) is a cancel; anything else
    is an error, with why the start failed if it did."""
    if current in (TaskStatus.STOPPED, TaskStatus.IDLE, TaskStatus.INTERRUPTED, None):
        return None
    if cancelled:
        return StopReason.CANCELLED, LEFT_CANCELLED
    return StopReason.ERROR, start_failure or LEFT_RUNNING


def end_not_recorded(exc: TaskWriteError, task_id: str) -> str:
    """What to say when task.json cannot take the end of a run (the disk is full, or gone).

    The run still ends; once this process lets the task go, the next look at it
    (``piwork tasks``, resume) finds it interrupted."""
    full = exc.errno == errno.ENOSPC
    return (
        f"cannot record the end of the task ({exc}); "
        + ("free some disk space, then " if full else "")
        + f"`piwork resume {task_id}` continues it"
    )
