"""Floods, huge lines and lock waits against the real host stack (channel, RPC client, the runner's
TaskSession with its transcript on disk); the guest end is tests/helpers/guest_double.py.

Behaviour, with generous bounds (the figures are in benchmarks/README.md):
- ``/stop`` while the guest floods ends the run promptly, even if pi never
  confirms the abort, and the loop keeps serving other tasks meanwhile;
- a 60 MB line is parsed and recorded off the event loop: the loop thread
  itself spends little time on it, and the line arrives whole;
- waiting for task.json's lock (held by another process) leaves the loop free.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from piwork.config import Paths
from piwork.rpc import models as m
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus
from piwork.tasks.store import META_LOCK
from piwork.tasks.transcript import read_records
from tests.helpers.guest_double import FakeGuest, Host, guest_and_host


class Ticker:
    """A 5 ms ticker on the loop: the worst lateness, and the loop thread's CPU in it."""

    def __init__(self) -> None:
        self.ticks = 0
        self.worst = 0.0
        self.worst_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t, c = loop.time(), time.thread_time()
            await asyncio.sleep(0.005)
            late = loop.time() - t - 0.005
            self.ticks += 1
            if late > self.worst:
                self.worst, self.worst_cpu = late, time.thread_time() - c

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


@contextlib.asynccontextmanager
async def session_on(tmp_path: Path) -> AsyncIterator[tuple[FakeGuest, Host, TaskSession]]:
    """A TaskSession driving a fake guest through the same door (PiDoor) as AgentVm."""
    async with guest_and_host(default_timeout=60) as (guest, host):
        paths = Paths(tmp_path / "d", tmp_path / "c", tmp_path / "s", tmp_path / "cfg")
        session = TaskSession(RunRequest(prompt="flood"), paths=paths)
        task = session.store.create("flood")
        session.adopt(task)
        session.attach_agent(host.agent)
        try:
            yield guest, host, session
        finally:
            await session.close()


UPDATE = orjson.dumps(
    {
        "type": "message_update",
        "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "x"},
    }
)


async def flood(guest: FakeGuest, stop: asyncio.Event) -> int:
    """pi streaming text as fast as the socket takes it, ignoring every command."""
    assert guest.writer is not None
    sent = 0
    while not stop.is_set():
        batch = []
        for _ in range(500):
            guest.seq += 1
            batch.append(b"%d %s\n" % (guest.seq, UPDATE))
        guest.writer.write(b"".join(batch))
        await guest.writer.drain()
        sent += 500
    return sent


async def test_stop_during_a_flood_ends_the_run_within_seconds_though_pi_never_confirms(
    tmp_path: Path,
) -> None:
    async with session_on(tmp_path) as (guest, _host, session):
        run = asyncio.create_task(session.run_prompt("flood me"))
        cmd = await guest.next_command()
        assert cmd["type"] == "prompt"
        await guest.send_pi({"id": cmd["id"], "type": "response", "command": "prompt",
                             "success": True})  # fmt: skip
        await guest.send_pi({"type": "agent_start"})
        halt = asyncio.Event()
        flooding = asyncio.create_task(flood(guest, halt))
        try:
            with Ticker() as ticker:
                await asyncio.sleep(1.0)  # the flood is under way
                assert not run.done()
                assert ticker.ticks > 20, "the loop stopped serving other tasks"
                started = time.monotonic()
                await session.stop()
                outcome = await asyncio.wait_for(run, 20)
                took = time.monotonic() - started
        finally:
            halt.set()
            sent = await flooding
        print(f"stop took {took:.2f}s; worst loop stall {ticker.worst * 1000:.0f} ms; {sent=}")
        assert outcome.reason == "cancelled"
        assert took < 5, f"stopping under a flood took {took:.1f}s"
        # The abort was asked for (pi, flooding, never answered it).
        assert (await guest.next_command(1))["type"] == "abort"
        assert session.task is not None
        record = session.store.get(session.task.id).record
        assert record.status.value == "stopped"


async def test_a_60_mb_line_is_parsed_and_recorded_off_the_event_loop(tmp_path: Path) -> None:
    text = "y" * 99 + "\n"
    big = {
        "type": "tool_execution_end",
        "toolCallId": "c1",
        "toolName": "bash",
        "isError": False,
        "result": {"content": [{"type": "text", "text": text * (620 * 1024)}]},
    }
    async with session_on(tmp_path) as (guest, host, session):
        got: list[Any] = []
        host.rpc.add_listener(got.append)
        payload = orjson.dumps(big)
        assert len(payload) > 60 * 1024 * 1024
        with Ticker() as ticker:
            await guest.send_pi(payload)
            await guest.send_pi({"type": "agent_end", "messages": []})
            for _ in range(600):
                if any(isinstance(i, m.AgentEnd) for i in got):
                    break
                await asyncio.sleep(0.05)
        stall, cpu = ticker.worst * 1000, ticker.worst_cpu * 1000
        print(f"worst stall {stall:.0f} ms, loop CPU {cpu:.0f} ms")
        ends = [i for i in got if isinstance(i, m.ToolExecutionEnd)]
        assert len(ends) == 1 and m.tool_outcome(ends[0]).text == text * (620 * 1024)
        # The loop thread was not the one parsing and writing 60 MB: however long the
        # worst stall (the worker holds the GIL while orjson parses), little of it was
        # the loop's own work. On the loop, parsing + recording took 0.7-1.1 s.
        assert ticker.worst_cpu < 0.2, f"the loop itself spent {ticker.worst_cpu:.2f}s"
        assert session.task is not None
        records, problems = read_records(session.task.transcript_path)
        assert not problems
        kinds = [(r.data or {}).get("type") for r in records if r.kind == "pi"]
        assert kinds == ["tool_execution_end", "agent_end"]


async def test_waiting_for_the_task_json_lock_does_not_block_the_event_loop(
    tmp_path: Path,
) -> None:
    """Another process holds task.json's write lock for a second: the status change
    waits for it off the loop (it polled with time.sleep on the loop before)."""
    async with session_on(tmp_path) as (_guest, _host, session):
        assert session.task is not None
        fd = os.open(session.task.dir / META_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: conflicts as another process
            with Ticker() as ticker:
                change = asyncio.create_task(session.set_status(TaskStatus.RUNNING))
                await asyncio.sleep(1.0)
                assert not change.done(), "the write did not wait for the lock"
                ticks_while_held = ticker.ticks
            fcntl.flock(fd, fcntl.LOCK_UN)
            await asyncio.wait_for(change, 10)
        finally:
            os.close(fd)
        assert ticks_while_held > 50, f"only {ticks_while_held} ticks in a second"
        assert ticker.worst < 0.5, f"the loop stalled {ticker.worst:.2f}s"
        assert session.store.get(session.task.id).record.status is TaskStatus.RUNNING
