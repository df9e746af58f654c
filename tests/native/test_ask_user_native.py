"""The real pi, run natively with node, loads runtime-pack/extensions/ask-user.ts
(next to the permission gate, with the same ``--tools`` allowlist piwork
uses), offers ``ask_user`` to the model, turns its calls into
``extension_ui_request`` input/select dialogs without a permission prompt, and
hands the person's answer (or its absence) back to the model. No VM."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from piwork.models import ScriptedModelServer, Step, Text, ToolCall, ToolCalls

REPO = Path(__file__).resolve().parents[2]
PI_PACKAGE = REPO / "runtime-pack" / "pi" / "node_modules" / "@mariozechner" / "pi-coding-agent"
EXTENSIONS = REPO / "runtime-pack" / "extensions"
TIMEOUT_S = 30
DIALOGS = {"select", "confirm", "input", "editor"}

JSON = dict[str, Any]
Answer = Callable[[JSON], JSON]


def pi_cli() -> Path:
    package_json = PI_PACKAGE / "package.json"
    assert package_json.is_file(), f"pi is not installed at {PI_PACKAGE}"
    bin_entry: str = json.loads(package_json.read_text())["bin"]["pi"]
    cli = PI_PACKAGE / bin_entry
    assert cli.is_file(), f"{cli} missing"
    return cli


class Pi:
    """pi --mode rpc on a subprocess; every dialog is answered by ``answer``."""

    def __init__(self, proc: asyncio.subprocess.Process, answer: Answer) -> None:
        self.proc = proc
        self.answer = answer
        self.events: list[JSON] = []
        self.dialogs: list[JSON] = []
        self.stderr = ""

    async def send(self, command: JSON) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def next_event(self) -> JSON:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"pi exited early (code {await self.proc.wait()})")
        event: JSON = json.loads(line)
        self.events.append(event)
        if event.get("type") == "extension_ui_request" and event.get("method") in DIALOGS:
            self.dialogs.append(event)
            reply = {"type": "extension_ui_response", "id": event["id"], **self.answer(event)}
            if "hold" not in reply:
                await self.send(reply)
        return event

    async def response(self, request_id: str) -> JSON:
        while True:
            event = await self.next_event()
            if event.get("type") == "response" and event.get("id") == request_id:
                return event

    async def run_until_idle(self) -> None:
        n = 0
        while True:
            if (await self.next_event()).get("type") != "agent_end":
                continue
            n += 1
            await self.send({"id": f"state-{n}", "type": "get_state"})
            if not (await self.response(f"state-{n}"))["data"]["isStreaming"]:
                return

    def of_type(self, kind: str) -> list[JSON]:
        return [e for e in self.events if e.get("type") == kind]


@asynccontextmanager
async def running_pi(
    tmp_path: Path, model: ScriptedModelServer, answer: Answer
) -> AsyncIterator[Pi]:
    """pi as piwork starts it in the guest (piwork.agent.pi_argv): both
    extensions with -e, discovery off, the same tool allowlist."""
    node = shutil.which("node")
    assert node, "node (>= 20.6) is needed on PATH to run pi natively"
    agent_dir, home, work = tmp_path / "agent", tmp_path / "home", tmp_path / "work"
    for folder in (agent_dir, home, work):
        folder.mkdir(exist_ok=True)
    models = {"providers": {"scripted": model.pi_provider()}}
    (agent_dir / "models.json").write_text(json.dumps(models))
    env = {
        **os.environ,
        "PI_CODING_AGENT_DIR": str(agent_dir),
        "HOME": str(home),
        "PIWORK_SCOPE_DIRS": str(work),
        "PIWORK_READONLY_DIRS": "",
        "PIWORK_TASK_ID": "t-ask",
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(pi_cli()),
        "--mode",
        "rpc",
        "--offline",
        "--no-session",
        "--provider",
        "scripted",
        "--model",
        model.model_id,
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--tools",
        "read,bash,edit,write,ask_user",
        "-e",
        str(EXTENSIONS / "permission-gate.ts"),
        "-e",
        str(EXTENSIONS / "ask-user.ts"),
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,
    )
    pi = Pi(proc, answer)
    try:
        # stdin stays open until we are done: EOF makes pi exit at once.
        async with asyncio.timeout(TIMEOUT_S):
            yield pi
    finally:
        if proc.returncode is None:
            proc.kill()
        _, stderr = await proc.communicate()
        pi.stderr = stderr.decode(errors="replace")


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
    node = shutil.which("node")
    assert node
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
