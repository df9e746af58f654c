"""The window says what is true in every state, in the person's words (issue 33).

These drive the real window the way a person does (keys, clicks, visible text) over
``FakeRun``, the runner's double: what is tested is the window's own logic, what it
shows for each state and what each key does. The same states from a real VM are in
tests/gui/test_gui_vm_session.py and test_gui_vm_states.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.gui.state import HINTS, NEW_TASK_HINT, Phase
from piwork.gui.widgets import MessageView, NoticeRow, ToolRow
from piwork.policy import Action
from piwork.runner import EventKind
from piwork.tasks import TaskStore
from tests.helpers.gui import (
    FakeRun,
    button,
    message_box,
    permission_request,
    press,
    say,
    shown,
    until,
)


def window(qtbot: QtBot, paths: Paths, script: Any, **prefs: Any) -> Any:
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=paths, prefs=Prefs(keep_warm_seconds=600, **prefs), tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = FakeRun.factory(script)
    return win


def rail_state(win: Any, task: Any) -> str:
    """The second line of the task's row in the rail: its state as the rail says it."""
    return str(win.rail.item(win.tasks.index(task)).text().split("\n")[1])


def agree(win: Any, task: Any, phase: Phase, label: str) -> None:
    """Every view says the same about the task: header, rail, composer hint, Send/Stop."""
    assert task.state.phase is phase, (task.state, phase)
    assert f"— {label}" in win.header.text(), win.header.text()
    assert rail_state(win, task).lstrip("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ").startswith(label), rail_state(win, task)
    assert win.composer.placeholderText() == HINTS[phase]
    assert win.send_btn.text() == ("Stop" if task.state.can_stop else "Send")


def test_every_view_says_the_same_state_and_enter_does_what_the_hint_says(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 items 2 and 12: the hint, the header and the rail from one state; "Enter
    steers" only where Enter steers; a paused task says "paused" in the rail too."""
    asked: list[object] = []

    async def work(run: FakeRun, prompt: str) -> None:
        run.emit(EventKind.TEXT, delta="Looking at the folder. ")
        asked.append(await run.asker.permission(permission_request(Action.WRITE, "/mnt/work/a")))
        await run.release.wait()

    win = window(qtbot, gui_paths, work)

    async def scenario() -> None:
        await shown(win)
        assert win.composer.placeholderText() == NEW_TASK_HINT
        say(win, "tidy the folder")
        task = win.current()
        await until(lambda: task.state.phase is Phase.WAITING, 10, "the question")
        agree(win, task, Phase.WAITING, "waiting for you")
        # Enter steers while it works (the hint says so).
        say(win, "only the docs, please")
        await until(lambda: task.session.steered, 10, "the steer")
        assert task.session.steered == ["only the docs, please"]
        button(win.sheet, "Allow once").click()
        await until(lambda: task.state.phase is Phase.RUNNING, 10, "running again")
        agree(win, task, Phase.RUNNING, "running")
        # Paused: Enter keeps the text (a frozen VM takes no message), the rail says so.
        win.pause_btn.click()
        await until(lambda: task.state.phase is Phase.PAUSED, 10, "paused")
        agree(win, task, Phase.PAUSED, "paused")
        assert win.pause_btn.text() == "Continue"
        say(win, "are you there?")
        await asyncio.sleep(0.2)
        assert win.composer.toPlainText() == "are you there?"
        assert task.session.steered == ["only the docs, please"]
        win.pause_btn.click()
        await until(lambda: task.state.phase is Phase.RUNNING, 10, "continued")
        task.session.release.set()
        # Stopped: Enter continues the task, never "steers".
        QTest.keyClick(win.composer, Qt.Key.Key_Escape)
        press(message_box("Stop the task?"), "Stop")
        await until(lambda: task.state.phase is Phase.STOPPED, 10, "stopped")
        agree(win, task, Phase.STOPPED, "stopped by you")
        assert task.state.warm and win.end_btn.isEnabled()
        win.composer.clear()
        say(win, "go on")
        await until(lambda: win.sheet is not None, 10, "the next question")
        assert task.state.phase is Phase.WAITING
        button(win.sheet, "Deny").click()
        await until(lambda: task.state.phase is Phase.DONE, 10, "done")
        agree(win, task, Phase.DONE, "done")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 60))


def test_a_queued_task_says_queued_everywhere(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    async def work(run: FakeRun, prompt: str) -> None:
        await run.release.wait()

    win = window(qtbot, gui_paths, work, max_tasks=1)

    async def scenario() -> None:
        await shown(win)
        say(win, "first")
        first = win.current()
        await until(lambda: first.state.phase is Phase.RUNNING, 10, "the first runs")
        win.new_task()
        say(win, "second")
        second = win.current()
        agree(win, second, Phase.QUEUED, "queued")
        agree_first = rail_state(win, first)
        assert "running" in agree_first
        first.session.release.set()
        await until(lambda: second.state.phase is Phase.RUNNING, 10, "the second starts")
        agree(win, second, Phase.RUNNING, "running")
        second.session.release.set()
        await until(lambda: second.state.phase is Phase.DONE, 10, "done")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 60))


def test_after_choosing_a_folder_typing_goes_to_the_composer(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33 item 4: the keys typed after the folder dialog are the task, not a second
    press of "Folder…"."""
    opened: list[int] = []

    def dialog(*_a: object, **_k: object) -> str:
        opened.append(1)
        return str(tmp_path)

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", dialog)
    win = window(qtbot, gui_paths, None)

    async def scenario() -> None:
        await shown(win)
        win.folder_btn.setFocus()
        QTest.keyClick(win.folder_btn, Qt.Key.Key_Space)  # the person picks a folder
        assert opened == [1]
        QTest.keyClicks(QApplication.focusWidget(), "fix the tests")
        assert win.composer.toPlainText() == "fix the tests"
        assert opened == [1] and str(tmp_path) in win.compose.folder_lbl.text()

    qloop.run_until_complete(scenario())


def test_a_long_title_keeps_its_state_visible_in_the_rail(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 12: a title that would wrap is cut to one line; the state keeps its own."""
    store = TaskStore(gui_paths.tasks)
    store.create("Rewrite the parser so that dates before 1900 and after 2100 both parse")
    store.close()
    win = window(qtbot, gui_paths, None)
    win.show()
    item = win.rail.item(0)
    qtbot.waitUntil(lambda: item.text().split("\n")[0].endswith("…"), timeout=5000)
    first, second = item.text().split("\n")
    assert second.startswith("new · ")  # its state, and when it last did something
    fm = win.rail.fontMetrics()
    assert fm.horizontalAdvance(first) <= win.rail.viewport().width()
    assert win.rail.visualItemRect(item).height() >= 2 * fm.lineSpacing()
    assert "1900 and after 2100" in item.toolTip()  # the whole title, on hover


def test_a_steer_never_cuts_the_agents_message_in_two(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 11."""

    async def work(run: FakeRun, prompt: str) -> None:
        run.emit(EventKind.TEXT, delta="I am reading the code, ")
        await until(lambda: run.steered, 10, "the steer")
        run.emit(EventKind.TEXT, delta="and now the tests.")
        run.emit(EventKind.TEXT_END)

    win = window(qtbot, gui_paths, work)

    async def scenario() -> None:
        await shown(win)
        say(win, "look around")
        task = win.current()
        await until(lambda: task.session is not None, 10, "the run")
        await until(lambda: win.conversation(task).messages()[1:], 10, "the agent writes")
        say(win, "check the tests too")
        await until(lambda: task.state.phase is Phase.DONE, 10, "done")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    task = win.current()
    msgs = win.conversation(task).messages()
    agent = [m for m in msgs if m.who == "agent"]
    assert len(agent) == 1
    assert agent[0].text == "I am reading the code, and now the tests."
    assert [m.who for m in msgs] == ["you", "agent", "you (steer)"]


def test_a_denied_step_says_denied_not_error(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 15."""

    async def work(run: FakeRun, prompt: str) -> None:
        run.emit(EventKind.TOOL_START, id="c1", name="bash", arg="rm -r build")
        run.emit(
            EventKind.PERMISSION,
            action="delete",
            tool="bash",
            target="rm -r build",
            decision="Deny",
            by="person",
            call="c1",
        )
        run.emit(EventKind.TOOL_END, id="c1", name="bash", ok=False, text="denied by the user")
        run.emit(EventKind.TOOL_START, id="c2", name="bash", arg="make")
        run.emit(EventKind.TOOL_END, id="c2", name="bash", ok=False, text="make: *** Error 2")

    win = window(qtbot, gui_paths, work)

    async def scenario() -> None:
        say(win, "clean up")
        task = win.current()
        await until(lambda: task.state.phase is Phase.DONE, 10, "done")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    rows = {r.call_id: r.head.text() for r in win.findChildren(ToolRow)}
    assert "⊘ denied" in rows["c1"] and "error" not in rows["c1"]
    assert "✗ failed" in rows["c2"]


def test_continuing_after_a_crash_sends_nothing_under_you(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 9: the message piwork sends to resume is piwork's, shown as such."""
    store = TaskStore(gui_paths.tasks)
    task = store.create("a task the crash cut off")
    lease = store.claim(task.id)
    store.transition(task.id, "running")
    lease.release()  # its owner is gone: the next start finds it interrupted
    store.close()
    prompts: list[str] = []

    async def work(run: FakeRun, prompt: str) -> None:
        prompts.append(prompt)

    win = window(qtbot, gui_paths, work)

    async def scenario() -> None:
        assert win.crash_banner is not None
        button(win.crash_banner, "Continue it").click()
        t = win.current()
        await until(lambda: t.state.phase is Phase.DONE, 10, "the resumed run ends")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    assert prompts and "piwork stopped unexpectedly" in prompts[0]  # the agent is told
    conv = win.conversation(win.current())
    assert not [m for m in conv.messages() if m.who.startswith("you")]
    notices = [n.text() for n in conv.findChildren(NoticeRow)]
    assert any("continue where the crash cut it off" in n for n in notices), notices


def test_a_reopened_task_shows_what_its_transcript_holds(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 8: after a restart each step has its duration and how it ended, a
    step that never ended says so (no spinner), and each run its tokens and steps."""
    store = TaskStore(gui_paths.tasks)
    task = store.create("an older task")
    store.close()

    def pi_tool(kind: str, call: str, **more: Any) -> dict[str, Any]:
        return {"type": kind, "toolCallId": call, "toolName": "bash", **more}

    recs: list[tuple[str, str, Any]] = [
        ("10:00:00", "prompt", {"message": "build it"}),
        ("10:00:01", "model_call", {"inputTokens": 1000, "outputTokens": 200}),
        ("10:00:02", "pi", pi_tool("tool_execution_start", "c1", args={"command": "make"})),
        (
            "10:00:09.5",
            "pi",
            pi_tool("tool_execution_end", "c1", result={"content": []}, isError=False),
        ),
        ("10:00:10", "pi", pi_tool("tool_execution_start", "c2", args={"command": "rm -r out"})),
        ("10:00:11", "permission", {"action": "delete", "tool": "bash", "target": "rm -r out",
                                    "decision": "Deny", "by": "person", "call": "c2"}),
        ("10:00:11", "pi", pi_tool("tool_execution_end", "c2", result={}, isError=True)),
        ("10:00:12", "model_call", {"inputTokens": 1300, "outputTokens": 50}),
        ("10:00:13", "status", {"from": "running", "to": "stopped",
                                "stop": {"reason": "completed"}}),
        ("10:01:00", "prompt", {"message": "and deploy"}),
        ("10:01:01", "model_call", {"inputTokens": 10, "outputTokens": 5}),
        ("10:01:02", "pi", pi_tool("tool_execution_start", "c3", args={"command": "deploy"})),
        ("10:05:00", "status", {"from": "running", "to": "interrupted"}),
    ]  # fmt: skip
    transcript = gui_paths.tasks / task.id / "transcript.jsonl"
    with transcript.open("a") as f:
        for i, (t, kind, data) in enumerate(recs):
            rec = {"seq": 100 + i, "t": f"2026-01-01T{t}Z", "kind": kind, "data": data}
            f.write(json.dumps(rec) + "\n")
    win = window(qtbot, gui_paths, None)
    conv = win.conversation(win.current())
    rows = {r.call_id: r.head.text() for r in conv.findChildren(ToolRow)}
    assert rows["c1"].endswith("✓  7.5s"), rows
    assert "⊘ denied  1.0s" in rows["c2"], rows
    assert "■ interrupted" in rows["c3"] and "…" not in rows["c3"], rows
    notices = [n.text() for n in conv.findChildren(NoticeRow)]
    assert "— Done · 2,550 tokens, 2 steps —" in notices, notices
    assert any(n.startswith("— Interrupted") for n in notices), notices
    assert [m.who for m in conv.findChildren(MessageView)] == ["you", "you"]


def test_a_move_onto_an_existing_file_says_it_replaces_it(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 1: the host looks, now, whether the move's destination is already in
    the person's folder, and the sheet says it will be replaced."""
    import dataclasses

    from piwork.policy import Target

    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "NOTES.md").write_text("my own notes\n")

    def move(src: str, dest: str) -> Any:
        req = permission_request(Action.MOVE, None, f"mv {src} {dest}")
        return dataclasses.replace(
            req,
            paths=(src, dest),
            targets=(
                Target(Action.MOVE, op="move", path=src),
                Target(Action.MOVE, op="move", path=dest),
            ),
        )

    asked = [move("/mnt/outputs/NOTES.md", "/mnt/work/NOTES.md"),
             move("/mnt/outputs/NEW.md", "/mnt/work/NEW.md")]  # fmt: skip
    answers: list[object] = []

    async def work(run: FakeRun, prompt: str) -> None:
        for req in asked:
            answers.append(await run.asker.permission(req))

    win = window(qtbot, gui_paths, work)

    async def scenario() -> None:
        win.new_folder = folder
        say(win, "put the notes in place")
        await until(lambda: win.sheet is not None, 10, "the first move")
        assert "This replaces NOTES.md, already in your folder" in win.sheet.what.text()
        button(win.sheet, "Deny").click()
        await until(lambda: len(answers) == 1 and win.sheet is not None, 10, "the second")
        assert "replaces" not in win.sheet.what.text()  # a new name replaces nothing
        button(win.sheet, "Deny").click()
        await until(lambda: len(answers) == 2, 10, "done")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    assert (folder / "NOTES.md").read_text() == "my own notes\n"


def test_open_in_file_manager_says_what_happened(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33 item 15: where no file manager answers, the person gets the path."""
    from PySide6.QtGui import QDesktopServices

    from piwork.gui.context import ContextPanel

    answers = [False, True]
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: answers.pop(0))
    panel = ContextPanel(gui_paths)
    qtbot.addWidget(panel)
    panel.show()
    panel.show_task("t1", tmp_path, None)
    button(panel, "Open in file manager").click()
    assert panel.open_note.isVisible()
    assert (
        "No file manager answered" in panel.open_note.text()
        and str(tmp_path) in panel.open_note.text()
    )
    button(panel, "Open in file manager").click()
    assert panel.open_note.text() == f"Opened in your file manager: {tmp_path}"


def test_the_composer_row_keeps_its_place_as_the_task_changes_state(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 15: Pause and End keep their place (disabled, not hidden), so the
    composer does not jump as they become useful."""

    async def work(run: FakeRun, prompt: str) -> None:
        await run.release.wait()

    win = window(qtbot, gui_paths, work)
    places: dict[str, Any] = {}

    async def scenario() -> None:
        await shown(win)
        say(win, "a job")
        task = win.current()
        await until(lambda: task.state.phase is Phase.RUNNING, 10, "running")
        await asyncio.sleep(0.2)
        places["running"] = [
            w.geometry()
            for w in (win.composer, win.send_btn, win.compose.folder_lbl, win.pause_btn)
        ]
        assert win.pause_btn.isEnabled() and not win.end_btn.isEnabled()
        task.session.release.set()
        await until(lambda: task.state.phase is Phase.DONE, 10, "done")
        await asyncio.sleep(0.2)
        places["done"] = [
            w.geometry()
            for w in (win.composer, win.send_btn, win.compose.folder_lbl, win.pause_btn)
        ]
        assert not win.pause_btn.isEnabled() and win.end_btn.isEnabled()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    assert places["running"] == places["done"]
