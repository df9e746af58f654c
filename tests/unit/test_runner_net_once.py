""" "Allow once" at the gate's network prompt also lets the egress proxy through,
for that domain and that turn: the person is not asked twice for one connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.config import Paths
from piwork.policy import Choice
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action, Target
from piwork.rpc.models import parse_event
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus


class CountingAsker:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def permission(self, request: PermissionRequest) -> Choice | None:
        self.asked.append(request.question)
        return Choice.ALLOW_ONCE

    async def question(self, *args: object) -> str | bool | None:
        return None


def _gate_network_request(domain: str) -> PermissionRequest:
    return PermissionRequest(
        request_id="ui-1",
        question=f"Allow bash: curl https://{domain}/?",
        options=tuple(c.value for c in Choice),
        action=Action.NETWORK,
        tool="bash",
        tool_call_id="call-1",
        task_id=None,
        cwd=None,
        command=f"curl https://{domain}/",
        paths=(),
        targets=(Target(Action.NETWORK, op="network", domain=domain, command="curl"),),
        payload={},
    )


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TaskSession:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    paths = Paths(data=tmp_path / "d", cache=tmp_path / "c", state=tmp_path / "s",
                  config=tmp_path / "cfg")  # fmt: skip
    s = TaskSession(RunRequest(prompt="x"), asker=CountingAsker(), paths=paths)
    task = s.store.create("net once")
    s.store.claim(task.id)
    s.task = s.store.transition(task.id, TaskStatus.RUNNING)
    return s


async def test_allow_once_at_the_gate_satisfies_the_egress_proxy_for_that_turn(
    session: TaskSession,
) -> None:
    asker = session.asker
    assert isinstance(asker, CountingAsker)
    assert await session._answer_permission(_gate_network_request("example.com")) is (
        Choice.ALLOW_ONCE
    )
    assert await session._domain_policy("example.com", 443)
    assert len(asker.asked) == 1, asker.asked
    # Another domain is still asked about.
    assert await session._domain_policy("other.example", 443)
    assert len(asker.asked) == 2
    # The next turn asks again.
    session._on_item(parse_event({"type": "turn_end", "message": {}, "toolResults": []}))
    assert await session._domain_policy("example.com", 443)
    assert len(asker.asked) == 3
    session.store.close()
