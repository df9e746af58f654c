"""Hardening in a real VM: a long pause is not a failure; QEMU killed mid-stream
fails the task with its reason, loses no transcript line and leaves no orphan.

One booted VM for the module; the kill test runs last (it ends the VM).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.rpc import models as m
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from piwork.tasks import TaskStatus
from piwork.tasks.transcript import read_records
from tests.helpers.procs import alive
from tests.helpers.vm import ScriptedAsker, scripted_provider

pytestmark = pytest.mark.vm

RPC_TIMEOUT = 8.0  # shortened clock: pi's default is 60 s (not shorter: TCG under load)
PAUSE = 30.0  # longer than wait_idle's 15 s silence poll plus the reply timeout


class Run:
    def __init__(self, session: TaskSession, server: ScriptedModelServer) -> None:
        self.session = session
        self.server = server
        self.events: list[RunEvent] = []
        self.items: list[tuple[float, object]] = []

    async def wait_item(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, it in self.items:
                if isinstance(it, m.ToolExecutionUpdate) and text in str(it.partial_result):
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{text!r} not streamed within {timeout:.0f}s")


@pytest.fixture(scope="module")
async def run(
    model_server: ScriptedModelServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Run]:
    folder: Path = tmp_path_factory.mktemp("hardening-work")
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        title="vm hardening",
        extra_providers=(scripted_provider(model_server),),  # type: ignore[arg-type]
    )
    events: list[RunEvent] = []
    asker = ScriptedAsker(permission=Choice.ALLOW_ONCE)
    async with TaskSession(req, events.append, asker) as session:  # type: ignore[arg-type]
        r = Run(session, model_server)
        r.events = events
        session.add_item_listener(lambda it: r.items.append((time.monotonic(), it)))
        session.agent.rpc.default_timeout = RPC_TIMEOUT  # type: ignore[union-attr]
        yield r


def ticks_then_done(count: int) -> object:
    loop = f"for i in $(seq 1 {count}); do echo tick-$i; sleep 0.5; done"

    def choose(req: ChatRequest) -> Step:
        return ToolCalls([bash(loop)]) if req.assistant_turns_since_user == 0 else Text("done")

    return choose


async def test_a_pause_longer_than_every_reply_timeout_does_not_end_the_task(run: Run) -> None:
    run.server.script = ticks_then_done(12)
    run.items.clear()
    prompt = asyncio.ensure_future(run.session.run_prompt("Count ticks, slowly"))
    await run.wait_item("tick-2", 180)
    assert not prompt.done(), prompt.result()
    await run.session.pause_vm()
    await asyncio.sleep(PAUSE)
    assert not prompt.done(), prompt.result() if prompt.done() else None
    await run.session.resume_vm()
    outcome = await asyncio.wait_for(prompt, 180)
    assert outcome.reason == "completed", outcome
    ends = [e for e in run.events if e.kind is EventKind.TOOL_END]
    assert "tick-12" in str(ends[-1].data.get("text"))


async def test_qemu_killed_mid_stream_fails_the_task_with_its_reason_and_loses_nothing(
    run: Run,
) -> None:
    session = run.session
    assert session.agent is not None and session.task is not None
    qemu = session.agent.vm.pid
    assert qemu is not None
    run.server.script = ticks_then_done(200)
    run.items.clear()
    prompt = asyncio.ensure_future(session.run_prompt("Count many ticks"))
    await run.wait_item("tick-3", 180)
    before, _ = read_records(session.task.transcript_path)
    os.kill(qemu, signal.SIGKILL)
    killed_at = time.monotonic()
    outcome = await asyncio.wait_for(prompt, 60)
    assert time.monotonic() - killed_at < 30
    assert outcome.reason == "error" and "VM stopped unexpectedly" in (outcome.message or "")
    assert "piwork resume" in (outcome.message or "")
    record = session.store.get(session.task.id).record
    assert record.status is TaskStatus.STOPPED and record.stop is not None
    after, problems = read_records(session.task.transcript_path)
    assert problems == []
    assert [r.seq for r in after[: len(before)]] == [r.seq for r in before]
    assert not alive(qemu)
    # No helper process of this VM is left (there are none since the netmux; slirp's
    # guestfwd relays used to be QEMU's children).
    mine = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _ppid(int(pid)) == qemu and alive(int(pid))
    ]
    assert mine == []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().split(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
