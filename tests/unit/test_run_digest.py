"""A task's tool rows look the same live and after reopening: one digester both ways.

The live side is the real host stack (fake guest -> channel -> RPC client ->
the session's listener -> RunEvents, as the window's _on_event shows them);
the reopened side is gui.history.load_history over the transcript the same
session wrote. Neither side is mocked; the guest double only sends pi's lines.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from piwork.config import Paths
from piwork.gui.history import load_history
from piwork.rpc import models as m
from piwork.run.digest import EventKind, RunEvent
from piwork.runner import RunRequest, TaskSession
from tests.helpers.guest_double import guest_and_host

PI_LINES: list[dict[str, Any]] = [
    {"type": "turn_start"},
    {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "bash",
     "args": {"command": "ls -la", "timeout": 5}},
    {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "bash", "isError": False,
     "result": {"content": [{"type": "text", "text": "a.txt\nb.txt\n"}]}},
    # A tool whose key argument is not the first string field the old replay tried.
    {"type": "tool_execution_start", "toolCallId": "c2", "toolName": "grep",
     "args": {"path": "src", "pattern": "TODO"}},
    {"type": "tool_execution_end", "toolCallId": "c2", "toolName": "grep", "isError": True,
     "result": {"content": [{"type": "text", "text": "no such dir"}]}},
    {"type": "tool_execution_start", "toolCallId": "c3", "toolName": "edit",
     "args": {"file_path": "x.py", "oldText": "a", "newText": "b"}},
    {"type": "tool_execution_end", "toolCallId": "c3", "toolName": "edit", "isError": False,
     "result": {"content": "done"}},
    {"type": "agent_end", "messages": []},
]  # fmt: skip


class Rows:
    """The tool rows a conversation view draws: (id, name, arg) starts, outcomes."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def user(self, text: str, mode: str | None = None) -> None:
        pass

    def text(self, delta: str) -> None:
        pass

    def text_end(self) -> None:
        pass

    def notice(self, text: str, kind: str = "notice") -> None:
        pass

    def tool_start(self, call_id: str, name: str, arg: str) -> None:
        self.rows.append(("start", call_id, name, arg))

    def tool_end(
        self, call_id: str, name: str, ok: bool, text: str, seconds: float | None = None
    ) -> None:
        self.rows.append(("end", call_id, name, ok, text))

    def deny(self, call_id: str) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def live(self, ev: RunEvent) -> None:
        """As piwork/gui/conversation.py's ConversationPane turns a RunEvent into a row."""
        d = ev.data
        if ev.kind is EventKind.TOOL_START:
            self.tool_start(str(d.get("id")), str(d.get("name")), str(d.get("arg") or ""))
        elif ev.kind is EventKind.TOOL_END:
            self.tool_end(
                str(d.get("id")), str(d.get("name")), bool(d.get("ok")), str(d.get("text") or "")
            )


async def test_tool_rows_are_the_same_live_and_after_reopening(tmp_path: Path) -> None:
    live = Rows()
    async with guest_and_host(default_timeout=30) as (guest, host):
        paths = Paths(tmp_path / "d", tmp_path / "c", tmp_path / "s", tmp_path / "cfg")
        session = TaskSession(RunRequest(prompt="rows"), live.live, paths=paths)
        task = session.store.create("rows")
        session.adopt(task)
        session.attach_agent(host.agent)
        got: list[Any] = []
        session.add_item_listener(got.append)
        try:
            for line in PI_LINES:
                await guest.send_pi(line)
            for _ in range(200):
                if any(isinstance(i, m.AgentEnd) for i in got):
                    break
                await asyncio.sleep(0.05)
        finally:
            await session.close()
    assert live.rows, "the live run showed no tool rows"
    assert len(live.rows) == 6
    reopened = Rows()
    load_history(task.transcript_path, reopened)
    assert reopened.rows == live.rows
    # What both show, spelled out: bash by its command, grep by its pattern.
    assert live.rows[0] == ("start", "c1", "bash", "ls -la")
    assert live.rows[2] == ("start", "c2", "grep", "TODO")
    assert live.rows[3] == ("end", "c2", "grep", False, "no such dir")


def test_what_pi_loaded_from_the_project_is_a_notice_and_other_statuses_are_not() -> None:
    from piwork.run.digest import digest

    report = m.parse_incoming(
        {
            "type": "extension_ui_request",
            "id": "u1",
            "method": "setStatus",
            "statusKey": "piwork-project",
            "statusText": '{"v":1,"trusted":true,"contextFiles":["AGENTS.md"]}',
        }
    )
    (out,) = digest(report)
    assert out.kind is EventKind.NOTICE
    assert out.data == {"message": "pi loaded from the project: context: AGENTS.md"}
    other = m.parse_incoming(
        {"type": "extension_ui_request", "id": "u2", "method": "setStatus",
         "statusKey": "someone-else", "statusText": '{"v":1,"trusted":true}'}
    )  # fmt: skip
    assert digest(other) == []
