"""pi's events, digested for people: one place turns them into :class:`RunEvent` data.

The live run (``piwork.run.session``) and the replay of a reopened task's
transcript (``piwork.gui.history``) both go through :func:`digest`, so a tool
step looks the same whether it was watched or reopened: same name, same key
argument, same outcome text. Everything here reads untrusted guest output:
only well-formed fields are used (the pydantic models in ``piwork.rpc.models``
reject the rest) and nothing raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from piwork.pisettings import REPORT_KEY, project_report_text
from piwork.rpc import models as m
from piwork.rpc.client import ClientItem
from piwork.rpc.framing import MalformedLine, OversizedLine


class EventKind(StrEnum):
    NOTICE = "notice"  # something the person should know (TCG, pack build, retry)
    TASK = "task"  # the task record was created or loaded
    BOOT = "boot"  # a boot stage reached
    READY = "ready"  # pi answered its first request
    STATUS = "status"  # task status changed
    PROMPT = "prompt"  # a message was sent to the agent
    TEXT = "text"  # assistant text delta
    TEXT_END = "text_end"  # an assistant message finished
    TOOL_START = "tool_start"
    TOOL_END = "tool_end"
    PERMISSION = "permission"  # a permission request and how it was decided
    QUESTION = "question"  # the agent asked the person something
    USAGE = "usage"
    ERROR = "error"
    DONE = "done"
    # What one agent turn changed in the working folder (piwork.checkpoints):
    # {"turn", "checkpoint" (id of the checkpoint before the turn), "added",
    # "modified", "deleted", "type_changed", "files": [{"path", "status"}] (at
    # most 200), "truncated" (files left out)}. Sent when the next checkpoint is
    # taken: at the next model call or at the end of the run.
    CHANGES = "changes"
    # A server in the guest, opened (or not) in the person's browser (piwork.preview):
    # {"port" (guest port), "url" (None unless opened), "state": opened|closed|refused,
    # "by" (rule|person|no-terminal|assume-yes|limit|error), "reason" (refused only)}.
    PREVIEW = "preview"


@dataclass(frozen=True)
class RunEvent:
    kind: EventKind
    data: dict[str, Any]
    elapsed: float
    task_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.kind.value,
            "t": round(self.elapsed, 3),
            "task": self.task_id,
            **self.data,
        }


EventSink = Callable[[RunEvent], None]
PiItem = ClientItem
"""One item from pi (an event, a dialog, or an unreadable line), as the agent delivers it."""


@dataclass(frozen=True)
class Digested:
    """One event for people, before it is stamped with a time and a task."""

    kind: EventKind
    data: dict[str, Any]


def digest(item: PiItem, *, replay: bool = False) -> list[Digested]:
    """What people see of one pi event (often nothing).

    ``replay``: the item comes from a transcript, where an assistant message's
    text deltas may be compacted away; its ``message_end`` carries the whole
    text, so it is shown as one text event before the end of the message.
    """
    out: list[Digested] = []
    if isinstance(item, m.MessageUpdate):
        delta = m.text_delta(item)
        if delta and not replay:
            out.append(Digested(EventKind.TEXT, {"delta": delta}))
    elif isinstance(item, m.MessageEnd):
        outcome = m.assistant_outcome(item)
        if outcome is not None:
            if replay and outcome.text:
                out.append(Digested(EventKind.TEXT, {"delta": outcome.text}))
            out.append(
                Digested(
                    EventKind.TEXT_END,
                    {"stop_reason": outcome.stop_reason, "error": outcome.error_message},
                )
            )
    elif isinstance(item, m.ToolExecutionStart):
        s = m.tool_call_summary(item)
        out.append(
            Digested(
                EventKind.TOOL_START, {"id": s.tool_call_id, "name": s.tool_name, "arg": s.key_arg}
            )
        )
    elif isinstance(item, m.ToolExecutionEnd):
        o = m.tool_outcome(item)
        out.append(
            Digested(
                EventKind.TOOL_END,
                {"id": o.tool_call_id, "name": o.tool_name, "ok": o.ok, "text": o.text},
            )
        )
    elif isinstance(item, m.AutoRetryStart):
        out.append(
            _notice(
                f"model call failed ({item.error_message}); retrying in "
                f"{item.delay_ms / 1000:.0f}s (attempt {item.attempt}/{item.max_attempts})"
            )
        )
    elif isinstance(item, m.ExtensionError):
        out.append(_notice(f"extension error: {item.error}"))
    elif isinstance(item, m.NotifyRequest):
        out.append(_notice(f"agent: {item.message}"))
    elif isinstance(item, m.SetStatusRequest) and item.status_key == REPORT_KEY:
        # What pi loaded from the folder, as the guest's project extension says.
        text = project_report_text(item.status_text or "")
        if text is not None:
            out.append(_notice(text))
    elif isinstance(item, (MalformedLine, OversizedLine)):
        out.append(_notice(f"unreadable line from pi: {item}"))
    return out


def _notice(message: str) -> Digested:
    return Digested(EventKind.NOTICE, {"message": message})


def replay_pi_record(data: Mapping[str, Any]) -> Iterator[Digested]:
    """The events a transcript's ``pi`` record shows, as the live run showed them."""
    yield from digest(m.parse_event(data), replay=True)


__all__ = [
    "Digested",
    "EventKind",
    "EventSink",
    "PiItem",
    "RunEvent",
    "digest",
    "replay_pi_record",
]
