"""One answer for the package registries (issue 18 item 4): "Allow the package registries".

When all a request still asks about is a registry domain, the prompt offers
one answer that saves every registry rule at once (``piwork.env.registries``).
The rules are the host's, shown before the person picks; they persist in the
policy like any "Always"; a guest request cannot get the offer for another
host, and the answer never lifts a deny the person made.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from piwork.config import Paths
from piwork.env.registries import registry_domains, registry_rules
from piwork.policy import AuditLog, Choice, PolicyStore, Rule, Scope, Verdict, build_reply
from piwork.policy.request import MARKER_CLOSE, MARKER_OPEN, PermissionRequest
from piwork.policy.rules import Action, Target, TaskContext
from piwork.rpc import models as m
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus


class ScriptedAsker:
    """Answers with ``answer`` and keeps every request it was shown."""

    def __init__(self, answer: Choice = Choice.ALLOW_REGISTRIES) -> None:
        self.answer = answer
        self.asked: list[PermissionRequest] = []

    async def permission(self, request: PermissionRequest) -> Choice | None:
        self.asked.append(request)
        return self.answer

    async def question(self, *args: object) -> str | bool | None:
        return None


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    return tmp_path / "proj"


@pytest.fixture
def session(tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> TaskSession:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    paths = Paths(data=tmp_path / "d", cache=tmp_path / "c", state=tmp_path / "s",
                  config=tmp_path / "cfg")  # fmt: skip
    s = TaskSession(RunRequest(prompt="x"), asker=ScriptedAsker(), paths=paths)
    task = s.store.create("installs")
    s.adopt(task)
    s.task = s.store.transition(task.id, TaskStatus.RUNNING)
    s.permissions.context = TaskContext(task_id=task.id, working_folder=folder)
    return s


def _asker(session: TaskSession) -> ScriptedAsker:
    assert isinstance(session.asker, ScriptedAsker)
    return session.asker


def _policy(session: TaskSession) -> list[Rule]:
    return PolicyStore(session.paths.policy_file).load()


def _gate_request(*effects: dict[str, str]) -> PermissionRequest:
    return PermissionRequest(
        request_id="ui-1",
        question="Allow bash?",
        options=(),
        action=Action.NETWORK,
        tool="bash",
        tool_call_id="call-1",
        task_id=None,
        cwd="/mnt/work",
        command="pip install requests",
        paths=(),
        targets=tuple(
            Target(Action(e["action"]), **{k: v for k, v in e.items() if k != "action"})
            for e in effects
        ),
        payload={},
    )


PIP_INSTALL = (
    {"action": "network", "op": "network", "domain": "pypi.org", "command": "pip install x"},
    {"action": "write", "op": "write", "path": "/mnt/work", "command": "pip install x"},
)


async def test_the_proxys_registry_question_offers_every_registry_rule_and_saves_them(
    session: TaskSession, folder: Path
) -> None:
    asker = _asker(session)
    assert await session.permissions.domain_policy("pypi.org", 443)
    [shown] = asker.asked
    offered = shown.proposals[Choice.ALLOW_REGISTRIES]
    expected = registry_rules(Scope.folder(folder))
    assert [r.describe() for r in offered] == [r.describe() for r in expected]
    assert {r.pattern for r in offered} == set(registry_domains())
    # Saved exactly as shown, in the person's policy file (it outlives the task) ...
    saved = _policy(session)
    assert [r.describe() for r in saved] == [r.describe() for r in offered]
    # ... so the other registries' questions never come.
    for domain in ("files.pythonhosted.org", "deb.debian.org", "registry.npmjs.org"):
        assert await session.permissions.domain_policy(domain, 443)
    assert len(asker.asked) == 1
    # The audit says what the person picked.
    [entry] = [
        e for e in AuditLog(session.paths.audit_log).read() if e.get("decidedBy") == "person"
    ]
    assert entry["choice"] == "Allow the package registries"
    session.store.close()


async def test_another_folder_is_asked_again(session: TaskSession, tmp_path: Path) -> None:
    """One answer in this folder, like "Always allow in this folder": not everywhere."""
    asker = _asker(session)
    assert await session.permissions.domain_policy("pypi.org", 443)
    other = tmp_path / "other"
    other.mkdir()
    session.permissions.context = TaskContext(task_id="t2", working_folder=other)
    asker.answer = Choice.DENY
    assert not await session.permissions.domain_policy("pypi.org", 443)
    assert len(asker.asked) == 2
    session.store.close()


@pytest.mark.parametrize(
    "domain", ["example.com", "pypi.org.attacker.example", "evil-pypi.org", "npmjs.org"]
)
async def test_another_host_is_never_offered_the_registries(
    session: TaskSession, domain: str
) -> None:
    asker = _asker(session)
    asker.answer = Choice.DENY
    assert not await session.permissions.domain_policy(domain, 443)
    [shown] = asker.asked
    assert Choice.ALLOW_REGISTRIES not in shown.proposals
    session.store.close()


async def test_the_gates_pip_install_question_offers_it_and_pi_gets_one_of_its_own_options(
    session: TaskSession,
) -> None:
    """The gate asks about ``pip install`` (network pypi.org + a write in the folder, which
    the policy allows): the one answer covers it, and pi is told "Allow once"."""
    payload = {
        "v": 1,
        "kind": "piwork.permission",
        "tool": "bash",
        "action": "network",
        "command": "pip install x",
        "effects": list(PIP_INSTALL),
    }
    title = f"Allow?\n\n{MARKER_OPEN}{orjson.dumps(payload).decode()}{MARKER_CLOSE}"
    req = m.SelectRequest.model_validate(
        {
            "type": "extension_ui_request",
            "id": "ui-7",
            "method": "select",
            "title": title,
            "options": [
                "Allow once",
                "Always allow in this folder",
                "Always allow everywhere",
                "Deny",
            ],
        }
    )
    reply = await session.permissions.on_ui_request(req)
    assert reply is not None and reply.model_dump(exclude_none=True)["value"] == "Allow once"
    assert Choice.ALLOW_REGISTRIES in _asker(session).asked[0].proposals
    assert {r.pattern for r in _policy(session)} == set(registry_domains())
    assert build_reply("x", Choice.ALLOW_REGISTRIES)["value"] == "Allow once"
    session.store.close()


async def test_a_request_with_anything_else_to_ask_is_not_offered_it(
    session: TaskSession,
) -> None:
    """A delete riding along with the registry domain: one answer must not allow it."""
    asker = _asker(session)
    asker.answer = Choice.DENY
    req = _gate_request(
        PIP_INSTALL[0],
        {"action": "delete", "op": "delete", "path": "/mnt/work/src", "command": "rm -r src"},
    )
    assert await session.permissions.answer_permission(req) is Choice.DENY
    assert Choice.ALLOW_REGISTRIES not in asker.asked[0].proposals
    session.store.close()


async def test_an_answer_the_host_did_not_offer_is_refused_and_saves_nothing(
    session: TaskSession,
) -> None:
    """A front end that offers the registries for any host (a bug) gets a deny."""
    assert not await session.permissions.domain_policy("example.com", 443)
    assert _policy(session) == []
    session.store.close()


async def test_a_registry_the_person_denied_stays_denied(session: TaskSession) -> None:
    PolicyStore(session.paths.policy_file).add(
        Rule(Action.NETWORK, Verdict.DENY, Scope.global_(), pattern="registry.npmjs.org")
    )
    assert await session.permissions.domain_policy("pypi.org", 443)
    [shown] = _asker(session).asked
    offered = {r.pattern for r in shown.proposals[Choice.ALLOW_REGISTRIES]}
    assert offered == set(registry_domains()) - {"registry.npmjs.org"}
    assert not await session.permissions.domain_policy("registry.npmjs.org", 443)
    assert len(_asker(session).asked) == 1  # denied by the rule, not asked
    session.store.close()


async def test_registries_already_allowed_are_not_saved_twice(session: TaskSession) -> None:
    PolicyStore(session.paths.policy_file).add(
        Rule(Action.NETWORK, Verdict.ALLOW, Scope.global_(), pattern="deb.debian.org")
    )
    assert await session.permissions.domain_policy("pypi.org", 443)
    offered = {r.pattern for r in _asker(session).asked[0].proposals[Choice.ALLOW_REGISTRIES]}
    assert "deb.debian.org" not in offered and "pypi.org" in offered
    assert len([r for r in _policy(session) if r.pattern == "deb.debian.org"]) == 1
    session.store.close()


def test_only_the_registries_answer_stores_the_rules_it_is_given(tmp_path: Path) -> None:
    """``record_answer(rules=...)`` is the bundle's door only: "Allow once" and "Deny"
    remember nothing, whatever a caller passes."""
    from piwork.policy import Decider

    decider = Decider(PolicyStore(tmp_path / "p.json"), AuditLog(tmp_path / "a.jsonl"))
    ctx = TaskContext(task_id="t1", working_folder=tmp_path)
    req = _gate_request(PIP_INSTALL[0])
    bundle = registry_rules(Scope.folder(tmp_path))
    for choice in (Choice.ALLOW_ONCE, Choice.DENY):
        assert decider.record_answer(req, choice, ctx, rules=bundle).created_rules == ()
    assert PolicyStore(tmp_path / "p.json").load() == []
    done = decider.record_answer(req, Choice.ALLOW_REGISTRIES, ctx, rules=bundle)
    assert [r.describe() for r in done.created_rules] == [r.describe() for r in bundle]
