"""Start the app: QApplication + the event loop of ``piwork.gui.loop`` (see there for why)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication

from piwork.config import get_paths
from piwork.doctor import run_checks
from piwork.gui.setup_screen import SetupScreen, blocking

T0 = time.monotonic()


def since_launch() -> float | None:
    """Seconds since this process started (Linux: /proc), for the first-paint figure."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


class FirstPaint(QObject):
    def __init__(self, exit_after: bool) -> None:
        super().__init__()
        self.exit_after = exit_after
        self.done = False

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if not self.done and event.type() == QEvent.Type.Paint:
            self.done = True
            since = since_launch()
            print(
                f"first paint {time.monotonic() - T0:.2f}s after import"
                + (f", {since:.2f}s after the process started" if since is not None else ""),
                flush=True,
            )
            if self.exit_after:
                QTimer.singleShot(0, QApplication.quit)
        return False


def make_app(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance()
    if isinstance(app, QApplication):
        return app
    # Qt 6 scales for high-DPI screens by itself; keep fractional factors as they are.
    os.environ.setdefault("QT_ENABLE_HIGHDPI_SCALING", "1")
    app = QApplication(argv or sys.argv[:1])
    app.setApplicationName("piwork")
    app.setDesktopFileName("piwork")
    app.setQuitOnLastWindowClosed(False)  # the tray keeps running tasks alive
    return app


def main(*, force_setup: bool = False) -> int:
    from piwork.gui.instance import AlreadyRunning, claim
    from piwork.gui.loop import LeakingQtError, new_loop
    from piwork.gui.window import MainWindow

    app = make_app()
    paths = get_paths()
    try:
        instance = claim(paths)
    except AlreadyRunning as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    if instance is None:
        print("piwork is already running: its window was brought to the front.", flush=True)
        return 0
    try:
        loop = new_loop(app)
    except LeakingQtError as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 2
    asyncio.set_event_loop(loop)
    quit_event = asyncio.Event()
    app.aboutToQuit.connect(quit_event.set)

    async def run() -> None:
        checks = await asyncio.to_thread(run_checks, paths)
        if (
            force_setup
            or blocking(checks)
            or any(c.name == "runtime pack" and not c.ok for c in checks)
        ):
            setup = SetupScreen(paths)
            setup.show()
            done = asyncio.Event()
            setup.finished.connect(lambda _r: done.set())
            await done.wait()
        win = MainWindow(paths=paths)
        instance.raise_requested.connect(win.show_from_tray)
        # A quit that does not go through the window (logout, a signal Qt turns into a
        # quit) is still a clean exit: keep the draft, say "no crash" to the next start.
        app.aboutToQuit.connect(win.on_app_quit)
        timing = os.environ.get("PIWORK_GUI_TIMING")
        if timing:
            # Measuring start-up: print when the window's first frame is painted
            # (and quit there with PIWORK_GUI_TIMING=exit, for `time piwork gui`).
            probe = FirstPaint(timing == "exit")
            win.installEventFilter(probe)
            win._first_paint = probe  # type: ignore[attr-defined]
        win.show()
        await quit_event.wait()

    try:
        loop.run_until_complete(run())
    finally:
        instance.close()
        loop.close()
    return 0
