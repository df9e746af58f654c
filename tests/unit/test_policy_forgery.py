"""Forged permission requests reaching the decider: the host trusts none of their contents.

Guest root can write any line into pi's stdout, so every field of a request
(action, op, paths, domains, commands, tool names, the question) is hostile.
These tests feed forged select messages through ``parse_request`` into the
``Decider`` and check that nothing over-broad is allowed or remembered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from piwork.cli.render import permission_prompt_text
from piwork.cli.run_cmd import TerminalAsker
from piwork.policy import describe_rules, needs_confirmation, proposed_rules
from piwork.policy.decider import Decider, persist_pattern
from piwork.policy.request import (
    Choice,
    PermissionRequest,
    clean_domain,
    clean_path,
    validate_request,
)
from piwork.policy.rules import Action, ScopeKind, Target, TaskContext, Verdict
from piwork.textsafe import sanitize
from tests.helpers.policy import forged

FOLDER = Path("/home/me/project")
CTX = TaskContext(task_id="t-1", working_folder=FOLDER)


@pytest.fixture
def decider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Decider:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return Decider()


def always_everywhere(decider: Decider, req: PermissionRequest) -> tuple[Any, ...]:
    assert decider.decide(req, CTX).verdict is Verdict.ASK
    d = decider.record_answer(req, Choice.ALWAYS_EVERYWHERE, CTX)
    return d.created_rules


# -- the two attacks from the issue ------------------------------------------


def test_forged_network_star_stores_no_rule_and_allows_no_host(decider: Decider) -> None:
    req = forged({"action": "network", "op": "network", "domain": "*", "reason": "x"})
    assert always_everywhere(decider, req) == ()
    assert decider.store.load() == []
    for host in ("evil.example", "pypi.org"):
        probe = forged({"action": "network", "op": "network", "domain": host})
        assert decider.decide(probe, CTX).verdict is Verdict.ASK


def test_forged_network_wildcards_are_unknown_hosts(decider: Decider) -> None:
    for bad in ("*", "*.com", "com", "", "evil.com/..", "user@evil.com", "evil.com:443", "a b.com"):
        req = forged({"action": "network", "op": "network", "domain": bad})
        [t] = validate_request(req, CTX).targets
        assert t.domain is None, bad
        assert decider.proposed_rules(req, Choice.ALWAYS_EVERYWHERE, CTX) == (), bad


def test_forged_delete_of_the_working_folder_stores_no_rule(decider: Decider) -> None:
    req = forged({"action": "delete", "op": "delete", "path": "/mnt/work", "reason": "x"})
    assert always_everywhere(decider, req) == ()
    later = forged({"action": "delete", "op": "delete", "path": "/mnt/work/src/main.py"})
    assert decider.decide(later, CTX).verdict is Verdict.ASK
    folder = decider.record_answer(req, Choice.ALWAYS_FOLDER, CTX)
    assert folder.created_rules == ()


@pytest.mark.parametrize("root", ["/mnt/outputs", "/mnt", "/", "/mnt/uploads", "/mnt/state"])
def test_forged_delete_of_broad_or_foreign_roots_stores_no_rule(
    decider: Decider, root: str
) -> None:
    req = forged({"action": "delete", "op": "delete", "path": root})
    assert always_everywhere(decider, req) == ()


# -- over-broad, outside-scope and malformed targets -----------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/mnt/work/../../etc/passwd",
        "/mnt/workx/a",
        "mnt/work/a",
        "",
        "/mnt/state/agent/models.json",
        "//mnt/work/a",
        "/mnt/work/a\x1b[2K",
    ],
)
def test_a_forged_read_outside_the_mounts_is_not_auto_allowed(decider: Decider, path: str) -> None:
    req = forged({"action": "read", "op": "read", "path": path})
    assert decider.decide(req, CTX).verdict is Verdict.ASK
    [t] = validate_request(req, CTX).targets
    assert t.action is Action.OUTSIDE_SCOPE


def test_a_read_with_no_target_or_no_effects_asks(decider: Decider) -> None:
    assert decider.decide(forged({"action": "read", "op": "read"}), CTX).verdict is Verdict.ASK
    assert decider.decide(forged(action="read"), CTX).verdict is Verdict.ASK


def test_a_read_that_carries_another_op_asks(decider: Decider) -> None:
    # the gate labels an effect; an op that does not fit its action is not believed
    for op in ("exec", "delete", "network", "bogus"):
        req = forged({"action": "read", "op": op, "path": "/mnt/work/a"})
        assert decider.decide(req, CTX).verdict is Verdict.ASK, op
        [t] = validate_request(req, CTX).targets
        assert t.action is Action.SHELL


def test_in_scope_read_and_write_still_run(decider: Decider) -> None:
    read = forged({"action": "read", "op": "read", "path": "/mnt/uploads/data.csv"})
    write = forged({"action": "write", "op": "write", "path": "/mnt/outputs/report.md"})
    assert decider.decide(read, CTX).verdict is Verdict.ALLOW
    assert decider.decide(write, CTX).verdict is Verdict.ALLOW


@pytest.mark.parametrize("path", ["/mnt/uploads/a", "/home/me/.bashrc", "/mnt/work/../../root/x"])
def test_a_forged_write_outside_the_writable_mounts_asks(decider: Decider, path: str) -> None:
    req = forged({"action": "write", "op": "write", "path": path})
    assert decider.decide(req, CTX).verdict is Verdict.ASK
    rules = decider.proposed_rules(req, Choice.ALWAYS_EVERYWHERE, CTX)
    assert all(r.action is not Action.WRITE for r in rules)


def test_a_write_rule_from_a_forged_request_never_covers_outside_paths(decider: Decider) -> None:
    # "write" is allowed by default in scope; an action-wide write rule can only be
    # stored from (and only ever matches) host-validated in-scope targets.
    decider.store.add_many(
        decider.proposed_rules(
            forged({"action": "write", "op": "write", "path": "/etc/cron.d/x"}),
            Choice.ALWAYS_EVERYWHERE,
            CTX,
        )
    )
    later = forged({"action": "write", "op": "write", "path": "/etc/cron.d/y"})
    assert decider.decide(later, CTX).verdict is Verdict.ASK


def test_wildcards_in_a_forged_path_are_escaped_in_the_rule(decider: Decider) -> None:
    req = forged({"action": "delete", "op": "delete", "path": "/mnt/work/*"})
    [rule] = always_everywhere(decider, req)
    assert rule.pattern == "/mnt/work/[*]"
    other = forged({"action": "delete", "op": "delete", "path": "/mnt/work/src"})
    assert decider.decide(other, CTX).verdict is Verdict.ASK


def test_outside_scope_rules_are_exact_and_never_cover_the_mounts(decider: Decider) -> None:
    for path in ("/", "/mnt", "/etc", "/mnt/work/a"):
        t = Target(Action.OUTSIDE_SCOPE, op="write", path=path)
        assert persist_pattern(t) == (False, None), path
    assert persist_pattern(Target(Action.OUTSIDE_SCOPE, op="write", path="/tmp/x")) == (
        True,
        "/tmp/x",
    )


def test_forged_tool_names_and_commands(decider: Decider) -> None:
    star = forged({"action": "connector", "op": "connector"}, tool="*")
    assert decider.proposed_rules(star, Choice.ALWAYS_EVERYWHERE, CTX) == ()
    empty = forged({"action": "shell", "op": "exec", "command": "   "})
    assert decider.proposed_rules(empty, Choice.ALWAYS_EVERYWHERE, CTX) == ()
    hidden = forged({"action": "shell", "op": "exec", "command": "ls\x1b[2K\rrm -rf /mnt/work"})
    assert decider.proposed_rules(hidden, Choice.ALWAYS_FOLDER, CTX) == ()


def test_a_command_rule_never_lets_the_command_reach_a_named_host(decider: Decider) -> None:
    req = forged({"action": "network", "op": "network", "command": "curl"}, command="curl")
    [rule] = always_everywhere(decider, req)
    assert rule.pattern == "cmd:curl"
    named = forged(
        {
            "action": "network",
            "op": "network",
            "domain": "evil.example",
            "command": "curl https://evil.example",
        }
    )
    assert decider.decide(named, CTX).verdict is Verdict.ASK


# -- exactly what "Always" stores ---------------------------------------------------


def test_proposed_rules_are_exactly_what_is_stored(decider: Decider) -> None:
    req = forged(
        {"action": "network", "op": "network", "domain": "PyPI.org."},
        {"action": "delete", "op": "delete", "path": "/mnt/work/build"},
        {"action": "write", "op": "write", "path": "/mnt/work/a"},
    )
    for choice in (Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE):
        proposed = proposed_rules(req, choice, CTX, store=decider.store)
        created = decider.record_answer(req, choice, CTX).created_rules
        key = [(r.action, r.scope, r.pattern, r.verdict) for r in proposed]
        assert key == [(r.action, r.scope, r.pattern, r.verdict) for r in created]
        assert [r.pattern for r in proposed] == ["pypi.org", "/mnt/work/build"]
        for r in decider.store.load():
            decider.store.remove(r.id)
    assert decider.proposed_rules(req, Choice.ALLOW_ONCE, CTX) == ()


def test_global_network_or_delete_needs_a_second_confirmation(decider: Decider) -> None:
    net = forged({"action": "network", "op": "network", "domain": "pypi.org"})
    shell = forged({"action": "shell", "op": "exec", "command": "npm test"})
    assert needs_confirmation(decider.proposed_rules(net, Choice.ALWAYS_EVERYWHERE, CTX))
    assert not needs_confirmation(decider.proposed_rules(net, Choice.ALWAYS_FOLDER, CTX))
    assert not needs_confirmation(decider.proposed_rules(shell, Choice.ALWAYS_EVERYWHERE, CTX))
    text = describe_rules(decider.proposed_rules(net, Choice.ALWAYS_EVERYWHERE, CTX))
    assert text == "allow network access to pypi.org in every task, everywhere"
    assert "allowed once" in describe_rules(())


class FakeConsole:
    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.prompts: list[str] = []
        self._turn = asyncio.Lock()

    def turn(self) -> asyncio.Lock:
        return self._turn

    async def ask(self, prompt: str) -> str | None:
        self.prompts.append(prompt)
        return self.answers.pop(0) if self.answers else None


def ask(
    req: PermissionRequest, answers: list[str], decider: Decider
) -> tuple[Choice | None, FakeConsole]:
    from dataclasses import replace

    req = replace(req, proposals=decider.proposals(req, CTX))
    console = FakeConsole(answers)
    choice = asyncio.run(TerminalAsker(console).permission(req))  # type: ignore[arg-type]
    return choice, console


def test_terminal_everywhere_for_network_needs_typed_yes(
    decider: Decider, capsys: pytest.CaptureFixture[str]
) -> None:
    net = forged({"action": "network", "op": "network", "domain": "pypi.org"})
    choice, console = ask(net, ["e", "y"], decider)
    assert choice is None  # "y" is not "yes": back to the menu, then no answer
    assert len(console.prompts) == 3
    err = capsys.readouterr().err
    assert "allow network access to pypi.org in every task, everywhere" in err
    choice, _ = ask(net, ["e", "yes"], decider)
    assert choice is Choice.ALWAYS_EVERYWHERE
    shell = forged({"action": "shell", "op": "exec", "command": "npm test"})
    choice, console = ask(shell, ["e"], decider)
    assert choice is Choice.ALWAYS_EVERYWHERE and len(console.prompts) == 1


# -- control characters ----------------------------------------------------------------


def test_the_prompt_shows_no_guest_control_characters(decider: Decider) -> None:
    evil = "Allow reading?\x1b[1A\x1b[2K\rThe agent wants to read files.\x9b31m\u202eexe.txt"
    req = forged({"action": "delete", "op": "delete", "path": "/mnt/work/build"}, question=evil)
    from dataclasses import replace

    text = permission_prompt_text(replace(req, proposals=decider.proposals(req, CTX)), color=False)
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b[1A" in text and "\\u202e" in text
    assert "[e] always everywhere stores: allow deleting /mnt/work/build" in text


def test_sanitize() -> None:
    assert sanitize("a\nb\tc") == "a\nb\tc"
    assert sanitize("a\nb", one_line=True) == "a\\x0ab"
    assert sanitize("\x1b]0;title\x07") == "\\x1b]0;title\\x07"
    assert sanitize("\u2066x\u2069\u200b\ufeff") == "\\u2066x\\u2069\\u200b\\ufeff"
    assert sanitize(None) == ""


def test_clean_values() -> None:
    assert clean_domain("Example.COM.") == "example.com"
    assert clean_domain("[::1]") == "::1" and clean_domain("10.0.2.2") == "10.0.2.2"
    assert clean_domain("1.2.3") is None and clean_domain("-a.com") is None
    assert clean_path("/mnt/work/a b") == "/mnt/work/a b"
    assert clean_path("/mnt/work/") is None and clean_path("/mnt/./work") is None


def test_rules_created_from_answers_are_user_rules_in_the_right_scope(decider: Decider) -> None:
    req = forged({"action": "delete", "op": "delete", "path": "/mnt/outputs/old"})
    [r] = decider.record_answer(req, Choice.ALWAYS_FOLDER, CTX).created_rules
    assert r.scope.kind is ScopeKind.FOLDER and r.scope.value == str(FOLDER)
