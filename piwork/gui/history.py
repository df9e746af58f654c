"""Rebuild a task's conversation from its transcript (tasks from before this window).

Reads the transcript through the task store's public reader; pi's own lines
are untrusted data: only well-formed fields are used and all text is bounded
and sanitized by the widgets.

What the transcript holds is shown as the live run showed it (issue 33 item 8):
each step's duration from the records' own times, how it ended (a denied step says
"denied"; one that never ended says "interrupted", it does not spin), and under each
run how it ended with its tokens and steps, counted from the model calls.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Protocol

from piwork.gui.words import ended_line, is_denied, permission_line, stopped_words
from piwork.run.digest import EventKind, replay_pi_record
from piwork.tasks.transcript import Record, read_records

MAX_RECORDS = 20_000


class Sink(Protocol):
    def user(self, text: str, mode: str | None = None) -> None: ...
    def text(self, delta: str) -> None: ...
    def text_end(self) -> None: ...
    def tool_start(self, call_id: str, name: str, arg: str) -> None: ...
    def tool_end(
        self, call_id: str, name: str, ok: bool, text: str, seconds: float | None = None
    ) -> None: ...
    def notice(self, text: str, kind: str = "notice") -> None: ...
    def deny(self, call_id: str) -> None: ...
    def interrupt(self) -> None: ...


def _when(rec: Record) -> float | None:
    try:
        return dt.datetime.fromisoformat(rec.t.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


class _Replay:
    """One pass over the records, keeping what a step's duration and a run's line need."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.started: dict[str, float | None] = {}  # call id -> when its step began
        self.tokens = 0
        self.steps = 0

    def pi(self, data: dict[str, Any], when: float | None) -> bool:
        shown = False
        for ev in replay_pi_record(data):
            e = ev.data
            if ev.kind is EventKind.TEXT:
                self.sink.text(str(e.get("delta") or ""))
            elif ev.kind is EventKind.TEXT_END:
                if not shown:
                    continue  # an assistant message without text shows nothing, as before
                self.sink.text_end()
            elif ev.kind is EventKind.TOOL_START:
                call = str(e.get("id"))
                self.started[call] = when
                self.sink.tool_start(call, str(e.get("name")), str(e.get("arg") or ""))
            elif ev.kind is EventKind.TOOL_END:
                call = str(e.get("id"))
                began = self.started.pop(call, None)
                took = when - began if when is not None and began is not None else None
                self.sink.tool_end(
                    call,
                    str(e.get("name")),
                    bool(e.get("ok")),
                    str(e.get("text") or ""),
                    max(0.0, took) if took is not None else None,
                )
            else:
                continue
            shown = True
        return shown

    def model_call(self, d: dict[str, Any]) -> None:
        for key in ("inputTokens", "outputTokens"):
            v = d.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                self.tokens += v
        self.steps += 1

    def ended(self, d: dict[str, Any]) -> None:
        """A run ended (stopped, or found interrupted at a start): its line, and no step
        of it left open."""
        self.sink.interrupt()
        self.started.clear()
        if d.get("to") == "interrupted":
            self.sink.notice("— Interrupted (piwork or the machine stopped) —")
        else:
            raw_stop = d.get("stop")
            stop: dict[str, Any] = raw_stop if isinstance(raw_stop, dict) else {}
            why = stopped_words(str(stop.get("reason") or d.get("reason") or ""))
            self.sink.notice(ended_line(why, None, self.tokens, self.steps))
        self.tokens = self.steps = 0


def load_history(path: Path, sink: Sink) -> int:
    """Replay ``path`` into ``sink``; returns the number of records used."""
    try:
        records, _bad = read_records(path)
    except OSError:
        return 0
    replay = _Replay(sink)
    used = 0
    for rec in records[-MAX_RECORDS:]:
        d = rec.data if isinstance(rec.data, dict) else {}
        if rec.kind in ("prompt", "steer", "follow_up"):
            mode = None if rec.kind == "prompt" else rec.kind
            sink.user(str(d.get("message", "")), mode)
        elif rec.kind == "pi":
            # The live run's digester, so a reopened task's rows match what was watched.
            if not replay.pi(d, _when(rec)):
                continue
        elif rec.kind == "model_call":
            replay.model_call(d)
            continue
        elif rec.kind == "permission":
            if is_denied(d):
                sink.deny(str(d.get("call") or ""))
            # The same words as the live run (piwork.gui.words), not the record's fields.
            line = permission_line(d)
            if line is None:
                continue
            sink.notice(line)
        elif rec.kind == "status" and d.get("to") in ("stopped", "interrupted"):
            replay.ended(d)
        else:
            continue
        used += 1
    sink.interrupt()  # the transcript ends mid-step: that step never finished
    return used
