"""Append-only audit log of permission decisions (JSONL, one fsync per line).

Every decision lands here: those a rule made and those a person made, plus
denials made for lack of anyone to ask and dialogs cancelled by a stop. A
crash can at worst leave a torn last line, which ``read`` skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths


class DecidedBy:
    """Who made a decision (``decidedBy`` in the log)."""

    RULE = "rule"
    PERSON = "person"
    NO_TERMINAL = "no-terminal"  # headless without a terminal: denied
    ASSUME_YES = "assume-yes"  # headless --yes
    CANCELLED = "cancelled"  # stop/abort answered the dialog
    UNUSABLE_POLICY = "unusable-policy"  # policy.json could not be read: denied, run ended


@dataclass(frozen=True)
class AuditEntry:
    task: str | None
    action: str
    target: str
    decision: str
    """allow | deny | cancelled"""
    decided_by: str
    rule: str | None = None
    """The id of the deciding rule (for decidedBy=rule) or of the rule a person created."""
    choice: str | None = None
    tool: str | None = None
    tool_call_id: str | None = None
    request_id: str | None = None
    command: str | None = None
    targets: tuple[str, ...] = ()
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="milliseconds"))

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "task": self.task,
            "action": self.action,
            "target": self.target,
            "decision": self.decision,
            "decidedBy": self.decided_by,
            "rule": self.rule,
            "choice": self.choice,
            "tool": self.tool,
            "toolCallId": self.tool_call_id,
            "requestId": self.request_id,
            "command": self.command,
            "targets": list(self.targets),
        }


class AuditLog:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else get_paths().audit_log

    def append(self, entry: AuditEntry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = orjson.dumps(entry.to_json()) + b"\n"
        # O_APPEND: concurrent writers (runner + CLI) never interleave within a line.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # An earlier write was cut short (disk full, crash): end that torn
                # line first, or it would swallow this entry when read.
                line = b"\n" + line
            view = memoryview(line)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> Iterator[dict[str, Any]]:
        """Entries oldest first; a torn or garbled line is skipped."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            return
        with fh:
            for raw in fh:
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    yield obj
