"""What the window says about real tasks, from a real VM (issue 33).

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
from piwork.models.demo import DEMO_FILE
from tests.helpers.gui import BOOT, button, shown, until

pytestmark = pytest.mark.vm


def test_the_demo_moving_onto_an_existing_file_says_it_replaces_it(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 1, as it was seen: the demo's second run in the same folder moves
    its draft onto the PIWORK_DEMO.md already there. The sheet says so; Deny keeps it."""
    from piwork.gui.window import MainWindow

    base = tmp_path / "piwork-demo"
    base.mkdir()
    (base / DEMO_FILE).write_text("what the person wrote here\n")

    async def scenario() -> None:
        win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=0), tray=False)
        qtbot.addWidget(win)
        await shown(win)
        win.demo_base = base
        try:
            ctl = win.start_demo()
            await until(lambda: win.sheet is not None, BOOT, "the demo's move asks")
            text = win.sheet.what.text()
            assert f"This replaces {DEMO_FILE}, already in your folder" in text, text
            button(win.sheet, "Deny").click()
            await until(lambda: not ctl.state.busy, BOOT, "the demo ends")
        finally:
            await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(asyncio.wait_for(scenario(), 900))
    assert (base / DEMO_FILE).read_text() == "what the person wrote here\n"
