"""A change-set source the unit tests control: the agent's layer as a dict (no VM).

It speaks to the engine exactly as the guest's layer service does through
:class:`piwork.changes.sources.LayerSource` (a scan of validated entries, reads
checked against their sha256), so the engine, the journal, the holds and undo
are exercised as in a run; only where the entries come from differs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from piwork.changes.engine import Answer
from piwork.changes.entry import Change, Kind
from piwork.changes.folder import Seen
from piwork.changes.sources import person_changed_since
from piwork.changes.wire import FileChanged, Scan
from piwork.policy.rules import Target, Verdict


def file(path: str, data: bytes, mode: int = 0o644) -> tuple[Change, bytes]:
    return Change(path, Kind.FILE, mode, len(data), hashlib.sha256(data).hexdigest()), data


class Layer:
    """The agent's layer: path -> (Change, bytes)."""

    def __init__(self) -> None:
        self.entries: dict[str, Change] = {}
        self.data: dict[str, bytes] = {}
        self.started_ns = time.time_ns()
        self._prev = self.started_ns
        self._last = self.started_ns
        self.reads = 0

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        c, d = file(path, data, mode)
        self.entries[path] = c
        self.data[c.sha256 or ""] = d
        parts = path.split("/")
        for i in range(1, len(parts)):
            p = "/".join(parts[:i])
            self.entries.setdefault(p, Change(p, Kind.DIR, 0o755))

    def delete(self, path: str) -> None:
        for p in [p for p in self.entries if p.startswith(path + "/")]:
            del self.entries[p]
        self.entries[path] = Change(path, Kind.GONE)

    def link(self, path: str, target: str) -> None:
        self.entries[path] = Change(path, Kind.LINK, 0o777, target=target)

    async def scan(self, max_entries: int) -> Scan:
        self._prev, self._last = self._last, time.time_ns()
        items = list(self.entries.values())
        return Scan(changes=items[:max_entries], truncated=len(items) > max_entries)

    async def read(self, change: Change, max_bytes: int) -> bytes:
        self.reads += 1
        data = self.data.get(change.sha256 or "")
        if data is None:
            raise FileChanged("gone")
        return data

    async def read_many(
        self, changes: list[Change], max_bytes: int
    ) -> AsyncIterator[tuple[Change, bytes | None, str | None]]:
        for c in changes:
            try:
                yield c, await self.read(c, max_bytes), None
            except FileChanged as exc:
                yield c, None, str(exc)

    def person_changed(self, seen: Seen, written: tuple[int, ...] | None) -> bool:
        return person_changed_since(seen, written, self._prev)


@dataclass
class Judge:
    """The policy as a function of the target, and the person's answer."""

    answer: Answer = Answer.NOBODY
    allow: set[str] = field(default_factory=set)
    """Guest paths a rule the person made allows."""
    deny: set[str] = field(default_factory=set)
    asked: list[tuple[list[Target], str]] = field(default_factory=list)

    def verdicts(self, targets: list[Target]) -> list[tuple[Verdict, bool]]:
        out = []
        for t in targets:
            if t.path in self.deny:
                out.append((Verdict.DENY, True))
            elif t.path in self.allow:
                out.append((Verdict.ALLOW, True))
            elif t.action.value in ("delete", "move"):
                out.append((Verdict.ASK, False))
            else:
                out.append((Verdict.ALLOW, False))
        return out

    async def ask(self, targets: list[Target], question: str) -> Answer:
        self.asked.append((targets, question))
        return self.answer


class MirrorLayer(Layer):
    """The agent's layer as the overlay makes it: ``view`` is the agent's folder (a copy
    of the person's at the start); the layer is what differs from that copy's start.
    Tests write into ``view`` as the agent's tools would write into /mnt/work."""

    def __init__(self, view: Path, start: Path) -> None:
        super().__init__()
        import shutil

        self.view = view
        if view.exists():
            shutil.rmtree(view)
        shutil.copytree(start, view, symlinks=True)
        self.base = self._listing()

    def _listing(self) -> dict[str, Change]:
        import os
        import stat as st

        out: dict[str, Change] = {}
        for dirpath, dirs, files in os.walk(self.view):
            for name in dirs + files:
                p = Path(dirpath) / name
                rel = p.relative_to(self.view).as_posix()
                s = p.lstat()
                if st.S_ISLNK(s.st_mode):
                    out[rel] = Change(rel, Kind.LINK, 0o777, target=os.readlink(p))
                elif st.S_ISDIR(s.st_mode):
                    out[rel] = Change(rel, Kind.DIR, st.S_IMODE(s.st_mode))
                else:
                    data = p.read_bytes()
                    c, _ = file(rel, data, st.S_IMODE(s.st_mode))
                    out[rel] = c
                    self.data[c.sha256 or ""] = data
            dirs[:] = [d for d in dirs if not (Path(dirpath) / d).is_symlink()]
        return out

    async def scan(self, max_entries: int) -> Scan:
        now = self._listing()
        entries: dict[str, Change] = {}
        for rel, c in now.items():
            b = self.base.get(rel)
            if b is None or not b.same_as(c) or b.mode != c.mode:
                entries[rel] = c
        for rel in self.base:
            if rel not in now and not any(p in entries and entries[p].kind is Kind.GONE
                                          for p in _parents(rel)):  # fmt: skip
                entries[rel] = Change(rel, Kind.GONE)
        # Only the topmost gone entry (a whiteout hides what is under it).
        gone = {p for p, c in entries.items() if c.kind is Kind.GONE}
        for p in list(entries):
            if any(q in gone for q in _parents(p)):
                del entries[p]
        self.entries = entries
        return await super().scan(max_entries)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
