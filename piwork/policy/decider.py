"""Deciding permission requests from the policy, and recording people's answers.

The runner's loop, in short::

    req = parse_request(msg)                      # None: not the gate's
    d = decider.decide(req, ctx)
    if d.verdict is Verdict.ASK:
        choice = await front_end.ask(req)         # or record_cancelled() on stop
        d = decider.record_answer(req, choice, ctx)
    send(build_reply(req.request_id, d.reply_choice))

``decide`` audits the decisions rules make; ``record_answer`` audits the
person's and persists "Always allow" as rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from piwork.policy.audit import AuditEntry, AuditLog, DecidedBy
from piwork.policy.request import (
    READABLE_ROOTS,
    WRITABLE_ROOTS,
    Choice,
    PermissionRequest,
    host_target,
    is_inside,
    validate_request,
)
from piwork.policy.rules import (
    COMMAND_PATTERN_PREFIX,
    Action,
    Rule,
    Scope,
    ScopeKind,
    Target,
    TaskContext,
    Verdict,
    escape_glob,
    winning_rule,
)
from piwork.policy.store import PolicyStore
from piwork.textsafe import sanitize

MAX_RULES_PER_ANSWER = 20


@dataclass(frozen=True)
class TargetDecision:
    target: Target
    verdict: Verdict
    rule: Rule | None


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    rule: Rule | None
    """The deciding rule (for deny: the denying one; for ask: the first asking one,
    None when nothing matched). For a person's answer: the first rule created, if any."""
    reason: str
    targets: tuple[TargetDecision, ...] = ()
    decided_by: str = DecidedBy.RULE
    created_rules: tuple[Rule, ...] = field(default_factory=tuple)

    @property
    def reply_choice(self) -> Choice:
        """What to send back to the gate for an allow/deny decision."""
        if self.verdict is Verdict.ALLOW:
            return Choice.ALLOW_ONCE
        if self.verdict is Verdict.DENY:
            return Choice.DENY
        raise ValueError("an 'ask' decision has no reply: ask the person first")


def combine(decisions: Sequence[TargetDecision]) -> tuple[Verdict, Rule | None]:
    """Deny if any target is denied, ask if any is asked or unmatched, else allow."""
    for d in decisions:
        if d.verdict is Verdict.DENY:
            return Verdict.DENY, d.rule
    for d in decisions:
        if d.verdict is Verdict.ASK:
            return Verdict.ASK, d.rule
    return Verdict.ALLOW, decisions[0].rule if decisions else None


def _unique_targets(request: PermissionRequest) -> list[Target]:
    seen: set[Target] = set()
    out: list[Target] = []
    for t in request.targets:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def persist_pattern(target: Target, asked_by: Rule | None = None) -> tuple[bool, str | None]:
    """The pattern an "Always allow" answer stores for this (host-validated) target.

    Returns ``(persistable, pattern)``. The pattern is derived by the host from
    validated fields, never copied from free guest text: a validated domain, an
    escaped exact path, a bounded printable command, a plain tool name. Refused
    (allow once only): unknown or malformed targets, a scope root itself, paths
    too close to ``/``, anything with a wildcard meaning.

    ``asked_by`` is the rule that made the request ask. A read or write that
    asked only because a *pattern* rule singles it out (``**/.git/hooks/**``,
    ``**/.git/config``) is remembered for its exact path: a blanket "writes in
    this folder" rule would outrank that protection for every other path it
    covers (user rules beat default ones whatever their pattern).
    """
    t = host_target(target)
    a = t.action
    if a in (Action.READ, Action.WRITE):
        # host_target only leaves these actions on paths inside the task's mounts
        if t.path is None:
            return False, None
        if asked_by is not None and asked_by.pattern is not None:
            return True, escape_glob(t.path)
        return True, None
    if a is Action.PRIVATE_NETWORK:
        return (True, t.domain) if t.domain else (False, None)
    if a is Action.NETWORK:
        if t.domain:
            return True, t.domain
        if t.command:
            return True, COMMAND_PATTERN_PREFIX + t.command
        return False, None
    if a is Action.SHELL:
        return (True, t.command) if t.command else (False, None)
    if a is Action.CONNECTOR:
        return (True, t.tool) if t.tool else (False, None)
    if t.path is None:
        return False, None
    if a in (Action.DELETE, Action.MOVE):
        # inside a writable mount (host_target), but never the mount itself
        if t.path in WRITABLE_ROOTS:
            return False, None
        return True, escape_glob(t.path)
    # outside-scope: an exact, deep enough path that does not cover a task mount
    # (/mnt holds the host's shares: never remembered as "outside")
    if t.path.count("/") < 2 or is_inside(t.path, (*READABLE_ROOTS, "/mnt")):
        return False, None
    if any(r.startswith(t.path + "/") for r in READABLE_ROOTS):
        return False, None
    return True, escape_glob(t.path)


CONFIRM_GLOBAL_ACTIONS = frozenset(
    {Action.NETWORK, Action.PRIVATE_NETWORK, Action.DELETE, Action.MOVE, Action.OUTSIDE_SCOPE}
)
"""Global "Always" rules for these need a second, explicit confirmation in front ends."""


def needs_confirmation(rules: Sequence[Rule]) -> bool:
    """True when storing ``rules`` should be confirmed a second time (a global
    rule for network, delete, move or outside-scope)."""
    return any(
        r.scope.kind is ScopeKind.GLOBAL and r.action in CONFIRM_GLOBAL_ACTIONS for r in rules
    )


def describe_rules(rules: Sequence[Rule]) -> str:
    """One line for the person: exactly what storing ``rules`` allows."""
    if not rules:
        return "nothing can be remembered for this request: it is allowed once"
    return "; ".join(r.human() for r in rules)


class Decider:
    def __init__(self, store: PolicyStore | None = None, audit: AuditLog | None = None) -> None:
        self.store = store if store is not None else PolicyStore()
        self.audit = audit if audit is not None else AuditLog()

    # -- deciding --------------------------------------------------------

    def evaluate(self, request: PermissionRequest, ctx: TaskContext) -> Decision:
        """Judge ``request`` without auditing (for previews and tests)."""
        request = validate_request(request, ctx)
        rules = self.store.effective_rules()
        decisions = tuple(
            TargetDecision(t, r.verdict if r else Verdict.ASK, r)
            for t in _unique_targets(request)
            for r in [winning_rule(rules, t, ctx)]
        )
        verdict, rule = combine(decisions)
        if verdict is Verdict.ASK:
            reason = (
                f"rule {rule.describe()}" if rule else "no rule matches"
            ) + f": ask about {request.action.value}"
        else:
            deciding = [d for d in decisions if d.verdict is verdict]
            reason = "; ".join(
                f"{d.target.action.value} {d.target.describe()}: "
                + (d.rule.describe() if d.rule else "?")
                for d in deciding[:5]
            )
        return Decision(verdict, rule, reason, decisions, DecidedBy.RULE)

    def decide(self, request: PermissionRequest, ctx: TaskContext) -> Decision:
        """Allow, deny or ask. Allow and deny are audited as decided by a rule."""
        request = validate_request(request, ctx)
        decision = self.evaluate(request, ctx)
        if decision.verdict is not Verdict.ASK:
            self._audit(request, ctx, decision.verdict.value, DecidedBy.RULE, decision.rule, None)
        return decision

    # -- answers ---------------------------------------------------------

    def proposed_rules(
        self,
        request: PermissionRequest,
        choice: Choice | str,
        ctx: TaskContext,
        *,
        patterns: dict[Target, str | None] | None = None,
    ) -> tuple[Rule, ...]:
        """Exactly the rules ``record_answer(request, choice, ctx)`` would store now.

        Empty for "Allow once"/"Deny", and for an "Always" whose targets are all
        already allowed or cannot be remembered (see ``persist_pattern``). Front
        ends show these (``describe_rules``) before the person picks "Always".
        """
        choice = Choice(choice)
        if not choice.persists:
            return ()
        request = validate_request(request, ctx)
        scope = self.scope_for(choice, ctx)
        created: list[Rule] = []
        for td in self.evaluate(request, ctx).targets:
            if td.verdict is Verdict.ALLOW:
                continue
            if patterns is not None and td.target in patterns:
                ok, pattern = True, patterns[td.target]
            else:
                ok, pattern = persist_pattern(td.target, asked_by=td.rule)
            if not ok:
                continue
            rule = Rule(
                action=td.target.action,
                verdict=Verdict.ALLOW,
                scope=scope,
                pattern=pattern,
                note=sanitize(
                    f"{choice.value} ({request.tool[:64]}, task {ctx.task_id or '-'})",
                    one_line=True,
                ),
            )
            if all(rule.key != r.key for r in created):
                created.append(rule)
        return tuple(created[:MAX_RULES_PER_ANSWER])

    def proposals(
        self, request: PermissionRequest, ctx: TaskContext
    ) -> dict[Choice, tuple[Rule, ...]]:
        """``proposed_rules`` for both "Always" choices (what the runner attaches)."""
        return {
            c: self.proposed_rules(request, c, ctx)
            for c in (Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE)
        }

    def record_answer(
        self,
        request: PermissionRequest,
        choice: Choice | str,
        ctx: TaskContext,
        *,
        decided_by: str = DecidedBy.PERSON,
        patterns: dict[Target, str | None] | None = None,
        rules: Sequence[Rule] = (),
    ) -> Decision:
        """Record the answer to an asked request: persist "Always allow" rules and audit.

        The rules stored are exactly ``proposed_rules(request, choice, ctx)``:
        "Always allow in this folder" makes folder-scoped rules (task-scoped when
        the task has no working folder); "everywhere" makes global ones; one rule
        per host-validated target that was not already allowed and can be
        remembered. ``patterns`` lets a front end override a target's pattern.
        ``rules`` are what an answer the policy does not derive stores instead
        (``Choice.ALLOW_REGISTRIES``: the host's registry rules, never guest text).
        """
        choice = Choice(choice)
        request = validate_request(request, ctx)
        if choice.persists:
            created = list(self.proposed_rules(request, choice, ctx, patterns=patterns))
        elif choice is Choice.ALLOW_REGISTRIES:
            created = list(rules)[:MAX_RULES_PER_ANSWER]
        else:
            created = []  # "Allow once" and "Deny" remember nothing, whatever is passed
        if created:
            self.store.add_many(created)
        verdict = Verdict.ALLOW if choice.allows else Verdict.DENY
        first = created[0] if created else None
        self._audit(request, ctx, verdict.value, decided_by, first, choice.value)
        reason = f"{decided_by}: {choice.value}"
        if created:
            reason += "; new rules: " + ", ".join(r.describe() for r in created)
        return Decision(
            verdict, first, reason, (), decided_by=decided_by, created_rules=tuple(created)
        )

    def record_cancelled(
        self, request: PermissionRequest, ctx: TaskContext, why: str = "stopped"
    ) -> None:
        """Audit a dialog answered ``cancelled`` because the task stopped or aborted."""
        self._audit(request, ctx, "cancelled", DecidedBy.CANCELLED, None, why)

    def record_unusable_policy(self, request: PermissionRequest, ctx: TaskContext) -> None:
        """Audit the deny given because the policy file could not be read."""
        self._audit(request, ctx, "deny", DecidedBy.UNUSABLE_POLICY, None, None)

    # -- helpers ---------------------------------------------------------

    @staticmethod
    def scope_for(choice: Choice, ctx: TaskContext) -> Scope:
        """Where an answer's rules apply: everywhere, else the task's folder (its task
        when it has none)."""
        if choice is Choice.ALWAYS_EVERYWHERE:
            return Scope.global_()
        if ctx.working_folder is not None:
            return Scope.folder(ctx.working_folder)
        if ctx.task_id is not None:
            return Scope.task(ctx.task_id)
        return Scope.global_()

    def _audit(
        self,
        request: PermissionRequest,
        ctx: TaskContext,
        decision: str,
        decided_by: str,
        rule: Rule | None,
        choice: str | None,
    ) -> None:
        targets = tuple(f"{t.action.value}:{t.describe()}" for t in _unique_targets(request))
        main = next((t for t in request.targets if t.action is request.action), None)
        self.audit.append(
            AuditEntry(
                task=ctx.task_id or request.task_id,
                action=request.action.value,
                target=main.describe() if main else request.summary,
                decision=decision,
                decided_by=decided_by,
                rule=rule.id if rule else None,
                choice=choice,
                tool=request.tool,
                tool_call_id=request.tool_call_id,
                request_id=request.request_id,
                command=request.command,
                targets=targets,
            )
        )


def decide(
    request: PermissionRequest,
    task_ctx: TaskContext,
    *,
    store: PolicyStore | None = None,
    audit: AuditLog | None = None,
) -> Decision:
    """Module-level convenience over ``Decider(store, audit).decide``."""
    return Decider(store, audit).decide(request, task_ctx)


def record_answer(
    request: PermissionRequest,
    choice: Choice | str,
    task_ctx: TaskContext,
    *,
    decided_by: str = DecidedBy.PERSON,
    store: PolicyStore | None = None,
    audit: AuditLog | None = None,
) -> Decision:
    """Module-level convenience over ``Decider(store, audit).record_answer``."""
    return Decider(store, audit).record_answer(request, choice, task_ctx, decided_by=decided_by)


def proposed_rules(
    request: PermissionRequest,
    choice: Choice | str,
    task_ctx: TaskContext,
    *,
    store: PolicyStore | None = None,
) -> tuple[Rule, ...]:
    """Module-level convenience over ``Decider(store).proposed_rules``: exactly the
    rules "Always" would store (empty: nothing is remembered, it allows once)."""
    return Decider(store).proposed_rules(request, choice, task_ctx)
