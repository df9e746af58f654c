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
        self._listeners: list[Callable[..., Any]] = []

    def connect(self, listener: Callable[..., Any]) -> None:
        self._listeners.append(listener)

    def disconnect(self, listener: Callable[..., Any]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def emit(self, *args: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(*args)
            except Exception as exc:
                sys.excepthook(type(exc), exc, exc.__traceback__)

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {len(self._listeners)} listeners)"
