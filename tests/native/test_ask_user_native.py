"""The real pi, run natively with node, loads runtime-pack/extensions/ask-user.ts
(next to the permission gate, with the same ``--tools`` allowlist piwork
uses), offers ``ask_user`` to the model, turns its calls into
``extension_ui_request`` input/select dialogs without a permission prompt, and
hands the person's answer (or its absence) back to the model. No VM."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from piwork.models import ScriptedModelServer, Step, Text, ToolCall, ToolCalls

from .pi_native import (
    EXTENSIONS,
    JSON,
    TIMEOUT_S,
    Answer,
    NativePi,
    node_binary,
    pi_cli,
    piwork_args,
    running_native_pi,
    write_agent_settings,
)


@asynccontextmanager
async def running_pi(
    tmp_path: Path, model: ScriptedModelServer, answer: Answer
) -> AsyncIterator[NativePi]:
    """pi as piwork starts it in the guest (piwork.agent.pi_argv, the agent dir's
    settings.json): its extensions with -e, pi's default tools."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    models = {"providers": {"scripted": model.pi_provider()}}
    write_agent_settings(tmp_path)
    flags, env = piwork_args()
    args = ["--no-session", "--provider", "scripted", "--model", model.model_id, *flags]
    env |= {"PIWORK_SCOPE_DIRS": str(work), "PIWORK_READONLY_DIRS": "", "PIWORK_TASK_ID": "t-ask"}
    async with running_native_pi(tmp_path, models, args, cwd=work, env=env, answer=answer) as pi:
        yield pi


def ask(call_id: str, question: str, **extra: Any) -> ToolCalls:
    return ToolCalls([ToolCall("ask_user", {"question": question, **extra}, call_id)])


def result_text(end: JSON) -> str:
    return "".join(c.get("text", "") for c in end["result"]["content"])


async def test_ask_user_input_select_and_dismissed(tmp_path: Path) -> None:
    script: list[Step] = [
        ask("q_input", "Which title should the report have?", placeholder="e.g. Q3 summary"),
        ask("q_select", "Which output format?", options=["csv", "json"]),
        ask("q_dismissed", "Anything else?"),
        Text("Thanks, done."),
    ]

    def answer(req: JSON) -> JSON:
        if req["title"] == "Anything else?":
            return {"cancelled": True}
        return {"value": "Sales 2024" if req["method"] == "input" else "json"}

    async with (
        ScriptedModelServer(script, model_id="scripted") as model,
        running_pi(tmp_path, model, answer) as pi,
    ):
        await pi.send({"id": "p1", "type": "prompt", "message": "Write the report"})
        assert (await pi.response("p1"))["success"]
        await pi.run_until_idle()

    assert not pi.of_type("extension_error"), pi.of_type("extension_error")
    assert "Error" not in pi.stderr, pi.stderr[-2000:]

    # The model is offered ask_user with the extension's schema.
    first = model.chat_requests[0].body
    (tool,) = [t["function"] for t in first["tools"] if t["function"]["name"] == "ask_user"]
    assert sorted(t["function"]["name"] for t in first["tools"]) == [
        "ask_user",
        "bash",
        "edit",
        "read",
        "write",
    ]
    assert tool["parameters"]["required"] == ["question"]
    assert set(tool["parameters"]["properties"]) == {"question", "options", "placeholder"}
    assert "permission" in tool["description"]
    assert "ask_user" in first["messages"][0]["content"], (
        "prompt snippet/guideline in system prompt"
    )

    # Exactly three dialogs, all plain questions: the gate asked no permission.
    assert [(d["method"], d["title"]) for d in pi.dialogs] == [
        ("input", "Which title should the report have?"),
        ("select", "Which output format?"),
        ("input", "Anything else?"),
    ]
    assert pi.dialogs[0]["placeholder"] == "e.g. Q3 summary"
    assert pi.dialogs[1]["options"] == ["csv", "json"]
    assert not any("piwork-permission" in d["title"] for d in pi.dialogs)

    ends = {e["toolCallId"]: e for e in pi.of_type("tool_execution_end")}
    assert set(ends) == {"q_input", "q_select", "q_dismissed"}
    assert not any(e["isError"] for e in ends.values()), ends
    assert result_text(ends["q_input"]) == "The user answered: Sales 2024"
    assert result_text(ends["q_select"]) == "The user answered: json"
    dismissed = result_text(ends["q_dismissed"])
    assert dismissed.startswith("The user did not answer")
    assert "Do not assume an answer" in dismissed

    # What the model got back.
    last = model.chat_requests[-1]  # the request answered with "Thanks, done."
    got = {}
    for m in last.body["messages"]:
        if m["role"] == "tool":
            content = m["content"]
            got[m["tool_call_id"]] = (
                content if isinstance(content, str) else "".join(p["text"] for p in content)
            )
    assert got == {k: result_text(v) for k, v in ends.items()}


async def test_abort_dismisses_the_question(tmp_path: Path) -> None:
    """The tool's signal reaches the dialog: an abort while the question is
    open ends the run without the host answering it."""
    script: list[Step] = [ask("q_open", "Which folder?"), Text("never reached")]

    async with (
        ScriptedModelServer(script, model_id="scripted") as model,
        running_pi(tmp_path, model, lambda req: {"hold": True}) as pi,
    ):
        await pi.send({"id": "p1", "type": "prompt", "message": "Go"})
        while not pi.dialogs:
            await pi.next_event()
        await pi.send({"id": "a1", "type": "abort"})
        assert (await pi.response("a1"))["success"]
        await pi.send({"id": "s1", "type": "get_state"})
        state = await pi.response("s1")

    assert state["data"]["isStreaming"] is False
    assert [d["method"] for d in pi.dialogs] == ["input"]
    (end,) = pi.of_type("tool_execution_end")
    assert end["toolCallId"] == "q_open"
    assert result_text(end).startswith("The user did not answer"), end
    assert len(model.chat_requests) == 1, "the aborted run did not go on"


async def test_without_a_ui_the_call_is_an_error(tmp_path: Path) -> None:
    """In print mode (``ctx.hasUI`` false) ask_user fails with a clear error;
    the gate does not block it first."""
    script: list[Step] = [ask("q_noui", "Which folder?"), Text("ok")]
    node = node_binary()
    async with ScriptedModelServer(script, model_id="scripted") as model:
        (tmp_path / "models.json").write_text(
            json.dumps({"providers": {"scripted": model.pi_provider()}})
        )
        env = {**os.environ, "PI_CODING_AGENT_DIR": str(tmp_path), "HOME": str(tmp_path)}
        proc = await asyncio.create_subprocess_exec(
            node,
            str(pi_cli()),
            "--mode",
            "json",
            "-p",
            "--offline",
            "--no-session",
            "--provider",
            "scripted",
            "--model",
            model.model_id,
            "--tools",
            "read,ask_user",
            "-e",
            str(EXTENSIONS / "permission-gate.ts"),
            "-e",
            str(EXTENSIONS / "ask-user.ts"),
            "Go",
            cwd=tmp_path,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(TIMEOUT_S):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    events = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    (end,) = [e for e in events if e.get("type") == "tool_execution_end"]
    assert end["toolName"] == "ask_user"
    assert end["isError"] is True
    assert result_text(end).startswith("No one can be asked"), end
    assert not [e for e in events if e.get("type") == "extension_ui_request"]
