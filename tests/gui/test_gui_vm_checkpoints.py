"""The context panel's turns, diff and undo for a real task: the real window, the real
runner, real QEMU and the real pi, a scripted model that edits files across two turns.

One boot. While the VM runs, Undo is disabled and says why; once it is off, the
panel lists turn 1 and turn 2 with the right files, the diff shows the changed
line, "Undo this turn" on turn 2 restores turn 2's files only, and "Undo the
undo" brings them back: all through ``piwork.checkpoints`` (``piwork undo``'s API).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.gui.turns import RUNNING_TIP
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, edit, write
from piwork.runner import EventKind, RunEvent
from tests.helpers.gui import BOOT, STEP, item, router, scripted_provider, send, shown, tree, until

pytestmark = pytest.mark.vm


def test_the_panel_shows_each_turn_and_undoes_one_in_a_real_task(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.window import MainWindow

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "keep.txt").write_text("one\ntwo\n")
    (folder / "notes.txt").write_text("old line\n")
    scripts = {
        "[CK]": [
            ToolCalls(
                [
                    write("notes.txt", "new line from turn 1\n", id="t1_notes"),
                    write("t1.txt", "turn one\n", id="t1_new"),
                ]
            ),
            ToolCalls(
                [
                    edit("keep.txt", [("one\n", "changed in turn 2\n")], id="t2_edit"),
                    write("t2.txt", "turn two\n", id="t2_new"),
                ]
            ),
            Text("Edited across two turns."),
        ]
    }
    after_turn_1 = {"notes.txt": "new line from turn 1\n", "t1.txt": "turn one\n"}
    after_turn_2 = {"keep.txt": "changed in turn 2\ntwo\n", "t2.txt": "turn two\n"}

    def files() -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}

    async def scenario() -> None:
        server = ScriptedModelServer(router(scripts), model_id="scripted")
        async with server:
            # keep_warm 0: the VM powers off as soon as the turn ends (undo needs it off).
            win = MainWindow(paths=gui_paths, prefs=Prefs(max_tasks=1, keep_warm_seconds=0))
            win.extra_run_args = {"extra_providers": (scripted_provider(server),)}
            qtbot.addWidget(win)
            await shown(win)
            win.model_pick.addItem("scripted", "scripted/scripted")
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            panel = win.context
            events: list[RunEvent] = []
            disabled_while_live: list[bool] = []
            try:
                win.new_task()
                win.new_folder = folder
                send(qtbot, win, "[CK] edit the files")
                ctl = win.current()
                assert ctl is not None
                ctl.run_event.connect(events.append)

                def on_changes(ev: RunEvent) -> None:
                    if ev.kind is EventKind.CHANGES and ctl.live:
                        # The window is told after the turn; the VM still runs.
                        disabled_while_live.append(
                            not panel.undo_btn.isEnabled()
                            and panel.undo_btn.toolTip() == RUNNING_TIP
                        )

                ctl.run_event.connect(on_changes)
                await until(lambda: ctl.label == "done" and not ctl.live, BOOT + STEP, "done")
                assert any(e.kind is EventKind.READY for e in events)  # pi ran in the VM
                assert disabled_while_live and all(disabled_while_live)
                turns = [e.data["turn"] for e in events if e.kind is EventKind.CHANGES]
                assert turns[:2] == [1, 2], turns

                # The panel lists both turns with their files (newest first).
                await until(lambda: not panel.loading and len(tree(panel)) == 2, 60, "turns listed")
                assert tree(panel) == {
                    "Turn 2 · 1 added, 1 modified": ["M  keep.txt", "A  t2.txt"],
                    "Turn 1 · 1 added, 1 modified": ["M  notes.txt", "A  t1.txt"],
                }
                panel.tabs.setCurrentIndex(1)
                panel.turns.setCurrentItem(item(panel, 2, "keep.txt"))
                diff = panel.diff_view.toPlainText().splitlines()
                assert "-one" in diff and "+changed in turn 2" in diff and " two" in diff
                assert panel.preview.currentWidget() is panel.diff_view

                # Undo this turn (turn 2): turn 2's files only.
                panel.turns.setCurrentItem(item(panel, 2))
                assert panel.undo_btn.isEnabled() and not panel.redo_btn.isEnabled()
                panel.undo_btn.click()
                await until(lambda: panel.redo_btn.isEnabled(), 60, "undo done")
                assert files() == {"keep.txt": "one\ntwo\n", **after_turn_1}
                # Undo the undo: turn 2's files come back.
                panel.redo_btn.click()
                await until(
                    lambda: not panel.loading and not panel.redo_btn.isEnabled(), 60, "redo"
                )
                assert files() == {**after_turn_1, **after_turn_2}
                assert panel.selected_turn() == 2  # the selection survives the reloads
            finally:
                await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout=600))
