"""GUI tests run headless on Qt's offscreen platform (the screenshot test uses Xvfb in a
subprocess). The platform must be chosen before pytest-qt creates the QApplication."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from piwork.config import Paths, get_paths


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
