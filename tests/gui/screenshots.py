"""Render the app's screens to PNG from a REAL run, under a real X server.

    xvfb-run -a -s "-screen 0 1440x900x24" \\
        .venv/bin/python tests/gui/screenshots.py docs/screenshots

Nothing is fed: the real window drives a real task (real runner, real QEMU, the real
pi) with the offline demo model, the scripted stand-in for a remote LLM, as a
newcomer's first run does: the welcome page, the demo's one permission prompt, the
finished task's change with its diff and Undo, the changed file's preview, and
Settings. A second task uses a scripted model that streams Markdown, for the
running view. Look at each PNG before committing them.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the kit beside it
import shotkit

SHOTS = (
    "welcome",
    "permission",
    "running",
    "finished",
    "finished-files",
    "settings",
    "settings-permissions",
)
BOOT = 420.0


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from piwork.models.custom import add_provider
    from piwork.models.demo import DEMO_FILE
    from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls
    from piwork.models.scripted import bash as bash_call
    from piwork.policy import Choice

    paths = get_paths()

    snap = functools.partial(shotkit.snap, out=out)

    markdown = (
        "The parser builds the date **before** it checks the year, so `29 Feb` fails in "
        "non-leap default years. The fix:\n\n```python\ndef parse_date(text: str) -> date:\n"
        "    day, month, year = split(text)\n    return date(year, month, day)  # year first\n"
        "```\n\n| test | before | after |\n|---|---|---|\n| leap day | fails | passes |\n\n"
        "Now I run the tests again."
    )

    def script(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        steps: list[Step] = [
            ToolCalls([bash_call("ls -la; sleep 1")], text="Let me look at the project first."),
            ToolCalls([bash_call("sleep 600")], text=markdown),
        ]
        return steps[i] if i < len(steps) else Text("done")

    add_provider(
        "ollama",
        "http://localhost:11434/v1",
        ["qwen2.5-coder:14b", "llama3.1:8b"],
        path=paths.config / "providers.json",
    )
    server = ScriptedModelServer(script, model_id="scripted", chunk_delay=0.01)
    async with server:
        win = MainWindow(paths=paths, prefs=Prefs(keep_warm_seconds=600), tray=False)
        win.extra_run_args = {"extra_providers": (server.as_provider(name="scripted model"),)}
        win.demo_base = home / "piwork-demo"
        win.resize(1280, 800)
        win.show()
        try:
            await snap(win, "welcome", 1.5)

            # The first run: the demo asks its one permission.
            ctl = win.start_demo()
            await shotkit.until(lambda: win.sheet is not None, BOOT, "the demo's permission sheet")
            await snap(win, "permission", 1.5)
            assert win.sheet is not None
            win.sheet.buttons[Choice.ALLOW_ONCE].click()
            await shotkit.until(lambda: ctl.label == "done", 300, "the demo finishes")
            folder = ctl.folder
            assert folder is not None and (folder / DEMO_FILE).is_file()

            # Its change: the Turns tab with the diff and Undo; then the file's preview.
            panel = win.context
            await shotkit.until(lambda: panel.turns.topLevelItemCount() > 0, 60, "turns")
            panel.tabs.setCurrentIndex(1)
            top = panel.turns.topLevelItem(0)
            for i in range(top.childCount()):
                if DEMO_FILE in top.child(i).text(0):
                    panel.turns.setCurrentItem(top.child(i))
            await snap(win, "finished", 1.2)
            panel.tabs.setCurrentIndex(0)
            await shotkit.until(lambda: DEMO_FILE in panel.changed, 30, "Files changed")
            for i in range(panel.files.count()):
                if DEMO_FILE in panel.files.item(i).text():
                    panel.files.setCurrentRow(i)
            await snap(win, "finished-files", 1.2)
            await ctl.end()

            # A task on a model that streams Markdown while a command runs.
            project = home / "date-parser"
            project.mkdir()
            (project / "README.md").write_text("# dates\n")
            win.new_task()
            win.new_folder = project
            win.model_pick.addItem("scripted model", "scripted/scripted")
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            shotkit.say(win, "The test for parse_date fails on 29 February. Fix it.")
            run = win.current()
            assert run is not None

            def running() -> bool:
                if run.label == "failed":
                    raise RuntimeError("the second task failed: see the window's notices")
                return any("sleep 600" in r.arg for r in win.conversation(run).tool_rows())

            await shotkit.until(running, BOOT, "the second task runs its command")
            await snap(win, "running", 2.5)
            await run.stop()

            win.open_settings()
            dlg = win.settings_dialog
            dlg.tabs.setCurrentIndex(0)
            await snap(dlg, "settings", 1.0)
            dlg.tabs.setCurrentIndex(1)
            await snap(dlg, "settings-permissions", 1.0)
            dlg.reject()
        finally:
            await win.quit_cleanly(exit_app=False)
    print(json.dumps({"shots": list(SHOTS), "out": str(out)}), flush=True)


if __name__ == "__main__":
    shotkit.run_shots(shoot)
