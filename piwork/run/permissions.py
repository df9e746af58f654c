"""One bridge for every question the guest makes the host ask: pi's dialogs and the egress proxy.

pi opens a dialog (a permission select from the gate extension, or a question
for the person); the egress proxy asks before the guest reaches a new host.
Both come here, are decided by the host policy (``piwork.policy``) or the
person (an :class:`Asker` the front end implements), and are recorded.

Security (review finding 10): a gate request is guest text. Its question and
command may name one domain while its effects name another, so an "Allow
once" at the gate must never open a domain at the egress proxy. The proxy's
question is built here, on the host, from the host name the proxy actually
sees (:meth:`PermissionBridge.domain_policy`); gate answers never feed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from piwork.changes.engine import Answer
from piwork.config import Paths
from piwork.env.registries import registry_offer
from piwork.net.addresses import describe_address
from piwork.policy import (
    GATE_CHOICES,
    AuditLog,
    Choice,
    DecidedBy,
    Decider,
    PolicyError,
    PolicyStore,
)
from piwork.policy.request import (
    PermissionPayloadError,
    PermissionRequest,
    parse_request,
    validate_request,
)
from piwork.policy.rules import (
    Action,
    Rule,
    RuleSource,
    Target,
    TaskContext,
    Verdict,
    scope_applies,
    winning_rule,
)
from piwork.preview import Previews
from piwork.proxy.allowlist import SERVER_TOOL_KINDS
from piwork.proxy.egress import (
    AllowNetError,
    EgressDecision,
    domain_allowed,
    normalize_allowed_domain,
)
from piwork.proxy.schema import ServerToolUse
from piwork.rpc import models as m
from piwork.run.digest import EventKind
from piwork.run.request import RunError
from piwork.tasks import Task, TaskStatus

log = logging.getLogger(__name__)


class Asker(Protocol):
    """How the runner asks the person. Front ends implement it."""

    async def permission(self, request: PermissionRequest) -> Choice | None:
        """The person's choice; ``None`` means no one can answer (deny and say so)."""

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        """Answer an input/confirm/select/editor dialog; ``None`` cancels it."""


class DenyAsker:
    """For runs with no person to ask: every undecided permission is denied."""

    def __init__(self, reason: str = "no terminal to ask on") -> None:
        self.reason = reason

    async def permission(self, request: PermissionRequest) -> Choice | None:
        return None

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        return None


class AllowAsker(DenyAsker):
    """``--yes``: allow everything the policy did not deny, once."""

    async def permission(self, request: PermissionRequest) -> Choice | None:
        return Choice.ALLOW_ONCE


def allowed_domains(domains: Iterable[str]) -> tuple[str, ...]:
    """``--allow-net`` as the proxy compares it; a malformed name is the person's to fix."""
    try:
        return tuple(normalize_allowed_domain(d) for d in domains)
    except AllowNetError as exc:
        raise RunError(str(exc)) from exc


def host_request(
    prefix: str, question: str, action: Action, tool: str, target: Target, task_id: str | None
) -> PermissionRequest:
    """A question the host itself asks (the egress proxy's, the gateway's): its one
    target is host-made, never guest text."""
    return PermissionRequest(
        request_id=f"{prefix}-{secrets.token_hex(4)}",
        question=question,
        options=tuple(c.value for c in GATE_CHOICES),
        action=action,
        tool=tool,
        tool_call_id=None,
        task_id=task_id,
        cwd=None,
        command=None,
        paths=(),
        targets=(target,),
        payload={},
    )


class BridgeHost(Protocol):
    """What the bridge needs from the session it serves."""

    @property
    def stopping(self) -> bool:
        """A stop is under way: do not put the task back to running."""

    @property
    def task_id(self) -> str | None: ...

    @property
    def paused(self) -> bool:
        """The VM is frozen (a dialog answered meanwhile leaves the task paused)."""

    def emit(self, kind: EventKind, **data: Any) -> None: ...

    def note(self, kind: str, data: Any) -> None: ...

    async def set_status(self, status: TaskStatus) -> None: ...


class PermissionBridge:
    """Decides pi's permission dialogs and the egress proxy's asks; forwards pi's questions."""

    def __init__(
        self,
        host: BridgeHost,
        decider: Decider,
        asker: Asker,
        *,
        assume_yes: bool = False,
        allow_net: tuple[str, ...] = (),
    ) -> None:
        self.host = host
        self.decider = decider
        self.asker = asker
        self.assume_yes = assume_yes
        self.allow_net = allow_net
        self.context = TaskContext()
        self._change_judge: ChangeJudge | None = None
        self.on_unusable_policy: Callable[[str], None] | None = None
        """Called with the message when the policy cannot be read mid-run (the session
        ends the run): what was asked is denied, nothing is decided on a guess."""
        self.mirror_hosts: tuple[str, ...] = ()
        """The task's package mirrors' hosts: "Allow the package registries" covers them."""

    def previews(self, task: Task) -> Previews:
        """The task's previews, decided under the same policy, audit log and ``--yes``."""
        return Previews(
            task.id,
            task.dir,
            self.context,
            self.decider.store,
            self.decider.audit,
            assume_yes=self.assume_yes or isinstance(self.asker, AllowAsker),
        )

    @classmethod
    def for_run(
        cls,
        host: BridgeHost,
        paths: Paths,
        asker: Asker | None,
        *,
        policy_file: Path | None = None,
        assume_yes: bool = False,
    ) -> PermissionBridge:
        """The person's policy (or ``policy_file``) and audit log; with no asker, ``--yes``
        allows and anything else denies what the policy leaves open."""
        if policy_file is not None and not policy_file.is_file():
            raise RunError(f"policy file {policy_file} does not exist (see `piwork policy list`)")
        store = (
            PolicyStore(paths.policy_file)
            if policy_file is None
            else PolicyStore(policy_file, keep_copies=False)
        )
        decider = Decider(store, AuditLog(paths.audit_log))
        asker = asker or (AllowAsker() if assume_yes else DenyAsker())
        return cls(host, decider, asker, assume_yes=assume_yes)

    # ------------------------------------------------------------ pi's dialogs
    async def on_ui_request(self, req: m.UiRequest) -> m.UiResponse | None:
        """Answer a dialog pi opened: a permission from policy or the person, else a question."""
        if isinstance(req, m.SelectRequest):
            try:
                perm = parse_request(req)
            except PermissionPayloadError as exc:
                self.host.emit(
                    EventKind.ERROR, message=f"unreadable permission request, denied: {exc}"
                )
                return m.ui_value(req.id, Choice.DENY.value)
            if perm is not None:
                answer = await self.answer_permission(perm)
                return m.ui_value(req.id, answer.gate_reply.value)
        return await self.answer_question(req)

    async def answer_permission(
        self, perm: PermissionRequest, *, yes_answers: bool = True
    ) -> Choice:
        """Policy first; if it says ask, the person; the answer is persisted and audited.

        ``yes_answers=False``: ``--yes`` does not answer this question (it is denied
        unless a rule or a person allows it)."""
        return (await self.decide_permission(perm, yes_answers=yes_answers))[0]

    async def decide_permission(
        self, perm: PermissionRequest, *, yes_answers: bool = True
    ) -> tuple[Choice, str]:
        """:meth:`answer_permission`, and who decided (``rule``, or a ``DecidedBy``)."""
        ctx = self.context
        asker, assume_yes = self.asker, self.assume_yes
        if not yes_answers and isinstance(asker, AllowAsker):
            asker, assume_yes = DenyAsker(), False
        elif not yes_answers:
            assume_yes = False
        perm = validate_request(perm, ctx)  # the guest's request is untrusted input
        # The policy read and the audit fsync happen off the event loop.
        try:
            decision = await asyncio.to_thread(self.decider.decide, perm, ctx)
        except PolicyError as exc:
            return self._policy_unusable(perm, exc), DecidedBy.UNUSABLE_POLICY
        base = dict(
            action=perm.action.value,
            tool=perm.tool,
            target=perm.summary,
            question=perm.question,
            call=perm.tool_call_id,  # the step it is about: the app marks a denied step
        )
        if decision.verdict is not Verdict.ASK:
            choice = decision.reply_choice
            self.host.emit(
                EventKind.PERMISSION,
                **base,
                decision=choice.value,
                by="rule",
                rule=decision.rule.describe() if decision.rule else None,
            )
            self.host.note("permission", {**base, "decision": choice.value, "by": "rule"})
            return choice, "rule"
        # Front ends show exactly the rules each "Always" would store (host-derived),
        # and the package registries' rules when that one answer covers the request.
        try:
            proposals = await asyncio.to_thread(self._proposals, perm)
        except PolicyError as exc:
            return self._policy_unusable(perm, exc), DecidedBy.UNUSABLE_POLICY
        shown = dataclasses.replace(perm, proposals=proposals)

        await self.host.set_status(TaskStatus.WAITING_PERMISSION)
        self.host.emit(EventKind.PERMISSION, **base, decision="ask", by=None)
        try:
            answer = await asker.permission(shown)
        finally:
            if not self.host.stopping and self.host.task_id is not None:
                # Answered while the VM is frozen: it stays paused until resumed.
                await self.host.set_status(
                    TaskStatus.PAUSED if self.host.paused else TaskStatus.RUNNING
                )
        if answer is None:
            by = DecidedBy.ASSUME_YES if assume_yes else DecidedBy.NO_TERMINAL
            answer = Choice.ALLOW_ONCE if assume_yes else Choice.DENY
        elif isinstance(asker, AllowAsker):
            by = DecidedBy.ASSUME_YES  # --yes answered, not a person: the audit must say so
        else:
            by = DecidedBy.PERSON
        bundle: tuple[Rule, ...] = ()
        if answer is Choice.ALLOW_REGISTRIES:
            if not shown.proposals.get(Choice.ALLOW_REGISTRIES):
                answer = Choice.DENY  # a front end offered what the host did not: refuse it
            else:
                # Derived again now, as "Always" is: what is stored is what still asks.
                bundle = await asyncio.to_thread(
                    registry_offer, self.decider, shown, ctx, self.mirror_hosts
                )
        # An "Allow once" here allows this tool call only; the egress proxy asks its
        # own question for every host the call then reaches (see the module docstring).
        try:
            recorded = await asyncio.to_thread(
                functools.partial(
                    self.decider.record_answer, shown, answer, ctx, decided_by=by, rules=bundle
                )
            )
        except PolicyError as exc:  # damaged while the person was asked
            return self._policy_unusable(perm, exc), DecidedBy.UNUSABLE_POLICY
        self.host.emit(
            EventKind.PERMISSION,
            **base,
            decision=answer.value,
            by=by,
            rules=[r.describe() for r in recorded.created_rules],
        )
        self.host.note("permission", {**base, "decision": answer.value, "by": by})
        return answer, by

    def ask_before_commands(self) -> tuple[str, ...]:
        """Command prefixes this task's rules ask or refuse before (the person's shell
        rules): the gate sends a bash call that may run one of them to the host."""
        out: dict[str, None] = {}
        try:
            rules = self.decider.store.effective_rules()
        except PolicyError:
            return ()  # said when the policy is first needed; the gate asks nothing extra
        for rule in rules:
            if (
                rule.action is Action.SHELL
                and rule.pattern
                and rule.source is RuleSource.USER
                and rule.verdict in (Verdict.ASK, Verdict.DENY)
                and scope_applies(rule.scope, self.context)
            ):
                out[" ".join(rule.pattern.split())] = None
        return tuple(out)[:256]

    def change_judge(self) -> ChangeJudge:
        """The change-set engine's policy and questions (piwork.changes.engine.Judge), one
        per session: a stop closes its open question (:meth:`ChangeJudge.cancel_questions`)."""
        if self._change_judge is None:
            self._change_judge = ChangeJudge(self)
        return self._change_judge

    def _policy_unusable(self, perm: PermissionRequest, exc: PolicyError) -> Choice:
        """The policy cannot be read: deny (a damaged policy is never a looser one), say
        why, and let the session end the run."""
        base = dict(action=perm.action.value, tool=perm.tool, target=perm.summary)
        by = DecidedBy.UNUSABLE_POLICY
        self.host.emit(EventKind.ERROR, message=str(exc))
        self.host.emit(EventKind.PERMISSION, **base, question=perm.question,
                       decision=Choice.DENY.value, by=by)  # fmt: skip
        self.host.note("permission", {**base, "decision": Choice.DENY.value, "by": by})
        with contextlib.suppress(OSError):  # the audit log is another file: say it if we can
            self.decider.record_unusable_policy(perm, self.context)
        if self.on_unusable_policy is not None:
            self.on_unusable_policy(str(exc))
        return Choice.DENY

    def _proposals(self, perm: PermissionRequest) -> dict[Choice, tuple[Rule, ...]]:
        proposals = self.decider.proposals(perm, self.context)
        offer = registry_offer(self.decider, perm, self.context, self.mirror_hosts)
        if offer:
            proposals[Choice.ALLOW_REGISTRIES] = offer
        return proposals

    async def answer_question(self, req: m.UiRequest) -> m.UiResponse:
        title = str(getattr(req, "title", ""))
        message = getattr(req, "message", None) or getattr(req, "placeholder", None)
        options = getattr(req, "options", None)
        await self.host.set_status(TaskStatus.WAITING_INPUT)
        self.host.emit(EventKind.QUESTION, method=req.method, title=title, options=options)
        try:
            answer = await self.asker.question(req.method, title, message, options)
        finally:
            if not self.host.stopping and self.host.task_id is not None:
                # Answered while the VM is frozen: it stays paused until resumed.
                await self.host.set_status(
                    TaskStatus.PAUSED if self.host.paused else TaskStatus.RUNNING
                )
        self.host.note("question", {"method": req.method, "title": title, "answer": answer})
        if answer is None:
            return m.ui_cancelled(req.id)
        if req.method == "confirm":
            return m.ui_confirmed(req.id, bool(answer))
        return m.ui_value(req.id, str(answer))

    def cancelled(self, dialogs: Iterable[m.UiRequest]) -> None:
        """Dialogs a stop closed unanswered: audited, and front ends told the question is gone."""
        for dialog in dialogs:
            with contextlib.suppress(Exception):
                perm = parse_request(dialog) if isinstance(dialog, m.SelectRequest) else None
                if perm is not None:
                    self.cancelled_request(perm)

    def cancelled_request(self, perm: PermissionRequest) -> None:
        """One question a stop closed unanswered: audited, and front ends told it is gone."""
        with contextlib.suppress(Exception):
            self.decider.record_cancelled(perm, self.context)
            fields = dict(
                action=perm.action.value,
                tool=perm.tool,
                target=perm.summary,
                decision="cancelled",
                by=DecidedBy.CANCELLED,
            )
            self.host.emit(EventKind.PERMISSION, **fields, question=perm.question)
            self.host.note("permission", fields)

    # ------------------------------------------------------------ the egress proxy
    async def domain_policy(self, host: str, port: int) -> bool:
        """The egress proxy asks here before the guest reaches a new host.

        The question is the host's own, naming the host the proxy resolved; no
        earlier answer at the gate counts (a gate request is guest text).
        """
        if domain_allowed(host, self.allow_net):
            self.host.note(
                "egress", {"host": host, "port": port, "decision": "allow", "by": "--allow-net"}
            )
            return True
        target = Target(
            Action.NETWORK,
            op="network",
            domain=host,
            reason=f"connects to {host}:{port} through the egress proxy",
        )
        perm = host_request(
            "egress",
            f"The agent wants to connect to {host} (port {port}). Allow?",
            Action.NETWORK,
            "network",
            target,
            self.host.task_id,
        )
        return (await self.answer_permission(perm)).allows

    async def private_policy(self, host: str, port: int, address: str) -> bool:
        """The egress proxy asks here when an allowed ``host`` resolves to a private or
        reserved ``address``: a question of its own, per domain, naming the address.
        ``--yes`` does not answer it (an allowed name must not open this computer's or
        the office network's services by accident): a rule does (``piwork network
        allow-private``), or a person."""
        where = f"{address} ({describe_address(address)})"
        target = Target(
            Action.PRIVATE_NETWORK,
            op="private-network",
            domain=host,
            reason=where,
        )
        perm = host_request(
            "private",
            (
                f"{host} resolves to {where}, not a public address. That can be your "
                "network's proxy or mirror, or a service on your network or this computer. "
                f"Let the agent reach it (port {port})?"
            ),
            Action.PRIVATE_NETWORK,
            "network",
            target,
            self.host.task_id,
        )
        return (await self.answer_permission(perm, yes_answers=False)).allows

    async def server_tool_policy(self, provider: str, use: ServerToolUse) -> bool:
        """The gateway asks here before a provider-side tool the person enabled is used.

        Like a network destination: each host the provider is told to reach (an MCP
        server, the domains a search is limited to) is asked as the egress proxy asks
        for it; a tool that reaches any site it likes is a question of its own.
        """
        if use.destinations:
            for host in use.destinations:
                if not await self.domain_policy(host, 443):
                    return False
            return True
        tool = f"{provider}:{use.kind}"
        perm = host_request(
            "server-tool",
            (
                f"The agent asks {provider} to use its {use.kind} tool: "
                f"{SERVER_TOOL_KINDS[use.kind]}, reaching any site it chooses, outside the "
                "egress proxy, with what the conversation holds. Allow?"
            ),
            Action.CONNECTOR,
            tool,
            Target(Action.CONNECTOR, op="connector", tool=tool),
            self.host.task_id,
        )
        return (await self.answer_permission(perm)).allows

    def on_egress_decision(self, decision: EgressDecision) -> None:
        self.host.note(
            "egress",
            {
                "host": decision.host,
                "port": decision.port,
                "allowed": decision.allowed,
                "reason": decision.reason,
                **({"detail": decision.detail} if decision.detail else {}),
            },
        )


class ChangeJudge:
    """What the agent changed in the folder, decided by the same policy, rules, audit log
    and question as every other permission (``piwork.changes.engine.Judge``).

    The request is built here, on the host, from the validated change set: its
    targets name the exact paths (``/mnt/work/...``, as rules match them); an
    "Always" answer stores exact-path rules (``persist_pattern``).
    """

    def __init__(self, bridge: PermissionBridge) -> None:
        self.bridge = bridge
        self._stop = asyncio.Event()

    def cancel_questions(self) -> None:
        """The run stops: an open question about a change set is closed (the change waits,
        audited and told as cancelled), and none is asked until :meth:`resume`."""
        self._stop.set()

    def resume(self) -> None:
        self._stop.clear()

    def verdicts(self, targets: list[Target]) -> list[tuple[Verdict, bool]]:
        try:
            rules = self.bridge.decider.store.effective_rules()
        except PolicyError as exc:
            # Nothing is decided on a damaged policy: said, audited, the run ends (as for
            # a gate request), and nothing is asked: every change waits in the layer.
            if targets:
                self.bridge._policy_unusable(self._request(targets, "the agent's changes"), exc)
            self._stop.set()
            return [(Verdict.ASK, False)] * len(targets)
        out = []
        for t in targets:
            rule = winning_rule(rules, t, self.bridge.context)
            verdict = rule.verdict if rule is not None else Verdict.ASK
            # What the host could be made to run is released only by the person's own
            # rule naming its exact path (an answer stored by `piwork apply`, or one they
            # wrote), never by a broad "allow write" (docs/change-sets.md).
            exact = rule is not None and rule.source is RuleSource.USER and rule.pattern == t.path
            out.append((verdict, exact))
            if verdict is Verdict.DENY or exact or t.action is not Action.WRITE:
                self._decided_by_rule(t)
        return out

    def _decided_by_rule(self, target: Target) -> None:
        """A delete or a move (or anything the person's own rule decided) that a rule
        answered instead of the person: audited and told like a gate request a rule
        decided. The default rules' allowed writes are not (one line per file written)."""
        perm = self._request([target], "the agent's change")
        try:
            decision = self.bridge.decider.decide(perm, self.bridge.context)
        except (PolicyError, OSError) as exc:
            log.warning("a change set's rule decision was not audited: %s", exc)
            return
        if decision.verdict is Verdict.ASK:
            return
        base = dict(action=perm.action.value, tool=perm.tool, target=perm.summary,
                    question=perm.question, call=None)  # fmt: skip
        choice = decision.reply_choice.value
        rule = decision.rule.describe() if decision.rule else None
        self.bridge.host.emit(EventKind.PERMISSION, **base, decision=choice, by="rule", rule=rule)
        self.bridge.host.note("permission", {**base, "decision": choice, "by": "rule"})

    def _request(self, targets: list[Target], question: str) -> PermissionRequest:
        order = (Action.DELETE, Action.MOVE, Action.WRITE)
        action = next((a for a in order if any(t.action is a for t in targets)), Action.WRITE)
        return PermissionRequest(
            request_id=f"changes-{secrets.token_hex(4)}",
            question=question,
            options=tuple(c.value for c in GATE_CHOICES),
            action=action,
            tool="changes",
            tool_call_id=None,
            task_id=self.bridge.host.task_id,
            cwd=None,
            command=None,
            paths=tuple(t.path for t in targets if t.path),
            targets=tuple(targets),
            payload={},
        )

    async def ask(self, targets: list[Target], question: str) -> Answer:
        perm = self._request(targets, question)
        if self._stop.is_set():
            return Answer.NOBODY
        deciding = asyncio.ensure_future(self.bridge.decide_permission(perm))
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({deciding, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not deciding.done():
            deciding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deciding
            self.bridge.cancelled_request(perm)
            return Answer.NOBODY
        choice, by = deciding.result()
        if by == DecidedBy.NO_TERMINAL:
            return Answer.NOBODY
        return Answer.ALLOW if choice.allows else Answer.DENY


__all__ = [
    "AllowAsker",
    "Asker",
    "BridgeHost",
    "ChangeJudge",
    "DenyAsker",
    "PermissionBridge",
    "allowed_domains",
]
