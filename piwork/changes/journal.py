"""A task's change history: checkpoints, what each touched, and the agent's layer as last seen.

One SQLite database per task (``<task>/changes/journal.sqlite``) beside the
content store (:mod:`piwork.changes.store`). SQLite gives the journal its
atomic, durable commits (a crash leaves a checkpoint whole or absent) and its
indexes; the rows are small, the file contents live in the store.

- ``checkpoints``: one row per applied change set (and per undo), in order;
- ``touches``: for each, every path it changed, with the folder's state
  before and what piwork wrote (so undo restores ``before`` and notices a file
  the person changed since by comparing with ``after``);
- ``layer``: every path the agent's layer holds, as the host last saw it, and
  what became of it (applied, held, kept out, ...): the next change set is
  compared with this, so only what changed since is looked at again.
- ``written``: the stat of what piwork last wrote at a path, so a later edit by
  the person is seen without reading the file.

Paths are stored as bytes (``os.fsencode``): names that are not UTF-8 keep
their exact bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from piwork.changes.entry import Change, Kind
from piwork.changes.errors import CheckpointError

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    turn INTEGER,
    label TEXT NOT NULL,
    created REAL NOT NULL,
    notes TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS touches (
    seq INTEGER NOT NULL,
    path BLOB NOT NULL,
    before TEXT NOT NULL,
    after TEXT NOT NULL,
    PRIMARY KEY (seq, path)
);
CREATE INDEX IF NOT EXISTS touches_path ON touches(path);
CREATE TABLE IF NOT EXISTS layer (
    path BLOB PRIMARY KEY,
    entry TEXT NOT NULL,
    state TEXT NOT NULL,
    why TEXT,
    root BLOB,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS written (
    path BLOB PRIMARY KEY,
    sig TEXT NOT NULL
);
"""


class State(StrEnum):
    """What became of a path of the agent's layer."""

    APPLIED = "applied"  # in the folder (or the folder already had it)
    ASKED = "asked"  # held: a delete or move waiting for the person
    HELD = "held"  # held: host-runnable, waiting for the person
    DENIED = "denied"  # the person (or a rule) kept it out
    KEPT = "kept"  # the person's git metadata: never applied (commits become patches)
    REFUSED = "refused"  # cannot be brought to the folder (a FIFO, too big, invalid)
    CONFLICT = "conflict"  # the person changed it too: theirs stays, the agent's is beside it


WAITING = frozenset({State.ASKED, State.HELD})


def encode(change: Change) -> str:
    d: dict[str, Any] = {"k": change.kind.value}
    if change.kind is Kind.FILE:
        d.update(h=change.sha256, m=change.mode, s=change.size)
    elif change.kind is Kind.LINK:
        d["t"] = os.fsencode(change.target or "").hex()
    elif change.kind in (Kind.DIR, Kind.OTHER):
        d["m"] = change.mode
    return json.dumps(d, separators=(",", ":"))


def decode(path: str, text: str) -> Change:
    d = json.loads(text)
    kind = Kind(d["k"])
    if kind is Kind.FILE:
        return Change(path, kind, int(d.get("m", 0o644)), int(d.get("s", 0)), str(d["h"]))
    if kind is Kind.LINK:
        return Change(path, kind, 0o777, target=os.fsdecode(bytes.fromhex(d.get("t", ""))))
    return Change(path, kind, int(d.get("m", 0)))


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    id: str
    turn: int | None
    label: str
    created: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Touch:
    seq: int
    path: str
    before: Change
    after: Change


@dataclass(frozen=True)
class LayerRow:
    change: Change
    state: State
    why: str | None = None
    root: str | None = None
    since: float = 0.0


@dataclass
class Pending:
    """A checkpoint being written: its touches go in with it, in one transaction."""

    turn: int | None
    label: str
    notes: list[str] = field(default_factory=list)
    touches: list[tuple[str, Change, Change]] = field(default_factory=list)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ------------------------------------------------------------ checkpoints
    def add(self, pending: Pending, db: sqlite3.Connection | None = None) -> Checkpoint:
        """Record a checkpoint (inside the caller's transaction when ``db`` is given)."""
        cp_id = secrets.token_hex(6)
        created = time.time()
        conn = db or self.db
        own = db is None
        if own:
            conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                "INSERT INTO checkpoints(id, turn, label, created, notes) VALUES (?,?,?,?,?)",
                (cp_id, pending.turn, pending.label, created, json.dumps(pending.notes[:200])),
            )
            seq = int(cur.lastrowid or 0)
            conn.executemany(
                "INSERT OR REPLACE INTO touches(seq, path, before, after) VALUES (?,?,?,?)",
                ((seq, os.fsencode(p), encode(b), encode(a)) for p, b, a in pending.touches),
            )
        except BaseException:
            if own:
                conn.execute("ROLLBACK")
            raise
        if own:
            conn.execute("COMMIT")
        return Checkpoint(seq, cp_id, pending.turn, pending.label, created, tuple(pending.notes))

    def checkpoints(self) -> list[Checkpoint]:
        rows = self.db.execute(
            "SELECT seq, id, turn, label, created, notes FROM checkpoints ORDER BY seq"
        ).fetchall()
        return [Checkpoint(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5]))) for r in rows]

    def resolve(self, ref: str) -> Checkpoint:
        """A checkpoint by its id or a unique prefix of it."""
        ref = ref.strip().lower()
        found = [c for c in self.checkpoints() if c.id.startswith(ref)] if ref else []
        if len(found) != 1:
            raise CheckpointError(
                f"no checkpoint {ref!r} in this task" if not found
                else f"{ref!r} names {len(found)} checkpoints; give more of the id"
            )  # fmt: skip
        return found[0]

    def touches(self, seqs: Iterable[int] | None = None, path: str | None = None) -> list[Touch]:
        sql = "SELECT seq, path, before, after FROM touches"
        args: list[Any] = []
        where = []
        if seqs is not None:
            seq_list = list(seqs)
            if not seq_list:
                return []
            where.append(f"seq IN ({','.join('?' * len(seq_list))})")
            args += seq_list
        if path is not None:
            where.append("path = ?")
            args.append(os.fsencode(path))
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq, path"
        out = []
        for seq, raw, b, a in self.db.execute(sql, args):
            p = os.fsdecode(raw)
            out.append(Touch(seq, p, decode(p, b), decode(p, a)))
        return out

    def objects(self) -> set[str]:
        """Every stored version any row names (what garbage collection keeps)."""
        used: set[str] = set()
        for b, a in self.db.execute("SELECT before, after FROM touches"):
            for text in (b, a):
                h = json.loads(text).get("h")
                if h:
                    used.add(h)
        for (e,) in self.db.execute("SELECT entry FROM layer"):
            h = json.loads(e).get("h")
            if h:
                used.add(h)
        return used

    # ------------------------------------------------------------ the agent's layer
    def layer(self) -> dict[str, LayerRow]:
        out = {}
        for raw, e, state, why, root, since in self.db.execute(
            "SELECT path, entry, state, why, root, since FROM layer"
        ):
            p = os.fsdecode(raw)
            out[p] = LayerRow(decode(p, e), State(state), why,
                              os.fsdecode(root) if root is not None else None, since)  # fmt: skip
        return out

    def waiting(self) -> dict[str, LayerRow]:
        rows = self.db.execute(
            "SELECT path, entry, state, why, root, since FROM layer WHERE state IN (?, ?)",
            (State.ASKED.value, State.HELD.value),
        ).fetchall()
        out = {}
        for raw, e, state, why, root, since in rows:
            p = os.fsdecode(raw)
            out[p] = LayerRow(decode(p, e), State(state), why,
                              os.fsdecode(root) if root is not None else None, since)  # fmt: skip
        return out

    def set_layer(self, db: sqlite3.Connection, rows: dict[str, LayerRow]) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO layer(path, entry, state, why, root, since) "
            "VALUES (?,?,?,?,?,?)",
            (
                (os.fsencode(p), encode(r.change), r.state.value, r.why,
                 os.fsencode(r.root) if r.root is not None else None, r.since)
                for p, r in rows.items()
            ),
        )  # fmt: skip

    def drop_layer(self, db: sqlite3.Connection, paths: Iterable[str]) -> None:
        db.executemany("DELETE FROM layer WHERE path = ?", ((os.fsencode(p),) for p in paths))

    # ------------------------------------------------------------ what piwork wrote
    def written(self, path: str) -> tuple[int, ...] | None:
        row = self.db.execute(
            "SELECT sig FROM written WHERE path = ?", (os.fsencode(path),)
        ).fetchone()
        return tuple(json.loads(row[0])) if row else None

    def set_written(self, db: sqlite3.Connection, sigs: dict[str, tuple[int, ...] | None]) -> None:
        for p, sig in sigs.items():
            if sig is None:
                db.execute("DELETE FROM written WHERE path = ?", (os.fsencode(p),))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO written(path, sig) VALUES (?, ?)",
                    (os.fsencode(p), json.dumps(list(sig))),
                )
