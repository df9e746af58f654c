"""Metering, limits and the model gateway's admission for one task.

The gateway sees every model call, pi's or any other guest code's: its counts
are what the task's token (and, where priced, cost) limits use. pi's own usage
only adds turns, and cost for providers whose prices the gateway does not know.
task.json is rewritten (two fsyncs) off the event loop; deltas that arrive
while a write is under way are added up and written together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from piwork.proxy.gateway import UsageRecord
from piwork.rpc import models as m
from piwork.run.digest import EventKind
from piwork.run.request import RunError
from piwork.tasks import Task, TaskStore
from piwork.tasks.model import LimitKind
from piwork.tasks.model import Usage as TaskUsage

LIMIT_FLAGS = {
    LimitKind.TURNS: "--max-turns",
    LimitKind.WALL_TIME: "--max-minutes",
    LimitKind.TOKENS: "--max-tokens",
    LimitKind.COST: "--max-cost",
}
"""The CLI flag that raises each limit: what the person is told to use."""


def refuse_if_used_up(task: Task) -> None:
    """A task that has used up a limit does not start: say which flag raises it."""
    used_up = task.record.limit_reached()
    if used_up is not None:
        flag = LIMIT_FLAGS[used_up]
        raise RunError(
            f"task {task.id} has used up its {used_up.value.replace('_', ' ')} limit; "
            f"resume it with a higher {flag} (e.g. `piwork resume {task.id} {flag} ...`)"
        )


class UsageMeter:
    """Adds up one task's usage, writes it to task.json, and stops the run at a limit."""

    def __init__(
        self,
        store: TaskStore,
        task: Task,
        *,
        emit: Callable[..., None],
        note: Callable[[str, Any], None],
        on_limit: Callable[[LimitKind], None],
        gateway_prices: bool = False,
    ) -> None:
        self.store = store
        self.task = task
        """The record as this meter last wrote it (its usage is what admission counts)."""
        self._emit = emit
        self._note = note
        self._on_limit = on_limit
        self.gateway_prices = gateway_prices
        self._due = TaskUsage()
        self._report = False
        self._inflight = TaskUsage()  # taken from _due, not yet in task.json
        self._writer: asyncio.Task[None] | None = None

    def on_gateway_usage(self, rec: UsageRecord) -> None:
        self._note(
            "model_call",
            {
                "provider": rec.provider,
                "model": rec.model,
                "status": rec.status,
                "inputTokens": rec.input_tokens,
                "outputTokens": rec.output_tokens,
                "seconds": round(rec.duration_s, 3),
                **({"estimated": True} if rec.estimated else {}),
            },
        )
        self.add(
            TaskUsage(
                input_tokens=rec.input_tokens,
                output_tokens=rec.output_tokens,
                cache_read_tokens=rec.cache_read_tokens,
                cache_write_tokens=rec.cache_write_tokens,
                cost_usd=rec.cost_usd or 0.0,
            ),
            report=True,
        )

    def account(self, usage: m.Usage | None, *, turns: int = 0) -> None:
        """Turns from pi; tokens come from the gateway (which sees every call)."""
        delta = TaskUsage(turns=turns)
        if usage is not None and not self.gateway_prices:
            delta = TaskUsage(turns=turns, cost_usd=max(usage.cost.total, 0.0))
        self.add(delta, report=usage is not None)

    def add(self, delta: TaskUsage, *, report: bool) -> None:
        self._due = self._due.plus(delta)
        self._report = self._report or report
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="task-usage-writer"
            )

    async def _write(self) -> None:
        while self._due != TaskUsage() or self._report:
            delta, self._due = self._due, TaskUsage()
            report, self._report = self._report, False
            self._inflight = delta
            try:
                self.task = await asyncio.to_thread(self.store.add_usage, self.task.id, delta)
            except Exception as exc:
                self._due = delta.plus(self._due)  # kept for the next write
                self._emit(EventKind.ERROR, message=f"cannot record usage: {exc}")
                return
            finally:
                self._inflight = TaskUsage()
            if report or delta.total_tokens or delta.cost_usd:
                u = self.task.record.usage
                self._emit(EventKind.USAGE, tokens=u.total_tokens, cost=u.cost_usd, turns=u.turns)
            limit = self.task.record.limit_reached()
            if limit is not None:
                self._on_limit(limit)

    async def flush(self) -> None:
        """Wait for usage accounted so far to be in task.json."""
        writer = self._writer
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(writer)

    async def wall_time_reached(self, every: float = 2.0) -> LimitKind:
        """Returns once a limit is reached. Usage events cannot catch a wall-time
        limit during a long tool call: this polls the record."""
        while True:
            await asyncio.sleep(every)
            task = await asyncio.to_thread(self.store.get, self.task.id)
            limit = task.record.limit_reached()
            if limit is not None:
                return limit

    def admits(self) -> str | None:
        """Before every model call: refused while any of the task's limits is used up
        (read afresh, so raising a limit lets calls through again)."""
        try:
            record = self.store.get(self.task.id).record
            # Usage is this meter's own count: what the writer last put in task.json
            # (self.task, replaced on the loop in the same step that clears the
            # in-flight delta) plus what is still on its way, so a burst of calls cannot
            # slip past the limit while the writer catches up, and a delta the file
            # already holds is never counted twice. Limits are read afresh.
            pending = self._due.plus(self._inflight)
            used = self.task.record.usage.plus(pending)
            limit = record.limits.exceeded(used, record.wall_seconds())
        except Exception as exc:  # cannot tell: refuse rather than spend blindly
            return f"cannot read this task's limits ({exc})"
        if limit is None:
            return None
        return (
            f"this task reached its {limit.value.replace('_', ' ')} limit; "
            f"`piwork resume` with a higher {LIMIT_FLAGS[limit]} continues it"
        )


__all__ = ["LIMIT_FLAGS", "UsageMeter", "refuse_if_used_up"]
