"""What every screenshot script shares: a fresh home, the real app and loop, waiting, grabbing.

Each script (``screenshots.py``, ``screenshot_preview.py``, ``screenshot_envs.py``)
drives a real run in its own ``shoot(app, home, out)`` and is started the same way:

    xvfb-run -a -s "-screen 0 1440x900x24" .venv/bin/python tests/gui/<script>.py OUT

Under a real X server the kit starts openbox (scripts/apt-packages.txt) as the window
manager, so windows are placed, decorated and activated as on a desktop (a bare Xvfb
activates nothing); one already running is left alone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

Shoot = Callable[[Any, Path, Path], Coroutine[Any, Any, None]]


def run_shots(shoot: Shoot) -> None:
    """Run ``shoot(app, home, out)`` in a fresh piwork home with the real app's event loop.

    ``out`` is the first command-line argument (default ``docs/screenshots``). The pack
    cache stays shared (content-addressed), as tests/conftest.py keeps it, so a script
    never rebuilds the pack in its temporary home."""
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
    home = Path(tempfile.mkdtemp(prefix="piwork-shots-"))
    os.environ["PIWORK_HOME"] = str(home)
    import platformdirs

    os.environ.setdefault("PIWORK_PACK_CACHE", platformdirs.user_cache_dir("piwork"))
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop

    wm = window_manager()
    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    out.mkdir(parents=True, exist_ok=True)
    try:
        loop.run_until_complete(shoot(app, home, out))
    finally:
        loop.close()
        if wm is not None:
            wm.terminate()


def window_manager() -> subprocess.Popen[bytes] | None:
    """openbox on the X display, if there is one and openbox is installed (it exits at
    once, harmlessly, where another window manager runs)."""
    import shutil

    exe = shutil.which("openbox")
    if not os.environ.get("DISPLAY") or os.environ.get("QT_QPA_PLATFORM") or exe is None:
        return None
    wm = subprocess.Popen([exe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # managing the screen before the first window maps
    return wm


async def until(cond: Callable[[], Any], timeout: float, what: str) -> None:
    """Wait (the loop runs Qt meanwhile) until ``cond()`` is true, or say what never came."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.2)


async def snap(widget: Any, name: str, settle: float = 0.8, *, out: Path) -> None:
    """Let layout and paint settle, then save ``widget`` as ``out/name.png``."""
    await asyncio.sleep(settle)
    widget.grab().save(str(out / f"{name}.png"))
    print(f"shot {name}", flush=True)


def say(win: Any, text: str) -> None:
    """Type ``text`` into the composer and press Enter, as a person does."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    win.composer.setFocus()
    win.composer.clear()
    QTest.keyClicks(win.composer, text)
    QTest.keyClick(win.composer, Qt.Key.Key_Return)
