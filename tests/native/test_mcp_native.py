"""An MCP server the person configures in piwork (settings.json → pi → mcp_servers),
with the real pi 1.x run natively as piwork starts it: the stdio server (written by
the test, tests/helpers/mcp_stdio_server.py) is started from the agent dir's
mcp.json the host writes, its tool reaches the model, and the model's call to it
meets the permission gate like any other tool call. No VM (in the VM:
tests/vm/test_vm_mcp.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from piwork.models import ScriptedModelServer, Step, Text, ToolCall, ToolCalls
from piwork.pisettings import McpServer, PiSettings

from .pi_native import JSON, permission, run_piwork_pi

SERVER = Path(__file__).resolve().parents[1] / "helpers" / "mcp_stdio_server.py"


@pytest.mark.parametrize("choice", ["Allow once", "Deny"])
async def test_a_stdio_mcp_server_is_used_and_its_calls_are_asked(
    tmp_path: Path, choice: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "mcp.log"
    server = McpServer(
        command=sys.executable, args=[str(SERVER)], env={"MCP_SERVER_LOG": str(log)},
        exposure="direct",
    )  # fmt: skip
    script: list[Step] = [
        ToolCalls([ToolCall("mcp__shouter__shout", {"text": "hello"}, "call_mcp")]),
        Text("done"),
    ]
    asked: list[JSON] = []

    def answer(req: JSON) -> JSON:
        found = permission(req)
        if found is None:
            return {"cancelled": True}
        asked.append(found)
        return {"value": choice}

    settings = PiSettings(mcp_servers={"shouter": server})
    async with ScriptedModelServer(script, model_id="scripted") as model:
        pi = await run_piwork_pi(
            tmp_path, work, model, "shout hello", settings=settings, answer=answer
        )

    offered = {t["function"]["name"] for t in model.chat_requests[0].body["tools"]}
    assert "mcp__shouter__shout" in offered, offered
    assert [(a["tool"], a["action"]) for a in asked] == [("mcp__shouter__shout", "connector")]
    (end,) = [e for e in pi.of_type("tool_execution_end") if e["toolCallId"] == "call_mcp"]
    text = "".join(c.get("text", "") for c in end["result"]["content"])
    served = [json.loads(line)["method"] for line in log.read_text().splitlines()]
    assert "initialize" in served and "tools/list" in served
    if choice == "Allow once":
        assert text == "SHOUTED: HELLO" and not end["isError"], end
        assert "tools/call" in served
    else:
        assert end["isError"] and "Permission denied" in text, end
        assert "tools/call" not in served
