"""piwork.run.pool: the limit, the queue and the keep-warm wait, without Qt."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

from piwork.config import Paths
from piwork.run.pool import CLOSE, Pool


class Slot:
    """What the app's TaskController does for the pool: start, and be tracked."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.live = False
        self.started = 0

    def start_queued(self) -> None:
        self.started += 1
        self.live = True
        self.pool.track(self)


def _pool(tmp_path: Path, **kw: float) -> Pool:
    home = tmp_path / "home"
    paths = Paths(data=home / "d", cache=home / "c", state=home / "s", config=home / "cfg")
    return Pool(paths=paths, **kw)  # type: ignore[arg-type]


def test_the_pool_never_imports_qt() -> None:
    import subprocess

    code = "import sys, piwork.run.pool; print(any('PySide6' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_queued_slots_start_in_order_when_a_slot_frees_or_the_limit_rises(tmp_path: Path) -> None:
    pool = _pool(tmp_path, limit=1)
    a, b, c = Slot(pool), Slot(pool), Slot(pool)
    pool.track(a)
    assert not pool.has_slot(b)
    pool.enqueue(b)
    pool.enqueue(c)
    pool.released(a)
    assert (b.started, c.started) == (1, 0)
    pool.set_limit(2)  # Settings: applies now
    assert c.started == 1


async def test_close_ends_the_warm_wait_at_once(tmp_path: Path) -> None:
    pool = _pool(tmp_path, keep_warm=600)
    inbox: asyncio.Queue[str] = asyncio.Queue()
    inbox.put_nowait(CLOSE)
    t0 = time.monotonic()
    try:
        await pool.next_prompt(inbox)
    except TimeoutError:
        pass
    else:
        raise AssertionError("CLOSE must end the wait")
    print(f"CLOSE ended the warm wait after {time.monotonic() - t0:.2f} s")


async def test_a_message_is_returned_and_a_shorter_keep_warm_applies_while_waiting(
    tmp_path: Path,
) -> None:
    pool = _pool(tmp_path, keep_warm=600)
    inbox: asyncio.Queue[str] = asyncio.Queue()
    inbox.put_nowait("next")
    assert await pool.next_prompt(inbox) == "next"
    waiting = asyncio.ensure_future(pool.next_prompt(inbox))
    await asyncio.sleep(0.1)
    pool.keep_warm = 0  # set in Settings while a VM is warm
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(waiting, 30)
    assert waiting.done() and isinstance(waiting.exception(), TimeoutError)
