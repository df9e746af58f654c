"""GUI helpers: waiting on the qasync loop, activating windows, typing into the
composer, reading the checkpoints tree."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTreeWidgetItem
from pytestqt.qtbot import QtBot

from piwork.gui.context import ContextPanel
from piwork.models.scripted import (
    ChatRequest,
    Step,
    Text,
)
from piwork.policy import (
    GATE_CHOICES,
    Action,
    PermissionRequest,
    Target,
)


def scripted_provider(server: Any) -> Any:
    """The scripted server as a custom provider: the runner reaches it through its gateway."""
    return server.as_provider(name="scripted test model")


def activate(w: Any) -> None:
    """Show ``w`` as the active window (shortcuts only reach the active window)."""
    from PySide6.QtTest import QTest

    w.show()
    w.activateWindow()
    assert QTest.qWaitForWindowActive(w)


async def shown(w: Any) -> None:
    """``activate`` for code already running on the qasync loop: no nested event loop
    (a nested loop would step other asyncio tasks re-entrantly, which asyncio refuses)."""
    w.show()
    w.activateWindow()
    await until(w.isActiveWindow, 10, "the window becomes active")


async def until(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Let the loop (and Qt) run until ``cond()`` is true."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for: {what}")
        await asyncio.sleep(0.05)


def permission_request(
    action: Action, path: str | None, command: str | None = None
) -> PermissionRequest:
    """A permission request for one target, as the runner parses it from pi's dialog."""
    return PermissionRequest(
        request_id="req-1",
        question=f"allow {action.value}?",
        options=tuple(c.value for c in GATE_CHOICES),
        action=action,
        tool="bash",
        tool_call_id="call-1",
        task_id="t1",
        cwd="/mnt/work",
        command=command,
        paths=(path,) if path else (),
        targets=(Target(action, op=action.value, path=path, command=command),),
        payload={},
    )


def tree(panel: ContextPanel) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in range(panel.turns.topLevelItemCount()):
        top = panel.turns.topLevelItem(i)
        out[top.text(0)] = [top.child(j).text(0) for j in range(top.childCount())]
    return out


def item(panel: ContextPanel, turn: int, path: str | None = None) -> QTreeWidgetItem:
    for i in range(panel.turns.topLevelItemCount()):
        top = panel.turns.topLevelItem(i)
        if top.data(0, Qt.ItemDataRole.UserRole)[0] != turn:
            continue
        if path is None:
            return top
        for j in range(top.childCount()):
            if top.child(j).data(0, Qt.ItemDataRole.UserRole)[1] == path:
                return top.child(j)
    raise AssertionError(f"no item for turn {turn} {path}")


BOOT = 300.0  # one TCG boot on a shared, loaded 2-core machine


STEP = 180.0


def router(scripts: dict[str, list[Step]]) -> Callable[[ChatRequest], Step]:
    """The model's reply depends on which prompt (by its tag) it is answering."""

    def choose(req: ChatRequest) -> Step:
        user = req.last_user_text
        for tag, steps in scripts.items():
            if tag in user:
                i = req.assistant_turns_since_user
                return steps[i] if i < len(steps) else Text("(script finished)")
        return Text("(no script for this prompt)")

    return choose


def send(qtbot: QtBot, win: Any, text: str, *, alt: bool = False) -> None:
    win.composer.setFocus()
    win.composer.setPlainText(text)
    mods = Qt.KeyboardModifier.AltModifier if alt else Qt.KeyboardModifier.NoModifier
    qtbot.keyClick(win.composer, Qt.Key.Key_Return, mods)
