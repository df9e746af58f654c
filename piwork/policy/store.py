"""The persisted policy: user rules in one JSON file, written durably, never guessed at.

Durability: every change is a read-modify-write under an advisory lock,
written to a temp file in the same directory, fsynced, ``os.replace``d over
the old file, and the directory fsynced; the same bytes are then kept as
``policy.json.last-good`` (:mod:`piwork.jsonstore`). A kill -9 at any point
leaves either the old or the new file, never a torn one.

A policy the host cannot read is never a looser policy: a ``policy.json``
that does not parse (truncated by another tool, a bad sync, a full disk
elsewhere), is empty, or is gone while its last good copy is there raises
:class:`PolicyDamaged`. Nothing runs on it (a run refuses to start, a
decision in a live run is a deny that ends the run); the message names the
file, where a copy of the damaged bytes was kept, and ``piwork policy
restore``, which puts the last good copy back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.jsonstore import DamagedFile, JsonFile, Restored
from piwork.policy.rules import DEFAULT_RULES, Rule

FORMAT_VERSION = 1
RESTORE_COMMAND = "piwork policy restore"


class PolicyError(PersonError):
    """The policy file could not be read or written."""


class PolicyDamaged(DamagedFile, PolicyError):
    """The policy file cannot be used: nothing is decided on it (see :mod:`piwork.jsonstore`)."""


def parse_rules(raw: bytes) -> list[Rule]:
    """``policy.json``'s bytes as rules; ValueError/KeyError/TypeError for anything else."""
    data: Any = orjson.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ValueError("expected an object with a 'rules' list")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {version!r}")
    return [Rule.from_json(item) for item in data["rules"]]


def policy_file(path: Path, *, keep_copies: bool = True) -> JsonFile[list[Rule]]:
    return JsonFile(
        path,
        parse_rules,
        what="policy file",
        restore_command=RESTORE_COMMAND,
        fresh="start with no rules of your own: `piwork policy reset --yes`",
        error=PolicyDamaged,
        keep_copies=keep_copies,
    )


class PolicyStore:
    """User rules on disk. Defaults (``DEFAULT_RULES``) are built in, never stored."""

    def __init__(self, path: Path | None = None, *, keep_copies: bool = True) -> None:
        """``keep_copies=False`` for a file given with ``run --policy``: nothing is written
        beside it but what the run stores in it (see :class:`piwork.jsonstore.JsonFile`)."""
        self.path = path if path is not None else get_paths().policy_file
        self.file = policy_file(self.path, keep_copies=keep_copies)

    # -- reading ---------------------------------------------------------

    def load(self) -> list[Rule]:
        """The user rules; raises :class:`PolicyDamaged` for a file that cannot be used."""
        return self.file.load() or []

    def check(self) -> PolicyDamaged | None:
        """Why the policy cannot be used, or None (front ends ask before a run)."""
        damage = self.file.check()
        assert damage is None or isinstance(damage, PolicyDamaged)
        return damage

    def effective_rules(self) -> list[Rule]:
        """User rules followed by the built-in defaults: what decisions use."""
        return [*self.load(), *DEFAULT_RULES]

    def restore(self) -> Restored:
        """Put ``policy.json.last-good`` back over a damaged policy file."""
        return self.file.restore()

    # -- writing ---------------------------------------------------------

    def _write_unlocked(self, rules: Sequence[Rule]) -> None:
        doc = {"version": FORMAT_VERSION, "rules": [r.to_json() for r in rules]}
        self.file.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")

    def update(
        self, change: Callable[[list[Rule]], list[Rule]], *, over_damaged: bool = False
    ) -> list[Rule]:
        """Read-modify-write under the lock; returns the new user rules.

        A damaged file is never written over (the person's rules may still be in it),
        except by ``over_damaged`` (``reset``: the person chose to start over; a copy of
        the damaged bytes is kept, see :class:`PolicyDamaged`).
        """
        with self.file.locked():
            try:
                current = self.file.read() or []
            except PolicyDamaged:
                if not over_damaged:
                    raise
                current = []
            rules = change(current)
            self._write_unlocked(rules)
            return rules

    def add(self, rule: Rule) -> Rule:
        """Add ``rule``; a rule with the same action, scope and pattern is replaced."""

        def change(rules: list[Rule]) -> list[Rule]:
            return [r for r in rules if r.key != rule.key] + [rule]

        self.update(change)
        return rule

    def add_many(self, new: Sequence[Rule]) -> None:
        keys = {r.key for r in new}

        def change(rules: list[Rule]) -> list[Rule]:
            return [r for r in rules if r.key not in keys] + list(new)

        self.update(change)

    def remove(self, rule_id: str) -> Rule | None:
        """Remove the rule with this id (or unique id prefix); returns it, or None."""
        removed: list[Rule] = []

        def change(rules: list[Rule]) -> list[Rule]:
            exact = [r for r in rules if r.id == rule_id]
            hits = exact or [r for r in rules if r.id.startswith(rule_id)]
            if len(hits) != 1:
                return rules
            removed.append(hits[0])
            return [r for r in rules if r is not hits[0]]

        self.update(change)
        return removed[0] if removed else None

    def reset(self) -> int:
        """Drop every user rule; returns how many there were."""
        count: list[int] = []

        def change(rules: list[Rule]) -> list[Rule]:
            count.append(len(rules))
            return []

        self.update(change, over_damaged=True)
        return count[0]
