"""The context panel's turns, diffs and undo on a real checkpoint repository (no VM).

The checkpoints are taken by the runner's own recorder (``RunRecorder``) on a
temporary folder, turn by turn as the runner does; the panel reads and undoes
them through ``piwork.checkpoints`` (what ``piwork changes``/``undo`` use), in
a worker thread under the app's qasync loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from piwork.checkpoints import RunRecorder, repo_for
from piwork.config import Paths
from piwork.gui import turns as turns_mod
from piwork.gui.context import ContextPanel
from piwork.gui.text import always_rules
from piwork.gui.turns import MAX_DIFF_LINES, RUNNING_TIP
from piwork.policy import (
    Action,
    AuditLog,
    Choice,
    Decider,
    PermissionRequest,
    PolicyStore,
    TaskContext,
)
from piwork.tasks import TaskStore
from tests.helpers.gui import (
    FakeRun,
    button,
    item,
    message_box,
    permission_request,
    press,
    say,
    tree,
    until,
)

BIG = 5000


def run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


class Recorded:
    """A real task on ``folder`` whose checkpoints the runner's own recorder takes,
    driven turn by turn on the GUI's loop as the runner drives it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        paths: Paths,
        folder: Path,
        title: str,
        on_event: Callable[[dict[str, Any]], None] = lambda _e: None,
    ) -> None:
        store = TaskStore(paths.tasks)
        try:
            self.task = store.create(title, folder)
        finally:
            store.close()
        self.loop = loop
        self.rec = RunRecorder(repo_for(self.task), on_event, turn_start_wait=0.01)
        run(loop, self.rec.start())

    def turn(self) -> None:
        async def go() -> None:
            self.rec.turn_started()
            await self.rec.before_model_call()

        run(self.loop, go())

    def end(self) -> None:
        run(self.loop, self.rec.end())


def two_turns(loop: asyncio.AbstractEventLoop, paths: Paths, folder: Path) -> str:
    """A task whose turn 1 edits a.txt and adds big.txt, and turn 2 edits b.txt."""
    (folder / "a.txt").write_text("alpha\nunchanged line\n")
    (folder / "b.txt").write_text("bravo\n")
    events: list[dict[str, Any]] = []
    recorded = Recorded(loop, paths, folder, "checkpoints in the window", events.append)
    recorded.turn()
    (folder / "a.txt").write_text("ALPHA from turn one\nunchanged line\n")
    (folder / "big.txt").write_text("".join(f"line {i}\n" for i in range(BIG)))
    recorded.turn()
    (folder / "b.txt").write_text("BRAVO from turn two\n")
    recorded.end()
    assert [e["turn"] for e in events] == [1, 2]
    return recorded.task.id


def settle(loop: asyncio.AbstractEventLoop, panel: ContextPanel) -> None:
    run(loop, until(lambda: not panel.loading, 30, "the panel's worker finishes"))


def test_turns_diff_bounds_and_undo_through_the_checkpoints_api(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    task_id = two_turns(qloop, gui_paths, folder)

    # Checkpoint work never runs on the window's (this) thread.
    threads: list[bool] = []
    real_load: Callable[..., Any] = turns_mod.load_turns

    def spy(*a: Any, **kw: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real_load(*a, **kw)

    monkeypatch.setattr(turns_mod, "load_turns", spy)

    panel = ContextPanel(gui_paths)
    qtbot.addWidget(panel)
    panel.show()
    panel.show_task(task_id, folder, None)
    assert panel.loading and not panel.undo_btn.isEnabled()
    settle(qloop, panel)
    assert threads == [False]
    assert tree(panel) == {
        "Turn 2 · 1 modified": ["M  b.txt"],
        "Turn 1 · 1 added, 1 modified": ["M  a.txt", "A  big.txt"],
    }
    assert panel.selected_turn() == 2  # the newest turn, its diff shown
    assert panel.preview.currentWidget() is panel.diff_view
    assert "+BRAVO from turn two" in panel.diff_view.toPlainText()

    # A file's diff: the changed line, coloured by the diff highlighter.
    panel.turns.setCurrentItem(item(panel, 1, "a.txt"))
    text = panel.diff_view.toPlainText()
    assert "-alpha" in text and "+ALPHA from turn one" in text and "big.txt" not in text
    block = panel.diff_view.document().findBlockByNumber(
        next(i for i, ln in enumerate(text.splitlines()) if ln.startswith("+ALPHA"))
    )
    assert block.layout().formats()  # the added line carries the "added" colours
    # A huge diff is bounded, with a note saying how big it is.
    panel.turns.setCurrentItem(item(panel, 1, "big.txt"))
    big = panel.diff_view.toPlainText().splitlines()
    assert big[0].startswith(f"# diff too large, {BIG + 6:,} lines")  # 6 header lines
    assert len(big) == MAX_DIFF_LINES + 2 and big[-1] == big[0]

    # While the task's VM runs the buttons are off and say why; the API refuses too.
    panel.turns.setCurrentItem(item(panel, 2))
    assert panel.undo_btn.isEnabled()
    panel.set_running(True)
    assert not panel.undo_btn.isEnabled() and panel.undo_btn.toolTip() == RUNNING_TIP
    panel.undo_turn()
    assert not panel.loading
    panel.set_running(False)
    settle(qloop, panel)
    store = TaskStore(gui_paths.tasks)
    try:
        with store.claim(task_id):  # another piwork process runs it
            panel.undo_btn.click()
            settle(qloop, panel)
    finally:
        store.close()
    assert "is running" in panel.checkpoints.text()
    assert (folder / "b.txt").read_text() == "BRAVO from turn two\n"

    # The person edited b.txt after the task: the conflict is listed and asked about.
    (folder / "b.txt").write_text("the person's own edit\n")
    panel.undo_btn.click()
    settle(qloop, panel)
    box = panel.conflict_box
    assert isinstance(box, QMessageBox) and "b.txt" in box.informativeText()
    assert box.defaultButton().text() == "Cancel"
    box.defaultButton().click()
    settle(qloop, panel)
    assert (folder / "b.txt").read_text() == "the person's own edit\n"
    assert not panel.redo_btn.isEnabled()
    panel.undo_btn.click()
    settle(qloop, panel)
    assert panel.conflict_box is not None
    [overwrite] = [b for b in panel.conflict_box.buttons() if b.text() == "Overwrite them"]
    overwrite.click()
    settle(qloop, panel)
    # Turn 2 only: b.txt as before turn 2, turn 1's edits kept.
    assert (folder / "b.txt").read_text() == "bravo\n"
    assert (folder / "a.txt").read_text().startswith("ALPHA from turn one")
    assert panel.redo_btn.isEnabled() and "Turn 2 undone" in panel.checkpoints.text()
    # The undo is read back from the checkpoints: a restarted app can undo it too.
    fresh = ContextPanel(gui_paths)
    qtbot.addWidget(fresh)
    fresh.show_task(task_id, folder, None)
    settle(qloop, fresh)
    assert fresh.redo_btn.isEnabled() and "Turn 2 undone" in fresh.checkpoints.text()
    assert fresh.undone is not None and fresh.undone == panel.undone
    panel.redo_btn.click()
    settle(qloop, panel)
    assert (folder / "b.txt").read_text() == "the person's own edit\n"
    assert not panel.redo_btn.isEnabled()


def test_everywhere_for_a_delete_asks_a_second_time_a_command_does_not(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.window import MainWindow

    ctx = TaskContext(task_id="t1", working_folder=tmp_path)
    decider = Decider(PolicyStore(tmp_path / "p.json"), AuditLog(tmp_path / "a.jsonl"))

    def proposed(req: PermissionRequest) -> PermissionRequest:
        # What the runner does before it asks: the policy's own proposals.
        return dataclasses.replace(req, proposals=decider.proposals(req, ctx))

    rm = proposed(permission_request(Action.DELETE, "/mnt/work/x", "rm x"))
    make = proposed(permission_request(Action.SHELL, None, "make test"))
    assert always_rules(rm, Choice.ALWAYS_EVERYWHERE)
    answers: list[object] = []

    async def ask(run: FakeRun, prompt: str) -> None:
        answers.append(await run.asker.permission(rm))
        answers.append(await run.asker.permission(make))

    win = MainWindow(paths=gui_paths, tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = FakeRun.factory(ask)

    async def scenario() -> None:
        folder = tmp_path / "work"
        folder.mkdir()
        win.new_folder = folder
        say(win, "tidy up")
        await until(lambda: win.sheet is not None, 10, "the delete's sheet")
        button(win.sheet, "Always allow everywhere").click()
        box = message_box("Allow in every folder?")
        assert "EVERY task" in box.text() and "delet" in box.informativeText()
        assert box.defaultButton().text() == "Back"
        box.defaultButton().click()
        await asyncio.sleep(0.2)
        assert answers == [] and win.sheet is not None  # back on the sheet, nothing stored
        button(win.sheet, "Always allow everywhere").click()
        press(message_box("Allow in every folder?"), "Store the rule")
        await until(lambda: answers == [Choice.ALWAYS_EVERYWHERE], 10, "the delete's answer")
        # A command's "everywhere" rule is not asked about a second time.
        await until(lambda: win.sheet is not None and "make" in win.sheet.what.text(), 10, "make")
        button(win.sheet, "Always allow everywhere").click()
        await until(lambda: len(answers) == 2, 10, "the command's answer")
        assert answers[1] is Choice.ALWAYS_EVERYWHERE
        assert message_box("Allow in every folder?") is None

    qloop.run_until_complete(scenario())


def test_a_running_turn_is_listed_only_once_the_task_stops(
    qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """While the VM runs, reading the open turn would checkpoint the folder again on every
    refresh: the panel lists closed turns then, and the open one once the task is off."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    recorded = Recorded(qloop, gui_paths, folder, "open turn")
    task = recorded.task
    recorded.turn()
    (folder / "a.txt").write_text("A\n")
    recorded.turn()  # turn 2 is open: no checkpoint after it yet
    (folder / "b.txt").write_text("b\n")
    running = turns_mod.load_turns(task.id, gui_paths, include_open=False)
    assert [t.turn for t in running.turns] == [1] and running.undone is None
    stopped = turns_mod.load_turns(task.id, gui_paths)
    assert {t.turn: [f.path for f in t.files] for t in stopped.turns} == {
        1: ["a.txt"],
        2: ["b.txt"],
    }


def test_a_follow_up_that_changes_the_file_again_shows_its_new_diff(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 10: the diff pane does not stay on an older turn once a newer turn
    changed files (here the same file, which stays selected in the new turn)."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "notes.md").write_text("one\n")
    recorded = Recorded(qloop, gui_paths, folder, "follow-ups")
    recorded.turn()
    (folder / "notes.md").write_text("one\ntwo\n")
    recorded.turn()  # turn 1 closed: it added "two"
    panel = ContextPanel(gui_paths)
    qtbot.addWidget(panel)
    panel.show()
    panel.show_task(recorded.task.id, folder, None, running=True)
    settle(qloop, panel)
    panel.tabs.setCurrentIndex(1)
    panel.turns.setCurrentItem(item(panel, 1, "notes.md"))
    assert "+two" in panel.diff_view.toPlainText()
    # The follow-up's turn changes the same file; the runner says so when it ends.
    (folder / "notes.md").write_text("one\ntwo\nthree\n")
    recorded.end()
    panel.set_running(False)
    settle(qloop, panel)
    assert panel.selected_turn() == 2
    assert "+three" in panel.diff_view.toPlainText() and "+two" not in panel.diff_view.toPlainText()
    assert panel.preview_title.text() == "Diff — turn 2, notes.md"


def test_files_changed_lists_the_folder_as_it_is_and_follows_an_undo(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 5: a file the agent only passed through its outputs is not listed,
    a click on a listed file previews it, and an undo takes the file off the list."""
    folder = tmp_path / "work"
    folder.mkdir()
    recorded = Recorded(qloop, gui_paths, folder, "files changed")
    recorded.turn()
    (folder / "REPORT.md").write_text("# the report\n")
    recorded.end()
    panel = ContextPanel(gui_paths)
    qtbot.addWidget(panel)
    panel.show()
    panel.show_task(recorded.task.id, folder, gui_paths.tasks / recorded.task.id / "outputs")
    # What the watcher saw while it ran: the draft made in the outputs, then moved out.
    panel.note_change("outputs/REPORT.md", "added")
    panel.note_change("outputs/REPORT.md", "deleted")
    settle(qloop, panel)
    shown = [panel.files.item(i).text() for i in range(panel.files.count())]
    assert shown == ["A  REPORT.md"]
    panel.files.setCurrentRow(0)
    run(qloop, until(lambda: "the report" in panel.preview_text.toPlainText(), 10, "preview"))
    panel.tabs.setCurrentIndex(1)
    panel.undo_btn.click()
    settle(qloop, panel)
    assert not (folder / "REPORT.md").exists()
    assert panel.files.count() == 0 and panel.changed == {}
