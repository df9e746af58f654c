"""The permission bridge: an "Allow once" at the gate never opens a domain at the egress proxy.

Security review finding 10: a gate request is guest text. Its question and
command may say one thing (``pip download ... pypi.org``) while its effects
name another domain. Answers at the gate therefore never feed the egress
proxy: the proxy asks its own question, built on the host from the host name
it was asked to reach, so the person always sees the real destination.
"""

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
        self.asked: list[PermissionRequest] = []

    async def permission(self, request: PermissionRequest) -> Choice | None:
        self.asked.append(request)
        return Choice.ALLOW_ONCE

    async def question(self, *args: object) -> str | bool | None:
        return None


def _gate_network_request(domain: str, *, says: str | None = None) -> PermissionRequest:
    """A gate select; ``says`` is the guest's own text (question and command)."""
    command = says or f"curl https://{domain}/"
    return PermissionRequest(
        request_id="ui-1",
        question=f"Allow bash: {command}?",
        options=tuple(c.value for c in Choice),
        action=Action.NETWORK,
        tool="bash",
        tool_call_id="call-1",
        task_id=None,
        cwd=None,
        command=command,
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
    s.adopt(task)
    s.task = s.store.transition(task.id, TaskStatus.RUNNING)
    return s


def _asker(session: TaskSession) -> CountingAsker:
    asker = session.asker
    assert isinstance(asker, CountingAsker)
    return asker


async def test_a_forged_gate_request_allowed_once_does_not_open_its_hidden_domain(
    session: TaskSession,
) -> None:
    """The attack: the text says pypi, the effect names the attacker's host."""
    asker = _asker(session)
    forged = _gate_network_request(
        "exfil.attacker.example",
        says="pip download requests --index-url https://pypi.org/simple",
    )
    assert await session.permissions.answer_permission(forged) is Choice.ALLOW_ONCE
    assert len(asker.asked) == 1
    # The guest now connects to the hidden domain: the proxy does not let it
    # through on the strength of that answer; it asks, naming the real host.
    assert await session.permissions.domain_policy("exfil.attacker.example", 443)
    assert len(asker.asked) == 2
    proxy_question = asker.asked[1]
    assert proxy_question.tool == "network"
    assert "exfil.attacker.example" in proxy_question.question
    assert "pypi" not in proxy_question.question
    assert [t.domain for t in proxy_question.targets] == ["exfil.attacker.example"]
    session.store.close()


async def test_a_denied_egress_question_blocks_a_domain_the_gate_allowed_once(
    session: TaskSession,
) -> None:
    asker = _asker(session)
    assert (
        await session.permissions.answer_permission(
            _gate_network_request("exfil.attacker.example", says="pip install requests")
        )
        is Choice.ALLOW_ONCE
    )

    async def deny(request: PermissionRequest) -> Choice | None:
        asker.asked.append(request)
        return Choice.DENY

    asker.permission = deny  # type: ignore[method-assign]
    assert not await session.permissions.domain_policy("exfil.attacker.example", 443)
    session.store.close()


async def test_every_egress_connection_to_an_unlisted_host_is_its_own_question(
    session: TaskSession,
) -> None:
    """Before finding 10, "Allow once" at the gate let the proxy through for that turn;
    now the person is asked by the proxy each time (showing the host it resolved)."""
    asker = _asker(session)
    assert await session.permissions.answer_permission(_gate_network_request("example.com")) is (
        Choice.ALLOW_ONCE
    )
    assert await session.permissions.domain_policy("example.com", 443)
    assert len(asker.asked) == 2, [r.question for r in asker.asked]
    assert await session.permissions.domain_policy("other.example", 443)
    assert len(asker.asked) == 3
    # A turn boundary changes nothing: each connection is asked about.
    session.attach_agent(_NoAgent())
    _NoAgent.listener(parse_event({"type": "turn_end", "message": {}, "toolResults": []}))
    assert await session.permissions.domain_policy("example.com", 443)
    assert len(asker.asked) == 4
    session.store.close()


async def test_allow_net_domains_pass_the_proxy_without_a_question(
    session: TaskSession,
) -> None:
    asker = _asker(session)
    session.permissions.allow_net = ("example.com",)
    assert await session.permissions.domain_policy("api.example.com", 443)
    assert asker.asked == []
    session.store.close()


class _NoAgent:
    """Only what attach_agent wires: the session's listener is kept to feed it items."""

    listener: object = None

    def connect(self, *, line_tap: object, ui_handler: object, listener: object) -> None:
        type(self).listener = listener


async def test_a_policy_damaged_mid_run_denies_and_ends_the_run(session: TaskSession) -> None:
    """The file is truncated while the task runs: the next question is a deny, not the
    built-in defaults' answer, and the run ends saying which file and how to restore it."""
    from piwork.policy import Rule, Scope, Verdict
    from piwork.run.digest import EventKind, RunEvent

    events: list[RunEvent] = []
    session.sink = events.append
    store = session.permissions.decider.store
    store.add(Rule(Action.NETWORK, Verdict.ALLOW, Scope.global_(), pattern="pypi.org"))
    store.path.write_bytes(b'{"version": 1, "ru')
    assert await session.permissions.answer_permission(_gate_network_request("pypi.org")) is (
        Choice.DENY
    )
    assert not await session.permissions.domain_policy("pypi.org", 443)
    assert _asker(session).asked == [], "nobody is asked on a guess either"
    from piwork.policy import AuditLog

    audited = [e["decidedBy"] for e in AuditLog(session.paths.audit_log).read()]
    assert audited == ["unusable-policy", "unusable-policy"]
    assert session.stop_requested
    reason = session.stop_reason
    assert reason is not None and "policy restore" in (reason[1] or "")
    errors = [e.data["message"] for e in events if e.kind is EventKind.ERROR]
    assert errors and str(store.path) in errors[0]
    session.store.close()


async def test_a_provider_side_tool_is_asked_like_a_network_destination(
    session: TaskSession,
) -> None:
    """An enabled server tool (security review 2, finding 2): an MCP server or a search
    limited to domains is asked about host by host, as the egress proxy asks; a tool that
    reaches any site is its own question, naming the provider and the tool."""
    from piwork.proxy.schema import ServerToolUse

    asker = _asker(session)
    mcp = ServerToolUse("mcp", "mcp_servers", ("mcp.example.com",))
    assert await session.permissions.server_tool_policy("anthropic", mcp)
    [question] = asker.asked
    assert question.tool == "network"
    assert [t.domain for t in question.targets] == ["mcp.example.com"]
    fetch = ServerToolUse("web_fetch", "tools[0]")
    assert await session.permissions.server_tool_policy("anthropic", fetch)
    question = asker.asked[1]
    assert question.action is Action.CONNECTOR
    assert [t.tool for t in question.targets] == ["anthropic:web_fetch"]
    assert "anthropic" in question.question and "any site" in question.question

    async def deny(request: PermissionRequest) -> Choice | None:
        asker.asked.append(request)
        return Choice.DENY

    asker.permission = deny  # type: ignore[method-assign]
    assert not await session.permissions.server_tool_policy("anthropic", fetch)
    session.store.close()
