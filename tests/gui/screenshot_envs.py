"""Render the package-registries prompt and Settings → Environments from a REAL run.

    xvfb-run -a -s "-screen 0 1440x900x24" \\
        .venv/bin/python tests/gui/screenshot_envs.py docs/screenshots

Nothing is fed: the real window drives real tasks (real runner, QEMU and pi, the
Debian workbench) whose scripted model (the stand-in for a remote LLM only) has the
agent make a Python venv in the guest (asked, allowed once: it lands on the task's
environment disk), then run ``pip install requests``: the gate asks to reach pypi.org
and the sheet offers "Allow the package registries" with the rules it saves
(``permission-registries.png``; the script then denies, so nothing leaves this
computer). A second task on the same folder starts from the first one's environment
(its disk frozen into a layer); Settings → Environments then lists the folder, the
layer and the disks with their real sizes (``settings-environments.png``). Look at
each PNG before committing it.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the kit beside it
import shotkit

BOOT = 420.0
SHOTS = ("permission-registries", "settings-environments")


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls
    from piwork.models.scripted import bash as bash_call
    from piwork.policy import Choice

    snap = functools.partial(shotkit.snap, settle=1.5, out=out)

    def script(req: ChatRequest) -> Step:
        if "Nothing" in req.last_user_text:
            return Text("The venv from the last task is still there: `/root/venv`.")
        steps: list[Step] = [
            ToolCalls(
                [bash_call("python3 -m venv /root/venv && du -sh /root/venv", timeout=600)],
                text="First a virtual environment for the project's tools.",
            ),
            ToolCalls(
                [bash_call("pip install requests", timeout=120)],
                text="Now the one dependency the tests need.",
            ),
        ]
        i = req.assistant_turns_since_user
        return steps[i] if i < len(steps) else Text("I could not reach PyPI: you said no.")

    project = home / "date-parser"
    project.mkdir()
    (project / "README.md").write_text("# dates\n")
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
            shotkit.say(win, "Set up a venv and install requests for the tests.")
            first = win.current()
            assert first is not None

            def registries_asked() -> bool:
                if first.label == "failed":
                    raise RuntimeError("the task failed: see the window's notices")
                sheet = win.sheet
                if sheet is None:
                    return False
                if Choice.ALLOW_REGISTRIES in sheet.buttons:
                    return True
                sheet.buttons[Choice.ALLOW_ONCE].click()  # the venv command: once
                return False

            await shotkit.until(registries_asked, BOOT, "the registries question")
            await snap(win, "permission-registries")
            assert win.sheet is not None
            win.sheet.buttons[Choice.DENY].click()
            await shotkit.until(lambda: first.label == "done", 300, "the first task finishes")
            await first.end()
            await shotkit.until(lambda: not first.live, 60, "the first task's VM is off")

            # A new task on the folder starts from what the first one left.
            win.new_task()
            win.new_folder = project
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            shotkit.say(win, "Nothing to install: is the venv still there?")
            second = win.current()
            assert second is not None
            await shotkit.until(lambda: second.label == "done", BOOT, "the second task finishes")
            await second.end()

            win.open_settings()
            dlg = win.settings_dialog
            dlg.resize(980, 560)
            dlg.tabs.setCurrentWidget(dlg.envs_tab)
            assert dlg.tabs.tabText(dlg.tabs.currentIndex()) == "Environments"
            dlg.refresh_envs()
            dlg.envs.setCurrentItem(dlg.envs.topLevelItem(0))
            await snap(dlg, "settings-environments")
            dlg.reject()
        finally:
            await win.quit_cleanly(exit_app=False)


if __name__ == "__main__":
    shotkit.run_shots(shoot)
