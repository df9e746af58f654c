"""One change-set engine: what the agent changed reaches the person's folder only through here.

:meth:`FolderChanges.take` is called before every model call (the gateway holds
the call until it returns), at the end of every run, and before a finished
task's VM is kept warm; ``piwork apply`` and undo use the same steps. For a
local VM and a ``--host`` one alike:

1. **scan**: the agent's layer, from a :class:`Source` (untrusted: every entry
   validated, :mod:`piwork.changes.wire`), compared with what the journal
   last saw, so only what changed since is looked at again;
2. **compare** each with the person's folder now (read beneath it, no link
   followed); what is already the same is done;
3. **decide** from the effect: a write is applied unless it lands in what the
   host could be made to run (:mod:`piwork.changes.holds`: held for the
   person) or the person's git metadata (kept: their commits come as
   patches); a delete, a move, a file emptied, or a file replaced by a folder
   is asked with its exact paths; each through the host policy (rules can
   allow, deny or ask), and the person through the same permission question as
   every other (once / this folder / everywhere). With no one to ask it waits;
4. **fetch** the content of what will be applied or waits (bounded), into the
   task's store;
5. **checkpoint**: the folder's previous version of every path about to change
   goes into the store and the journal, *before* the folder changes;
6. **apply**, three-way: a path the person changed since the agent's layer took
   it (:meth:`Source.person_changed`) keeps the person's version, and the
   agent's lands beside it (``<name>.agent-N``), said in a conflict notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from piwork.changes import folder as fs
from piwork.changes.entry import Change, Kind, display, parents
from piwork.changes.holds import (
    GITDIR_PREFIX,
    GITDIR_WHY,
    Held,
    hook_paths,
    refused_prefix,
    runnable,
)
from piwork.changes.journal import Checkpoint, Journal, LayerRow, Pending, State
from piwork.changes.store import ObjectStore, sync_filesystem
from piwork.changes.wire import Scan
from piwork.policy.rules import Action, Target, Verdict
from piwork.sharefs import UnsafePathError

log = logging.getLogger(__name__)

GUEST_FOLDER = "/mnt/work"
"""Where the guest sees the folder: rules' path patterns are matched against this."""
CHANGES_DIR = "changes"
HEAD_BYTES = 64
HEAD_LIMIT = 4096
"""Files up to this size are looked at for a ``gitdir:`` first line."""


@dataclass(frozen=True)
class Limits:
    max_entries: int = 200_000
    """Entries one scan may bring; more wait for the next scan."""
    max_file_bytes: int = 256 << 20
    """A file the agent wrote bigger than this is not brought back (it stays in its layer)."""
    max_batch_bytes: int = 2 << 30
    """Bytes one change set may bring; the rest waits for the next one."""
    max_before_bytes: int = 50 << 20
    """The person's file a change would replace is kept for undo up to this size
    (``tasks.checkpointMaxFileBytes``); a bigger one is not replaced without asking."""
    max_ask_paths: int = 200
    """Paths named in one question (the rest are counted)."""


class Source(Protocol):
    """Where a change set comes from: the guest's layer (local or ``--host``), or the store."""

    async def scan(self, max_entries: int) -> Scan: ...

    def read_many(
        self, changes: list[Change], max_bytes: int
    ) -> AsyncIterator[tuple[Change, bytes | None, str | None]]:
        """The files' bytes in order: ``(change, bytes, None)`` or ``(change, None, why)``."""
        ...

    def person_changed(self, seen: fs.Seen, written: tuple[int, ...] | None) -> bool:
        """Did the person change this path after the agent's layer took its version?"""
        ...


class Answer(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    NOBODY = "nobody"
    """No one could answer: the change waits (``piwork apply``)."""


class Judge(Protocol):
    """The host policy and the person, as the run (or ``piwork apply``) reaches them."""

    def verdicts(self, targets: list[Target]) -> list[tuple[Verdict, bool]]:
        """The policy's verdict for each target, and whether a rule the person made
        naming exactly that path decided it (only such a rule releases a held change)."""
        ...

    async def ask(self, targets: list[Target], question: str) -> Answer:
        """Ask the person (policy first, audited, answers persisted as rules)."""
        ...


class OpKind(StrEnum):
    WRITE = "write"
    DELETE = "delete"
    MOVE = "move"


@dataclass
class Op:
    kind: OpKind
    path: str
    change: Change
    """The agent's version (for a delete: ``GONE``; for a move: the destination's)."""
    person: fs.Seen
    to: str | None = None
    why: str = ""
    held: Held | None = None
    files: list[fs.Seen] = field(default_factory=list)
    """Everything under a folder that goes (recorded for undo, counted in questions)."""
    state: State = State.APPLIED
    retry: bool = False
    """Not brought back this time (over the batch, changed while read): not recorded as
    seen, so the next change set tries again."""

    @property
    def paths(self) -> list[str]:
        return [self.path] if self.to is None else [self.path, self.to]

    def target(self) -> Target:
        action = {
            OpKind.WRITE: Action.WRITE,
            OpKind.DELETE: Action.DELETE,
            OpKind.MOVE: Action.MOVE,
        }
        root = self.held.root if self.held is not None else self.path
        return Target(action[self.kind], op=self.kind.value, path=f"{GUEST_FOLDER}/{root}",
                      reason=self.why)  # fmt: skip

    def describe(self) -> str:
        n = sum(1 for f in self.files if f.change.kind is not Kind.DIR)
        inside = f" ({n} files in it)" if n > 1 else ""
        if self.kind is OpKind.MOVE:
            return f"{display(self.path)} -> {display(self.to or '')}"
        return f"{display(self.path)}{inside}"


@dataclass
class Outcome:
    """What one change set did; the run reports it (a ``changes`` event, notices)."""

    checkpoint: Checkpoint | None = None
    applied: list[tuple[str, str]] = field(default_factory=list)
    """(path, status): added | modified | deleted | type_changed."""
    waiting: list[tuple[str, str, str]] = field(default_factory=list)
    """(path, asked|held, why)."""
    denied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    """(path, where the agent's version is)."""
    truncated: bool = False
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def empty(self) -> bool:
        return not (self.applied or self.waiting or self.denied or self.refused or self.conflicts)


def status_of(before: Change, after: Change) -> str:
    """What a change did to a path: added | deleted | type_changed | modified."""
    if before.kind is Kind.GONE:
        return "added"
    if after.kind is Kind.GONE:
        return "deleted"
    if before.kind is not after.kind:
        return "type_changed"
    return "modified"


class FolderChanges:
    """The engine for one task's folder (``task_dir``/changes, ``folder``)."""

    def __init__(
        self,
        task_dir: Path,
        folder: Path,
        *,
        limits: Limits | None = None,
    ) -> None:
        self.dir = task_dir / CHANGES_DIR
        self.folder = folder
        self.limits = limits or Limits()
        self.store = ObjectStore(self.dir / "objects")
        self.journal = Journal(self.dir / "journal.sqlite")
        self._lock = asyncio.Lock()

    def close(self) -> None:
        self.journal.close()

    # ------------------------------------------------------------ the whole step
    async def take(
        self,
        source: Source,
        judge: Judge,
        *,
        turn: int | None,
        label: str,
        again: frozenset[str] = frozenset(),
    ) -> Outcome:
        """Scan ``source``, decide, checkpoint and apply (see the module docstring).
        ``again``: paths to decide afresh even if the layer holds them as last seen
        (changes waiting for the person, applied from the store)."""
        async with self._lock:
            t0 = time.monotonic()
            scan = await source.scan(self.limits.max_entries)
            out = Outcome(truncated=scan.truncated)
            for why in scan.refused:
                out.notes.append(f"the guest reported an entry piwork refused: {why}")
            record = await asyncio.to_thread(self.journal.layer)
            for p in again:
                record.pop(p, None)
            with fs.Dirs(self.folder) as dirs:
                ops, rows, vanished = await asyncio.to_thread(self._plan, dirs, scan, record, out)
                await self._decide(ops, judge, out)
                await self._fetch(ops, source, out)
                await asyncio.to_thread(
                    self._commit, dirs, ops, rows, vanished, source, out, turn, label
                )
            out.seconds = time.monotonic() - t0
            return out

    # ------------------------------------------------------------ 1-2: compare
    def _plan(
        self, dirs: fs.Dirs, scan: Scan, record: dict[str, LayerRow], out: Outcome
    ) -> tuple[list[Op], dict[str, LayerRow], list[str]]:
        now = time.time()
        by_path = {c.path: c for c in scan.changes}
        fresh: list[Change] = []
        rows: dict[str, LayerRow] = {}
        for c in scan.changes:
            old = record.get(c.path)
            if old is not None and old.change.same_as(c) and old.change.mode == c.mode:
                continue
            fresh.append(c)
        vanished = [] if scan.truncated or scan.partial else [p for p in record if p not in by_path]
        looked: dict[str, fs.Seen] = {}

        def person(rel: str, *, keep: bool = False) -> fs.Seen:
            """What the folder holds at ``rel``; ``keep``: its bytes go into the store now
            (the checkpoint's previous version, read once with the hash)."""
            if rel not in looked or (keep and rel not in kept):
                data: list[bytes] = []
                looked[rel] = fs.look(dirs, rel, max_hash_bytes=self.limits.max_before_bytes,
                                      keep=data if keep else None)  # fmt: skip
                if data:
                    self.store.put(data[0])
                    kept.add(rel)
            return looked[rel]

        kept: set[str] = set()

        def person_has(rel: str) -> bool:
            return person(rel).change.kind is not Kind.GONE

        def agent_has(rel: str) -> bool:
            c = by_path.get(rel)
            if c is not None:
                return c.kind not in (Kind.GONE, Kind.OTHER)
            if any(by_path.get(p) is not None and by_path[p].kind is Kind.GONE
                   for p in parents(rel)):  # fmt: skip
                return False
            return person_has(rel)

        hooks = self._hooks_dirs(dirs, fresh)
        # A new folder with anything in the change set under it is made when what goes
        # in it is written (a folder holding only what waits is not made at all).
        has_children = {p for c in fresh for p in parents(c.path)}
        ops: list[Op] = []
        for c in fresh:
            seen = person(c.path, keep=True)
            p = seen.change
            if c.kind is Kind.OTHER:
                out.refused.append((c.path, "a FIFO, socket or device node"))
                rows[c.path] = LayerRow(c, State.REFUSED, "not a file, folder or link", since=now)
                continue
            if c.kind is Kind.GONE:
                if p.kind is Kind.GONE:
                    rows[c.path] = LayerRow(c, State.APPLIED, since=now)
                    continue
                op = Op(OpKind.DELETE, c.path, c, seen, why="the agent deleted it")
            elif c.same_as(p) and (c.kind is not Kind.FILE or c.executable == p.executable):
                rows[c.path] = LayerRow(c, State.APPLIED, since=now)  # the folder has it already
                continue
            elif c.kind is Kind.DIR and (
                p.kind is Kind.DIR or (p.kind is Kind.GONE and c.path in has_children)
            ):
                rows[c.path] = LayerRow(c, State.APPLIED, since=now)
                continue
            elif p.kind is not Kind.GONE and p.kind is not c.kind:
                why = f"the agent replaced a {p.kind.value} with a {c.kind.value}"
                op = Op(OpKind.DELETE, c.path, c, seen, why=why)
            elif p.kind is Kind.FILE and c.kind is Kind.FILE and c.size == 0 and p.size > 0:
                op = Op(OpKind.DELETE, c.path, c, seen, why="the agent emptied the file")
            else:
                op = Op(
                    OpKind.WRITE,
                    c.path,
                    c,
                    seen,
                    why="the agent wrote it" if p.kind is Kind.GONE else "the agent changed it",
                )
            op.held = runnable(c, agent_has, person_has, hooks)
            if op.held is None and c.kind is Kind.GONE:
                op.held = runnable(p, person_has, person_has, hooks)  # what it deletes
                if op.held is not None and not op.held.existing_git:
                    op.held = None  # deleting is asked anyway; only the person's git stays
            if p.kind is Kind.DIR and (op.kind is OpKind.DELETE):
                op.files = [person(e.path, keep=True) for e in fs.walk(dirs, c.path)]
                repo = next(
                    (f.change.path for f in op.files if refused_prefix(f.change.path)), None
                )
                if op.held is None and repo is not None:
                    # a folder holding a repository of the person's: their git metadata
                    # is never removed by piwork (they can delete the folder themselves)
                    op.held = Held(c.path, f"it holds your git metadata ({display(repo)})",
                                   existing_git=True)  # fmt: skip
            ops.append(op)
        self._pair_moves(ops)
        return ops, rows, vanished

    def _hooks_dirs(self, dirs: fs.Dirs, fresh: list[Change]) -> frozenset[str]:
        """What host git runs as hooks (a hooks folder in the folder, the targets of
        linked hooks) of the person's repositories the change set is in."""
        repos: set[str] = set()
        checked: set[str] = set()
        for c in fresh:
            for p in ["", *parents(c.path)]:
                if p in checked:
                    continue
                checked.add(p)
                git = f"{p}/.git" if p else ".git"
                if fs.signature(dirs, git) is not None:
                    repos.add(p)
        out: set[str] = set()
        for r in sorted(repos)[:64]:
            out |= hook_paths(self.folder, r)
        return frozenset(out)

    def _pair_moves(self, ops: list[Op]) -> None:
        """A file that went from one path and appeared, same bytes, at another: a move."""
        gone: dict[str, Op] = {}
        for op in ops:
            if op.kind is OpKind.DELETE and op.change.kind is Kind.GONE:
                p = op.person.change
                if p.kind is Kind.FILE and p.sha256:
                    gone.setdefault(p.sha256, op)
        if not gone:
            return
        for op in ops:
            c = op.change
            if op.held is not None:
                continue  # a host-runnable destination is held, whatever its source
            if (
                op.kind is OpKind.WRITE
                and c.kind is Kind.FILE
                and op.person.change.kind is Kind.GONE
            ):
                src = gone.pop(c.sha256 or "", None)
                if src is None:
                    continue
                src.kind = OpKind.MOVE
                src.to = op.path
                src.why = "the agent moved it"
                src.change = c
                op.kind = OpKind.MOVE  # the destination half: decided with its source
                op.to = None
                op.why = "moved here"

    # ------------------------------------------------------------ 3: decide
    async def _decide(self, ops: list[Op], judge: Judge, out: Outcome) -> None:
        pending = [op for op in ops if not (op.held is not None and op.held.existing_git)]
        for op in ops:
            if op.held is not None and op.held.existing_git:
                op.state = State.KEPT
        halves = {op.to for op in pending if op.kind is OpKind.MOVE and op.to is not None}
        lead = [
            op
            for op in pending
            if not (op.kind is OpKind.MOVE and op.to is None and op.path in halves)
        ]
        verdicts = judge.verdicts([op.target() for op in lead]) if lead else []
        ask: list[Op] = []
        for op, (v, by_person) in zip(lead, verdicts, strict=True):
            if v is Verdict.DENY:
                op.state = State.DENIED
            elif v is Verdict.ALLOW and (op.held is None or by_person):
                op.state = State.APPLIED
            elif op.kind is OpKind.WRITE:
                op.state = State.HELD  # host-runnable: waits without interrupting the run
            else:
                ask.append(op)
        if ask:
            targets = [op.target() for op in ask]
            question = self._question(ask)
            answer = await judge.ask(targets, question)
            state = {Answer.ALLOW: State.APPLIED, Answer.DENY: State.DENIED}.get(
                answer, State.ASKED
            )
            for op in ask:
                op.state = state
        # A move's destination follows its source.
        by_dest = {op.to: op for op in ops if op.kind is OpKind.MOVE and op.to is not None}
        for op in ops:
            if op.kind is OpKind.MOVE and op.to is None and op.path in by_dest:
                op.state = by_dest[op.path].state

    def _question(self, ops: list[Op]) -> str:
        lines = ["The agent's changes include these, which piwork does not make in your "
                 "folder without asking:"]  # fmt: skip
        for op in ops[: self.limits.max_ask_paths]:
            verb = {OpKind.DELETE: "delete", OpKind.MOVE: "move", OpKind.WRITE: "write"}[op.kind]
            if op.why == "the agent emptied the file":
                verb = "empty"
            elif op.kind is OpKind.DELETE and op.change.kind is not Kind.GONE:
                verb = "replace"
            lines.append(f"- {verb}: {op.describe()}")
        if len(ops) > self.limits.max_ask_paths:
            lines.append(f"- ... and {len(ops) - self.limits.max_ask_paths} more")
        lines.append(
            "Make these changes in your folder? (They stay in the agent's copy either way.)"
        )
        return "\n".join(lines)

    # ------------------------------------------------------------ 4: fetch
    async def _fetch(self, ops: list[Op], source: Source, out: Outcome) -> None:
        budget = self.limits.max_batch_bytes
        wanted: dict[str, list[Op]] = {}
        for op in ops:
            c = op.change
            if op.state not in (State.APPLIED, State.HELD, State.ASKED) or c.kind is not Kind.FILE:
                continue
            assert c.sha256 is not None
            if c.size > self.limits.max_file_bytes:
                op.state = State.REFUSED
                out.refused.append((c.path, f"over {self.limits.max_file_bytes >> 20} MiB"))
                continue
            if self.store.has(c.sha256):
                continue
            if c.sha256 in wanted:
                wanted[c.sha256].append(op)  # the same bytes at another path: read once
                continue
            if c.size > budget:
                op.state, op.retry = State.REFUSED, True
                out.truncated = True
                continue
            budget -= c.size
            wanted[c.sha256] = [op]
        firsts = [group[0].change for group in wanted.values()]
        async for change, data, why in source.read_many(firsts, self.limits.max_file_bytes):
            group = wanted[change.sha256 or ""]
            if data is None:
                for op in group:
                    op.state, op.retry = State.REFUSED, True
                out.notes.append(f"{display(change.path)}: not brought back now ({why}); the "
                                 "next change set tries again")  # fmt: skip
                continue
            await asyncio.to_thread(self.store.put, data)
        for op in ops:
            c = op.change
            if op.state is State.REFUSED or c.kind is not Kind.FILE or c.size > HEAD_LIMIT:
                continue
            if op.held is not None or op.kind is not OpKind.WRITE or not c.sha256:
                continue
            if self.store.has(c.sha256) and self.store.get(c.sha256)[
                :HEAD_BYTES
            ].lstrip().startswith(GITDIR_PREFIX):
                op.held = Held(c.path, GITDIR_WHY)
                if op.state is State.APPLIED:
                    op.state = State.HELD
        await asyncio.to_thread(self.store.sync)

    # ------------------------------------------------------------ 5-6: checkpoint, apply
    def _commit(
        self,
        dirs: fs.Dirs,
        ops: list[Op],
        rows: dict[str, LayerRow],
        vanished: list[str],
        source: Source,
        out: Outcome,
        turn: int | None,
        label: str,
    ) -> None:
        now = time.time()
        pending = Pending(turn, label)
        apply: list[Op] = []
        for op in ops:
            if op.state is State.APPLIED:
                if not self._record_before(dirs, op):
                    op.state = State.HELD
                    op.why = "the file it replaces is too big to keep for undo"
                else:
                    apply.append(op)
        # Undo needs the previous versions before the folder changes.
        self.store.sync()
        written: dict[str, tuple[int, ...] | None] = {}
        done: list[tuple[str, Change, Change]] = []
        for op in sorted(apply, key=_order):
            try:
                self._apply(dirs, op, source, written, done, out)
            except UnsafePathError:
                # something that is not a folder stands where it goes (a file the agent
                # replaced by a folder, and that replacement waits): it waits with it
                op.state, op.retry = State.ASKED, True
                op.why = "it goes into a folder whose change waits for you"
            except OSError as exc:
                op.state = State.REFUSED
                out.refused.append((op.path, f"could not be written: {exc.strerror or exc}"))
        with contextlib.suppress(OSError):
            sync_filesystem(self.folder)
        pending.touches = done
        with self.journal.transaction() as db:
            if done or label in ("task start", "task resumed"):
                out.checkpoint = self.journal.add(pending, db)
            for op in ops:
                if op.retry:
                    continue
                key = op.to if (op.kind is OpKind.MOVE and op.to is not None) else None
                for path, change in (
                    ((op.path, op.change),)
                    if key is None
                    else ((op.path, Change(op.path, Kind.GONE)), (op.to or "", op.change))
                ):
                    rows[path] = LayerRow(change, op.state, op.held.why if op.held else op.why,
                                          op.held.root if op.held else None, now)  # fmt: skip
            self.journal.set_layer(db, rows)
            self.journal.drop_layer(db, vanished)
            self.journal.set_written(db, written)
        for op in ops:
            if op.state in (State.ASKED, State.HELD):
                for p in op.paths:
                    out.waiting.append((p, op.state.value, op.held.why if op.held else op.why))
            elif op.state is State.DENIED:
                out.denied.extend(op.paths)
            elif op.state is State.KEPT:
                out.kept.append(op.path)
        for path, before, after in done:
            out.applied.append((path, status_of(before, after)))

    def _record_before(self, dirs: fs.Dirs, op: Op) -> bool:
        """The folder's current version of what ``op`` changes is in the store (read when
        it was compared; a move's destination now)."""
        targets = [op.person, *op.files]
        if op.kind is OpKind.MOVE and op.to is not None:
            data: list[bytes] = []
            dest = fs.look(dirs, op.to, max_hash_bytes=self.limits.max_before_bytes, keep=data)
            if data:
                self.store.put(data[0])
            targets.append(dest)
        for seen in targets:
            c = seen.change
            if c.kind is Kind.FILE and (c.sha256 is None or not self.store.has(c.sha256)):
                return False  # over the size the checkpoints keep, or gone meanwhile
        return True

    def _apply(
        self,
        dirs: fs.Dirs,
        op: Op,
        source: Source,
        written: dict[str, tuple[int, ...] | None],
        done: list[tuple[str, Change, Change]],
        out: Outcome,
    ) -> None:
        if op.kind is OpKind.MOVE and op.to is None:
            return  # the destination half: written by its source's op
        now = op.person
        if fs.signature(dirs, op.path) != (
            now.signature if now.change.kind is not Kind.GONE else None
        ):
            now = fs.look(dirs, op.path, max_hash_bytes=self.limits.max_before_bytes)
        if self._conflict(op, now, source):
            if op.change.kind is Kind.FILE:
                beside = self._beside(dirs, op, written)
                if beside is not None:
                    out.conflicts.append((op.path, beside))
                    done.append((beside, Change(beside, Kind.GONE), op.change))
                    op.state = State.CONFLICT
                    return
            out.conflicts.append((op.path, ""))
            op.state = State.CONFLICT
            return
        if op.kind is OpKind.DELETE and op.change.kind is Kind.GONE:
            done.extend(
                (f.change.path, f.change, Change(f.change.path, Kind.GONE)) for f in op.files
            )
            fs.remove(dirs, op.path)
            done.append((op.path, now.change, Change(op.path, Kind.GONE)))
            written[op.path] = None
            return
        if op.kind is OpKind.MOVE:
            dest = op.to or ""
            dest_before = fs.look(dirs, dest, max_hash_bytes=self.limits.max_before_bytes)
            self._write(dirs, dest, op.change, None, written, done)
            done.append((dest, dest_before.change, op.change))
            fs.remove(dirs, op.path)
            done.append((op.path, now.change, Change(op.path, Kind.GONE)))
            written[op.path] = None
            return
        # a write, or a replacement (a folder by a file and so on)
        done.extend((f.change.path, f.change, Change(f.change.path, Kind.GONE)) for f in op.files)
        self._write(dirs, op.path, op.change, now.change, written, done)
        done.append((op.path, now.change, op.change))

    def _conflict(self, op: Op, now: fs.Seen, source: Source) -> bool:
        if now.change.kind is Kind.GONE and op.person.change.kind is Kind.GONE:
            return False
        if not now.change.same_as(op.person.change):
            return True  # it changed between the look and now
        if now.change.kind is Kind.GONE:
            return False
        return source.person_changed(now, self.journal.written(op.path))

    def _write(
        self,
        dirs: fs.Dirs,
        rel: str,
        change: Change,
        before: Change | None,
        written: dict[str, tuple[int, ...] | None],
        done: list[tuple[str, Change, Change]],
    ) -> None:
        """Write ``change`` at ``rel``; the folders made for it are recorded (undo removes
        them again, if they are empty then)."""
        for parent in fs.missing_parents(dirs, rel):
            done.append((parent, Change(parent, Kind.GONE), Change(parent, Kind.DIR, 0o755)))
        if change.kind is Kind.DIR:
            seen = fs.make_dir(dirs, rel)
        elif change.kind is Kind.LINK:
            seen = fs.make_link(dirs, rel, change.target or "")
        else:
            assert change.sha256 is not None
            data = self.store.get(change.sha256)
            seen = fs.write_file(dirs, rel, data, mode=_mode(change, before))
        written[rel] = seen.signature

    def _beside(
        self, dirs: fs.Dirs, op: Op, written: dict[str, tuple[int, ...] | None]
    ) -> str | None:
        """The agent's version of a file the person changed too, at ``<name>.agent-N``."""
        assert op.change.sha256 is not None
        data = self.store.get(op.change.sha256)
        for n in range(1, 100):
            cand = f"{op.path}.agent-{n}"
            if fs.signature(dirs, cand) is None:
                try:
                    seen = fs.write_file(dirs, cand, data, mode=_mode(op.change, None))
                except OSError:
                    return None
                written[cand] = seen.signature
                return cand
        return None


def _mode(change: Change, before: Change | None) -> int:
    """The person's permission bits where they had the file (the agent's executable bit
    applied on them); 0644/0755 for a new one."""
    if before is not None and before.kind is Kind.FILE:
        mode = before.mode & 0o777
        if change.executable and not mode & 0o111:
            mode |= (mode & 0o444) >> 2
        elif not change.executable:
            mode &= ~0o111
        return mode
    return 0o755 if change.executable else 0o644


def _order(op: Op) -> tuple[int, int, str]:
    """Folders first (parents before children), then files, then deletes (deepest first)."""
    depth = op.path.count("/")
    if op.kind is OpKind.DELETE and op.change.kind is Kind.GONE:
        return (2, -depth, op.path)
    if op.change.kind is Kind.DIR:
        return (0, depth, op.path)
    return (1, depth, op.path)


def summary(outcome: Outcome, limit: int = 200) -> dict[str, object]:
    """The ``changes`` event's data: counts and a bounded file list (JSON-safe paths)."""
    counts = {"added": 0, "modified": 0, "deleted": 0, "type_changed": 0}
    for _p, st in outcome.applied:
        counts[st] = counts.get(st, 0) + 1
    files = [{"path": display(p), "status": st} for p, st in outcome.applied[:limit]]
    return {
        **counts,
        "files": files,
        "truncated": max(0, len(outcome.applied) - limit),
        "waiting": [
            {"path": display(p), "state": s, "why": w} for p, s, w in outcome.waiting[:limit]
        ],
        "denied": [display(p) for p in outcome.denied[:limit]],
        "conflicts": [
            {"path": display(p), "agent_copy": display(b)} for p, b in outcome.conflicts[:limit]
        ],
        "refused": [{"path": display(p), "why": w} for p, w in outcome.refused[:limit]],
    }
