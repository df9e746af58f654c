"""Start the app: QApplication + qasync loop (see controller.py for why qasync)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from piwork.config import get_paths
from piwork.doctor import run_checks
from piwork.gui.setup_screen import SetupScreen, blocking

T0 = time.monotonic()


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
    import qasync

    from piwork.gui.window import MainWindow

    app = make_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    paths = get_paths()
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
        win.show()
        if os.environ.get("PIWORK_GUI_TIMING"):
            # `time` from launch to first paint: printed once the first frame is drawn.
            QTimer.singleShot(
                0, lambda: print(f"first paint {time.monotonic() - T0:.2f}s", flush=True)
            )
        await quit_event.wait()

    with loop:
        loop.run_until_complete(run())
    return 0
