"""Several tasks at once, the queue behind them, and the keep-warm wait. Qt-free.

Why it is here and not in the window: the limit ("at most N VMs at once"), the
order in which queued tasks start, and how long a finished task's VM stays warm
for a follow-up are engine rules. The app uses them today and a headless front
end (``piwork`` running several tasks) needs the same ones; a Qt import here
would make that impossible (ARCHITECTURE.md: nothing below the runner imports a
front end).

A *slot* is anything with ``live`` (its VM job is running) and ``start_queued()``
(called when the pool gives it a turn): the app's ``TaskController`` is one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from piwork.config import Paths, get_paths

CLOSE = "\x00close"  # inbox sentinel: leave the warm wait now (power the VM off)
DEFAULT_KEEP_WARM = 300.0


class Slot(Protocol):
    @property
    def live(self) -> bool: ...

    def start_queued(self) -> None: ...


class Pool:
    """Up to ``limit`` tasks run at once, each in its own VM; the rest wait, in order."""

    def __init__(
        self,
        limit: int = 2,
        *,
        paths: Paths | None = None,
        keep_warm: float = DEFAULT_KEEP_WARM,
    ) -> None:
        self.limit = max(1, limit)
        self.paths = paths or get_paths()
        self.keep_warm = keep_warm
        self._live: list[Slot] = []
        self._queue: list[Slot] = []
        self.on_change: Callable[[], None] = lambda: None

    def has_slot(self, slot: Slot) -> bool:
        return len([c for c in self._live if c is not slot]) < self.limit

    def track(self, slot: Slot) -> None:
        if slot not in self._live:
            self._live.append(slot)

    def enqueue(self, slot: Slot) -> None:
        if slot not in self._queue:
            self._queue.append(slot)

    def dequeue(self, slot: Slot) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(slot)

    def waiting(self) -> bool:
        return bool(self._queue)

    def set_limit(self, limit: int) -> None:
        """A raised limit starts queued tasks now (settings apply at once)."""
        self.limit = max(1, limit)
        self._start_waiting()
        self.on_change()

    def released(self, slot: Slot) -> None:
        with contextlib.suppress(ValueError):
            self._live.remove(slot)
        self._start_waiting()
        self.on_change()

    def _start_waiting(self) -> None:
        while self._queue and len(self._live) < self.limit:
            self._queue.pop(0).start_queued()

    @property
    def running(self) -> list[Slot]:
        return [c for c in self._live if c.live]

    async def next_prompt(self, inbox: asyncio.Queue[str]) -> str:
        """Keep a finished task's VM warm for its next message.

        Raises TimeoutError when the VM should power off: ``keep_warm`` seconds
        passed, another task waits for the slot, or ``CLOSE`` arrived. The deadline
        is re-read every second, so a shorter keep-warm set in Settings applies to
        VMs already warm, not only after a restart.
        """
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            if self.waiting():
                raise TimeoutError
            remaining = since + self.keep_warm - loop.time()
            if remaining <= 0:
                raise TimeoutError
            try:
                text = await asyncio.wait_for(inbox.get(), timeout=min(remaining, 1.0))
            except TimeoutError:
                continue  # look at the queue and the (maybe changed) keep-warm again
            if text == CLOSE:
                # Outside the try: a CLOSE must end the wait, not be taken for a tick
                # (it was, and "End task" waited 60 s and then cancelled the task).
                raise TimeoutError
            return text
