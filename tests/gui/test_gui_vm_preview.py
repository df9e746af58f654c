"""A preview in the real window: real runner, real QEMU and the real pi (issue 20).

The scripted model (the stand-in for the remote LLM only) has the agent start a Node
web server on port 8000 in the VM. piwork's guest port watcher notices it and asks
through the window's preview question; answering "Open for this task" gives an
"Open preview" row that opens exactly piwork's loopback URL, the context panel lists
it, and once the task's VM is off nothing is left to open.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.preview import PreviewChoice
from tests.helpers.gui import say, scripted_provider, shown, until

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1500)]

BOOT = 360.0  # one TCG boot on a shared, loaded 2-core machine
NODE = "/opt/piwork/node/bin/node"
SERVE = f"timeout 600 {NODE} -e \"require('http').createServer((q,s)=>s.end('hi')).listen(8000)\""


def script(req: ChatRequest) -> Step:
    if req.assistant_turns_since_user == 0:
        return ToolCalls([bash(SERVE, timeout=700)], text="Starting the server.")
    return Text("The server stopped.")


def test_a_server_in_the_vm_becomes_an_open_preview_row(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from PySide6.QtGui import QDesktopServices

    from piwork.gui.widgets import PreviewRow
    from piwork.gui.window import MainWindow

    opened: list[str] = []

    def record(url: Any) -> bool:
        opened.append(url.toString())
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(record))
    project = tmp_path / "site"
    project.mkdir()

    async def scenario() -> None:
        server = ScriptedModelServer(script, model_id="scripted")
        async with server:
            win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=600), tray=False)
            win.extra_run_args = {"extra_providers": (scripted_provider(server),)}
            qtbot.addWidget(win)
            await shown(win)
            try:
                win.model_pick.addItem("scripted", "scripted/scripted")
                win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
                win.new_folder = project
                say(win, "Serve the page.")
                run = win.current()
                assert run is not None

                def asked() -> bool:
                    if run.label == "failed":
                        raise AssertionError("the task failed: see the window's notices")
                    if win.sheet is not None:  # starting node is a command: allow it once
                        win.sheet.buttons[Choice.ALLOW_ONCE].click()
                    return win.preview_sheet is not None

                await until(asked, BOOT, "the preview question")
                sheet = win.preview_sheet
                assert sheet is not None and "port 8000" in sheet.what.text()
                assert run.label == "waiting for you"
                sheet.buttons[PreviewChoice.TASK].click()
                conv = win.conversation(run)

                def open_rows() -> list[PreviewRow]:
                    return [r for r in conv.findChildren(PreviewRow) if r.url]

                await until(open_rows, 120, "the Open preview row")
                [row] = open_rows()
                assert run.task_id is not None
                url = row.url
                assert url is not None
                assert re.fullmatch(r"http://127\.\d+\.\d+\.\d+:\d+/", url), url
                assert [p.url for p in run.session.previews.list()] == [url]  # type: ignore[union-attr]
                row.open_btn.click()
                assert opened == [url]
                assert list(win.context.preview_buttons) == [8000]

                # The VM powers off: nothing is left to open.
                await run.stop()
                await run.end()
                await until(lambda: not run.live, 120, "the VM is off")
                assert not row.open_btn.isEnabled()
                assert win.context.preview_buttons == {}
            finally:
                await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout=1200))
