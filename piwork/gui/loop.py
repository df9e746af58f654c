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

Cyclic garbage is collected on the GUI thread only (:class:`GuiThreadCollector`).
Python runs its cycle collector in whichever thread happens to allocate past the
threshold: a worker (``asyncio.to_thread``, the transcript's sync thread, the child
watcher) could free a QObject that lives on the GUI thread. Qt refuses to stop that
object's timers from another thread ("Timers cannot be stopped from another thread")
and frees it anyway, so the GUI thread later fires a timer at freed memory: a
segfault with no Python frame to blame (it was seen in the full test run, in the
VM-backed window tests, where a closed qasync loop's timer object is such a cycle).
While the app's loop runs, automatic collection is off and a GUI-thread timer collects
with the interpreter's own thresholds instead.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading

from PySide6.QtCore import QCoreApplication, QObject, QTimer

from piwork.errors import PersonError

PROBE_TIMERS = 64


class LeakingQtError(RuntimeError, PersonError):
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


COLLECT_EVERY_MS = 200


class GuiThreadCollector(QObject):
    """Python's cyclic garbage collector, run on the GUI thread only, while held.

    ``hold()`` turns automatic collection off (for every thread) and starts a GUI-thread
    timer that collects the oldest generation whose count is over the interpreter's
    threshold, as the automatic collector would. The last ``release()`` collects once
    more on the GUI thread and gives automatic collection back as it was. Holds nest (the
    app's loop holds it; the GUI tests hold it across loops)."""

    def __init__(self, every_ms: int = COLLECT_EVERY_MS) -> None:
        super().__init__()
        self._holds = 0
        self._was_enabled = True
        self._timer = QTimer(self)
        self._timer.setInterval(every_ms)
        self._timer.timeout.connect(self.collect_due)

    @property
    def held(self) -> bool:
        return self._holds > 0

    def hold(self) -> None:
        _require_gui_thread("hold")
        if self._holds == 0:
            self._was_enabled = gc.isenabled()
            gc.disable()
            self._timer.start()
        self._holds += 1

    def release(self) -> None:
        _require_gui_thread("release")
        if self._holds == 0:
            raise RuntimeError("GuiThreadCollector.release() without a hold()")
        self._holds -= 1
        if self._holds == 0:
            self._timer.stop()
            gc.collect()
            if self._was_enabled:
                gc.enable()

    def collect_due(self) -> int | None:
        """Collect the oldest generation that is due; the generation collected, if any."""
        counts = gc.get_count()
        thresholds = gc.get_threshold()
        due = [g for g in range(3) if thresholds[g] and counts[g] > thresholds[g]]
        if not due:
            return None
        gc.collect(due[-1])
        return due[-1]


def _require_gui_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"GuiThreadCollector.{what}() must run on the GUI (main) thread")


_collector: GuiThreadCollector | None = None


def gui_thread_collector() -> GuiThreadCollector:
    """The process's one collector (created on first use, on the GUI thread)."""
    global _collector
    if _collector is None:
        _require_gui_thread("create")
        _collector = GuiThreadCollector()
    return _collector


def new_loop(app: QCoreApplication) -> asyncio.AbstractEventLoop:
    """The app's event loop: asyncio's selector loop driven by Qt (qasync), on a PySide6
    build that has been checked not to leak per timer, with cyclic garbage collected on
    the GUI thread for as long as the loop is open (:class:`GuiThreadCollector`)."""
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
    collector = gui_thread_collector()

    class Loop(qasync.QEventLoop):  # type: ignore[misc]
        def close(self) -> None:
            was_closed = self.is_closed()
            super().close()
            if not was_closed:
                collector.release()

    loop: asyncio.AbstractEventLoop = Loop(app)
    collector.hold()
    return loop
