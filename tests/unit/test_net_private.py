"""Private destinations: the egress proxy's own question, per domain, naming the address.

A destination that resolves to a private or reserved address is refused by
default; a rule (``piwork network allow-private``) or the person allows it,
once, for a folder or everywhere. ``--yes`` does not answer it, and a guest
request cannot forge it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.config import Paths
from piwork.env.registries import registry_offer, registry_rules
from piwork.net.addresses import describe_address, is_public
from piwork.policy import Choice
from piwork.policy.prompt import headline
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action, Rule, Scope, Target, TaskContext, Verdict
from piwork.policy.store import PolicyStore
from piwork.run.permissions import AllowAsker
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus
from tests.helpers.policy import forged

FOLDER = Path("/home/p/project")


class Answers:
    def __init__(self, *answers: Choice | None) -> None:
        self.answers = list(answers)
        self.asked: list[PermissionRequest] = []

    async def permission(self, request: PermissionRequest) -> Choice | None:
        self.asked.append(request)
        return self.answers.pop(0)

    async def question(self, *args: object) -> str | bool | None:
        return None


def session_with(tmp_path: Path, asker: object, *, yes: bool = False) -> TaskSession:
    paths = Paths(data=tmp_path / "d", cache=tmp_path / "c", state=tmp_path / "s",
                  config=tmp_path / "cfg")  # fmt: skip
    s = TaskSession(RunRequest(prompt="x", assume_yes=yes), asker=asker, paths=paths)  # type: ignore[arg-type]
    task = s.store.create("private")
    s.adopt(task)
    s.task = s.store.transition(task.id, TaskStatus.RUNNING)
    s.permissions.context = TaskContext(task_id=task.id, working_folder=FOLDER)
    return s


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("203.0.113.80", "documentation range"),
        ("127.0.0.1", "this computer"),
        ("::1", "this computer"),
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private network"),
        ("100.64.0.9", "carrier-grade NAT"),
        ("::ffff:192.168.1.1", "private network"),
        ("1.1.1.1", "public"),
    ],
)
def test_addresses_in_words(address: str, words: str) -> None:
    assert words in describe_address(address)
    assert is_public(address) == (words == "public")


async def test_the_question_names_domain_and_address_and_always_stores_a_domain_rule(
    tmp_path: Path,
) -> None:
    asker = Answers(Choice.ALWAYS_FOLDER)
    s = session_with(tmp_path, asker)
    assert await s.permissions.private_policy("pypi.org", 443, "203.0.113.80")
    (req,) = asker.asked
    assert req.action is Action.PRIVATE_NETWORK
    assert "pypi.org resolves to 203.0.113.80" in req.question
    assert headline(req) == (
        "The agent wants to reach pypi.org, which resolves to 203.0.113.80 "
        "(a reserved documentation range, often an inspecting proxy's)"
    )
    (rule,) = req.proposals[Choice.ALWAYS_FOLDER]
    assert (rule.action, rule.pattern, rule.scope) == (
        Action.PRIVATE_NETWORK,
        "pypi.org",
        Scope.folder(FOLDER),
    )
    # the rule answers next time: no question
    assert await s.permissions.private_policy("pypi.org", 443, "203.0.113.80")
    assert len(asker.asked) == 1
    # another domain still asks; a network rule does not cover a private address
    PolicyStore(s.paths.policy_file).add(
        Rule(Action.NETWORK, Verdict.ALLOW, Scope.global_(), pattern="deb.debian.org")
    )
    asker.answers.append(Choice.DENY)
    assert not await s.permissions.private_policy("deb.debian.org", 80, "203.0.113.80")


async def test_yes_does_not_answer_it(tmp_path: Path) -> None:
    s = session_with(tmp_path, AllowAsker(), yes=True)
    assert not await s.permissions.private_policy("localhost", 5432, "127.0.0.1")
    s.permissions.decider.store.add(
        Rule(Action.PRIVATE_NETWORK, Verdict.ALLOW, Scope.global_(), pattern="localhost")
    )
    assert await s.permissions.private_policy("localhost", 5432, "127.0.0.1")
    entries = list(s.permissions.decider.audit.read())
    assert [(e["action"], e["decision"]) for e in entries] == [
        ("private-network", "deny"),
        ("private-network", "allow"),
    ]
    assert entries[0]["decidedBy"] == "no-terminal" and entries[1]["decidedBy"] == "rule"


def test_a_guest_request_cannot_ask_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged gate request naming the private-address question is an unknown command."""
    req = forged(
        {"action": "private-network", "op": "private-network", "domain": "intranet.corp"},
        action="private-network",
    )
    assert req.action is Action.SHELL
    assert all(t.action is Action.SHELL for t in req.targets)
    assert all(t.domain is None for t in req.targets)


def test_the_package_registries_cover_the_mirrors(tmp_path: Path) -> None:
    rules = registry_rules(Scope.global_(), ["repo.corp", "pypi.org"])
    assert [r.pattern for r in rules] == [
        "deb.debian.org",
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "repo.corp",
    ]
    assert rules[-1].note == "package mirror"
    from piwork.policy import Decider

    decider = Decider(PolicyStore(tmp_path / "p.json"))
    ask = PermissionRequest(
        request_id="egress-1", question="?", options=(), action=Action.NETWORK, tool="network",
        tool_call_id=None, task_id="t", cwd=None, command=None, paths=(),
        targets=(Target(Action.NETWORK, op="network", domain="repo.corp"),), payload={},
    )  # fmt: skip
    ctx = TaskContext(task_id="t", working_folder=FOLDER)
    assert registry_offer(decider, ask, ctx) == ()
    offered = registry_offer(decider, ask, ctx, ["repo.corp"])
    assert "repo.corp" in [r.pattern for r in offered]


def test_env_build_says_the_real_reason_of_a_refusal() -> None:
    """Issue 31: the private-address guard's refusal was printed as "denied (by your
    policy)" after the person's rule had allowed the domain."""
    from piwork.env.build import decision_line
    from piwork.proxy.egress import EgressDecision

    guard = EgressDecision(
        "deb.debian.org", 80, "GET", False, "private address",
        "piwork: deb.debian.org resolves to 203.0.113.80, a private or reserved address ... "
        "`piwork network allow-private deb.debian.org`",
    )  # fmt: skip
    line = decision_line(guard, "by your policy")
    assert line.startswith("network: deb.debian.org:80 refused by the private-address guard: ")
    assert "allow-private deb.debian.org" in line and "by your policy" not in line
    policy = EgressDecision("evil.example", 443, "CONNECT", False, "policy")
    assert decision_line(policy, "by your policy") == (
        "network: evil.example:443 denied (by your policy)"
    )
    upstream = EgressDecision("pypi.org", 443, "CONNECT", False, "upstream proxy", "407 …")
    assert "refused by the upstream proxy: 407" in decision_line(upstream, "by your policy")
