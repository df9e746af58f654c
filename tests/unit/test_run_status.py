"""How a run's end is recorded when it ends unusually (piwork.run.status)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

from piwork.run.status import (
    LEFT_CANCELLED,
    LEFT_RUNNING,
    end_not_recorded,
    leaving_status,
    run_ended_by,
)
from piwork.tasks import StopReason, TaskStatus, TaskWriteError


async def futures() -> tuple[asyncio.Future[None], asyncio.Future[dict[str, str]]]:
    loop = asyncio.get_running_loop()
    return loop.create_future(), loop.create_future()


async def test_pi_gone_mid_run_is_the_error_not_the_lost_connection() -> None:
    work, gone = await futures()
    gone.set_result({"message": "pi exited with signal SIGKILL"})
    why = run_ended_by(work, gone, ["last stderr line"], "t1")  # work still pending
    assert why is not None and why[0] is StopReason.ERROR
    assert "SIGKILL" in str(why[1]) and "piwork resume t1" in str(why[1])
    work.set_exception(ConnectionResetError("rpc channel closed"))
    why = run_ended_by(work, gone, [], "t1")
    assert why is not None and "SIGKILL" in str(why[1]) and "rpc channel" not in str(why[1])
    work.exception()  # retrieved


async def test_a_failed_prompt_with_pi_alive_says_what_failed() -> None:
    work, gone = await futures()
    work.set_exception(ValueError("bad line"))
    assert run_ended_by(work, gone, [], "t1") == (StopReason.ERROR, "ValueError: bad line", None)
    gone.cancel()


async def test_a_finished_or_stopped_run_has_no_error_of_its_own() -> None:
    work, gone = await futures()
    assert run_ended_by(work, gone, [], "t1") is None  # a stop or a limit woke the run
    work.set_result(None)
    gone.set_result({"message": "pi exited after the run"})
    assert run_ended_by(work, gone, [], "t1") is None
    cancelled, alive = await futures()
    cancelled.cancel()
    assert run_ended_by(cancelled, alive, [], "t1") is None
    alive.cancel()


def test_a_session_closed_while_live_records_how() -> None:
    for done in (TaskStatus.STOPPED, TaskStatus.IDLE, TaskStatus.INTERRUPTED, None):
        assert leaving_status(done, cancelled=True, start_failure=None) is None
    assert leaving_status(TaskStatus.RUNNING, cancelled=True, start_failure="x") == (
        StopReason.CANCELLED,
        LEFT_CANCELLED,
    )
    assert leaving_status(TaskStatus.PAUSED, cancelled=False, start_failure=None) == (
        StopReason.ERROR,
        LEFT_RUNNING,
    )
    assert leaving_status(TaskStatus.RUNNING, cancelled=False, start_failure="VM exited") == (
        StopReason.ERROR,
        "VM exited",
    )


def test_a_full_disk_says_to_free_space_then_resume() -> None:
    full = TaskWriteError(Path("task.json"), OSError(errno.ENOSPC, "No space left"))
    assert "free some disk space, then `piwork resume t9`" in end_not_recorded(full, "t9")
    gone = TaskWriteError(Path("task.json"), OSError(errno.EIO, "I/O error"))
    said = end_not_recorded(gone, "t9")
    assert "free some disk space" not in said and "`piwork resume t9` continues it" in said
