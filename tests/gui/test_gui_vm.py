"""The desktop app against the real runner, real QEMU and the real pi (scripted model).

One test, two VMs (booted one after the other, then running at once), everything
else on those two warm sessions, so the GUI suite boots only twice:

* two tasks run at once, each with its own permission prompt kept apart (rail badge
  on the one not selected);
* Always allow in this folder: the sheet showed exactly the rule that was saved, and
  settings lists it; Deny: the file is kept and the tool row says error;
* streamed Markdown (rendered, code highlighted, throttled) and tool rows;
* one more task than the limit waits "queued" and can be stopped there;
* a finished task continues with a follow-up; an ask_user select is answered by a button;
* the window closes to the tray while a task runs and comes back with nothing missing;
* Esc stops a running task after a confirmation; quit powers every VM off cleanly.
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextFormat
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui import text as text_mod
from piwork.gui.controller import TaskController
from piwork.gui.prefs import Prefs
from piwork.gui.widgets import MessageView
from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
    ToolCall,
    ToolCalls,
    bash,
)
from piwork.policy import Choice, PolicyStore
from piwork.runner import EventKind, RunEvent
from piwork.tasks import TaskStore
from tests.helpers.gui import (
    BOOT,
    STEP,
    message_box,
    press,
    router,
    scripted_provider,
    send,
    shown,
    until,
)

pytestmark = pytest.mark.vm


MARKDOWN = (
    "Done. Here is **what I did**:\n\n"
    "| file | result |\n|---|---|\n| b.txt | deleted |\n\n"
    "```python\ndef hello():\n    return 'world'\n```\n" + "More words to stream. " * 40
)


def by_title(win: Any, tag: str) -> TaskController:
    return next(c for c in win.tasks if tag in c.title)


def rail_text(win: Any, ctl: TaskController) -> str:
    return str(win.rail.item(win.tasks.index(ctl)).text())


def confirm_stop(win: Any) -> None:
    press(message_box("Stop the task?"), "Stop")


def test_the_window_drives_real_tasks(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.window import MainWindow

    fa, fb = tmp_path / "folder-a", tmp_path / "folder-b"
    fa.mkdir()
    fb.mkdir()
    (fa / "victim.txt").write_text("precious\n")
    (fb / "b.txt").write_text("bye\n")

    scripts: dict[str, list[Step]] = {
        "[A1]": [ToolCalls([bash("rm victim.txt", id="call_a_rm")]), Text("I left it.")],
        "[B1]": [
            ToolCalls([bash("rm b.txt", id="call_b_rm")]),
            ToolCalls([bash("echo 'a,b\n1,2' > table.csv", id="call_b_csv")]),
            Text(MARKDOWN),
        ],
        "[A2]": [
            ToolCalls(
                [ToolCall("ask_user", {"question": "Which colour?", "options": ["red", "blue"]})]
            ),
            Text("You chose."),
        ],
        "[A3]": [ToolCalls([bash("echo started; sleep 45; echo late", id="call_a_sleep")])],
    }

    async def scenario() -> None:
        server = ScriptedModelServer(router(scripts), model_id="scripted")
        async with server:
            prefs = Prefs(max_tasks=2, keep_warm_seconds=600)
            win = MainWindow(paths=gui_paths, prefs=prefs, tray=True)  # a desktop with a tray
            win.extra_run_args = {"extra_providers": (scripted_provider(server),)}
            qtbot.addWidget(win)
            await shown(win)
            win.model_pick.addItem("scripted", "scripted/scripted")
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            texts: dict[str, list[RunEvent]] = {}

            def start(tag: str, folder: Path, prompt: str) -> TaskController:
                win.new_task()
                win.new_folder = folder
                send(qtbot, win, f"{tag} {prompt}")
                ctl = by_title(win, tag)
                ctl.run_event.connect(lambda ev: texts.setdefault(tag, []).append(ev))
                return ctl

            try:
                # Two VMs, two prompts, kept apart. B boots once A is asking (one TCG boot at
                # a time on this shared machine); A's question stays open meanwhile.
                a = start("[A1]", fa, "delete victim.txt")
                await until(lambda: a.permissions, BOOT, "task A asks")
                b = start("[B1]", fb, "delete b.txt and make a table")
                assert win.current() is b and a.busy
                await until(lambda: b.permissions, BOOT, "task B asks")
                assert a.permissions and not a.permissions[0].future.done()
                assert "⚠" in rail_text(win, a) and "⚠" not in rail_text(win, b)
                assert win.sheet is not None and "rm b.txt" in win.sheet.what.text()
                shown_rule = html.unescape(win.sheet.rule_label.toolTip())  # the exact rules
                win.sheet.buttons[Choice.ALWAYS_FOLDER].click()

                # Ctrl+1.. switch tasks: A is the second in the rail (newest first).
                qtbot.keyClick(win.composer, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
                assert win.current() is a
                assert win.sheet is not None and "rm victim.txt" in win.sheet.what.text()
                # Enter on the sheet is Deny, never an "Always".
                qtbot.keyClick(win.sheet, Qt.Key.Key_Return)

                await until(lambda: a.label == "done" and b.label == "done", STEP, "both finish")
                assert (fa / "victim.txt").read_text() == "precious\n"
                assert not (fb / "b.txt").exists()
                conv_a = win.conversation(a)
                [row] = [r for r in conv_a.tool_rows() if "rm victim.txt" in r.arg]
                assert row.ok is False

                # The rule saved is exactly the one the sheet showed; settings lists it.
                # (the sheet shows the folder's path relative to it: gui.text.shown_rule)
                rules = PolicyStore(gui_paths.policy_file).load()
                saved = [r.describe() for r in rules]
                assert len(saved) == 1, saved
                assert text_mod.shown_rule(rules[0]).describe() in shown_rule, (saved, shown_rule)
                assert f"folder:{fb}" in saved[0]
                win.open_settings()
                words = text_mod.shown_rule(rules[0]).human()  # Settings says it in words
                assert words in win.settings_dialog.rule_texts()
                win.settings_dialog.reject()
                # The offscreen platform has no window manager to hand activation back
                # from the closed dialog (Esc is a window shortcut): do what one does.
                await shown(win)

                # Streamed Markdown in B: rendered (no ** left), table and code block, throttled.
                win.select(b)
                conv_b = win.conversation(b)
                agent = [m for m in conv_b.messages() if m.who == "agent"]
                final: MessageView = agent[-1]
                doc = final.body.document()
                plain = doc.toPlainText()
                assert "what I did" in plain and "**" not in plain and "```" not in plain
                deltas = [e for e in texts["[B1]"] if e.kind is EventKind.TEXT]
                assert len(deltas) > 5 and final.renders < len(deltas)
                fences = [
                    doc.findBlockByNumber(i)
                    .blockFormat()
                    .hasProperty(QTextFormat.Property.BlockCodeFence)
                    for i in range(doc.blockCount())
                ]
                assert any(fences)
                assert {r.name for r in conv_b.tool_rows()} == {"bash"}
                # The changed-files panel shows the CSV the agent wrote, previewed as a table.
                await until(lambda: "table.csv" in win.context.changed, 20, "csv in changed files")
                read = win.context.preview_file("table.csv")
                assert read is not None
                await read
                assert win.context.preview.currentWidget() is win.context.preview_table
                assert win.context.preview_table.columnCount() == 2

                # One more than the limit waits "queued"; Esc stops it (after confirming).
                c = start("[C1]", fa, "never runs")
                assert c.label == "queued" and "queued" in rail_text(win, c)
                qtbot.keyClick(win.composer, Qt.Key.Key_Escape)
                confirm_stop(win)
                await until(lambda: c.label == "stopped by you", 10, "queued task cancelled")
                assert c.task_id is None  # never started a VM

                # A finished task continues with a follow-up (warm VM), ask_user select by button.
                win.select(a)
                boots_before = sum(1 for e in texts["[A1]"] if e.kind is EventKind.BOOT)
                send(qtbot, win, "[A2] ask me")
                await until(lambda: win.question_bar is not None, STEP, "the question")
                assert [bt.text() for bt in win.question_bar.option_buttons] == ["red", "blue"]
                win.question_bar.option_buttons[1].click()
                await until(lambda: a.label == "done" and a.question is None, STEP, "A2 done")
                sent = [
                    x.result
                    for x in ChatRequest(
                        body=server.chat_requests[-1].body, headers=server.chat_requests[-1].headers
                    ).tool_exchanges()
                ]
                assert any("blue" in (r or "") for r in sent), sent
                assert sum(1 for e in texts["[A1]"] if e.kind is EventKind.BOOT) == boots_before

                # Close to the tray while A runs; what happens meanwhile is there on return.
                send(qtbot, win, "[A3] take long")
                win.close()
                assert not win.isVisible() and a.live
                await until(
                    lambda: any("sleep 45" in r.arg for r in conv_a.tool_rows()), STEP, "sleep row"
                )
                win.show_from_tray()
                await shown(win)
                assert win.isVisible() and win.current() is a
                assert any(m.text.startswith("[A3]") for m in conv_a.messages())
                assert any("sleep 45" in r.arg and r.ok is None for r in conv_a.tool_rows())
                assert win.send_btn.text() == "Stop"

                # Esc stops it, after confirmation.
                qtbot.keyClick(win.composer, Qt.Key.Key_Escape)
                confirm_stop(win)
                await until(lambda: a.label == "stopped by you", 60, "A3 cancelled")

                # Quit: every VM powered off, tasks left resumable (stopped, not running).
                await win.quit_cleanly(exit_app=False)
                assert not any(t.live for t in win.tasks)
                store = TaskStore(gui_paths.tasks)
                try:
                    for ctl in (a, b):
                        assert ctl.task_id is not None
                        assert store.get(ctl.task_id).record.status.value == "stopped"
                finally:
                    store.close()
            finally:
                # Whatever happened, power every VM off (a failed test must not leave
                # QEMU running or the process waiting on them).
                await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout=900))
