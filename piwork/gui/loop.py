"""The app's one asyncio/Qt event loop integration, and the probe that guards it.

Why this stack (measured on Python 3.11.7, offscreen, 2026-11):

* PySide6 6.12.0 leaks a reference to ``None`` on every ``QObject.killTimer()``
  (1,000 start/kill pairs: ``sys.getrefcount(None)`` -881 to -940, then
  ``Fatal Python error: none_dealloc``). qasync starts and kills one Qt timer per
  asyncio callback, so the app died after ~38,000 callbacks: minutes of a busy task.
* PySide6 6.11.3, the release before, does not: the same 1,000 pairs move the count
  by 0, and 100,000 ``await asyncio.sleep(0)`` under qasync end with the count flat.
* PySide6's own ``QtAsyncio`` cannot run subprocesses, sockets, unix connections or
  ``add_reader`` (NotImplementedError), all of which the runner needs.
* A second asyncio thread crossing into Qt by signals would avoid Qt timers per
  callback, but every runner event and every permission answer would cross threads,
  and the runner's sink and Asker are written for one thread.
* Python 3.12 makes ``None`` immortal, but piwork supports 3.11.

So the app keeps qasync on one thread and pins ``pyside6-essentials==6.11.3``: the
smallest change that removes the cause. Because a future wheel could bring the leak
back, :func:`timer_leak` measures it in a few microseconds; the app refuses to run a
loop on a leaking build (it would abort later and lose work), and
``tests/gui/test_event_loop.py`` runs 100,000 callbacks through :func:`new_loop` in a
subprocess and checks that the process lives and ``None``'s count stays flat.
"""

from __future__ import annotations

import asyncio
import sys

from PySide6.QtCore import QCoreApplication, QObject

PROBE_TIMERS = 64


class LeakingQtError(RuntimeError):
    """The installed PySide6 drops a reference to ``None`` per killed timer."""


def timer_leak(n: int = PROBE_TIMERS) -> int:
    """References to ``None`` lost by starting and killing ``n`` Qt timers (0 on a sound
    build). Needs a Q(Core)Application. Always 0 where ``None`` is immortal (3.12+)."""
    probe = QObject()
    ids = [probe.startTimer(60_000) for _ in range(n)]
    before = sys.getrefcount(None)
    for t in ids:
        probe.killTimer(t)
    lost = before - sys.getrefcount(None)
    probe.deleteLater()
    # A few unrelated references may come and go while measuring: only a loss that
    # scales with ``n`` is the leak.
    return lost if lost >= n // 2 else 0


def new_loop(app: QCoreApplication) -> asyncio.AbstractEventLoop:
    """The app's event loop: asyncio's selector loop driven by Qt (qasync), on a PySide6
    build that has been checked not to leak per timer."""
    import qasync

    if sys.version_info < (3, 12):
        lost = timer_leak()
        if lost:
            from PySide6 import __version__ as pyside

            raise LeakingQtError(
                f"PySide6 {pyside} loses a reference to None per Qt timer ({lost} for "
                f"{PROBE_TIMERS}); the app would abort with 'none_dealloc' after a few "
                "minutes of work. Install the pinned version: "
                "pip install 'pyside6-essentials==6.11.3' (scripts/setup.sh does)."
            )
    loop: asyncio.AbstractEventLoop = qasync.QEventLoop(app)
    return loop
