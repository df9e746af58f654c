"""The first-run demo in the real window, real runner, real QEMU and the real pi (issue 16).

One VM, one scenario, each step a defect the new-user drive found:

* the demo asks exactly ONE permission (its rename of notes.txt: a move of the person's
  file, which the change set asks; its new file is brought in without a question), shown
  with the person's paths, while the header, rail and composer all tell the same story;
* closing the window with no system tray asks; "Minimise" keeps the task running;
* the elapsed time keeps going while the task waits for the person;
* pausing while a permission is open, then answering it: the task stays "paused"
  (the runner's pause state is the truth) and the VM stays frozen until Continue;
* the new file and the rename appear in "Files changed"; the finished task's VM stays
  warm with an "End task" button; Undo on it powers the warm VM off and puts the folder
  back, one turn (change set) at a time;
* switching to another task carries nothing over (header, usage, diff title);
* after a restart of the window, "Files changed" is filled from the checkpoints.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.gui.widgets import NoticeRow
from piwork.models.demo import DEMO_FILE, TIDY_FROM, TIDY_TO
from piwork.policy import Choice
from piwork.runner import EventKind, RunEvent
from piwork.tasks import TaskStore
from tests.helpers.gui import shown, until

pytestmark = pytest.mark.vm

BOOT = 360.0  # one TCG boot on a shared, loaded 2-core machine
STEP = 180.0


def rail_text(win: Any) -> str:
    """The selected task's row in the rail."""
    return str(win.rail.item(win.tasks.index(win.current())).text())


def header(win: Any) -> str:
    return str(win.header.text())


def test_the_first_run_demo_tells_one_truth_and_done_is_done(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.window import MainWindow

    # An earlier task, so there is something to switch to.
    (tmp_path / "earlier").mkdir()
    store = TaskStore(gui_paths.tasks)
    earlier = store.create("An earlier task", tmp_path / "earlier")
    store.close()

    async def scenario() -> None:
        win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=600), tray=False)
        qtbot.addWidget(win)
        await shown(win)
        win.demo_base = tmp_path / "piwork-demo"
        events: list[RunEvent] = []
        try:
            ctl = win.start_demo()
            ctl.run_event.connect(events.append)
            folder = ctl.folder
            assert folder is not None and not (folder / DEMO_FILE).exists()
            assert "New task" not in header(win)

            # One permission: the rename of notes.txt (the new summary came in unasked).
            await until(lambda: ctl.permissions, BOOT, "the demo asks")
            assert len(ctl.permissions) == 1
            assert win.sheet is not None
            sheet_text = win.sheet.what.text()
            assert TIDY_FROM in sheet_text and "/mnt/" not in sheet_text, sheet_text
            assert win.sheet.detail is not None
            assert f"{TIDY_FROM} -> {TIDY_TO}" in win.sheet.detail.text()
            assert (folder / DEMO_FILE).is_file() and (folder / TIDY_FROM).is_file()
            assert "waiting for you" in header(win) and ctl.label == "waiting for you"
            assert "waiting for you" in str(win.rail.item(0).text())
            assert win.composer.placeholderText().startswith("Enter steers")
            # The clock does not freeze while the task waits for the person.
            t1 = ctl.elapsed
            await asyncio.sleep(1.5)
            assert ctl.elapsed >= t1 + 1.0

            # No tray: closing asks, and "Minimise" keeps the task running.
            win.close()
            box = win.close_box
            assert box.isVisible() and "still running" in box.text()
            [keep] = [b for b in box.buttons() if b.text() == "Minimise"]
            keep.click()
            await until(win.isMinimized, 10, "the window is minimised")
            assert ctl.live and ctl.permissions
            win.show_from_tray()
            await shown(win)

            # Pause while the question is open, then answer it: still paused, VM frozen.
            win.pause_btn.click()
            await until(lambda: ctl.paused, 60, "the VM pauses")
            await until(lambda: "paused" in header(win), 5, "the header says so")
            assert ctl.label == "paused" and "paused" in rail_text(win)
            assert win.pause_btn.text() == "Continue"
            assert win.sheet is not None
            win.sheet.buttons[Choice.ALLOW_ONCE].click()
            await until(lambda: not ctl.permissions, 30, "the answer is taken")
            await asyncio.sleep(2.0)
            assert ctl.paused and ctl.label == "paused" and "paused" in header(win)
            tool_ends = sum(1 for e in events if e.kind is EventKind.TOOL_END)
            await asyncio.sleep(2.0)
            assert sum(1 for e in events if e.kind is EventKind.TOOL_END) == tool_ends
            win.pause_btn.click()  # Continue
            await until(lambda: ctl.label == "done", STEP, "the demo finishes")

            # The change is there and in "Files changed"; the VM is warm; End task is offered.
            assert (folder / DEMO_FILE).is_file()
            assert (folder / TIDY_TO).is_file() and not (folder / TIDY_FROM).exists()
            agent_text = " ".join(m.text for m in win.conversation(ctl).messages())
            assert "did not write" not in agent_text and "Done." in agent_text
            await until(lambda: DEMO_FILE in win.context.changed, 30, "Files changed")
            # Only the person's folder: nothing of the task's outputs is listed (issue 33
            # item 5).
            assert not [f for f in win.context.changed if f.startswith("outputs/")]
            assert ctl.warm and win.end_btn.isEnabled()
            assert win.composer.placeholderText().startswith("Enter continues")
            tokens = ctl.tokens
            assert tokens > 0

            # Another task: nothing of the demo carries over.
            other = next(c for c in win.tasks if c.task_id == earlier.id)
            win.select(other)
            assert "An earlier task" in header(win)
            assert "Tokens 0 " in win.context.usage.text()
            assert win.context.preview_title.text() == "Preview"
            assert DEMO_FILE not in win.context.changed
            assert not win.end_btn.isEnabled() and not win.pause_btn.isEnabled()
            win.select(ctl)
            assert "Show me what piwork does" in header(win) and ctl.label in header(win)
            assert f"Tokens {tokens:,}" in win.context.usage.text()

            # Undo on the finished task: the warm VM powers off first, then the undo runs.
            # Two turns changed the folder (a change set per model call): the summary's,
            # then the rename's, the newest first and selected.
            panel = win.context
            await until(lambda: len(panel.turn_changes) == 2, 30, "the turns load")
            assert panel.undo_btn.isEnabled()
            panel.undo_btn.click()
            await until(lambda: (folder / TIDY_FROM).is_file(), STEP, "the rename's undo")
            assert not (folder / TIDY_TO).exists() and (folder / DEMO_FILE).is_file()
            assert not ctl.live

            def select_the_summarys_turn() -> bool:
                for i in range(panel.turns.topLevelItemCount()):
                    top = panel.turns.topLevelItem(i)
                    kids = [top.child(j).text(0) for j in range(top.childCount())]
                    if any(DEMO_FILE in k for k in kids):
                        panel.turns.setCurrentItem(top)
                        return panel.undo_btn.isEnabled()
                return False

            await until(select_the_summarys_turn, 30, "the summary's turn")
            panel.undo_btn.click()
            await until(lambda: not (folder / DEMO_FILE).exists(), STEP, "the summary's undo")
            assert (folder / TIDY_FROM).is_file() and not (folder / TIDY_TO).exists()
            await until(lambda: DEMO_FILE not in panel.changed, 30, "the list follows")
            live = {
                r.call_id: r.duration
                for r in win.conversation(ctl).tool_rows()
                if r.duration is not None
            }
            assert not ctl.live and not win.end_btn.isEnabled()
            statuses = [e.data for e in events if e.kind in (EventKind.STATUS, EventKind.DONE)]
            assert ctl.label == "done", (ctl.status, ctl.reason, statuses)
        finally:
            await win.quit_cleanly(exit_app=False)

        # A new window (a restart): the turns and the undo come from the checkpoints,
        # the history from the transcript, as it was watched (issue 33 item 8).
        win2 = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
        qtbot.addWidget(win2)
        again = next(c for c in win2.tasks if c.task_id == ctl.task_id)
        win2.select(again)
        await until(lambda: win2.context.turn_changes, 30, "the turns after restart")
        assert win2.context.redo_btn.isEnabled() and DEMO_FILE not in win2.context.changed
        rows = {r.call_id: r for r in win2.conversation(again).tool_rows()}
        assert live and set(live) <= set(rows), (live, list(rows))
        for call, took in live.items():
            replayed = rows[call].duration
            assert replayed is not None and abs(replayed - took) < 1.5, (call, took, replayed)
            assert "…" not in rows[call].head.text()
        notices = [n.text() for n in win2.conversation(again).findChildren(NoticeRow)]
        done = [n for n in notices if n.startswith("— Done · ")]
        assert done and not done[0].startswith("— Done · 0 tokens"), notices
        assert win2.crash_banner is None  # a clean quit is not a crash
        await win2.quit_cleanly(exit_app=False)

    started = time.monotonic()
    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout=1200))
    print(f"first-run demo scenario: {time.monotonic() - started:.0f} s")
