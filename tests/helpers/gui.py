"""GUI helpers: waiting on the qasync loop, activating windows, what a person does
(typing into the composer, clicking a button by its text, answering a message box by
its title, the rail's menu), reading the checkpoints tree, and ``FakeRun``: the
runner's double for tests of the window's own logic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTreeWidgetItem
from pytestqt.qtbot import QtBot

from piwork.config import Paths
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


# --------------------------------------------------------------------------- the person
def say(win: Any, text: str, *, alt: bool = False) -> None:
    """Type ``text`` into the composer and press Enter (Alt+Enter: queue a follow-up)."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    win.composer.setFocus()
    win.composer.clear()
    QTest.keyClicks(win.composer, text)
    mods = Qt.KeyboardModifier.AltModifier if alt else Qt.KeyboardModifier.NoModifier
    QTest.keyClick(win.composer, Qt.Key.Key_Return, mods)


def button(parent: Any, text: str) -> Any:
    """The visible button labelled ``text`` under ``parent`` (what a person would click)."""
    from PySide6.QtWidgets import QAbstractButton

    found = [
        b
        for b in parent.findChildren(QAbstractButton)
        if b.text().replace("&", "") == text and b.isVisibleTo(b.window())
    ]
    assert found, f"no visible button {text!r}"
    return found[0]


def message_box(title: str) -> Any:
    """The open message box titled ``title`` (None if there is none)."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    for w in QApplication.topLevelWidgets():
        if isinstance(w, QMessageBox) and w.isVisible() and w.windowTitle() == title:
            return w
    return None


def press(box: Any, text: str) -> None:
    """Click the button labelled ``text`` of an open message box."""
    [b] = [b for b in box.buttons() if b.text().replace("&", "") == text]
    b.click()


# --------------------------------------------------------------------------- the runner
class FakeRun:
    """A stand-in for the runner (``TaskSession``) in tests of the window's OWN logic:
    what it shows for each event, what each click and key does. It speaks the runner's
    events and asks through the window's real Asker; the task record is real (the task
    store). Tests that claim the VM or pi works use the real runner (tests/gui/*vm*).

    ``script(run, prompt)`` plays one prompt: ``run.emit(kind, **data)``, ``await
    run.asker.permission(req)``, ``await run.release.wait()`` ... Its return ends the
    prompt "completed" (or raise ``asyncio.CancelledError`` to mimic a stop)."""

    Script = Callable[["FakeRun", str], Any]

    def __init__(self, req: Any, sink: Any, asker: Any, *, paths: Paths, script: Any) -> None:
        self.req, self.sink, self.asker, self.paths, self.script = req, sink, asker, paths, script
        self.paused = False
        self.steered: list[str] = []
        self.followed: list[str] = []
        self.release = asyncio.Event()
        self.stopped = asyncio.Event()
        self.task_id: str | None = req.task_id

    @classmethod
    def factory(cls, script: Any) -> Any:
        return lambda req, sink, asker, *, paths: cls(req, sink, asker, paths=paths, script=script)

    def emit(self, kind: Any, **data: Any) -> None:
        from piwork.runner import RunEvent

        self.sink(RunEvent(kind, data, 0.0, self.task_id))

    async def __aenter__(self) -> FakeRun:
        from piwork.runner import EventKind
        from piwork.tasks import TaskStore

        # The task's record is claimed for the run, as the runner claims it: its status
        # is real (a crash leaves it "running" for the next start to find).
        self.store = TaskStore(self.paths.tasks)
        if self.task_id is None:
            task = self.store.create(self.req.prompt.splitlines()[0][:80], self.req.folder)
            self.task_id = task.id
        self.lease = self.store.claim(self.task_id)
        rec = self.store.get(self.task_id).record
        folder = str(rec.working_folder) if rec.working_folder else None
        self.emit(EventKind.TASK, id=self.task_id, title=rec.title, folder=folder, model="fake")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.lease.release()
        self.store.close()

    def _status(self, status: str, reason: str | None = None) -> None:
        from piwork.runner import EventKind
        from piwork.tasks import StopReason

        why = StopReason(reason) if reason else None
        self.store.transition(self.task_id or "", status, reason=why)
        self.emit(EventKind.STATUS, status=status, reason=reason)

    async def run_prompt(self, prompt: str) -> None:
        from piwork.runner import EventKind

        self.stopped.clear()
        self.emit(EventKind.PROMPT, message=prompt)
        self._status("running")
        play = asyncio.ensure_future(self.script(self, prompt))
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait([play, stop], return_when=asyncio.FIRST_COMPLETED)
        reason = "cancelled" if stop.done() else "completed"
        for f in (play, stop):
            f.cancel()
        self._status("stopped", reason)
        self.emit(EventKind.DONE, reason=reason, tokens=42, turns=1)

    async def stop(self) -> None:
        self.stopped.set()

    async def steer(self, text: str) -> None:
        from piwork.runner import EventKind

        self.steered.append(text)
        self.emit(EventKind.PROMPT, message=text, mode="steer")

    async def follow_up(self, text: str) -> None:
        self.followed.append(text)

    async def pause_vm(self) -> None:
        self.paused = True
        self._status("paused")  # as the runner says it

    async def resume_vm(self) -> None:
        self.paused = False
        self._status("running")


def rail_menu(win: Any, row: int, action: str) -> None:
    """Right-click the rail's ``row`` and pick ``action`` from its menu."""
    win.rail.setCurrentRow(row)
    win.rail.customContextMenuRequested.emit(win.rail.visualItemRect(win.rail.item(row)).center())
    menu = win.rail_view.menu
    [act] = [a for a in menu.actions() if a.text() == action]
    menu.close()
    act.trigger()
