"""Issue 33's fixes as a person sees them, from REAL runs under a real X server.

    xvfb-run -a -s "-screen 0 1440x900x24" sh -c \\
        'openbox & .venv/bin/python tests/gui/screenshot_states.py docs/screenshots'

The real window drives real tasks (real runner, QEMU and pi; the offline demo model
and a scripted model, the stand-ins for a remote LLM):

* ``hint-waiting``, ``hint-paused``, ``hint-done``: the composer's hint, the header
  and the rail say the same in each state (the demo waits on its one question: the
  rename of the person's notes.txt).
* ``restored-history``: the app restarted: the task's steps with their durations,
  how each ended, and the run's tokens.
* ``crash-banner``: the app was killed (``kill -9``) with one task done and one
  working; the next start names only the working one. (The killed app runs its tasks
  on the runner's double, tests/helpers/gui.FakeRun: a VM orphaned by a killed test
  process would outlive the script.)

Look at each PNG before committing it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the kit beside it
import shotkit

SHOTS = (
    "hint-waiting",
    "hint-paused",
    "hint-done",
    "restored-history",
    "crash-banner",
)
BOOT = 420.0
REPO = Path(__file__).resolve().parents[2]

KILLED = textwrap.dedent(
    """
    import asyncio, os, signal
    from piwork.config import get_paths
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from tests.helpers.gui import FakeRun, say

    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)

    async def work(run, prompt):
        if "tests" in prompt:
            await run.release.wait()

    async def main():
        win = MainWindow(paths=get_paths(), prefs=Prefs(keep_warm_seconds=600), tray=False)
        win.model.session_factory = FakeRun.factory(work)
        say(win, "Summarise the changelog")
        while win.current().label != "done":
            await asyncio.sleep(0.05)
        win.new_task()
        say(win, "Run the tests and fix what fails")
        while win.current().session is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)

    loop.run_until_complete(main())
    """
)


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from piwork.models.demo import TIDY_FROM

    paths = get_paths()

    async def snap(widget: Any, name: str, settle: float = 1.2) -> None:
        await shotkit.snap(widget, name, settle, out=out)

    base = home / "piwork-demo"
    base.mkdir()
    (base / TIDY_FROM).write_text("What I wrote here myself.\n")
    win = MainWindow(paths=paths, prefs=Prefs(keep_warm_seconds=600), tray=False)
    win.demo_base = base
    win.resize(1280, 800)
    win.show()
    try:
        ctl = win.start_demo()
        await shotkit.until(lambda: win.sheet is not None, BOOT, "the demo's rename asks")
        await snap(win, "hint-waiting")
        win.pause_btn.click()
        await shotkit.until(lambda: ctl.label == "paused", 60, "the VM pauses")
        await snap(win, "hint-paused")
        win.pause_btn.click()
        await shotkit.until(lambda: ctl.label != "paused", 60, "the VM runs again")
        win.sheet.buttons[next(iter(win.sheet.buttons))].click()  # Allow once
        await shotkit.until(lambda: ctl.label == "done", 300, "the demo finishes")
        await snap(win, "hint-done")
    finally:
        await win.quit_cleanly(exit_app=False)

    async def reopened(on: Any, name: str, settle: float) -> None:
        """A new window on ``on`` (a restart of the app), shot once it settled."""
        again = MainWindow(paths=on, prefs=Prefs(), tray=False)
        again.resize(1280, 800)
        again.show()
        try:
            await snap(again, name, settle)
        finally:
            await again.quit_cleanly(exit_app=False)

    # A restart: the same task, read back from its transcript.
    await reopened(paths, "restored-history", 2.0)

    # An app killed with one task done and one working, then started again.
    crashed = home / "crashed"
    env = dict(os.environ, PIWORK_HOME=str(crashed), QT_QPA_PLATFORM="offscreen")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLED, env=env, cwd=REPO)
    rc = await asyncio.wait_for(proc.wait(), 120)
    assert rc == -signal.SIGKILL, rc
    from piwork.config import Paths

    cpaths = Paths(
        data=crashed / "data", cache=paths.cache, state=crashed / "state", config=crashed / "config"
    )
    await reopened(cpaths, "crash-banner", 1.5)
    print({"shots": list(SHOTS), "out": str(out)}, flush=True)


if __name__ == "__main__":
    shotkit.run_shots(shoot)
