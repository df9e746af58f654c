"""The scripted model server speaks OpenAI's streaming chat-completions wire
format, picks steps from the conversation, injects failures and records
every request. The demo script drives its short task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from typing import Any

import aiohttp
import pytest

from piwork.models.demo import (
    DEMO_FILE,
    DEMO_MODEL_ID,
    DEMO_MODEL_NAME,
    DEMO_PROVIDER,
    TIDY_FROM,
    TIDY_TO,
    demo_models_json,
    demo_script,
    parse_ls_la,
)
from piwork.models.scripted import (
    SCRIPT_EXHAUSTED_TEXT,
    ChatRequest,
    Delay,
    Disconnect,
    HttpError,
    LoopForever,
    ScriptedModelServer,
    Step,
    Text,
    ToolCalls,
    bash,
    edit,
    read,
    write,
)

JSON = dict[str, Any]


# --------------------------------------------------------------------------- helpers


def chat_body(messages: list[JSON], *, usage: bool = True, stream: bool = True) -> JSON:
    """A request shaped like the one pi's openai-completions client sends."""
    body: JSON = {"model": "scripted", "messages": messages, "stream": stream}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def user(text: str) -> JSON:
    return {"role": "user", "content": text}


def assistant_call(call_id: str, name: str, args: JSON) -> JSON:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


def tool_result(call_id: str, text: str) -> JSON:
    return {"role": "tool", "content": text, "tool_call_id": call_id}


async def stream_chat(
    server: ScriptedModelServer, body: JSON, headers: dict[str, str] | None = None
) -> tuple[aiohttp.ClientResponse, list[JSON | str]]:
    """POST a chat request and parse the SSE stream: JSON chunks, then "[DONE]"."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.base_url}/chat/completions",
            json=body,
            headers={"Authorization": "Bearer test-key", **(headers or {})},
        ) as resp,
    ):
        frames: list[JSON | str] = []
        if resp.status != 200:
            await resp.read()
            return resp, frames
        async for raw in resp.content:
            line = raw.decode().rstrip("\r\n")
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line[len("data: ") :]
            frames.append(data if data == "[DONE]" else json.loads(data))
        return resp, frames


def deltas(frames: list[JSON | str]) -> list[JSON]:
    return [f["choices"][0]["delta"] for f in frames if isinstance(f, dict) and f["choices"]]


def content_of(frames: list[JSON | str]) -> str:
    return "".join(d.get("content") or "" for d in deltas(frames))


def finish_reason(frames: list[JSON | str]) -> str | None:
    reasons = [
        f["choices"][0]["finish_reason"]
        for f in frames
        if isinstance(f, dict) and f["choices"] and f["choices"][0]["finish_reason"]
    ]
    assert len(reasons) <= 1, reasons
    return reasons[0] if reasons else None


# --------------------------------------------------------------------------- wire format


async def test_text_reply_streams_role_then_small_pieces_then_stop_usage_and_done() -> None:
    text = "Hello from the scripted model, streamed in pieces."
    async with ScriptedModelServer([Text(text)]) as server:
        resp, frames = await stream_chat(server, chat_body([user("hi")]))

    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    chunks = [f for f in frames if isinstance(f, dict)]
    assert frames[-1] == "[DONE]" and frames.count("[DONE]") == 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1, "every chunk carries the completion's id"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [d["content"] for d in deltas(frames) if d.get("content")]
    assert len(pieces) >= 5, "text must arrive in several small chunks"
    assert "".join(pieces) == text
    assert finish_reason(frames) == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_tool_calls_stream_id_and_name_first_then_arguments_in_pieces() -> None:
    calls = [
        bash("ls -la", id="call_one"),
        write("notes/a.txt", 'line 1\nline 2 with "quotes" and ünïcode\n'),
        edit("a.txt", [("old", "new")]),
        read("README.md", offset=2, limit=5),
    ]
    async with ScriptedModelServer([ToolCalls(calls, text="Working on it.")]) as server:
        _, frames = await stream_chat(server, chat_body([user("go")]))

    assert content_of(frames) == "Working on it."
    assert finish_reason(frames) == "tool_calls"
    by_index: dict[int, list[JSON]] = {}
    for d in deltas(frames):
        for tc in d.get("tool_calls", []):
            by_index.setdefault(tc["index"], []).append(tc)
    assert sorted(by_index) == [0, 1, 2, 3]
    for index, call in enumerate(calls):
        first, *rest = by_index[index]
        assert first["type"] == "function"
        assert first["function"]["name"] == call.name
        assert first["id"].startswith("call_")
        assert all("id" not in tc and "name" not in tc["function"] for tc in rest)
        assert len(rest) >= 2, "arguments must be streamed in pieces"
        arguments = "".join(tc["function"]["arguments"] for tc in [first, *rest])
        assert json.loads(arguments) == dict(call.arguments)
    assert by_index[0][0]["id"] == "call_one"
    assert json.loads("".join(tc["function"]["arguments"] for tc in by_index[2])) == {
        "path": "a.txt",
        "edits": [{"oldText": "old", "newText": "new"}],
    }


async def test_usage_chunk_only_when_the_client_asks_for_it() -> None:
    async with ScriptedModelServer([Text("hi")]) as server:
        _, frames = await stream_chat(server, chat_body([user("x")], usage=False))
    chunks = [f for f in frames if isinstance(f, dict)]
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)
    assert frames[-1] == "[DONE]"


async def test_reasoning_streams_as_reasoning_content_before_the_text() -> None:
    async with ScriptedModelServer([Text("answer", reasoning="let me think")]) as server:
        _, frames = await stream_chat(server, chat_body([user("x")]))
    kinds = [next(iter(d)) for d in deltas(frames)[1:] if d]
    assert kinds[0] == "reasoning_content" and "content" in kinds
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning_content")
    assert "".join(d.get("reasoning_content", "") for d in deltas(frames)) == "let me think"


async def test_non_streaming_request_gets_a_chat_completion_object() -> None:
    async with (
        ScriptedModelServer([ToolCalls([bash("pwd")], text="t")]) as server,
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.base_url}/chat/completions", json=chat_body([user("x")], stream=False)
        ) as resp,
    ):
        body = await resp.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "t"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "pwd"
    }


async def test_models_endpoint_lists_the_model() -> None:
    server = ScriptedModelServer([Text("x")], model_id="demo", model_name="Demo")
    async with (
        server,
        aiohttp.ClientSession() as session,
        session.get(f"{server.base_url}/models") as resp,
    ):
        body = await resp.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["demo"]
    assert server.requests[0].method == "GET" and server.requests[0].path == "/v1/models"


# --------------------------------------------------------------------------- step selection


async def test_linear_script_position_is_the_number_of_assistant_messages() -> None:
    script: list[Step] = [
        ToolCalls([bash("ls")], text="first"),
        ToolCalls([read("a.txt")], text="second"),
        Text("third"),
    ]
    history = [user("go")]
    turn1 = [*history, assistant_call("c1", "bash", {"command": "ls"}), tool_result("c1", "a")]
    turn2 = [*turn1, assistant_call("c2", "read", {"path": "a.txt"}), tool_result("c2", "x")]
    turn3 = [*turn2, {"role": "assistant", "content": "third"}, user("again")]
    async with ScriptedModelServer(script) as server:
        texts = [
            content_of((await stream_chat(server, chat_body(msgs)))[1])
            for msgs in (history, turn1, turn2, history, turn2, turn3)
        ]
    # Re-sent histories (retries, resumes) get the same step: no hidden counter.
    assert texts == ["first", "second", "third", "first", "third", SCRIPT_EXHAUSTED_TEXT]


async def test_loop_forever_answers_every_position_from_its_own_on() -> None:
    script: list[Step] = [Text("intro"), LoopForever(command="echo again")]
    history = [user("go"), {"role": "assistant", "content": "intro"}, user("more")]
    async with ScriptedModelServer(script) as server:
        for n in range(5):
            _, frames = await stream_chat(server, chat_body(history))
            assert finish_reason(frames) == "tool_calls"
            history += [
                assistant_call(f"c{n}", "bash", {"command": "echo again"}),
                tool_result(f"c{n}", "again"),
            ]
    assert len(server.chat_requests) == 5


async def test_step_function_sees_the_conversation_and_tool_results() -> None:
    seen: list[ChatRequest] = []

    def script(request: ChatRequest) -> Step:
        seen.append(request)
        exchanges = request.tool_exchanges()
        if not exchanges:
            return ToolCalls([bash("ls")])
        return Text(f"ls said {exchanges[0].result!r} to {request.last_user_text!r}")

    msgs = [
        {"role": "system", "content": "sys"},
        user("old prompt"),
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        assistant_call("c1", "bash", {"command": "ls"}),
        tool_result("c1", "a.txt\nb.txt"),
    ]
    async with ScriptedModelServer(script) as server:
        _, frames = await stream_chat(server, chat_body(msgs))
    assert content_of(frames) == "ls said 'a.txt\\nb.txt' to 'list files'"
    request = seen[0]
    assert request.assistant_turns == 2
    assert request.assistant_turns_since_user == 1
    assert len(request.tool_results_since_user) == 1
    assert request.tool_exchanges()[0].arguments == {"command": "ls"}


# --------------------------------------------------------------------------- failures and delays


async def test_http_error_is_served_times_then_the_next_step_at_that_position() -> None:
    script: list[Step] = [HttpError(500, "boom", times=2), Text("recovered")]
    async with ScriptedModelServer(script) as server:
        results = [await stream_chat(server, chat_body([user("x")])) for _ in range(3)]
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.base_url}/chat/completions", json=chat_body([])) as resp,
        ):
            pass  # position 0 again: both errors used up
    statuses = [r.status for r, _ in results]
    assert statuses == [500, 500, 200]
    assert results[0][0].headers["x-should-retry"] == "false"
    assert content_of(results[2][1]) == "recovered"
    assert resp.status == 200


async def test_http_error_body_is_openai_shaped_and_sdk_retry_can_be_allowed() -> None:
    async with (
        ScriptedModelServer([HttpError(429, "slow down", sdk_retry=True)]) as server,
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}/chat/completions", json=chat_body([user("x")])) as resp,
    ):
        body = await resp.json()
    assert resp.status == 429
    assert "x-should-retry" not in resp.headers
    assert body["error"]["message"] == "slow down"


async def test_delay_sends_headers_and_role_chunk_first_then_waits() -> None:
    async with (
        ScriptedModelServer([Delay(0.4, Text("late"))]) as server,
        aiohttp.ClientSession() as session,
    ):
        start = time.monotonic()
        async with session.post(
            f"{server.base_url}/chat/completions", json=chat_body([user("x")])
        ) as resp:
            first = await resp.content.readline()
            first_at = time.monotonic() - start
            rest = await resp.read()
            done_at = time.monotonic() - start
    assert b'"role":"assistant"' in first
    assert first_at < 0.3
    assert done_at >= 0.4
    assert b"late" in rest and rest.rstrip().endswith(b"data: [DONE]")


async def test_one_shot_delay_notices_the_client_leaving_and_takes_no_position() -> None:
    script: list[Step] = [Delay(30, Text("never sent"), times=1), Text("after the abort")]
    async with ScriptedModelServer(script) as server, aiohttp.ClientSession() as session:
        async with session.post(
            f"{server.base_url}/chat/completions", json=chat_body([user("x")])
        ) as resp:
            await resp.content.readline()  # the role chunk: pi is now mid-stream
        # Leaving the block closed the connection: what pi's abort does.
        for _ in range(100):
            if server.requests[0].client_disconnected:
                break
            await asyncio.sleep(0.02)
        assert server.requests[0].client_disconnected
        _, frames = await stream_chat(server, chat_body([user("x")]))
    assert content_of(frames) == "after the abort"


async def test_disconnect_breaks_the_stream_midway() -> None:
    async with (
        ScriptedModelServer([Disconnect("partial answer"), Text("whole answer")]) as server,
        aiohttp.ClientSession() as session,
    ):
        async with session.post(
            f"{server.base_url}/chat/completions", json=chat_body([user("x")])
        ) as resp:
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        _, frames = await stream_chat(server, chat_body([user("x")]))
    assert content_of(frames) == "whole answer"


# --------------------------------------------------------------------------- recording and modes


async def test_every_request_is_recorded_with_headers_body_and_step() -> None:
    step = Text("ok")
    async with ScriptedModelServer([step]) as server:
        await stream_chat(server, chat_body([user("record me")]), {"X-Extra": "1"})
    (rec,) = server.chat_requests
    assert rec.method == "POST" and rec.path == "/v1/chat/completions"
    assert rec.headers["authorization"] == "Bearer test-key"
    assert rec.headers["x-extra"] == "1"
    assert rec.body["messages"] == [user("record me")]
    assert rec.step == step


async def test_api_key_is_enforced_when_configured() -> None:
    async with ScriptedModelServer([Text("x")], api_key="right") as server:
        bad, _ = await stream_chat(server, chat_body([user("x")]))
        good, _ = await stream_chat(
            server, chat_body([user("x")]), {"Authorization": "Bearer right"}
        )
    assert (bad.status, good.status) == (401, 200)


def test_thread_mode_serves_sync_code_and_stops_cleanly() -> None:
    with ScriptedModelServer([Text("from a thread")]) as server:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps(chat_body([user("x")])).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            body = resp.read().decode()
        assert server.wait_for_chat_requests(1, timeout=1)[0].body["messages"] == [user("x")]
        port = server.port
    assert '"content":"from "' in body and body.rstrip().endswith("data: [DONE]")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)


def test_stop_does_not_wait_for_a_long_delay() -> None:
    server = ScriptedModelServer([Delay(60, Text("x"))]).start_in_thread()

    def call() -> None:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps(chat_body([user("x")])).encode(),
        )
        with contextlib.suppress(Exception):  # the server goes away mid-response
            urllib.request.urlopen(request, timeout=10).read()

    client = threading.Thread(target=call, daemon=True)
    client.start()
    server.wait_for_chat_requests(1, timeout=5)
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 3
    client.join(5)


# --------------------------------------------------------------------------- the demo script

GNU_LISTING = """total 20
drwxr-xr-x 3 me me 4096 Jan  1 12:00 .
drwxr-xr-x 9 me me 4096 Jan  1 12:00 ..
-rw-r--r-- 1 me me  120 Jan  1 12:00 README.md
-rw-r--r-- 1 me me 9000 Jan  1 12:00 photo.png
drwxr-xr-x 2 me me 4096 Jan  1 12:00 src
lrwxrwxrwx 1 me me    9 Jan  1 12:00 link -> README.md
-rw-r--r-- 1 me me   10 Jan  1 12:00 my notes.txt
"""

BUSYBOX_LISTING = """total 8
drwxr-xr-x    2 root     root            80 Jan  1 00:00 .
drwxr-xr-x    3 root     root            60 Jan  1 00:00 ..
-rw-r--r--    1 root     root             6 Jan  1 00:00 data.csv
"""


def test_parse_ls_la_reads_gnu_and_busybox_listings() -> None:
    gnu = parse_ls_la(GNU_LISTING)
    assert gnu is not None
    assert [(e.name, e.kind) for e in gnu] == [
        ("README.md", "file"),
        ("photo.png", "file"),
        ("src", "dir"),
        ("link", "link"),
        ("my notes.txt", "file"),
    ]
    busybox = parse_ls_la(BUSYBOX_LISTING)
    assert busybox is not None and [(e.name, e.size) for e in busybox] == [("data.csv", 6)]
    assert parse_ls_la("total 0\n") == []
    assert parse_ls_la("Blocked by policy: bash is not allowed") is None


def run_demo(
    listing: str, read_text: str = "# Title\nbody", move_result: str = "(no output)"
) -> list[Step]:
    """Feed the demo script its own tool calls with canned results until it stops."""
    msgs: list[JSON] = [{"role": "system", "content": "s"}, user("please refactor my code")]
    steps: list[Step] = []
    for n in range(10):
        step = demo_script(ChatRequest(body=chat_body(msgs), headers={}))
        steps.append(step)
        if not isinstance(step, ToolCalls):
            return steps
        (call,) = step.calls
        cid = f"c{n}"
        msgs.append(
            {
                "role": "assistant",
                "content": step.text,
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                ],
            }
        )
        command = str(call.arguments.get("command", ""))
        bash_result = (
            listing
            if command == "ls -la"
            else move_result
            if command.startswith("mv ")
            else "17 PIWORK_DEMO.md"
        )
        result = {"bash": bash_result, "read": read_text, "write": "Successfully wrote"}[call.name]
        msgs.append(tool_result(cid, result))
    raise AssertionError("the demo did not finish")


DEMO_FOLDER_LISTING = """total 16
drwxr-xr-x 2 me me 4096 Jan  1 12:00 .
drwxr-xr-x 9 me me 4096 Jan  1 12:00 ..
-rw-r--r-- 1 me me   60 Jan  1 12:00 README.md
-rw-r--r-- 1 me me   22 Jan  1 12:00 notes.txt
"""


def names_of(steps: list[Step]) -> list[str]:
    return [s.calls[0].name if isinstance(s, ToolCalls) else "text" for s in steps]


def test_demo_lists_reads_writes_checks_and_finishes() -> None:
    """In a folder with no notes.txt the demo changes nothing of the person's: it only
    adds its summary (brought in without a question)."""
    steps = run_demo(GNU_LISTING)
    assert names_of(steps) == ["bash", "read", "write", "bash", "text"]
    first = steps[0]
    assert isinstance(first, ToolCalls) and "offline demo model" in first.text
    assert "please refactor my code" in first.text
    assert all(
        "demo model" in (s.text if isinstance(s, Text | ToolCalls) else "") for s in steps
    ), "every reply says it comes from the demo model"
    read_step, write_step, check_step, final = steps[1:]
    assert isinstance(read_step, ToolCalls) and isinstance(write_step, ToolCalls)
    assert read_step.calls[0].arguments["path"] == "README.md"
    # The summary goes straight into (the agent's copy of) the folder.
    assert write_step.calls[0].arguments["path"] == DEMO_FILE
    summary = write_step.calls[0].arguments["content"]
    assert "5 entries: 3 files, 1 folder, 1 other" in summary
    for name in ("README.md", "photo.png", "src/", "my notes.txt"):
        assert name in summary
    assert "> # Title" in summary
    assert "Nothing else in this folder was changed." in summary
    assert isinstance(check_step, ToolCalls)
    assert check_step.calls[0].arguments == {"command": f"wc -l {DEMO_FILE}"}
    assert isinstance(final, Text) and "17 lines" in final.text and "Done" in final.text
    assert "renamed" not in final.text


def test_demo_renames_notes_txt_the_one_change_piwork_asks_about() -> None:
    steps = run_demo(DEMO_FOLDER_LISTING)
    assert names_of(steps) == ["bash", "read", "write", "bash", "bash", "text"]
    write_step, tidy_step, final = steps[2], steps[4], steps[5]
    assert isinstance(write_step, ToolCalls) and isinstance(tidy_step, ToolCalls)
    summary = write_step.calls[0].arguments["content"]
    assert f"renames `{TIDY_FROM}` to `{TIDY_TO}`" in summary
    assert "Nothing else" not in summary
    assert tidy_step.calls[0].arguments == {"command": f"mv {TIDY_FROM} {TIDY_TO}"}
    assert "asks you" in tidy_step.text
    assert isinstance(final, Text) and "Done" in final.text
    assert f"renamed {TIDY_FROM} to {TIDY_TO}" in final.text
    assert f"if you said no, your {TIDY_FROM} is as it was" in final.text


def test_demo_leaves_notes_txt_alone_when_notes_md_is_in_the_way() -> None:
    listing = DEMO_FOLDER_LISTING + "-rw-r--r-- 1 me me 5 Jan  1 12:00 notes.md\n"
    steps = run_demo(listing)
    assert names_of(steps) == ["bash", "read", "write", "bash", "text"]


def test_demo_skips_reading_in_an_empty_folder() -> None:
    steps = run_demo("total 0\ndrwxr-xr-x 2 a a 40 Jan  1 00:00 .\n")
    assert names_of(steps) == ["bash", "write", "bash", "text"]
    write_step = steps[1]
    assert isinstance(write_step, ToolCalls)
    assert "0 entries" in write_step.calls[0].arguments["content"]


@pytest.mark.parametrize(
    "refusal",
    [
        "Permission denied by the user: the command `mv notes.txt notes.md` (move) was "
        "not run. Do not retry the same action.",
        "Permission request for the command `mv` (move) was cancelled before the user "
        "answered (the task was stopped or aborted). It did not run.",
    ],
)
def test_a_refused_rename_is_said_as_refused(refusal: str) -> None:
    steps = run_demo(DEMO_FOLDER_LISTING, move_result=refusal)
    assert names_of(steps) == ["bash", "read", "write", "bash", "bash", "text"]
    final = steps[-1]
    assert isinstance(final, Text)
    assert f"The rename of {TIDY_FROM} was refused" in final.text
    assert "renamed" not in final.text


def test_demo_models_json_labels_the_demo() -> None:
    config = demo_models_json("http://10.0.2.100/v1")
    provider = config["providers"][DEMO_PROVIDER]
    assert provider["api"] == "openai-completions"
    assert provider["baseUrl"] == "http://10.0.2.100/v1"
    assert provider["apiKey"]
    assert provider["models"][0]["id"] == DEMO_MODEL_ID == "demo"
    assert provider["models"][0]["name"] == DEMO_MODEL_NAME
    assert "not a real LLM" in DEMO_MODEL_NAME
