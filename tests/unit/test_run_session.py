"""TaskSession driven end to end through its public methods, with FakeAgent behind the
agent door (tests/helpers/fake_agent.py) and every host-side part real."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from piwork.config import get_paths
from piwork.run.digest import EventKind, RunEvent
from piwork.runner import RunError, RunRequest, TaskSession
from piwork.tasks import TaskStatus
from piwork.tasks.transcript import read_records
from tests.helpers.fake_agent import FakeAgent
from tests.helpers.pack import MANIFEST

SCRIPT: list[dict[str, Any]] = [
    {"type": "agent_start"},
    {"type": "turn_start"},
    {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "bash",
     "args": {"command": "ls"}},
    {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "bash", "isError": False,
     "result": {"content": [{"type": "text", "text": "a.txt"}]}},
    {"type": "message_update", "message": {},
     "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "done"}},
    {"type": "message_end", "message": {"role": "assistant", "content": [
        {"type": "text", "text": "done"}], "stopReason": "stop", "api": "x", "provider": "x",
        "model": "x", "usage": {}, "timestamp": 0}},
    {"type": "turn_end", "message": {}, "toolResults": []},
    {"type": "agent_end", "messages": []},
]  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    # The pack is the VM's business: the fake agent boots nothing.
    monkeypatch.setattr("piwork.run.environment.ensure_pack", lambda **_: tmp_path / "pack")
    monkeypatch.setattr("piwork.run.environment.load_manifest", lambda _d: MANIFEST)
    return tmp_path / "home"


def _session(events: list[RunEvent], agents: list[FakeAgent]) -> TaskSession:
    def factory(cfg: Any, **hooks: Any) -> FakeAgent:
        agents.append(FakeAgent(cfg, script=SCRIPT, **hooks))
        return agents[-1]

    req = RunRequest(prompt="list files", memory_mb=256, cpus=1)
    return TaskSession(req, events.append, paths=get_paths(), agent_factory=factory)


async def test_a_run_is_sequenced_through_the_agent_door(home: Path) -> None:
    events: list[RunEvent] = []
    agents: list[FakeAgent] = []
    async with _session(events, agents) as session:
        outcome = await session.run_prompt("list files")
        await session.steer("and the hidden ones")
        await session.follow_up("then stop")
    [agent] = agents
    assert outcome.ok, outcome
    assert [c for c, _ in agent.calls] == ["start", "prompt", "steer", "follow_up", "stop"]
    kinds = [e.kind for e in events]
    shown = (EventKind.TASK, EventKind.READY, EventKind.PROMPT, EventKind.TOOL_START)
    shown += (EventKind.TOOL_END, EventKind.TEXT, EventKind.TEXT_END, EventKind.DONE)
    for kind in shown:
        assert kind in kinds, kind
    assert kinds.index(EventKind.TOOL_START) < kinds.index(EventKind.TEXT_END)
    # The guest sees only the gateway and the proxy, with this run's tokens.
    env = agent.cfg.extra_env
    assert (
        env["HTTPS_PROXY"].startswith("http://piwork:") and "@10.0.2.101:3128" in env["HTTPS_PROXY"]
    )
    assert "10.0.2.100" in env["NO_PROXY"]
    assert outcome.task_id
    task = session.store.get(outcome.task_id)
    records, _ = read_records(task.transcript_path)
    noted = [r.kind for r in records]
    assert "prompt" in noted and "steer" in noted and "pi" in noted
    assert task.record.usage.turns == 1


async def test_pause_and_resume_go_through_the_door_only_while_a_prompt_runs(home: Path) -> None:
    events: list[RunEvent] = []
    agents: list[FakeAgent] = []
    async with _session(events, agents) as session:
        with pytest.raises(RunError, match="nothing to pause"):
            await session.pause_vm()
        agent = agents[0]
        agent.idle.clear()  # pi is busy with the prompt
        agent.prompted.clear()
        run = asyncio.ensure_future(session.run_prompt("work"))
        await asyncio.wait_for(agent.prompted.wait(), 10)
        await session.pause_vm()
        assert session.paused
        assert session.store.get(agent.cfg.task_id).record.status is TaskStatus.PAUSED
        await session.resume_vm()
        assert not session.paused
        agent.idle.set()
        assert (await run).ok
    assert [c for c, _ in agent.calls if c in ("pause", "resume")] == ["pause", "resume"]


async def test_controls_before_start_or_after_close_name_the_state(home: Path) -> None:
    session = _session([], [])
    with pytest.raises(RunError, match="cannot steer: the task's VM is not started"):
        await session.steer("x")
    await session.close()
    with pytest.raises(RunError, match="cannot run a prompt: the task's VM is closed"):
        await session.run_prompt("x")


async def test_a_damaged_policy_starts_nothing(home: Path) -> None:
    """A policy the host cannot read is never a looser one: no task, no VM, one line."""
    from piwork.policy import Action, PolicyDamaged, PolicyStore, Rule, Scope, Verdict

    store = PolicyStore()
    store.add(Rule(Action.WRITE, Verdict.DENY, Scope.folder(home), pattern="secret/**"))
    store.path.write_bytes(store.path.read_bytes()[:40])
    events: list[RunEvent] = []
    agents: list[FakeAgent] = []
    with pytest.raises(PolicyDamaged) as caught:
        async with _session(events, agents):
            pass
    assert agents == [], "no VM was asked for"
    assert not get_paths().tasks.exists() or not any(get_paths().tasks.iterdir())
    assert "\n" not in str(caught.value) and "piwork policy restore" in str(caught.value)
