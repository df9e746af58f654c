"""Rule matching and precedence: task > folder > global > defaults; deny wins at a level."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.policy.rules import (
    DEFAULT_RULES,
    Action,
    Rule,
    Scope,
    Target,
    TaskContext,
    Verdict,
    command_matches,
    domain_matches,
    path_matches,
    winning_rule,
)

FOLDER = Path("/home/me/project")
CTX = TaskContext(task_id="t-1", working_folder=FOLDER)


def rule(action: Action, verdict: Verdict, scope: Scope | None = None, pattern: str | None = None):
    return Rule(action=action, verdict=verdict, scope=scope or Scope.global_(), pattern=pattern)


def delete(path: str = "/mnt/work/build") -> Target:
    return Target(action=Action.DELETE, op="delete", path=path)


def verdict(rules: list[Rule], target: Target, ctx: TaskContext = CTX) -> Verdict | None:
    r = winning_rule([*rules, *DEFAULT_RULES], target, ctx)
    return r.verdict if r else None


class TestDefaults:
    @pytest.mark.parametrize(
        ("action", "expected"),
        [
            (Action.READ, Verdict.ALLOW),
            (Action.WRITE, Verdict.ALLOW),
            (Action.DELETE, Verdict.ASK),
            (Action.MOVE, Verdict.ASK),
            (Action.OUTSIDE_SCOPE, Verdict.ASK),
            (Action.NETWORK, Verdict.ASK),
            (Action.SHELL, Verdict.ASK),
            (Action.CONNECTOR, Verdict.ASK),
        ],
    )
    def test_defaults(self, action: Action, expected: Verdict) -> None:
        assert verdict([], Target(action=action)) is expected

    def test_writes_to_what_the_host_could_run_ask(self) -> None:
        """The one list (piwork.changes.holds.RUNNABLE) is the default rules' too."""
        for path in (
            ".git/hooks/pre-commit", "sub/.git/config", ".git/index", ".gitmodules",
            ".husky/pre-commit", "a/.vscode/tasks.json", ".envrc", ".venv/pyvenv.cfg",
            "node_modules/.bin/eslint", ".pre-commit-config.yaml", ".idea/x.xml",
        ):  # fmt: skip
            assert verdict([], Target(Action.WRITE, path=f"/mnt/work/{path}")) is Verdict.ASK, path
        for path in ("hooks/x", "src/app.py", "node_modules/pkg/index.js", "gitignore"):
            assert verdict([], Target(Action.WRITE, path=f"/mnt/work/{path}")) is Verdict.ALLOW

    def test_any_user_rule_beats_a_default(self) -> None:
        assert verdict([rule(Action.DELETE, Verdict.ALLOW)], delete()) is Verdict.ALLOW
        assert verdict([rule(Action.WRITE, Verdict.DENY)], Target(Action.WRITE)) is Verdict.DENY


class TestPrecedence:
    def test_task_beats_folder_beats_global(self) -> None:
        g = rule(Action.DELETE, Verdict.DENY)
        f = rule(Action.DELETE, Verdict.ALLOW, Scope.folder(FOLDER))
        t = rule(Action.DELETE, Verdict.ASK, Scope.task("t-1"))
        assert verdict([g], delete()) is Verdict.DENY
        assert verdict([g, f], delete()) is Verdict.ALLOW
        assert verdict([g, f, t], delete()) is Verdict.ASK
        # order in the file does not matter
        assert verdict([t, f, g], delete()) is Verdict.ASK

    def test_deny_beats_allow_at_the_same_level(self) -> None:
        for scope in (Scope.global_(), Scope.folder(FOLDER), Scope.task("t-1")):
            rules = [
                rule(Action.DELETE, Verdict.ALLOW, scope),
                rule(Action.DELETE, Verdict.DENY, scope),
            ]
            assert verdict(rules, delete()) is Verdict.DENY
            assert verdict(rules[::-1], delete()) is Verdict.DENY

    def test_deny_without_pattern_beats_allow_with_pattern_at_the_same_level(self) -> None:
        rules = [
            rule(Action.NETWORK, Verdict.ALLOW, pattern="github.com"),
            rule(Action.NETWORK, Verdict.DENY),
        ]
        assert verdict(rules, Target(Action.NETWORK, domain="github.com")) is Verdict.DENY

    def test_a_pattern_beats_a_level_wide_ask(self) -> None:
        rules = [
            rule(Action.NETWORK, Verdict.ASK),
            rule(Action.NETWORK, Verdict.ALLOW, pattern="github.com"),
        ]
        assert verdict(rules, Target(Action.NETWORK, domain="github.com")) is Verdict.ALLOW
        assert verdict(rules, Target(Action.NETWORK, domain="evil.com")) is Verdict.ASK

    def test_ask_beats_allow_at_the_same_level_and_specificity(self) -> None:
        rules = [rule(Action.SHELL, Verdict.ALLOW), rule(Action.SHELL, Verdict.ASK)]
        assert verdict(rules, Target(Action.SHELL, command="make")) is Verdict.ASK

    def test_a_folder_allow_overrides_a_global_deny_only_in_that_folder(self) -> None:
        rules = [
            rule(Action.NETWORK, Verdict.DENY),
            rule(Action.NETWORK, Verdict.ALLOW, Scope.folder(FOLDER), "pypi.org"),
        ]
        t = Target(Action.NETWORK, domain="pypi.org")
        assert verdict(rules, t) is Verdict.ALLOW
        other = TaskContext(task_id="t-2", working_folder=Path("/elsewhere"))
        assert verdict(rules, t, other) is Verdict.DENY
        # the folder pattern does not cover other domains: the global deny applies
        assert verdict(rules, Target(Action.NETWORK, domain="x.org")) is Verdict.DENY


class TestScopes:
    def test_folder_scope_covers_subfolders(self) -> None:
        r = rule(Action.DELETE, Verdict.ALLOW, Scope.folder(FOLDER))
        sub = TaskContext(task_id="x", working_folder=FOLDER / "sub")
        assert verdict([r], delete(), sub) is Verdict.ALLOW
        sibling = TaskContext(task_id="x", working_folder=Path("/home/me/project2"))
        assert verdict([r], delete(), sibling) is Verdict.ASK

    def test_folder_rules_do_not_apply_to_tasks_without_a_folder(self) -> None:
        r = rule(Action.DELETE, Verdict.ALLOW, Scope.folder(FOLDER))
        assert verdict([r], delete(), TaskContext(task_id="t-1")) is Verdict.ASK

    def test_task_scope_applies_to_that_task_only(self) -> None:
        r = rule(Action.MOVE, Verdict.ALLOW, Scope.task("t-1"))
        t = Target(Action.MOVE, path="/mnt/work/a")
        assert verdict([r], t) is Verdict.ALLOW
        assert verdict([r], t, TaskContext(task_id="t-2")) is Verdict.ASK

    def test_scope_validation(self) -> None:
        with pytest.raises(ValueError):
            Scope(Scope.global_().kind, "x")


class TestPatterns:
    @pytest.mark.parametrize(
        ("pattern", "path", "expected"),
        [
            ("/mnt/work/build", "/mnt/work/build", True),
            ("/mnt/work/build", "/mnt/work/build/x.o", True),  # a dir pattern covers its tree
            ("/mnt/work/build", "/mnt/work/buildx", False),
            ("build/**", "/mnt/work/build/a/b.o", True),
            ("build", "/mnt/outputs/build", True),
            ("*.log", "/mnt/work/deep/dir/x.log", True),  # no slash: any file name
            ("src/*.py", "/mnt/work/src/a.py", True),
            ("src/*.py", "/mnt/work/src/sub/a.py", False),
            ("src/**/*.py", "/mnt/work/src/sub/a.py", True),
            ("src/**/*.py", "/mnt/work/src/a.py", True),
            ("/etc/*", "/etc/passwd", True),
            ("tmp/*", "/tmp/x", False),  # relative patterns only below the guest scope roots
        ],
    )
    def test_path_globs(self, pattern: str, path: str, expected: bool) -> None:
        assert path_matches(pattern, path) is expected

    def test_command_prefix_on_word_boundaries(self) -> None:
        assert command_matches("npm test", "npm test")
        assert command_matches("npm test", "npm  test -- --watch")
        assert not command_matches("npm test", "npm testx")
        assert not command_matches("npm test", "npm")

    def test_domains(self) -> None:
        assert domain_matches("github.com", "GitHub.com")
        assert domain_matches("*.github.com", "api.github.com")
        assert not domain_matches("*.github.com", "github.com")
        assert not domain_matches("github.com", "github.com.evil.io")

    def test_unknown_targets_match_only_rules_without_a_pattern(self) -> None:
        allow_gh = rule(Action.NETWORK, Verdict.ALLOW, pattern="github.com")
        assert verdict([allow_gh], Target(Action.NETWORK, domain=None)) is Verdict.ASK
        allow_rm = rule(Action.OUTSIDE_SCOPE, Verdict.ALLOW, pattern="/tmp/**")
        assert verdict([allow_rm], Target(Action.OUTSIDE_SCOPE, path=None)) is Verdict.ASK

    def test_network_cmd_patterns(self) -> None:
        r = rule(Action.NETWORK, Verdict.ALLOW, pattern="cmd:git push")
        assert verdict([r], Target(Action.NETWORK, command="git push origin main")) is Verdict.ALLOW
        assert verdict([r], Target(Action.NETWORK, command="git pull")) is Verdict.ASK

    def test_connector_patterns_match_the_tool(self) -> None:
        r = rule(Action.CONNECTOR, Verdict.ALLOW, pattern="github_*")
        assert verdict([r], Target(Action.CONNECTOR, tool="github_issue")) is Verdict.ALLOW
        assert verdict([r], Target(Action.CONNECTOR, tool="slack_post")) is Verdict.ASK

    def test_deny_pattern_inside_a_broad_allow(self) -> None:
        rules = [
            rule(Action.WRITE, Verdict.ALLOW),
            rule(Action.WRITE, Verdict.DENY, pattern=".git/**"),
        ]
        assert verdict(rules, Target(Action.WRITE, path="/mnt/work/.git/config")) is Verdict.DENY
        assert verdict(rules, Target(Action.WRITE, path="/mnt/work/a.py")) is Verdict.ALLOW


def test_rule_json_round_trip() -> None:
    r = Rule(
        action=Action.NETWORK,
        verdict=Verdict.ALLOW,
        scope=Scope.folder("/home/me/p"),
        pattern="pypi.org",
        note="x",
    )
    assert Rule.from_json(r.to_json()) == r
