"""The app as a process (issue 16): one instance, a crash loses nothing, closing is honest.

These drive the real app entry point (``piwork.gui.app.main``) or a real window in
a subprocess where the behaviour is about processes: a second launch, an abort.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.appstate import NEW, AppState
from piwork.gui.prefs import Prefs
from piwork.tasks import TaskStore
from tests.helpers.gui import FakeRun, button, say, shown, until


def _env(home: Path) -> dict[str, str]:
    return dict(os.environ, QT_QPA_PLATFORM="offscreen", PIWORK_HOME=str(home))


def _home_paths(home: Path) -> Paths:
    return Paths(
        data=home / "data", cache=home / "cache", state=home / "state", config=home / "config"
    )


def test_a_second_launch_raises_the_first_window_and_touches_no_task(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from piwork.gui.instance import SingleInstance, server_name
    from piwork.gui.window import MainWindow

    home = tmp_path / "home"
    paths = _home_paths(home)
    # The first instance has a task running: it holds the task's lease, as the runner does.
    store = TaskStore(paths.tasks)
    task = store.create("the first instance's task")
    lease = store.claim(task.id)
    store.transition(task.id, "running")

    async def scenario() -> tuple[int, bytes, bytes]:
        instance = SingleInstance(server_name(paths))
        win = MainWindow(paths=paths, prefs=Prefs(), tray=False)
        qtbot.addWidget(win)
        instance.raise_requested.connect(win.show_from_tray)
        await shown(win)
        win.showMinimized()
        await until(win.isMinimized, 10, "the window is minimised")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from piwork.gui.app import main; raise SystemExit(main())",
            env=_env(home),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode is not None
        await until(lambda: not win.isMinimized(), 10, "the first window comes back")
        assert win.isVisible()
        instance.close()
        await win.quit_cleanly(exit_app=False)
        return proc.returncode, out, err

    try:
        rc, out, err = qloop.run_until_complete(scenario())
        assert rc == 0, err.decode()
        assert b"already running" in out
        # The relaunch never touched the running task.
        assert store.get(task.id).record.status.value == "running"
    finally:
        lease.release()
        store.close()


# The app as `piwork app` starts it, in a child process that dies on purpose.
APP = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from piwork.config import get_paths
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow

    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    """
)

CRASHING_APP = APP + textwrap.dedent(
    """
    from piwork.tasks import TaskStore

    paths = get_paths()
    store = TaskStore(paths.tasks)
    task = store.create("a task that was running")
    store.claim(task.id)
    store.transition(task.id, "running")

    async def main() -> None:
        win = MainWindow(paths=paths, prefs=Prefs(), tray=False)
        win.show()
        win.new_task()
        win.composer.setPlainText("a long prompt I typed\\nand did not send")
        await asyncio.sleep(1.5)  # the person pauses; then the process aborts
        print("typed", flush=True)
        os.kill(os.getpid(), signal.SIGABRT)

    loop.run_until_complete(main())
    """
)


def test_after_a_crash_the_typed_text_is_back_and_the_task_is_offered(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    import subprocess

    from piwork.gui.window import MainWindow

    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_APP],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert "typed" in proc.stdout
    paths = _home_paths(home)
    assert AppState(paths).draft(NEW).startswith("a long prompt")

    win = MainWindow(paths=paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    assert win.crash_banner is not None
    [ctl] = win.tasks
    assert ctl.status == "interrupted"  # not "running", not "failed"
    assert win.current() is ctl and win.crash_continue.text() == "Continue it"
    text = " ".join(lbl.text() for lbl in win.crash_banner.findChildren(type(win.header)))
    assert "closed unexpectedly" in text and "a task that was running" in text
    # The unsent text is in the new-task composer.
    win.new_task()
    assert win.composer.toPlainText() == "a long prompt I typed\nand did not send"
    button(win.crash_banner, "Dismiss").click()
    assert win.crash_banner is None
    qloop.run_until_complete(win.quit_cleanly(exit_app=False))
    # A clean quit leaves no crash marker: the next start says nothing.
    win2 = MainWindow(paths=paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win2)
    assert win2.crash_banner is None


def test_a_draft_follows_its_task_and_is_forgotten_when_sent(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.window import MainWindow

    store = TaskStore(gui_paths.tasks)
    t1 = store.create("one")
    store.close()
    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    [ctl] = win.tasks
    assert win.current() is ctl
    win.composer.setPlainText("for task one")
    win.new_task()
    assert win.composer.toPlainText() == ""
    win.composer.setPlainText("for a new task")
    win.select(ctl)
    assert win.composer.toPlainText() == "for task one"
    fresh = AppState(gui_paths)
    assert fresh.draft(t1.id) == "for task one" and fresh.draft(NEW) == "for a new task"
    win.composer.clear()  # a moment later the emptied draft is forgotten, on disk too
    qtbot.waitUntil(lambda: AppState(gui_paths).draft(t1.id) == "", timeout=5000)


def test_hidden_in_the_tray_the_app_quits_by_itself_once_nothing_runs(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.window import MainWindow

    async def work(run: FakeRun, prompt: str) -> None:
        await run.release.wait()  # works until the test lets it finish

    win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=0), tray=True)
    qtbot.addWidget(win)
    win.model.session_factory = FakeRun.factory(work)
    quits: list[bool] = []

    async def quit_cleanly(*, exit_app: bool = True) -> None:
        quits.append(exit_app)

    win.quit_cleanly = quit_cleanly  # type: ignore[method-assign]

    async def scenario() -> None:
        await shown(win)
        say(win, "keep busy")
        ctl = win.current()
        assert ctl is not None
        await until(lambda: ctl.session is not None, 10, "the task runs")
        win.close()  # a task runs: into the tray, not quit
        assert not win.isVisible() and quits == []
        ctl.session.release.set()  # type: ignore[union-attr]
        await until(lambda: quits, 10, "the app quits by itself")

    qloop.run_until_complete(scenario())
    assert quits == [True]


KILLED_APP = APP + textwrap.dedent(
    """
    from tests.helpers.gui import FakeRun, say

    async def work(run, prompt):
        if "long" in prompt:
            await run.release.wait()  # still working when the app is killed

    async def main() -> None:
        win = MainWindow(paths=get_paths(), prefs=Prefs(keep_warm_seconds=600), tray=False)
        win.model.session_factory = FakeRun.factory(work)
        win.show()
        say(win, "a short task that finishes")
        done = win.current()
        while done.label != "done":
            await asyncio.sleep(0.05)
        assert done.state.warm  # finished, its VM kept on for a follow-up
        win.new_task()
        say(win, "a long task still working")
        while win.current().session is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    loop.run_until_complete(main())
    """
)


def test_after_a_kill_the_banner_names_only_the_task_that_was_working(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Issue 33 item 3: kill -9 of the app while one task is done (its VM kept warm) and
    another works: the next start names the working one as interrupted, not the done one."""
    import subprocess

    from piwork.gui.window import MainWindow

    home = tmp_path / "home"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_APP],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    win = MainWindow(paths=_home_paths(home), prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    assert win.crash_banner is not None
    text = win.crash_banner.text.text()
    assert "closed unexpectedly" in text
    assert "a long task still working" in text and "a short task" not in text, text
    labels = {t.title: t.label for t in win.tasks}
    assert labels == {
        "a long task still working": "interrupted",
        "a short task that finishes": "done",
    }
    assert win.current().title == "a long task still working"
    qloop.run_until_complete(win.quit_cleanly(exit_app=False))
