"""Previews in the app: the preview question, the conversation's "Open preview" row and
the context panel's list, fed the run's real ``preview`` event shapes through the task's
controller (the backend's own VM tests cover the VM side: tests/vm/test_vm_preview.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.policy.rules import TaskContext
from piwork.preview import PreviewChoice
from piwork.preview.policy import question_for
from piwork.runner import EventKind, RunEvent
from tests.helpers.gui import FakeRun, say, until

URL_A = "http://t1-8000.localhost:41001/"
URL_B = "http://t2-3000.localhost:41002/"


def preview_event(task: str, port: int, state: str, url: str | None, **more: Any) -> RunEvent:
    data = {"port": port, "url": url, "state": state, "by": "person", **more}
    return RunEvent(EventKind.PREVIEW, data, 1.0, task)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL the app asks the desktop to open (nothing reaches a real browser)."""
    from PySide6.QtGui import QDesktopServices

    seen: list[str] = []

    def record(url: Any) -> bool:
        seen.append(url.toString())
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(record))
    return seen


def window(qtbot: QtBot, paths: Paths) -> Any:
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    return win


def task(win: Any, task_id: str) -> Any:
    ctl = win.model.new(task_id=task_id, title=task_id, status="running")
    win.model.add(ctl)
    return ctl


def test_an_opened_preview_row_opens_exactly_its_url_and_greys_when_closed(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, opened: list[str]
) -> None:
    from piwork.gui.widgets import PreviewRow

    win = window(qtbot, gui_paths)
    ctl = task(win, "t1")
    win.select(ctl)
    ctl.on_run_event(preview_event("t1", 8000, "opened", URL_A, hostPort=41001))
    [row] = win.conversation(ctl).findChildren(PreviewRow)
    assert row.label.text() == "Preview of port 8000"
    assert row.open_btn.isEnabled()
    row.open_btn.click()
    assert opened == [URL_A]
    # The context panel lists it too, with its own Open button.
    assert win.context.previews_box.isVisibleTo(win.context)
    win.context.preview_buttons[8000].click()
    assert opened == [URL_A, URL_A]
    ctl.on_run_event(preview_event("t1", 8000, "closed", URL_A))
    assert not row.open_btn.isEnabled()
    assert "closed" in row.label.text()
    row.open_btn.click()  # a disabled button does nothing
    assert opened == [URL_A, URL_A]
    assert win.context.preview_buttons == {}
    assert not win.context.previews_box.isVisibleTo(win.context)


def test_a_refused_preview_says_why_and_offers_nothing_to_open(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, opened: list[str]
) -> None:
    from piwork.gui.widgets import PreviewRow

    win = window(qtbot, gui_paths)
    ctl = task(win, "t1")
    win.select(ctl)
    ctl.on_run_event(preview_event("t1", 5000, "refused", None, reason="you answered Never"))
    [row] = win.conversation(ctl).findChildren(PreviewRow)
    assert row.label.text() == "Preview of port 5000 refused: you answered Never"
    assert not row.open_btn.isEnabled()
    assert win.context.preview_buttons == {}
    assert opened == []


def test_a_url_that_is_not_piworks_loopback_http_is_never_offered(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, opened: list[str]
) -> None:
    """The event's port numbers came from the guest: the app opens only plain http on
    a loopback name, whatever ends up in the event."""
    from piwork.gui.widgets import PreviewRow

    win = window(qtbot, gui_paths)
    ctl = task(win, "t1")
    win.select(ctl)
    bad = [
        "file:///etc/passwd",
        "https://t1-8000.localhost:41001/",
        "http://evil.example:8000/",
        "http://t1-8000.localhost.evil.example:41001/",
        "javascript:alert(1)",
        "http://t1-8000.localhost:99999999/",
        "http://10.0.0.1:41001/",
        "http://127.1.2.3.evil.example:41001/",
        "http://0x7f.1.2.3:41001/",
    ]
    for port, url in enumerate(bad, start=7000):
        ctl.on_run_event(preview_event("t1", port, "opened", url))
    rows = win.conversation(ctl).findChildren(PreviewRow)
    assert len(rows) == len(bad)
    for row in rows:
        assert not row.open_btn.isEnabled()
        row.open_btn.click()
    assert ctl.previews == {} and win.context.preview_buttons == {}
    assert opened == []


def test_the_context_panel_shows_only_the_selected_tasks_previews(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, opened: list[str]
) -> None:
    win = window(qtbot, gui_paths)
    one, two = task(win, "t1"), task(win, "t2")
    one.on_run_event(preview_event("t1", 8000, "opened", URL_A))
    two.on_run_event(preview_event("t2", 3000, "opened", URL_B))
    win.select(one)
    assert list(win.context.preview_buttons) == [8000]
    win.select(two)
    assert list(win.context.preview_buttons) == [3000]
    win.context.preview_buttons[3000].click()
    assert opened == [URL_B]
    win.new_task()
    assert win.context.preview_buttons == {}


class StubSession:
    """Stands in for the run's session (no VM here: this test is about the window).

    It opens a preview as the real session's manager does, then ends when told to.
    """

    release: asyncio.Event

    def __init__(self, req: Any, sink: Any, asker: Any, *, paths: Any) -> None:
        self.sink = sink
        self.ended = StubSession.release

    async def __aenter__(self) -> StubSession:
        self.sink(preview_event("t1", 8000, "opened", URL_A))
        await self.ended.wait()
        raise RuntimeError("the VM stopped")

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_previews_are_cleared_when_the_task_stops(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session that ends without a "closed" event per port (a crash) leaves no preview."""
    StubSession.release = asyncio.Event()
    win = window(qtbot, gui_paths)
    win.model.session_factory = StubSession
    ctl = task(win, "t1")
    ctl.status = "idle"
    win.select(ctl)

    async def scenario() -> None:
        ctl.submit("serve something", win.run_options(None))
        await until(lambda: 8000 in win.context.preview_buttons, 10, "the preview is listed")
        StubSession.release.set()
        await until(lambda: not ctl.live, 10, "the run ends")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    assert ctl.previews == {}
    assert win.context.preview_buttons == {}


def test_the_preview_question_shows_each_answers_rule_and_returns_the_choice(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.widgets import PreviewSheet

    win = window(qtbot, gui_paths)
    q = question_for(8000, TaskContext(task_id="t1", working_folder=tmp_path))
    answers: list[PreviewChoice | None] = []

    async def serve(run: FakeRun, prompt: str) -> None:
        answers.append(await run.asker.preview(q))

    win.model.session_factory = FakeRun.factory(serve)

    async def scenario() -> PreviewChoice | None:
        say(win, "serve the page")
        ctl = win.current()
        await until(lambda: win.preview_sheet is not None, 10, "the preview question shows")
        sheet: PreviewSheet = win.preview_sheet
        assert sheet.what.text() == q.question
        assert [b.text() for b in sheet.buttons.values()] == [c.value for c in PreviewChoice]
        for choice in PreviewChoice:
            assert sheet.rule_labels[choice].text() == q.rules[choice].human()
        assert ctl.label == "waiting for you"
        assert "waiting for you" in win.header.text()
        sheet.buttons[PreviewChoice.FOLDER].click()
        await until(lambda: answers, 10, "the answer reaches the runner")
        await until(lambda: win.preview_sheet is None, 10, "the question goes away")
        assert ctl.preview_questions == []
        return answers[0]

    assert qloop.run_until_complete(asyncio.wait_for(scenario(), 30)) is PreviewChoice.FOLDER
