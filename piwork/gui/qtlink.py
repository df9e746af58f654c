"""A view listens to the Qt-free model for as long as its widget lives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject

from piwork.gui.events import Event


def listen(owner: QObject, event: Event, listener: Callable[..., Any]) -> None:
    """Connect ``listener`` to ``event`` until Qt deletes ``owner`` (then it is dropped,
    as a Qt connection to a destroyed receiver is: a task that outlives its window, a
    run still powering off at quit, must not call into deleted widgets)."""
    event.connect(listener, alive=lambda: shiboken6.isValid(owner))
