"""A Qt-free event: what the task model tells its views (napari's ``EventEmitter``, small).

The model of the tasks (``piwork.gui.model``) and each task (``piwork.gui.controller``)
are plain Python, so they can be tested and reasoned about without a window; the
views connect to these events the way they would to a Qt signal (``connect``,
``emit``). Everything runs on the app's one thread (qasync: see ``piwork.gui.loop``),
so a listener is called directly, in the order it connected. A listener that raises
goes to ``sys.excepthook`` (the app logs it; pytest-qt fails the test) and the others
still run, as with a Qt slot: one broken view must not stop the rail or the banner
from hearing about a task.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class Event:
    """One kind of news (``task.changed``, ``model.selected``): listeners, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[tuple[Callable[..., Any], Callable[[], bool] | None]] = []

    def connect(
        self, listener: Callable[..., Any], *, alive: Callable[[], bool] | None = None
    ) -> None:
        """``alive``: the listener is dropped once it says False (a view whose widget Qt
        deleted: what a Qt connection does for a destroyed receiver)."""
        self._listeners.append((listener, alive))

    def disconnect(self, listener: Callable[..., Any]) -> None:
        self._listeners = [(f, a) for f, a in self._listeners if f != listener]

    def emit(self, *args: Any) -> None:
        for entry in list(self._listeners):
            listener, alive = entry
            if alive is not None and not alive():
                if entry in self._listeners:
                    self._listeners.remove(entry)
                continue
            try:
                listener(*args)
            except Exception as exc:
                sys.excepthook(type(exc), exc, exc.__traceback__)

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {len(self._listeners)} listeners)"
