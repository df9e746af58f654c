"""Task controls in a real VM: ask_user, steer, pause/continue, stop, max-turns.

One booted VM and one :class:`TaskSession` serve the whole module: a task
that stopped (completed, cancelled or by a limit) can be prompted again, so
each test is one more ``run_prompt`` on the same pi session. The scripted
model restarts its script at every user message (``per_prompt``-style).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
    ToolCall,
    ToolCalls,
    bash,
)
from piwork.policy import Choice
from piwork.rpc import models as m
from piwork.runner import EventKind, Outcome, RunEvent, RunRequest, TaskSession
from piwork.tasks import TaskStatus
from tests.helpers.vm import ScriptedAsker, scripted_provider

pytestmark = pytest.mark.vm


@dataclass
class Harness:
    session: TaskSession
    server: ScriptedModelServer
    asker: ScriptedAsker
    folder: Path
    events: list[RunEvent] = field(default_factory=list)
    items: list[tuple[float, object]] = field(default_factory=list)  # pi's, as they arrive

    @property
    def record(self) -> Any:
        assert self.session.task is not None
        return self.session.store.get(self.session.task.id).record

    def mark(self) -> int:
        return len(self.events)

    def since(self, start: int, kind: EventKind | None = None) -> list[RunEvent]:
        return [e for e in self.events[start:] if kind is None or e.kind is kind]

    async def wait_event(
        self, start: int, pred: Callable[[RunEvent], bool], timeout: float
    ) -> RunEvent:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events[start:]:
                if pred(ev):
                    return ev
            await asyncio.sleep(0.05)
        kinds = [e.kind.value for e in self.events[start:]]
        raise AssertionError(f"event not seen within {timeout:.0f}s; saw {kinds}")

    async def wait_item(self, pred: Callable[[object], bool], timeout: float) -> float:
        """Wait for a pi event matching ``pred`` (any seen before this call counts)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, it in self.items:
                if pred(it):
                    return t
            await asyncio.sleep(0.05)
        raise AssertionError(f"pi event not seen within {timeout:.0f}s")

    def chats_since(self, count: int) -> list[ChatRequest]:
        return [ChatRequest(r.body, r.headers) for r in self.server.chat_requests[count:]]


@pytest.fixture(scope="module")
async def h(
    model_server: ScriptedModelServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    folder = tmp_path_factory.mktemp("tasks-work")
    asker = ScriptedAsker(permission=Choice.ALLOW_ONCE)
    events: list[RunEvent] = []
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        title="vm task controls",
        extra_providers=(scripted_provider(model_server),),  # type: ignore[arg-type]
    )
    async with TaskSession(req, events.append, asker) as session:  # type: ignore[arg-type]
        harness = Harness(session, model_server, asker, folder, events)
        session.add_item_listener(lambda it: harness.items.append((time.monotonic(), it)))
        yield harness
    assert session.agent is None


def bash_outputs(h: Harness, start: int) -> list[str]:
    return [str(e.data.get("text")) for e in h.since(start, EventKind.TOOL_END)]


def text_of(h: Harness, start: int) -> str:
    return "".join(str(e.data.get("delta", "")) for e in h.since(start, EventKind.TEXT))


def streamed(item: object, text: str) -> bool:
    """A bash output update containing ``text``."""
    return isinstance(item, m.ToolExecutionUpdate) and text in str(item.partial_result)


# --------------------------------------------------------------------------- ask_user


async def test_ask_user_questions_are_answered_and_the_answers_reach_the_model(h: Harness) -> None:
    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        if i == 0:
            return ToolCalls(
                [ToolCall("ask_user", {"question": "Which colour?", "options": ["red", "blue"]})]
            )
        if i == 1:
            return ToolCalls([ToolCall("ask_user", {"question": "Your name?"})])
        results = [x.result for x in req.tool_exchanges()]
        return Text(f"model saw: {results}")

    h.server.script = choose
    h.asker.answer = lambda title: {"Which colour?": "blue", "Your name?": "Ada"}.get(title)
    start, chats = h.mark(), len(h.server.chat_requests)
    outcome = await h.session.run_prompt("Ask me two things")

    assert outcome.reason == "completed", outcome
    assert h.asker.questions[-2:] == [("select", "Which colour?"), ("input", "Your name?")]
    asked = h.since(start, EventKind.QUESTION)
    assert [e.data["options"] for e in asked] == [["red", "blue"], None]
    statuses = [e.data["status"] for e in h.since(start, EventKind.STATUS)]
    assert statuses.count("waiting_input") == 2 and statuses[-1] == "stopped"
    # The answers are what the model got back as the tool results.
    last = h.chats_since(chats)[-1]
    results = [x.result for x in last.tool_exchanges()]
    assert results == ["The user answered: blue", "The user answered: Ada"]
    assert "The user answered: Ada" in text_of(h, start)


# --------------------------------------------------------------------------- steer


async def test_a_steer_changes_what_the_model_does_next(h: Harness) -> None:
    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        if "use plan B" in req.last_user_text:
            return ToolCalls([bash("echo plan-b-ran")]) if i == 0 else Text("switched to plan B")
        if i < 15:
            return ToolCalls([bash(f"sleep 1; echo plan-a-{i}")])
        return Text("plan A finished")

    h.server.script = choose
    start, chats = h.mark(), len(h.server.chat_requests)
    run = asyncio.ensure_future(h.session.run_prompt("Do plan A"))
    await h.wait_event(start, lambda e: e.kind is EventKind.TOOL_START, 120)
    await h.session.steer("Stop that; use plan B instead")
    outcome = await asyncio.wait_for(run, 240)

    assert outcome.reason == "completed", outcome
    assert "switched to plan B" in text_of(h, start)
    outputs = bash_outputs(h, start)
    plan_a = [o for o in outputs if "plan-a-" in o]
    assert any("plan-b-ran" in o for o in outputs), outputs
    assert 1 <= len(plan_a) <= 3, outputs  # plan A stopped right after the steer
    # The model saw the steer as the latest user message.
    steered = [c for c in h.chats_since(chats) if "use plan B" in c.last_user_text]
    assert steered and "Do plan A" in str(steered[0].messages)


# --------------------------------------------------------------------------- pause


async def test_pause_freezes_the_guest_and_continue_resumes_it(h: Harness) -> None:
    ticks = "for i in $(seq 1 24); do echo tick-$i; sleep 0.5; done"

    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        return ToolCalls([bash(ticks)]) if i == 0 else Text("ticks done")

    h.server.script = choose
    h.items.clear()
    start, chats = h.mark(), len(h.server.chat_requests)
    run = asyncio.ensure_future(h.session.run_prompt("Count ticks"))
    # Wait until the loop streams its output, so pi events would keep coming.
    await h.wait_item(lambda it: streamed(it, "tick-2"), 120)
    await h.session.pause_vm()
    paused_at = time.monotonic()
    assert h.session.agent is not None
    assert await h.session.agent.vm.status() == "paused"
    assert h.record.status is TaskStatus.PAUSED
    await asyncio.sleep(4.0)
    during = [it for t, it in h.items if t > paused_at + 0.2]
    assert during == [], f"pi events while paused: {during[:3]}"
    assert not run.done()

    await h.session.resume_vm()
    resumed_at = time.monotonic()
    assert await h.session.agent.vm.status() == "running"
    outcome = await asyncio.wait_for(run, 180)
    after = [t for t, _ in h.items if t > resumed_at]
    assert after and after[0] - resumed_at < 5.0  # the control: events flow again
    assert outcome.reason == "completed", outcome
    out = bash_outputs(h, start)[0]
    assert all(f"tick-{i}\n" in out + "\n" for i in range(1, 25)), out
    assert len(h.chats_since(chats)) == 2
    statuses = [e.data["status"] for e in h.since(start, EventKind.STATUS)]
    assert statuses[-3:] == ["paused", "running", "stopped"]


# --------------------------------------------------------------------------- stop


async def test_stop_while_a_tool_runs_ends_cancelled_and_kills_the_tool(h: Harness) -> None:
    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        return ToolCalls([bash("sleep 300; echo never")]) if i == 0 else Text("not reached")

    h.server.script = choose
    start, chats = h.mark(), len(h.server.chat_requests)
    h.items.clear()
    run = asyncio.ensure_future(h.session.run_prompt("Sleep for a long time"))
    # bash announces itself with an empty update when the command starts.
    await h.wait_item(lambda it: isinstance(it, m.ToolExecutionUpdate), 120)
    await asyncio.sleep(2.0)  # the sleep runs in the guest
    assert not run.done()
    stopped_at = time.monotonic()
    await h.session.stop()
    outcome = await asyncio.wait_for(run, 60)
    took = time.monotonic() - stopped_at

    assert outcome.reason == "cancelled" and outcome.exit_code == 130, outcome
    assert took < 30, f"stop took {took:.1f}s"
    rec = h.record
    assert rec.status is TaskStatus.STOPPED and rec.stop.reason.value == "cancelled"
    ends = h.since(start, EventKind.TOOL_END)
    assert len(ends) == 1 and ends[0].data["ok"] is False
    assert "never" not in str(ends[0].data["text"])
    assert len(h.chats_since(chats)) == 1  # the model was not asked again

    # The cancelled task takes a new prompt, and the sleep is really gone.
    # A control sleep shows that `ps` would see one.
    check = "(sleep 77 &); ps -eo args | grep -c '^sleep 77'; ps -eo args | grep -c '^sleep 300'"
    h.server.script = lambda req: (
        ToolCalls([bash(f"{check}; true")]) if req.assistant_turns_since_user == 0 else Text("ok")
    )
    start = h.mark()
    outcome = await h.session.run_prompt("Is it still sleeping?")
    assert outcome.reason == "completed", outcome
    assert bash_outputs(h, start)[0].split() == ["1", "0"]


# --------------------------------------------------------------------------- limits


async def test_the_max_turns_limit_stops_a_looping_model(h: Harness) -> None:
    assert h.session.task is not None
    rec = h.record
    base = rec.usage.turns
    h.session.store.update(
        h.session.task.id, limits=rec.limits.model_copy(update={"max_turns": base + 3})
    )
    assert h.record.limits.max_turns == base + 3
    h.server.script = lambda req: ToolCalls([bash("echo still working")])
    start, chats = h.mark(), len(h.server.chat_requests)
    outcome: Outcome = await asyncio.wait_for(h.session.run_prompt("Loop forever"), 300)

    assert outcome.reason == "limit" and outcome.exit_code == 3, outcome
    rec = h.record
    assert rec.status is TaskStatus.STOPPED
    assert rec.stop.reason.value == "limit" and rec.stop.limit.value == "turns"
    assert base + 3 <= rec.usage.turns <= base + 4, rec.usage
    assert 3 <= len(h.chats_since(chats)) <= 4
    done = h.since(start, EventKind.DONE)[-1]
    assert done.data["reason"] == "limit" and "turns" in str(done.data["message"])


async def test_the_wall_time_limit_stops_a_long_tool_call(h: Harness) -> None:
    """No usage event arrives while a tool runs; the limit must still be enforced."""
    assert h.session.task is not None
    rec = h.record
    budget = rec.wall_seconds() + 6
    h.session.store.update(
        h.session.task.id,
        limits=rec.limits.model_copy(update={"max_turns": None, "max_wall_time_seconds": budget}),
    )
    h.server.script = lambda req: (
        ToolCalls([bash("sleep 300")]) if req.assistant_turns_since_user == 0 else Text("woke")
    )
    start = h.mark()
    t0 = time.monotonic()
    outcome: Outcome = await asyncio.wait_for(h.session.run_prompt("Sleep for a while"), 120)
    took = time.monotonic() - t0

    assert outcome.reason == "limit", outcome
    rec = h.record
    assert rec.stop.reason.value == "limit" and rec.stop.limit.value == "wall_time"
    assert took < 60, f"the limit took {took:.0f}s to act on a 6s budget"
    tool_ends = h.since(start, EventKind.TOOL_END)
    assert tool_ends and not tool_ends[-1].data["ok"]  # the sleep was cut short
