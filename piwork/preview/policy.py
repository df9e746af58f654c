"""Whether a guest port may be opened in the person's browser: rules, then the person.

A preview is a ``preview`` rule in the ordinary policy (``piwork policy``):
``allow|deny preview PORT`` scoped to a task, a folder or everywhere, so the
person's answer persists like any other permission and ``piwork policy list``
shows it. The person is asked through the run's :class:`~piwork.runner.Asker`:

* a front end with a ``preview(question)`` method gets the three answers of
  :class:`PreviewChoice` (this task / always in this folder / never);
* any other asker gets an ordinary permission request (``Choice``): allow once
  opens it for this run, the two "Always" store an allow rule, Deny keeps it
  closed for this run;
* :class:`~piwork.runner.DenyAsker` (no one to ask: ``--json`` without a
  terminal, a script) answers nothing, so the preview stays closed and the
  event says why; ``AllowAsker`` (``--yes``) opens it for this run.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from piwork.policy import AuditEntry, AuditLog, Choice, PolicyStore
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action, Rule, Scope, Target, TaskContext, Verdict, winning_rule


class PreviewChoice(StrEnum):
    """What the person answered; the value is the label a front end shows."""

    TASK = "Open for this task"
    FOLDER = "Always open in this folder"
    NEVER = "Never"


@dataclass(frozen=True)
class PreviewQuestion:
    """What a front end shows: the task, the guest port, what each answer stores."""

    task_id: str | None
    port: int
    question: str
    rules: dict[PreviewChoice, Rule]
    """The rule each answer stores (``TASK`` stores a task-scoped rule)."""


@runtime_checkable
class PreviewAsker(Protocol):
    async def preview(self, question: PreviewQuestion) -> PreviewChoice | None:
        """The person's answer; None: no answer (the preview stays closed this run)."""


@dataclass(frozen=True)
class Answer:
    open: bool
    by: str
    """``rule`` | ``person`` | ``no-terminal`` | ``assume-yes``."""
    rule: str | None = None
    """The rule that decided, or the one the answer stored (``describe()``)."""


def target(port: int) -> Target:
    return Target(Action.PREVIEW, op="preview", tool=str(port))


def _folder_scope(ctx: TaskContext) -> Scope:
    if ctx.working_folder is not None:
        return Scope.folder(ctx.working_folder)
    if ctx.task_id is not None:
        return Scope.task(ctx.task_id)
    return Scope.global_()


def _rule(port: int, verdict: Verdict, scope: Scope, why: str) -> Rule:
    return Rule(Action.PREVIEW, verdict, scope, pattern=str(port), note=why)


def question_for(port: int, ctx: TaskContext) -> PreviewQuestion:
    task_scope = Scope.task(ctx.task_id) if ctx.task_id else _folder_scope(ctx)
    folder_scope = _folder_scope(ctx)
    note = f"answered for task {ctx.task_id or '-'}"
    return PreviewQuestion(
        task_id=ctx.task_id,
        port=port,
        question=(
            f"The agent serves something on port {port} in the VM. Open it as a preview? "
            "The page runs in your browser, with your browser's network: it can reach any "
            "site your browser can and send it what the agent put in the page, which the "
            "VM's network rules do not see. It gets a loopback address of its own, which "
            "your other local apps and dev servers do not trust."
        ),
        rules={
            PreviewChoice.TASK: _rule(port, Verdict.ALLOW, task_scope, note),
            PreviewChoice.FOLDER: _rule(port, Verdict.ALLOW, folder_scope, note),
            PreviewChoice.NEVER: _rule(port, Verdict.DENY, folder_scope, note),
        },
    )


def _permission_request(q: PreviewQuestion) -> PermissionRequest:
    """The same question for an asker that only knows permission prompts."""
    t = target(q.port)
    note = q.rules[PreviewChoice.TASK].note or ""
    return PermissionRequest(
        request_id=f"preview-{secrets.token_hex(4)}",
        question=q.question,
        options=tuple(c.value for c in Choice),
        action=Action.PREVIEW,
        tool="preview",
        tool_call_id=None,
        task_id=q.task_id,
        cwd=None,
        command=None,
        paths=(),
        targets=(t,),
        payload={},
        proposals={
            Choice.ALWAYS_FOLDER: (q.rules[PreviewChoice.FOLDER],),
            Choice.ALWAYS_EVERYWHERE: (_rule(q.port, Verdict.ALLOW, Scope.global_(), note),),
        },
    )


class PreviewPolicy:
    """Decide one port: a stored rule, else the person; persist and audit the answer."""

    def __init__(self, store: PolicyStore, audit: AuditLog, ctx: TaskContext) -> None:
        self.store = store
        self.audit = audit
        self.ctx = ctx

    def rule_for(self, port: int) -> Rule | None:
        return winning_rule(self.store.effective_rules(), target(port), self.ctx)

    def _record(
        self, port: int, decision: str, by: str, rule: Rule | None, choice: str | None
    ) -> None:
        self.audit.append(
            AuditEntry(
                task=self.ctx.task_id,
                action=Action.PREVIEW.value,
                target=f"guest port {port}",
                decision=decision,
                decided_by=by,
                rule=rule.id if rule else None,
                choice=choice,
                tool="preview",
            )
        )

    def decide_by_rule(self, port: int) -> Answer | None:
        """A stored rule's verdict (audited), or None when the person must be asked."""
        rule = self.rule_for(port)
        if rule is None or rule.verdict is Verdict.ASK:
            return None
        allowed = rule.verdict is Verdict.ALLOW
        self._record(port, rule.verdict.value, "rule", rule, None)
        return Answer(allowed, "rule", rule.describe())

    def record(self, port: int, answer: Any, *, assume_yes: bool = False) -> Answer:
        """Store and audit what the asker answered (a PreviewChoice, a Choice, or None)."""
        q = question_for(port, self.ctx)
        rule: Rule | None = None
        if answer is None:
            by = "assume-yes" if assume_yes else "no-terminal"
            allowed = assume_yes
        elif isinstance(answer, PreviewChoice):
            by, rule = "person", q.rules[answer]
            allowed = answer is not PreviewChoice.NEVER
        else:
            choice = Choice(answer)
            by, allowed = "person", choice.allows
            if choice.persists:
                rule = _permission_request(q).proposals[choice][0]
        if rule is not None:
            self.store.add_many([rule])
        choice_text = answer.value if answer is not None else None
        self._record(port, "allow" if allowed else "deny", by, rule, choice_text)
        return Answer(allowed, by, rule.describe() if rule else None)


async def ask(asker: Any, q: PreviewQuestion) -> PreviewChoice | Choice | None:
    """Ask through whatever the front end offers (see the module docstring)."""
    if isinstance(asker, PreviewAsker):
        return await asker.preview(q)
    answer: Choice | None = await asker.permission(_permission_request(q))
    return answer
