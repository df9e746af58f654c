"""GUI tests run headless on Qt's offscreen platform (the screenshot test uses Xvfb in a
subprocess). The platform must be chosen before pytest-qt creates the QApplication."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from piwork.config import Paths, get_paths
from piwork.policy import GATE_CHOICES, Action, PermissionRequest, Target


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GUI soak (``@pytest.mark.soak``) runs only with PIWORK_SOAK=1: deselected, not
    skipped (the same rule as tests/faults/conftest.py)."""
    if os.environ.get("PIWORK_SOAK") == "1":
        return
    here = Path(__file__).parent
    soak = [i for i in items if i.get_closest_marker("soak") and here in Path(i.path).parents]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [i for i in items if i not in soak]


@pytest.fixture(scope="package", autouse=True)
def gc_on_gui_thread(qapp: object) -> Iterator[None]:
    """Cyclic garbage is collected on the GUI thread for all of tests/gui, between tests
    too: a window a test left as garbage must not be freed later by a worker thread of
    the next test (``piwork.gui.loop.GuiThreadCollector``; each loop also holds it)."""
    from piwork.gui.loop import gui_thread_collector

    collector = gui_thread_collector()
    collector.hold()
    yield
    collector.release()


@pytest.fixture
def gui_paths(tmp_path: Path) -> Paths:
    """A private piwork home (tasks, policy, settings); the pack cache stays shared."""
    home = tmp_path / "home"
    return Paths(
        data=home / "data", cache=get_paths().cache, state=home / "state", config=home / "config"
    )


@pytest.fixture
def qloop(qapp: object) -> Iterator[asyncio.AbstractEventLoop]:
    """The app's own loop (``piwork.gui.loop.new_loop``) on pytest-qt's QApplication."""
    from piwork.gui.loop import new_loop

    loop = new_loop(qapp)  # type: ignore[arg-type]
    asyncio.set_event_loop(loop)
    yield loop
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=30))
    loop.close()
    asyncio.set_event_loop(None)


def scripted_provider(server: Any) -> Any:
    """The scripted server as a custom provider: the runner reaches it through its gateway."""
    return server.as_provider(name="scripted test model")


def activate(w: Any) -> None:
    """Show ``w`` as the active window (shortcuts only reach the active window)."""
    from PySide6.QtTest import QTest

    w.show()
    w.activateWindow()
    assert QTest.qWaitForWindowActive(w)


async def shown(w: Any) -> None:
    """``activate`` for code already running on the qasync loop: no nested event loop
    (a nested loop would step other asyncio tasks re-entrantly, which asyncio refuses)."""
    w.show()
    w.activateWindow()
    await until(w.isActiveWindow, 10, "the window becomes active")


async def until(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Let the loop (and Qt) run until ``cond()`` is true."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for: {what}")
        await asyncio.sleep(0.05)


def permission_request(
    action: Action, path: str | None, command: str | None = None
) -> PermissionRequest:
    """A permission request for one target, as the runner parses it from pi's dialog."""
    return PermissionRequest(
        request_id="req-1",
        question=f"allow {action.value}?",
        options=tuple(c.value for c in GATE_CHOICES),
        action=action,
        tool="bash",
        tool_call_id="call-1",
        task_id="t1",
        cwd="/mnt/work",
        command=command,
        paths=(path,) if path else (),
        targets=(Target(action, op=action.value, path=path, command=command),),
        payload={},
    )
