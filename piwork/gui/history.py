"""Rebuild a task's conversation from its transcript (tasks from before this window).

Reads the transcript through the task store's public reader; pi's own lines
are untrusted data: only well-formed fields are used and all text is bounded
and sanitized by the widgets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from piwork.tasks.transcript import read_records

MAX_RECORDS = 20_000


class Sink(Protocol):
    def user(self, text: str, mode: str | None = None) -> None: ...
    def text(self, delta: str) -> None: ...
    def text_end(self) -> None: ...
    def tool_start(self, call_id: str, name: str, arg: str) -> None: ...
    def tool_end(self, call_id: str, name: str, ok: bool, text: str) -> None: ...
    def notice(self, text: str, kind: str = "notice") -> None: ...


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(c.get("text", "")) for c in content if isinstance(c, dict) and c.get("type") == "text"
    )


def _key_arg(args: Any) -> str:
    if not isinstance(args, dict):
        return ""
    for k in ("command", "path", "file_path", "pattern", "url"):
        if isinstance(args.get(k), str):
            return str(args[k])
    return ""


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
            t = d.get("type")
            if t == "message_end":
                msg = d.get("message")
                if isinstance(msg, dict) and msg.get("role") == "assistant":
                    text = _text_of(msg.get("content"))
                    if text:
                        sink.text(text)
                        sink.text_end()
            elif t == "tool_execution_start":
                sink.tool_start(
                    str(d.get("toolCallId")), str(d.get("toolName")), _key_arg(d.get("args"))
                )
            elif t == "tool_execution_end":
                result = d.get("result")
                text = _text_of(result.get("content")) if isinstance(result, dict) else ""
                sink.tool_end(
                    str(d.get("toolCallId")), str(d.get("toolName")), not d.get("isError"), text
                )
            else:
                continue
        elif rec.kind == "permission":
            sink.notice(
                f"permission {d.get('action')} {d.get('target')}: {d.get('decision')}"
                f" by {d.get('by')}"
            )
        elif rec.kind == "status" and d.get("to") == "stopped":
            sink.notice(f"— stopped ({d.get('reason') or 'done'}) —")
        else:
            continue
        used += 1
    return used
