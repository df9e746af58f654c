"""Does pi's ``tool_call`` fire for the tools a codemode script calls? The real pi 1.x,
run natively as piwork starts it (its extensions, pi's defaults, the agent dir's
settings), in a trusted folder whose ``.pi/settings.json`` turns codemode on. The
scripted model calls ``codemode`` with a script that runs ``rm`` through
``tools.bash``: the permission gate, which asks only from its ``tool_call`` handler,
must ask about that ``bash`` call, and its answer must decide it. No VM (the same
through the VM and the host's policy: tests/vm/test_vm_codemode.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.models import ScriptedModelServer, Step, Text, ToolCall, ToolCalls

from .pi_native import JSON, permission, run_piwork_pi

SCRIPT = "const out = await tools.bash({ command: 'rm victim.txt' });\nreturn 'rm said: ' + out;"


@pytest.mark.parametrize("choice", ["Deny", "Allow once"])
async def test_a_delete_in_a_codemode_script_is_asked_and_the_answer_holds(
    tmp_path: Path, choice: str
) -> None:
    work = tmp_path / "work"
    (work / ".pi").mkdir(parents=True)
    (work / ".pi" / "settings.json").write_text(json.dumps({"defaultTools": ["+codemode"]}))
    (work / "victim.txt").write_text("keep me\n")
    script: list[Step] = [
        ToolCalls([ToolCall("codemode", {"code": SCRIPT}, "call_cm")]),
        Text("done"),
    ]

    def answer(req: JSON) -> JSON:
        return {"value": choice} if permission(req) is not None else {"cancelled": True}

    async with ScriptedModelServer(script, model_id="scripted") as model:
        pi = await run_piwork_pi(tmp_path, work, model, "clean up", answer=answer)

    # codemode was offered because the trusted folder's settings asked for it.
    offered = {t["function"]["name"] for t in model.chat_requests[0].body["tools"]}
    assert "codemode" in offered, offered
    # One question, about the bash call the script made, and none about the script itself.
    asked = [p for p in map(permission, pi.dialogs) if p is not None]
    assert len(asked) == 1, pi.dialogs
    (req,) = asked
    assert req["tool"] == "bash" and req["command"] == "rm victim.txt", req
    assert req["toolCallId"].startswith("call_cm/"), req  # pi numbers nested calls <parent>/<n>
    starts = {e["toolCallId"]: e for e in pi.of_type("tool_execution_start")}
    nested = starts[req["toolCallId"]]
    assert (nested["toolName"], nested.get("parentToolCallId")) == ("bash", "call_cm")
    (cm_end,) = [e for e in pi.of_type("tool_execution_end") if e["toolCallId"] == "call_cm"]
    result = "".join(c.get("text", "") for c in cm_end["result"]["content"])
    if choice == "Deny":
        assert (work / "victim.txt").read_text() == "keep me\n"
        assert "Script failed" in result, result
    else:
        assert not (work / "victim.txt").exists()
        assert "Script completed" in result, result
