"""The real pi, run natively with node, completes the demo task against the
demo model server: proof that the scripted server speaks pi's
openai-completions wire protocol (no VM involved)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from piwork.models import (
    ChatRequest,
    Delay,
    HttpError,
    ScriptedModelServer,
    Step,
    Text,
    ToolCalls,
    bash,
)
from piwork.models.demo import (
    DEMO_API_KEY,
    DEMO_FILE,
    DEMO_MODEL_ID,
    DEMO_PROVIDER,
    demo_models_json,
    demo_server,
)

from .pi_native import JSON, NativePi, running_native_pi


@asynccontextmanager
async def running_pi(
    tmp_path: Path, models_json: JSON, provider: str, model_id: str, cwd: Path
) -> AsyncIterator[NativePi]:
    """Start pi natively in RPC mode with its own agent dir and session file."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    args = ["--session", str(state / "session.jsonl"), "--provider", provider, "--model", model_id]
    async with running_native_pi(tmp_path, models_json, args, cwd=cwd) as pi:
        yield pi


async def test_real_pi_completes_the_demo_task(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "README.md").write_text("# Sample project\n\nA folder for the demo.\n")
    (work / "data.csv").write_text("a,b\n1,2\n")
    (work / "notes.txt").write_text("buy milk\n")

    async with demo_server() as model:
        started = time.monotonic()
        config = demo_models_json(model.base_url)
        async with running_pi(tmp_path, config, DEMO_PROVIDER, DEMO_MODEL_ID, work) as pi:
            await pi.send({"id": "p1", "type": "prompt", "message": "Tidy up this folder"})
            reply = await pi.response("p1")
            assert reply["success"], reply
            prompted = time.monotonic()
            await pi.run_until_idle()
            finished = time.monotonic()
    print(
        f"pi start-up to prompt reply {prompted - started:.2f} s, "
        f"demo task {finished - prompted:.2f} s"
    )

    # pi executed every demo tool call successfully, in order.
    ends = pi.of_type("tool_execution_end")
    tool_names = [e["toolName"] for e in ends]
    # No host natively: the rename piwork's change set would ask about just runs.
    assert tool_names == ["bash", "read", "write", "bash", "bash"], (ends, pi.stderr[-2000:])
    assert not [e for e in ends if e["isError"]], ends
    starts = pi.of_type("tool_execution_start")
    assert starts[0]["args"] == {"command": "ls -la"}
    assert starts[1]["args"]["path"] == "README.md"
    assert starts[2]["args"]["path"] == DEMO_FILE
    assert starts[3]["args"] == {"command": f"wc -l {DEMO_FILE}"}
    assert starts[4]["args"] == {"command": "mv notes.txt notes.md"}
    assert (work / "notes.md").read_text() == "buy milk\n" and not (work / "notes.txt").exists()

    # The file the demo wrote.
    summary = (work / DEMO_FILE).read_text()
    assert "4 entries: 3 files, 1 folder, 0 other" in summary
    for name in ("README.md", "data.csv", "notes.txt", "src/"):
        assert name in summary
    assert "> # Sample project" in summary
    lines = summary.count("\n")
    assert f"{lines} PIWORK_DEMO.md" in ends[3]["result"]["content"][0]["text"]

    # The conversation, as pi recorded it.
    assistant_ends = [
        e["message"] for e in pi.of_type("message_end") if e["message"]["role"] == "assistant"
    ]
    assert [m["stopReason"] for m in assistant_ends] == ["toolUse"] * 5 + ["stop"]
    texts = ["".join(b.get("text", "") for b in m["content"]) for m in assistant_ends]
    assert all("demo model" in t for t in texts), texts
    assert f"it has {lines} lines" in texts[-1]
    assert assistant_ends[-1]["usage"]["totalTokens"] > 0, "usage chunk was understood"
    assert pi.of_type("message_update"), "pi streamed the replies"
    assert (tmp_path / "state" / "session.jsonl").is_file()

    # What pi sent to the model.
    chats = model.chat_requests
    assert len(chats) == 6
    first = chats[0]
    assert first.headers["authorization"] == f"Bearer {DEMO_API_KEY}"
    assert first.body["model"] == DEMO_MODEL_ID
    assert first.body["stream"] is True
    assert first.body["stream_options"] == {"include_usage": True}
    offered = {t["function"]["name"] for t in first.body["tools"]}
    assert {"bash", "read", "write", "edit"} <= offered
    assert first.body["messages"][0]["role"] == "system"
    assert ChatRequest(body=first.body, headers=first.headers).last_user_text == (
        "Tidy up this folder"
    )
    last = chats[-1].body["messages"]
    assert [m["role"] for m in last[-2:]] == ["assistant", "tool"]


async def test_real_pi_retries_a_server_error_and_can_abort_mid_stream(tmp_path: Path) -> None:
    """HttpError reaches pi's own auto-retry; a one-shot Delay holds pi
    mid-stream for an abort, and the aborted turn is never replayed."""
    script: list[Step] = [
        HttpError(500, "scripted outage"),
        ToolCalls([bash("echo retried")]),
        Delay(30, Text("never finished"), times=1),
        Text("answer after the abort"),
    ]
    async with ScriptedModelServer(script, model_id="scripted") as model:
        config = {"providers": {"scripted": model.pi_provider()}}
        async with running_pi(tmp_path, config, "scripted", "scripted", tmp_path) as pi:
            await pi.send({"id": "p1", "type": "prompt", "message": "first"})
            # The third request is the delayed one: pi is now mid-stream.
            await model.wait_for_chat_requests_async(3, timeout=15)
            await pi.send({"id": "a1", "type": "abort"})
            assert (await pi.response("a1"))["success"]
            await pi.send({"id": "p2", "type": "prompt", "message": "second"})
            await pi.run_until_idle()

    retry = pi.of_type("auto_retry_start")
    # pi 1.x quotes the error body: 500: {"message":"scripted outage","type":"server_error",...}
    assert [e["attempt"] for e in retry] == [1]
    assert (
        retry[0]["errorMessage"].startswith("500") and "scripted outage" in retry[0]["errorMessage"]
    )
    assert pi.of_type("auto_retry_end")[0]["success"] is True
    (ran,) = pi.of_type("tool_execution_end")
    assert ran["result"]["content"][0]["text"] == "retried\n"
    assistant = [
        e["message"] for e in pi.of_type("message_end") if e["message"]["role"] == "assistant"
    ]
    assert [m["stopReason"] for m in assistant] == ["error", "toolUse", "aborted", "stop"]
    assert assistant[-1]["content"][0]["text"] == "answer after the abort"

    steps = [type(r.step).__name__ for r in model.chat_requests]
    assert steps == ["HttpError", "ToolCalls", "Delay", "Text"]
    delayed, after = model.chat_requests[2:]
    assert delayed.client_disconnected, "pi's abort closes the HTTP request"
    roles = [m["role"] for m in after.body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"], "aborted turn not replayed"
