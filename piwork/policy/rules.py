"""Permission rules: what they match and which one wins.

A rule is ``(action, scope, pattern?) -> allow | deny | ask``. A request is
judged one *target* at a time (one effect of the tool call: a path, a domain,
a command); the request as a whole is denied if any target is denied, asked
if any target is asked or unmatched, and allowed only if every target is.

Precedence for one target, most important first:

1. scope level: task, then folder, then global, then the built-in defaults;
   the first level with any matching rule decides;
2. within that level, deny beats everything;
3. then a rule with a pattern beats a rule without one (so "allow network for
   github.com" overrides a level-wide "ask network");
4. then ask beats allow.
"""

from __future__ import annotations

import fnmatch
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any


class Action(StrEnum):
    """What a tool call does, as classified by the gate in the guest."""

    READ = "read"
    WRITE = "write"  # write and edit inside the task's scope
    DELETE = "delete"
    MOVE = "move"  # move and rename
    OUTSIDE_SCOPE = "outside-scope"
    NETWORK = "network"
    SHELL = "shell"
    CONNECTOR = "connector"
    # A guest port opened in the person's browser (piwork.preview). The host asks
    # this itself, never from a guest request; the pattern is the port number.
    PREVIEW = "preview"
    # A destination that resolves to a private or reserved address (the egress
    # proxy's own question, never a guest request's; piwork.net). Pattern: a domain.
    PRIVATE_NETWORK = "private-network"


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


class ScopeKind(StrEnum):
    GLOBAL = "global"
    FOLDER = "folder"
    TASK = "task"


class RuleSource(StrEnum):
    USER = "user"
    DEFAULT = "default"


# Guest directories a relative path pattern is matched against (see
# docs/guest-protocol.md): "src/**" means /mnt/work/src/** and /mnt/outputs/src/**.
GUEST_SCOPE_ROOTS: tuple[str, ...] = ("/mnt/work", "/mnt/outputs", "/mnt/uploads")

PATH_ACTIONS = frozenset(
    {Action.READ, Action.WRITE, Action.DELETE, Action.MOVE, Action.OUTSIDE_SCOPE}
)

COMMAND_PATTERN_PREFIX = "cmd:"
"""Network rules normally name a domain; ``cmd:PREFIX`` matches the command instead
(for calls whose domain cannot be known, such as ``git push`` to a configured remote)."""


@dataclass(frozen=True)
class Scope:
    kind: ScopeKind
    value: str | None = None
    """Host folder path for FOLDER, task id for TASK, None for GLOBAL."""

    def __post_init__(self) -> None:
        if (self.kind is ScopeKind.GLOBAL) != (self.value is None):
            raise ValueError(f"scope {self.kind.value} needs {'no' if self.value else 'a'} value")

    @property
    def level(self) -> int:
        return {ScopeKind.GLOBAL: 1, ScopeKind.FOLDER: 2, ScopeKind.TASK: 3}[self.kind]

    @classmethod
    def global_(cls) -> Scope:
        return cls(ScopeKind.GLOBAL)

    @classmethod
    def folder(cls, path: str | Path) -> Scope:
        return cls(ScopeKind.FOLDER, str(Path(path).expanduser().resolve()))

    @classmethod
    def task(cls, task_id: str) -> Scope:
        return cls(ScopeKind.TASK, task_id)

    def describe(self) -> str:
        return self.kind.value if self.value is None else f"{self.kind.value}:{self.value}"


@dataclass(frozen=True)
class TaskContext:
    """What the host knows about the task a request comes from."""

    task_id: str | None = None
    working_folder: Path | None = None
    """The host folder mounted at /mnt/work (None when the task has none)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_rule_id() -> str:
    return "r-" + uuid.uuid4().hex[:10]


@dataclass(frozen=True)
class Rule:
    action: Action
    verdict: Verdict
    scope: Scope = field(default_factory=Scope.global_)
    pattern: str | None = None
    id: str = field(default_factory=new_rule_id)
    created: str = field(default_factory=_now)
    source: RuleSource = RuleSource.USER
    note: str | None = None

    @property
    def key(self) -> tuple[Action, ScopeKind, str | None, str | None]:
        """Two rules with the same key are the same rule (the newer replaces the older)."""
        return (self.action, self.scope.kind, self.scope.value, self.pattern)

    @property
    def level(self) -> int:
        return 0 if self.source is RuleSource.DEFAULT else self.scope.level

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "action": self.action.value,
            "verdict": self.verdict.value,
            "scope": self.scope.kind.value,
            "scopeValue": self.scope.value,
            "pattern": self.pattern,
            "created": self.created,
        }
        if self.note:
            out["note"] = self.note
        if self.source is RuleSource.DEFAULT:
            out["source"] = self.source.value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Rule:
        """Strict: raises ValueError/KeyError/TypeError on anything malformed."""
        if not isinstance(data, dict):
            raise TypeError("rule is not an object")
        pattern = data.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise TypeError("pattern must be a string")
        scope_value = data.get("scopeValue")
        if scope_value is not None and not isinstance(scope_value, str):
            raise TypeError("scopeValue must be a string")
        note = data.get("note")
        return cls(
            action=Action(data["action"]),
            verdict=Verdict(data["verdict"]),
            scope=Scope(ScopeKind(data["scope"]), scope_value),
            pattern=pattern,
            id=str(data["id"]),
            created=str(data.get("created", "")),
            source=RuleSource(data.get("source", RuleSource.USER.value)),
            note=note if isinstance(note, str) else None,
        )

    def describe(self) -> str:
        pat = f" {self.pattern}" if self.pattern else ""
        return f"{self.verdict.value} {self.action.value}{pat} ({self.scope.describe()})"

    def human(self) -> str:
        """One line for a person: what the rule lets through, and where it applies."""
        what = {
            Action.READ: "reading files in the task's folders",
            Action.WRITE: "changing files in the task's folders",
            Action.DELETE: "deleting",
            Action.MOVE: "moving or renaming",
            Action.OUTSIDE_SCOPE: "touching, outside the task's folders,",
            Action.NETWORK: "network access to",
            Action.SHELL: "running the command",
            Action.CONNECTOR: "using the tool",
            Action.PREVIEW: "opening in the browser the page served on guest port",
            Action.PRIVATE_NETWORK: "reaching a private or reserved address through",
        }[self.action]
        if self.pattern is None:
            target = "" if self.action in (Action.READ, Action.WRITE) else " (anything)"
        elif self.action is Action.NETWORK and self.pattern.startswith(COMMAND_PATTERN_PREFIX):
            target = (
                f" by the command `{self.pattern[len(COMMAND_PATTERN_PREFIX) :]}` (unknown host)"
            )
        elif self.action is Action.SHELL:
            target = f" `{self.pattern}` (and the same command with more arguments)"
        elif self.action in PATH_ACTIONS:
            target = f" {self.pattern} (and everything inside it)"
        else:
            target = f" {self.pattern}"
        where = {
            ScopeKind.GLOBAL: "in every task, everywhere",
            ScopeKind.FOLDER: f"in tasks on {self.scope.value}",
            ScopeKind.TASK: f"in task {self.scope.value}",
        }[self.scope.kind]
        return f"{self.verdict.value} {what}{target} {where}"


def _default(action: Action, verdict: Verdict, note: str) -> Rule:
    return Rule(
        action=action,
        verdict=verdict,
        id=f"default-{action.value}",
        created="",
        source=RuleSource.DEFAULT,
        note=note,
    )


def _held(name: str, why: str) -> Rule:
    return Rule(
        action=Action.WRITE,
        verdict=Verdict.ASK,
        pattern=f"**/{name}",
        id=f"default-write-{name.strip('.').replace('/', '-')}",
        created="",
        source=RuleSource.DEFAULT,
        note=why,
    )


def _runnable_rules() -> tuple[Rule, ...]:
    # The one list of what the host could be made to run from the folder
    # (piwork.changes.holds.RUNNABLE): an agent's change there waits for the person.
    from piwork.changes.holds import RUNNABLE

    return tuple(_held(r.name, r.why) for r in RUNNABLE)


DEFAULT_RULES: tuple[Rule, ...] = (
    _default(Action.READ, Verdict.ALLOW, "reads inside scope never ask"),
    _default(
        Action.WRITE, Verdict.ALLOW, "the agent's changes to files are applied (and undoable)"
    ),
    _default(Action.DELETE, Verdict.ASK, "deletes always ask"),
    _default(Action.MOVE, Verdict.ASK, "moves and renames always ask"),
    _default(Action.OUTSIDE_SCOPE, Verdict.ASK, "anything outside the task's folders asks"),
    _default(Action.NETWORK, Verdict.ASK, "network asks on first use per domain"),
    _default(
        Action.PRIVATE_NETWORK,
        Verdict.ASK,
        "a domain that resolves to a private address asks (--yes does not answer it)",
    ),
    _default(Action.SHELL, Verdict.ASK, "a command one of your rules names asks"),
    _default(Action.CONNECTOR, Verdict.ASK, "other tools ask"),
    # Changes the host could be made to run (git metadata, hooks, editors' and
    # shells' folder integrations, virtual environments): they wait for the person.
    *_runnable_rules(),
)


@dataclass(frozen=True)
class Target:
    """One effect of a tool call, the unit rules are matched against."""

    action: Action
    op: str | None = None
    path: str | None = None
    domain: str | None = None
    command: str | None = None
    tool: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        if self.action in (Action.NETWORK, Action.PRIVATE_NETWORK):
            return self.domain or f"(unknown host) {self.command or ''}".strip()
        if self.action is Action.SHELL:
            return self.command or self.tool or ""
        if self.action is Action.CONNECTOR:
            return self.tool or ""
        return self.path or "(unknown path)"


# ---------------------------------------------------------------------------
# Pattern matching


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """``**`` crosses directories, ``*`` and ``?`` do not, ``[...]`` is a class."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" also matches nothing
                i += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def escape_glob(path: str) -> str:
    """A pattern that matches exactly ``path`` (and, like every path pattern, below it)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def path_matches(pattern: str, path: str, roots: Sequence[str] = GUEST_SCOPE_ROOTS) -> bool:
    """Absolute patterns match the guest path; relative ones match it below a scope root;
    a relative pattern without ``/`` also matches the file name anywhere (like .gitignore)."""
    pattern = pattern.rstrip("/") or "/"
    if pattern.startswith("/"):
        rx = glob_to_regex(pattern)
        return bool(rx.match(path)) or bool(glob_to_regex(pattern + "/**").match(path))
    rx = glob_to_regex(pattern)
    under = glob_to_regex(pattern + "/**")
    p = PurePosixPath(path)
    for root in roots:
        try:
            rel = p.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel != "." and (rx.match(rel) or under.match(rel)):
            return True
    return "/" not in pattern and bool(rx.match(p.name))


def command_matches(prefix: str, command: str) -> bool:
    """Prefix match on word boundaries: ``npm test`` matches ``npm test -- -w``,
    not ``npm testx``."""
    prefix = " ".join(prefix.split())
    command = " ".join(command.split())
    return command == prefix or command.startswith(prefix + " ")


def domain_matches(pattern: str, domain: str) -> bool:
    """``example.com`` matches itself; ``*.example.com`` matches its subdomains."""
    return fnmatch.fnmatchcase(domain.lower().rstrip("."), pattern.lower().rstrip("."))


def pattern_matches(rule: Rule, target: Target) -> bool:
    if rule.pattern is None:
        return True
    pat = rule.pattern
    if target.action is Action.NETWORK:
        if pat.startswith(COMMAND_PATTERN_PREFIX):
            # Only for calls whose host is unknown: a command rule never lets
            # the same command reach a different, named host.
            return (
                target.domain is None
                and target.command is not None
                and command_matches(pat[len(COMMAND_PATTERN_PREFIX) :], target.command)
            )
        return target.domain is not None and domain_matches(pat, target.domain)
    if target.action is Action.PRIVATE_NETWORK:
        return target.domain is not None and domain_matches(pat, target.domain)
    if target.action is Action.SHELL:
        return target.command is not None and command_matches(pat, target.command)
    if target.action in (Action.CONNECTOR, Action.PREVIEW):
        return target.tool is not None and fnmatch.fnmatchcase(target.tool, pat)
    return target.path is not None and path_matches(pat, target.path)


def scope_applies(scope: Scope, ctx: TaskContext) -> bool:
    if scope.kind is ScopeKind.GLOBAL:
        return True
    if scope.kind is ScopeKind.TASK:
        return ctx.task_id is not None and scope.value == ctx.task_id
    if ctx.working_folder is None or scope.value is None:
        return False
    folder = Path(ctx.working_folder).expanduser().resolve()
    base = Path(scope.value)
    return folder == base or base in folder.parents


def rule_matches(rule: Rule, target: Target, ctx: TaskContext) -> bool:
    return (
        rule.action is target.action
        and scope_applies(rule.scope, ctx)
        and pattern_matches(rule, target)
    )


def winning_rule(rules: Iterable[Rule], target: Target, ctx: TaskContext) -> Rule | None:
    """The rule that decides ``target``, or None when nothing matches (ask)."""
    matching = [r for r in rules if rule_matches(r, target, ctx)]
    if not matching:
        return None
    top = max(r.level for r in matching)
    level = [r for r in matching if r.level == top]

    def rank(r: Rule) -> tuple[int, int, int]:
        verdict_rank = {Verdict.DENY: 2, Verdict.ASK: 1, Verdict.ALLOW: 0}[r.verdict]
        deny_first = 1 if r.verdict is Verdict.DENY else 0
        return (deny_first, 1 if r.pattern is not None else 0, verdict_rank)

    return max(level, key=rank)
