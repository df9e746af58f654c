"""What the window says about real tasks, from a real VM (issue 33, issue 34).

The real runner, QEMU and pi, with the offline demo model (the scripted stand-in for
a remote LLM).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.models.demo import DEMO_FILE, TIDY_FROM, TIDY_TO
from tests.helpers.gui import BOOT, button, shown, until

pytestmark = pytest.mark.vm


def test_the_demos_rename_asks_with_its_paths_and_deny_keeps_the_persons_file(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """The demo renames notes.txt, a file the person had before the task: the change set
    asks, naming the file; Deny keeps it where it was, and the demo's new summary, which
    came in without a question, stays."""
    from piwork.gui.window import MainWindow

    base = tmp_path / "piwork-demo"
    base.mkdir()
    (base / TIDY_FROM).write_text("what the person wrote here\n")

    async def scenario() -> None:
        win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=0), tray=False)
        qtbot.addWidget(win)
        await shown(win)
        win.demo_base = base
        try:
            ctl = win.start_demo()
            await until(lambda: win.sheet is not None, BOOT, "the demo's rename asks")
            text = win.sheet.what.text()
            assert TIDY_FROM in text and "/mnt/" not in text, text
            assert win.sheet.detail is not None
            assert f"{TIDY_FROM} -> {TIDY_TO}" in win.sheet.detail.text()
            button(win.sheet, "Deny").click()
            await until(lambda: not ctl.state.busy, BOOT, "the demo ends")
        finally:
            await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(asyncio.wait_for(scenario(), 900))
    assert (base / TIDY_FROM).read_text() == "what the person wrote here\n"
    assert not (base / TIDY_TO).exists()
    assert "demo model" in (base / DEMO_FILE).read_text()
