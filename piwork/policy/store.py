"""The persisted policy: user rules in one JSON file, written atomically.

Durability: every change is a read-modify-write under an advisory lock,
written to a temp file in the same directory, fsynced, ``os.replace``d over
the old file, and the directory fsynced. A kill -9 at any point leaves either
the old or the new file, never a torn one. A file that does not parse is
moved aside (``policy.json.corrupt-<timestamp>``) with a warning naming both
paths, never silently dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.fsutil import atomic_write_bytes, fsync_dir
from piwork.policy.rules import DEFAULT_RULES, Rule

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class PolicyError(PersonError):
    """The policy file could not be read or written."""


class PolicyCorruptError(PolicyError):
    """The policy file did not parse; it has been moved aside."""

    def __init__(self, path: Path, moved_to: Path, detail: str) -> None:
        self.path = path
        self.moved_to = moved_to
        self.detail = detail
        super().__init__(
            f"the policy file {path} was unreadable ({detail}); it was moved to {moved_to} "
            f"and piwork is using the default rules. Inspect that file and re-add your rules "
            f"with `piwork policy allow|deny|ask`."
        )


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: single-writer best effort
        yield
        return
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class PolicyStore:
    """User rules on disk. Defaults (``DEFAULT_RULES``) are built in, never stored."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else get_paths().policy_file
        self.notice: PolicyCorruptError | None = None
        """Set when a corrupt file was moved aside during the last load."""

    @property
    def _lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- reading ---------------------------------------------------------

    def _parse(self, raw: bytes) -> list[Rule]:
        data: Any = orjson.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ValueError("expected an object with a 'rules' list")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported format version {version!r}")
        return [Rule.from_json(item) for item in data["rules"]]

    def _move_aside(self, detail: str) -> PolicyCorruptError:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        moved = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        os.replace(self.path, moved)
        fsync_dir(self.path.parent)
        err = PolicyCorruptError(self.path, moved, detail)
        log.warning("%s", err)
        return err

    def _read_unlocked(self) -> list[Rule]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PolicyError(f"cannot read the policy file {self.path}: {exc}") from exc
        try:
            return self._parse(raw)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            self.notice = self._move_aside(str(exc) or type(exc).__name__)
            return []

    def load(self) -> list[Rule]:
        """The user rules. A corrupt file is moved aside (see ``notice``)."""
        with _locked(self._lock_path):
            return self._read_unlocked()

    def effective_rules(self) -> list[Rule]:
        """User rules followed by the built-in defaults: what decisions use."""
        return [*self.load(), *DEFAULT_RULES]

    # -- writing ---------------------------------------------------------

    def _write_unlocked(self, rules: Sequence[Rule]) -> None:
        doc = {"version": FORMAT_VERSION, "rules": [r.to_json() for r in rules]}
        atomic_write_bytes(self.path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")

    def update(self, change: Callable[[list[Rule]], list[Rule]]) -> list[Rule]:
        """Read-modify-write under the lock; returns the new user rules."""
        with _locked(self._lock_path):
            rules = change(self._read_unlocked())
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

        self.update(change)
        return count[0]
