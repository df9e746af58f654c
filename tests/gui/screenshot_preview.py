"""Render the app with an open preview to PNG, from a REAL run under a real X server.

    xvfb-run -a -s "-screen 0 1440x900x24" \\
        .venv/bin/python tests/gui/screenshot_preview.py docs/screenshots

Nothing is fed: the real window drives a real task (real runner, QEMU and pi) whose
scripted model (the stand-in for a remote LLM only) has the agent start a Node web
server on port 8000 in the VM. piwork notices the listener and asks through the
window's preview question; the script allows the command once and answers "Open for
this task" as a person would, waits for the conversation's "Open preview" row, and
grabs the window. Look at the PNG before committing it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the kit beside it
import shotkit

BOOT = 420.0
NODE = "/opt/piwork/node/bin/node"
SERVE = f"timeout 600 {NODE} -e \"require('http').createServer((q,s)=>s.end('hi')).listen(8000)\""


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.widgets import PreviewRow
    from piwork.gui.window import MainWindow
    from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls
    from piwork.models.scripted import bash as bash_call
    from piwork.policy import Choice
    from piwork.preview import PreviewChoice

    def script(req: ChatRequest) -> Step:
        if req.assistant_turns_since_user == 0:
            return ToolCalls(
                [bash_call(SERVE, timeout=700)],
                text="I'll start the site's dev server on port 8000 so you can look at it.",
            )
        return Text("The server stopped.")

    project = home / "site"
    project.mkdir()
    (project / "index.html").write_text("<h1>hi</h1>\n")
    server = ScriptedModelServer(script, model_id="scripted", chunk_delay=0.01)
    async with server:
        win = MainWindow(paths=get_paths(), prefs=Prefs(keep_warm_seconds=60), tray=False)
        win.extra_run_args = {"extra_providers": (server.as_provider(name="scripted model"),)}
        win.resize(1280, 800)
        win.show()
        try:
            win.new_folder = project
            win.model_pick.addItem("scripted model", "scripted/scripted")
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            shotkit.say(win, "Start the dev server so I can see the page.")
            run = win.current()
            assert run is not None

            def asked() -> bool:
                if run.label == "failed":
                    raise RuntimeError("the task failed: see the window's notices")
                if win.sheet is not None:  # starting node is a command: allow it once
                    win.sheet.buttons[Choice.ALLOW_ONCE].click()
                return win.preview_sheet is not None

            await shotkit.until(asked, BOOT, "the preview question")
            assert win.preview_sheet is not None
            win.preview_sheet.buttons[PreviewChoice.TASK].click()
            conv = win.conversation(run)

            def row_open() -> bool:
                return any(r.url for r in conv.findChildren(PreviewRow))

            await shotkit.until(row_open, 120, "the Open preview row")
            await asyncio.sleep(2.0)  # layout and paint
            win.grab().save(str(out / "preview.png"))
            print("shot preview", flush=True)
            await run.stop()
        finally:
            await win.quit_cleanly(exit_app=False)


if __name__ == "__main__":
    shotkit.run_shots(shoot)
