"""The window speaks the person's language (issue 16 item 6): their paths, plain words."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.conversation import technical_notice
from piwork.gui.prefs import Prefs
from piwork.gui.state import NEW_TASK_HINT, hint_for
from piwork.gui.words import permission_line, person_paths
from piwork.run.pool import Pool
from piwork.runner import EventKind, RunEvent


def test_guest_paths_read_as_paths_in_the_persons_folder() -> None:
    assert person_paths("cat /mnt/work/src/a.py") == "cat src/a.py"
    assert person_paths("ls /mnt/work") == "ls ."
    assert person_paths("/mnt/outputs/report.csv") == "outputs/report.csv"
    assert person_paths("/mnt/workshop/x") == "/mnt/workshop/x"  # not the folder


def test_permission_lines_say_who_decided_without_echoes() -> None:
    base = {"action": "write", "tool": "write", "target": "write /mnt/work/notes.txt"}
    line = permission_line({**base, "decision": "Allow once", "by": "person"})
    assert line == "You allowed: change notes.txt"
    assert "write write" not in (line or "")
    cancelled = permission_line({**base, "decision": "cancelled", "by": "cancelled"})
    assert cancelled == "Question withdrawn (the task stopped): change notes.txt"
    assert permission_line({**base, "decision": "ask", "by": None}) is None
    ruled = permission_line(
        {"action": "shell", "tool": "bash", "target": "make test", "decision": "Allow once",
         "by": "rule", "rule": "allow shell make (global)"}
    )  # fmt: skip
    assert ruled == "Allowed by the rules: make test"  # a plain command: nothing to add
    outside = permission_line(
        {"action": "outside-scope", "tool": "bash", "target": "python3 -m venv /root/venv",
         "decision": "Allow once", "by": "person"}
    )  # fmt: skip
    assert outside == "You allowed: python3 -m venv /root/venv (reaches outside the folder)"
    denied = permission_line({**base, "decision": "Deny", "by": "no-terminal"})
    assert denied == "Denied (nobody was there to ask): change notes.txt"


def test_start_up_details_are_folded_away() -> None:
    assert technical_notice("accelerator: tcg (/dev/kvm exists but the CPU advertises no vmx/svm)")
    assert technical_notice(
        "using the offline demo model (scripted, not a real LLM); choose a real one with "
        "--model PROVIDER/MODEL"
    )
    assert not technical_notice("pi has not confirmed the stop within 5.0 s")


def test_the_composer_says_what_enter_does_in_each_state(
    qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.controller import TaskController

    assert "Enter starts" in hint_for(None) == NEW_TASK_HINT
    ctl = TaskController(Pool(1, paths=gui_paths), status="stopped", reason="completed")
    assert hint_for(ctl.state).startswith("Enter continues this task")
    ctl.status = "queued"
    assert "Queued" in hint_for(ctl.state)


def test_boot_stages_fold_into_one_row_and_a_stop_is_no_model_error(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.widgets import NoticeRow
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    ctl = win.model.new(task_id=None, title="t", status="running")
    win.model.add(ctl)
    ev = [
        RunEvent(EventKind.BOOT, {"stage": "qemu", "seconds": 0.4}, 0.4, None),
        RunEvent(EventKind.NOTICE, {"message": "accelerator: tcg (no vmx/svm)"}, 0.5, None),
        RunEvent(EventKind.BOOT, {"stage": "kernel", "seconds": 3.1}, 3.1, None),
        RunEvent(EventKind.READY, {"seconds": 9.0}, 9.0, None),
    ]
    for e in ev:
        ctl.on_run_event(e)  # what the runner tells the task
    conv = win.conversation(ctl)
    rows = [w for w in conv.findChildren(NoticeRow)]
    assert [r.text() for r in rows] == ["The agent is ready (9 s to start)"]
    assert "vmx/svm" in rows[0].toolTip() and "kernel" in rows[0].toolTip()
    ctl.stopping = True
    ctl.on_run_event(RunEvent(EventKind.TEXT_END, {"error": "Request was aborted."}, 1, None))
    ctl.on_run_event(RunEvent(EventKind.STATUS, {"status": "stopped", "reason": "cancelled"}, 1))
    ctl.on_run_event(
        RunEvent(EventKind.DONE, {"message": "stopped by the person", "tokens": 10}, 1, None)
    )
    texts = [r.text() for r in conv.findChildren(NoticeRow)]
    assert not any("aborted" in t or "error" in t for t in texts), texts
    assert texts[-1] == "— Stopped by you · 10 tokens, 0 steps —"


def test_the_setup_screen_keeps_cpu_flags_in_a_tooltip(qtbot: QtBot, gui_paths: Paths) -> None:
    from piwork.doctor import Check
    from piwork.gui.setup_screen import SetupScreen

    accel = Check(
        "accelerator",
        True,
        "tcg: /dev/kvm exists but the CPU advertises no vmx/svm (nested KVM)",
        warning=True,
    )
    screen = SetupScreen(gui_paths, checks=lambda _p: [accel])
    qtbot.addWidget(screen)
    item = screen.list.item(0)
    assert "vmx/svm" not in item.text() and "software emulation" in item.text()
    assert "vmx/svm" in item.toolTip()


def test_a_reopened_task_says_its_decisions_and_stops_in_the_same_words(tmp_path: Path) -> None:
    from piwork.gui.history import load_history
    from piwork.tasks.transcript import TranscriptWriter

    path = tmp_path / "transcript.jsonl"
    base = {"action": "write", "tool": "write", "target": "write /mnt/work/notes.txt"}
    with TranscriptWriter(path) as w:
        w.append("permission", {**base, "decision": "ask", "by": None})
        w.append("permission", {**base, "decision": "Allow once", "by": "person"})
        w.append("status", {"from": "running", "to": "stopped", "stop": {"reason": "cancelled"}})

    class Notices:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def notice(self, text: str, kind: str = "notice") -> None:
            self.lines.append(text)

        def deny(self, call_id: str) -> None:
            pass

        def interrupt(self) -> None:
            pass

    sink = Notices()
    load_history(path, sink)  # type: ignore[arg-type]
    assert sink.lines == ["You allowed: change notes.txt", "— Stopped by you · 0 tokens, 0 steps —"]


def test_runner_messages_name_tasks_by_title_and_say_enter_not_a_command(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 13: the runner's messages (shared with the CLI) name a task by its
    id and say `piwork resume ID`; the window says "this task", the other task's title,
    and Enter. A command only a terminal can do keeps the id it needs."""
    from piwork.gui.widgets import NoticeRow
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    other = win.model.new(task_id="aaaaaaaaaaaa", title="tidy the notes", status="stopped")
    win.model.add(other)
    ctl = win.model.new(task_id="3f2a1b2c4d5e", title="fix the tests", status="running")
    win.model.add(ctl)
    win.select(ctl)
    for kind, message in (
        (EventKind.NOTICE, "task aaaaaaaaaaaa holds the folder's lock (since 12:00)"),
        (
            EventKind.ERROR,
            "the VM exited while starting: no memory (QEMU exit 1). `piwork resume "
            "3f2a1b2c4d5e` tries again; if it fails again, `piwork doctor` checks QEMU",
        ),
        (
            EventKind.ERROR,
            "task 3f2a1b2c4d5e has used up its turns limit; resume it with a higher "
            "--max-turns (e.g. `piwork resume 3f2a1b2c4d5e --max-turns ...`)",
        ),
    ):
        ctl.on_run_event(RunEvent(kind, {"message": message}, 1.0, ctl.task_id))
    ctl.on_run_event(RunEvent(EventKind.STATUS, {"status": "stopped", "reason": "error"}, 1))
    ctl.on_run_event(
        RunEvent(
            EventKind.DONE,
            {"reason": "error", "message": "pi exited; `piwork resume 3f2a1b2c4d5e` continues"},
            2.0,
            ctl.task_id,
        )
    )
    texts = [r.text() for r in win.conversation(ctl).findChildren(NoticeRow)]
    assert texts[0] == "the task “tidy the notes” holds the folder's lock (since 12:00)"
    assert texts[1].startswith("the VM exited while starting: no memory (QEMU exit 1). A new ")
    assert "A new message to this task (Enter below) tries again" in texts[1]
    assert texts[2].startswith("This task has used up its turns limit")
    assert texts[2].endswith("(e.g. `piwork resume 3f2a1b2c4d5e --max-turns ...`)")  # a command
    assert "a new message to this task (Enter below) continues" in texts[3]
    assert not any("aaaaaaaaaaaa" in t for t in texts)
    assert sum("3f2a1b2c4d5e" in t for t in texts) == 1
