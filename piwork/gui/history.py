"""Rebuild a task's conversation from its transcript (tasks from before this window).

Reads the transcript through the task store's public reader; pi's own lines
are untrusted data: only well-formed fields are used and all text is bounded
and sanitized by the widgets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from piwork.gui.words import permission_line, stopped_words
from piwork.run.digest import EventKind, replay_pi_record
from piwork.tasks.transcript import read_records

MAX_RECORDS = 20_000


class Sink(Protocol):
    def user(self, text: str, mode: str | None = None) -> None: ...
    def text(self, delta: str) -> None: ...
    def text_end(self) -> None: ...
    def tool_start(self, call_id: str, name: str, arg: str) -> None: ...
    def tool_end(self, call_id: str, name: str, ok: bool, text: str) -> None: ...
    def notice(self, text: str, kind: str = "notice") -> None: ...


def _replay_pi(data: dict[str, Any], sink: Sink) -> bool:
    shown = False
    for ev in replay_pi_record(data):
        e = ev.data
        if ev.kind is EventKind.TEXT:
            sink.text(str(e.get("delta") or ""))
        elif ev.kind is EventKind.TEXT_END:
            if not shown:
                continue  # an assistant message without text shows nothing, as before
            sink.text_end()
        elif ev.kind is EventKind.TOOL_START:
            sink.tool_start(str(e.get("id")), str(e.get("name")), str(e.get("arg") or ""))
        elif ev.kind is EventKind.TOOL_END:
            sink.tool_end(
                str(e.get("id")), str(e.get("name")), bool(e.get("ok")), str(e.get("text") or "")
            )
        else:
            continue
        shown = True
    return shown


def load_history(path: Path, sink: Sink) -> int:
    """Replay ``path`` into ``sink``; returns the number of records used."""
    try:
        records, _bad = read_records(path)
    except OSError:
        return 0
    used = 0
    for rec in records[-MAX_RECORDS:]:
        d = rec.data if isinstance(rec.data, dict) else {}
        if rec.kind in ("prompt", "steer", "follow_up"):
            mode = None if rec.kind == "prompt" else rec.kind
            sink.user(str(d.get("message", "")), mode)
        elif rec.kind == "pi":
            # The live run's digester, so a reopened task's rows match what was watched.
            if not _replay_pi(d, sink):
                continue
        elif rec.kind == "permission":
            # The same words as the live run (piwork.gui.words), not the record's fields.
            line = permission_line(d)
            if line is None:
                continue
            sink.notice(line)
        elif rec.kind == "status" and d.get("to") == "stopped":
            raw_stop = d.get("stop")
            stop: dict[str, Any] = raw_stop if isinstance(raw_stop, dict) else {}
            sink.notice(f"— {stopped_words(str(stop.get('reason') or d.get('reason') or ''))} —")
        else:
            continue
        used += 1
    return used
