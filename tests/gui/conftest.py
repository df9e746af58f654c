"""GUI tests run headless on Qt's offscreen platform (the screenshot test uses Xvfb in a
subprocess). The platform must be chosen before pytest-qt creates the QApplication."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from piwork.config import Paths, get_paths
from piwork.policy import GATE_CHOICES, Action, PermissionRequest, Target


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GUI soak (``@pytest.mark.soak``) runs only with PIWORK_SOAK=1: deselected, not
    skipped (the same rule as tests/faults/conftest.py)."""
    if os.environ.get("PIWORK_SOAK") == "1":
        return
    here = Path(__file__).parent
    soak = [i for i in items if i.get_closest_marker("soak") and here in Path(i.path).parents]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [i for i in items if i not in soak]


@pytest.fixture(scope="package", autouse=True)
def gc_on_gui_thread(qapp: object) -> Iterator[None]:
    """Cyclic garbage is collected on the GUI thread for all of tests/gui, between tests
    too: a window a test left as garbage must not be freed later by a worker thread of
    the next test (``piwork.gui.loop.GuiThreadCollector``; each loop also holds it)."""
    from piwork.gui.loop import gui_thread_collector

    collector = gui_thread_collector()
    collector.hold()
    yield
    collector.release()


@pytest.fixture
def gui_paths(tmp_path: Path) -> Paths:
    """A private piwork home (tasks, policy, settings); the pack cache stays shared."""
    home = tmp_path / "home"
    return Paths(
        data=home / "data", cache=get_paths().cache, state=home / "state", config=home / "config"
    )


@pytest.fixture
def qloop(qapp: object) -> Iterator[asyncio.AbstractEventLoop]:
    """The app's own loop (``piwork.gui.loop.new_loop``) on pytest-qt's QApplication."""
    from piwork.gui.loop import new_loop

    loop = new_loop(qapp)  # type: ignore[arg-type]
    asyncio.set_event_loop(loop)
    yield loop
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=30))
    loop.close()
    asyncio.set_event_loop(None)


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

        store = TaskStore(self.paths.tasks)
        try:
            if self.task_id is None:
                task = store.create(self.req.prompt.splitlines()[0][:80], self.req.folder)
                self.task_id = task.id
            rec = store.get(self.task_id).record
        finally:
            store.close()
        folder = str(rec.working_folder) if rec.working_folder else None
        self.emit(EventKind.TASK, id=self.task_id, title=rec.title, folder=folder, model="fake")
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _status(self, status: str, reason: str | None = None) -> None:
        from piwork.runner import EventKind
        from piwork.tasks import StopReason, TaskStore

        store = TaskStore(self.paths.tasks)
        try:
            with contextlib.suppress(Exception):  # the record is a witness, not the subject
                why = StopReason(reason) if reason else None
                store.transition(self.task_id or "", status, reason=why)
        finally:
            store.close()
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

    async def resume_vm(self) -> None:
        self.paused = False


def rail_menu(win: Any, row: int, action: str) -> None:
    """Right-click the rail's ``row`` and pick ``action`` from its menu."""
    win.rail.setCurrentRow(row)
    win.rail.customContextMenuRequested.emit(win.rail.visualItemRect(win.rail.item(row)).center())
    menu = win.rail_view.menu
    [act] = [a for a in menu.actions() if a.text() == action]
    menu.close()
    act.trigger()
