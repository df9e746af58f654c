"""What waits for the person, and their answer: the API ``piwork apply`` and the app use.

Qt-free and blocking (the app calls it from a worker thread). A task's agent
may have changed things piwork does not put in the person's folder without
them: deletes, moves and files emptied (*asked*: a question during the run, or
waiting when no one could answer), and what the host could be made to run from
the folder (*held*: :mod:`piwork.changes.holds`). Both stay in the agent's
layer (it keeps working with them) and in the task's store (so they can be
applied with no VM running).

- :func:`waiting_changes` lists them, each with its exact path, why it waits,
  the unit the person answers for (``root``: a folder such as ``.venv`` or the
  path itself) and a bounded diff against the folder as it is now;
- :func:`apply_waiting` applies some (by root or path) with one of the
  permission answers (once / this folder / everywhere): checkpointed first,
  three-way like every change set, rules stored for an "Always";
- :func:`keep_out` records "no" for some (the folder keeps its version; the
  agent's copy keeps the change);
- :func:`applied_changes` (``piwork.checkpoints.task_changes``) is what was
  applied, per turn or for the whole task.

Every path and diff is guest text: show it through ``piwork.textsafe`` /
``piwork.gui.text`` (plain text, never rich text).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from piwork.changes import folder as fs
from piwork.changes.engine import CHANGES_DIR, GUEST_FOLDER, Answer, FolderChanges, Outcome
from piwork.changes.entry import Change, Kind
from piwork.changes.errors import CheckpointError
from piwork.changes.history import claimed_task, describe, task_changes
from piwork.changes.journal import LayerRow, State
from piwork.changes.sources import StoredSource
from piwork.config import Paths, get_paths
from piwork.policy import GATE_CHOICES, AuditLog, Choice, DecidedBy, Decider, PolicyStore
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action, Target, TaskContext, Verdict
from piwork.tasks.settings import load_task_settings
from piwork.tasks.store import Task, TaskStore

applied_changes = task_changes


@dataclass(frozen=True)
class WaitingChange:
    path: str
    """Relative to the working folder (``/``-separated; may hold bytes that are not UTF-8,
    as surrogate escapes)."""
    root: str
    """What the person answers for: the folder or file that makes it wait (``.venv``,
    ``vendor/lib/.git``), or the path itself."""
    kind: str
    """``asked`` (a delete, a move, a file emptied) or ``held`` (the host could be made to
    run it)."""
    why: str
    status: str
    """What applying it does to the folder now: added | modified | deleted | type_changed."""
    binary: bool
    diff: str | None
    note: str | None = None


@dataclass
class ApplyResult:
    applied: list[tuple[str, str]] = field(default_factory=list)
    """(path, status)"""
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    """(path, where the agent's version went): the person changed it since."""
    still_waiting: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    """The rules an "Always" answer stored (described for people)."""
    checkpoint: str | None = None


def _quiet_task(task_id: str, paths: Paths | None) -> contextlib.AbstractContextManager[Task]:
    """The task, claimed: nothing runs it while its folder is changed here."""
    return claimed_task(
        task_id, paths, "its waiting changes are answered in the run, or here once it stops"
    )


def _engine(task: Task) -> FolderChanges:
    if task.record.working_folder is None:
        raise CheckpointError(f"task {task.id} has no working folder")
    return FolderChanges(task.dir, Path(task.record.working_folder))


def _has_journal(task: Task) -> bool:
    return (task.dir / CHANGES_DIR / "journal.sqlite").is_file()


def waiting_changes(
    task_id: str, *, paths: Paths | None = None, diffs: bool = True
) -> list[WaitingChange]:
    """Everything of the task's that waits for the person, with diffs against the folder now."""
    with TaskStore((paths or get_paths()).tasks) as store:
        task = store.get(task_id)
    if task.record.working_folder is None or not _has_journal(task):
        return []
    engine = _engine(task)
    try:
        rows = engine.journal.waiting()
        folder = Path(task.record.working_folder)
        net = {p: (fs.look(folder, p).change, row.change) for p, row in sorted(rows.items())}
        described = {c.path: c for c in describe(engine.store, net, diffs=200 if diffs else 0)}
    finally:
        engine.close()
    out = []
    for p, row in sorted(rows.items()):
        d = described.get(p)
        out.append(WaitingChange(
            path=p, root=row.root or p, kind=row.state.value, why=row.why or "",
            status=d.status if d else "modified", binary=d.binary if d else False,
            diff=d.diff if d else None, note=d.note if d else None,
        ))  # fmt: skip
    return out


def _selected(rows: dict[str, LayerRow], which: list[str] | None) -> dict[str, LayerRow]:
    if not which:
        return rows
    wanted = [w.strip("/") for w in which]
    return {
        p: r
        for p, r in rows.items()
        if any(p == w or p.startswith(w + "/") or (r.root or p) == w for w in wanted)
    }


class _Answered:
    """The person has answered (allow) for every target: the engine applies them."""

    def verdicts(self, targets: list[Target]) -> list[tuple[Verdict, bool]]:
        return [(Verdict.ALLOW, True)] * len(targets)

    async def ask(self, targets: list[Target], question: str) -> Answer:
        return Answer.ALLOW


def _targets(rows: dict[str, LayerRow]) -> list[Target]:
    out: dict[str, Target] = {}
    for p, r in rows.items():
        root = r.root or p
        if r.state is State.HELD:
            action = Action.WRITE
        elif r.change.kind is Kind.GONE:
            action = Action.DELETE
        else:
            action = (
                Action.MOVE
                if (r.why or "").startswith(("the agent moved", "moved"))
                else Action.DELETE
            )
        target = Target(action, op=action.value, path=f"{GUEST_FOLDER}/{root}", reason=r.why)
        out.setdefault(f"{action.value}:{root}", target)
    return list(out.values())


def apply_waiting(
    task_id: str,
    which: list[str] | None = None,
    *,
    choice: Choice = Choice.ALLOW_ONCE,
    paths: Paths | None = None,
) -> ApplyResult:
    """Apply the waiting changes named by ``which`` (roots or paths; None: all) as the
    person's answer ``choice``. An "Always" also stores the rules it implies (exact
    paths, the held unit as a folder rule), through the same policy and audit log as a
    question in a run. Refuses while the task runs (:class:`TaskRunning`)."""
    if not choice.allows:
        raise CheckpointError("use keep_out() for a no")
    p = paths or get_paths()
    with _quiet_task(task_id, paths) as task:
        engine = _engine(task)
        try:
            rows = _selected(engine.journal.waiting(), which)
            if not rows:
                return ApplyResult()
            rules = _record_answer(task, rows, choice, p)
            limits = load_task_settings().checkpoint_max_file_bytes
            engine.limits = type(engine.limits)(max_before_bytes=limits)
            source = StoredSource([r.change for r in rows.values()], engine.store,
                                  {k: r.since for k, r in rows.items()})  # fmt: skip
            out = asyncio.run(engine.take(source, _Answered(), turn=None, label="applied by you",
                                          again=frozenset(rows)))  # fmt: skip
        finally:
            engine.close()
    return _result(out, rules)


def _result(out: Outcome, rules: list[str]) -> ApplyResult:
    return ApplyResult(
        applied=list(out.applied),
        conflicts=list(out.conflicts),
        still_waiting=[p for p, _s, _w in out.waiting],
        rules=rules,
        checkpoint=out.checkpoint.id if out.checkpoint else None,
    )


def _record_answer(
    task: Task, rows: dict[str, LayerRow], choice: Choice, paths: Paths
) -> list[str]:
    """Audit the answer (and store an "Always"'s rules) as the run's questions are."""
    targets = _targets(rows)
    ctx = TaskContext(task_id=task.id, working_folder=Path(task.record.working_folder or "."))
    perm = PermissionRequest(
        request_id=f"apply-{secrets.token_hex(4)}",
        question="apply the agent's waiting changes",
        options=tuple(c.value for c in GATE_CHOICES),
        action=targets[0].action,
        tool="changes",
        tool_call_id=None,
        task_id=task.id,
        cwd=None,
        command=None,
        paths=tuple(t.path for t in targets if t.path),
        targets=tuple(targets),
        payload={},
    )
    decider = Decider(PolicyStore(paths.policy_file), AuditLog(paths.audit_log))
    decision = decider.record_answer(perm, choice, ctx, decided_by=DecidedBy.PERSON)
    return [r.human() for r in decision.created_rules]


def keep_out(task_id: str, which: list[str] | None = None, *, paths: Paths | None = None) -> int:
    """The person's "no" for waiting changes: the folder keeps its version (the agent's
    layer keeps its own). Returns how many paths were answered."""
    with _quiet_task(task_id, paths) as task:
        engine = _engine(task)
        try:
            rows = _selected(engine.journal.waiting(), which)
            with engine.journal.transaction() as db:
                engine.journal.set_layer(db, {
                    p: LayerRow(r.change, State.DENIED, r.why, r.root, r.since)
                    for p, r in rows.items()
                })  # fmt: skip
        finally:
            engine.close()
    return len(rows)


__all__ = [
    "ApplyResult",
    "WaitingChange",
    "applied_changes",
    "apply_waiting",
    "keep_out",
    "waiting_changes",
]

_ = Change
