"""A scripted stand-in for an OpenAI-compatible chat-completions server.

There is no real LLM in tests (and none offline), so this server plays one: it
speaks the same streaming wire protocol pi's ``openai-completions`` client
reads (SSE ``chat.completion.chunk`` frames), but what it "says" comes from a
script. Tests use it as the test double for the remote model; the offline demo
model (:mod:`piwork.models.demo`) is one such script.

Step selection is derived from the conversation pi sends, not from a private
counter, so the same script keeps working when pi re-sends a history, resumes
a session, or retries: for a linear script, the step for a request is the one
at position *number of assistant messages in the request*. pi never replays
errored or aborted assistant turns, so failed attempts do not move the
position. Steps that do not leave an assistant message behind (HTTP errors,
dropped connections, one-shot delays) take no position of their own; they are
served ``times`` times and then the next step at the same position is used.

Usage::

    script = [ToolCalls([bash("ls -la")]), Text("Done.")]
    async with ScriptedModelServer(script) as server:
        ...  # point pi at server.base_url; inspect server.requests afterwards

    server = ScriptedModelServer(script).start_in_thread()  # sync code
    try: ...
    finally: server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeAlias

from aiohttp import web

from piwork.models.providers import ModelSpec, Provider

__all__ = [
    "ChatRequest",
    "Delay",
    "Disconnect",
    "HttpError",
    "LoopForever",
    "RecordedRequest",
    "Script",
    "ScriptedModelServer",
    "Step",
    "StepFunction",
    "Text",
    "ToolCall",
    "ToolCalls",
    "ToolExchange",
    "bash",
    "edit",
    "pi_provider_config",
    "read",
    "split_text",
    "write",
]

JsonObject: TypeAlias = dict[str, Any]

# Text shown to pi when a linear script has no step left for the conversation.
# A text reply (not an error) so pi stops cleanly instead of retrying.
SCRIPT_EXHAUSTED_TEXT = "[scripted model: the script has no step left for this conversation]"


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asks pi to run.

    ``arguments`` must match the tool's schema in pi (see the helpers
    :func:`bash`, :func:`read`, :func:`write`, :func:`edit`). ``id`` is
    generated when left out; set it to assert on ``toolCallId`` in events.
    """

    name: str
    arguments: Mapping[str, Any]
    id: str | None = None


def bash(command: str, *, timeout: float | None = None, id: str | None = None) -> ToolCall:
    """pi's ``bash`` tool: ``{command, timeout?}`` (timeout in seconds)."""
    args: JsonObject = {"command": command}
    if timeout is not None:
        args["timeout"] = timeout
    return ToolCall("bash", args, id)


def read(
    path: str, *, offset: int | None = None, limit: int | None = None, id: str | None = None
) -> ToolCall:
    """pi's ``read`` tool: ``{path, offset?, limit?}`` (offset is 1-based, in lines)."""
    args: JsonObject = {"path": path}
    if offset is not None:
        args["offset"] = offset
    if limit is not None:
        args["limit"] = limit
    return ToolCall("read", args, id)


def write(path: str, content: str, *, id: str | None = None) -> ToolCall:
    """pi's ``write`` tool: ``{path, content}`` (creates parent folders, overwrites)."""
    return ToolCall("write", {"path": path, "content": content}, id)


def edit(path: str, replacements: Sequence[tuple[str, str]], *, id: str | None = None) -> ToolCall:
    """pi's ``edit`` tool: ``{path, edits: [{oldText, newText}, ...]}``.

    Each ``oldText`` must occur exactly once in the original file.
    """
    edits = [{"oldText": old, "newText": new} for old, new in replacements]
    return ToolCall("edit", {"path": path, "edits": edits}, id)


@dataclass(frozen=True)
class Text:
    """A plain text reply; ends the agent's turn (``finish_reason`` ``stop``).

    ``reasoning`` is streamed first as ``delta.reasoning_content`` (pi shows it
    as a thinking block). ``finish_reason`` can be set to e.g. ``"length"``.
    """

    text: str
    reasoning: str = ""
    finish_reason: str = "stop"


@dataclass(frozen=True)
class ToolCalls:
    """One assistant message with one or more tool calls (``finish_reason``
    ``tool_calls``), optionally preceded by some text."""

    calls: Sequence[ToolCall]
    text: str = ""
    reasoning: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "calls", tuple(self.calls))
        if not self.calls:
            raise ValueError("ToolCalls needs at least one ToolCall")


@dataclass(frozen=True)
class HttpError:
    """Answer with an HTTP error status and an OpenAI-style error body.

    pi's OpenAI SDK client (openai 6.x) itself retries 408/409/429/5xx twice
    with 0.5-8 s back-off before pi sees the error, unless the response says
    ``x-should-retry: false``. That header is sent unless ``sdk_retry`` is
    true, so each served error reaches pi's own auto-retry (2 s, 4 s, 8 s).
    Served ``times`` times for its position, then the next step takes over.
    """

    status: int = 500
    message: str = "scripted server error"
    times: int = 1
    sdk_retry: bool = False


@dataclass(frozen=True)
class Disconnect:
    """Start streaming (role chunk, then ``partial_text``), then drop the
    connection without finishing the response. pi reports ``terminated``
    (retryable). Served ``times`` times for its position."""

    partial_text: str = ""
    times: int = 1


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` inside a response, then serve ``then``.

    For streamed replies the response headers and the role chunk are sent
    first, so pi is visibly mid-stream while waiting (the right moment to
    test ``steer`` or ``abort``); for HTTP errors the wait comes first. The
    wait ends early if the client goes away.

    With ``times`` set, the delay is one-shot: it takes no position and is
    served ``times`` times, then the next step at that position is used;
    that is what an abort test wants, since an aborted turn is never replayed.
    """

    seconds: float
    then: Step = Text("")
    times: int | None = None


@dataclass(frozen=True)
class LoopForever:
    """Always one more ``bash`` call; never finishes on its own.

    In a linear script it answers every position from its own onward, which
    makes it the tool for max-turns / stop tests.
    """

    command: str = "echo still working"
    text: str = ""


Step: TypeAlias = Text | ToolCalls | HttpError | Disconnect | Delay | LoopForever


def _is_transient(step: Step) -> bool:
    """True for steps that leave no assistant message in pi's history."""
    if isinstance(step, HttpError | Disconnect):
        return True
    if isinstance(step, Delay):
        return step.times is not None or _is_transient(step.then)
    return False


def _times(step: Step) -> int:
    if isinstance(step, HttpError | Disconnect):
        return step.times
    if isinstance(step, Delay):
        return step.times if step.times is not None else _times(step.then)
    raise TypeError(f"{type(step).__name__} is not a transient step")


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ToolExchange:
    """A tool call the model made and the text pi sent back for it."""

    id: str
    name: str
    arguments: JsonObject
    result: str | None


def _content_text(content: Any) -> str:
    """Text of an OpenAI message ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


@dataclass(frozen=True)
class ChatRequest:
    """An incoming ``/chat/completions`` request, with helpers that scripts
    use to decide what to answer."""

    body: JsonObject
    headers: Mapping[str, str]

    @property
    def messages(self) -> list[JsonObject]:
        msgs = self.body.get("messages", [])
        return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools pi offered in this request."""
        names: list[str] = []
        for tool in self.body.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
                names.append(str(tool["function"].get("name", "")))
        return names

    def _last_user_index(self) -> int:
        msgs = self.messages
        for i in range(len(msgs) - 1, -1, -1):
            if msgs[i].get("role") == "user":
                return i
        return -1

    @property
    def last_user_text(self) -> str:
        i = self._last_user_index()
        return _content_text(self.messages[i].get("content")) if i >= 0 else ""

    @property
    def since_last_user(self) -> list[JsonObject]:
        """Messages after the last user message (the current agent run)."""
        return self.messages[self._last_user_index() + 1 :]

    @property
    def assistant_turns(self) -> int:
        """Assistant messages in the whole conversation (a linear script's position)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    @property
    def assistant_turns_since_user(self) -> int:
        return sum(1 for m in self.since_last_user if m.get("role") == "assistant")

    @property
    def tool_results_since_user(self) -> list[JsonObject]:
        return [m for m in self.since_last_user if m.get("role") == "tool"]

    def tool_exchanges(self, *, since_last_user: bool = True) -> list[ToolExchange]:
        """Tool calls in order, each with the result text pi returned (or None)."""
        msgs = self.since_last_user if since_last_user else self.messages
        results = {
            str(m.get("tool_call_id")): _content_text(m.get("content"))
            for m in msgs
            if m.get("role") == "tool"
        }
        exchanges: list[ToolExchange] = []
        for m in msgs:
            if m.get("role") != "assistant":
                continue
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = {}
                call_id = str(call.get("id", ""))
                exchanges.append(
                    ToolExchange(
                        id=call_id,
                        name=str(fn.get("name", "")),
                        arguments=args if isinstance(args, dict) else {},
                        result=results.get(call_id),
                    )
                )
        return exchanges


@dataclass
class RecordedRequest:
    """Everything the server received for one HTTP request (for assertions)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float
    step: Step | None = None
    client_disconnected: bool = False


StepFunction: TypeAlias = Callable[[ChatRequest], Step]
Script: TypeAlias = Sequence[Step] | StepFunction


class _LinearScript:
    """Maps a conversation position to a step of a list (see module doc)."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self._served: dict[int, int] = {}

    def __call__(self, request: ChatRequest) -> Step:
        position = request.assistant_turns
        pos = 0
        for i, step in enumerate(self.steps):
            if isinstance(step, LoopForever) and position >= pos:
                return step
            if _is_transient(step):
                if pos == position and self._served.get(i, 0) < _times(step):
                    self._served[i] = self._served.get(i, 0) + 1
                    return step
                continue
            if pos == position:
                return step
            pos += 1
        return Text(SCRIPT_EXHAUSTED_TEXT)


# --------------------------------------------------------------------------- wire format

_WORD = re.compile(r"\s*\S+\s*|\s+")


def split_text(text: str) -> list[str]:
    """Cut text into word-sized pieces so streaming is visible downstream."""
    return _WORD.findall(text)


def _split_fixed(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Completion:
    """Builds the ``chat.completion.chunk`` objects of one streamed reply."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def chunk(self, delta: JsonObject, finish_reason: str | None = None) -> JsonObject:
        obj: JsonObject = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            obj["usage"] = None
        return obj

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> JsonObject:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _reply_parts(step: Text | ToolCalls | LoopForever) -> tuple[str, str, list[ToolCall], str]:
    """(reasoning, text, tool calls, finish_reason) of a content step."""
    if isinstance(step, Text):
        return step.reasoning, step.text, [], step.finish_reason
    if isinstance(step, ToolCalls):
        return step.reasoning, step.text, list(step.calls), "tool_calls"
    return "", step.text, [bash(step.command)], "tool_calls"


def _call_id(call: ToolCall) -> str:
    return call.id or f"call_{uuid.uuid4().hex[:24]}"


def _sse(obj: JsonObject | str) -> bytes:
    data = (
        obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {data}\n\n".encode()


# --------------------------------------------------------------------------- server


class ScriptedModelServer:
    """An OpenAI-compatible chat-completions server driven by a script.

    ``script`` is a list of steps (see module doc for how a request picks
    one) or a function ``(ChatRequest) -> Step``. It can be replaced between
    runs through the ``script`` attribute.

    ``chunk_delay`` (seconds) is slept between streamed frames: 0 for tests,
    a few tens of ms to make streaming visible to a person. ``api_key``, when
    set, is required as ``Authorization: Bearer <key>`` (401 otherwise).
    """

    def __init__(
        self,
        script: Script,
        *,
        model_id: str = "scripted",
        model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_delay: float = 0.0,
        args_chunk_chars: int = 12,
        api_key: str | None = None,
    ) -> None:
        self.script = script
        self.model_id = model_id
        self.model_name = model_name or model_id
        self.host = host
        self.chunk_delay = chunk_delay
        self.args_chunk_chars = args_chunk_chars
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self._requested_port = port
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._linear: tuple[Sequence[Step], _LinearScript] | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # ---- addresses

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ScriptedModelServer is not running; start it first")
        return self._port

    @property
    def base_url(self) -> str:
        """What pi's ``models.json`` calls ``baseUrl``: ``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def as_provider(self, provider: str = "scripted", **model: Any) -> Provider:
        """This server as a custom provider (no key), so a run reaches it through
        piwork's model gateway like any other; ``model``: more ``ModelSpec`` fields
        (``name`` defaults to the server's model name)."""
        spec = ModelSpec.model_validate({"id": self.model_id, "name": self.model_name, **model})
        return Provider(
            name=provider,
            api="openai-completions",
            base_url=self.base_url,
            auth="none",
            key_required=False,
            default_model=self.model_id,
            models=(spec,),
        )

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def pi_provider(self, *, api_key: str = "piwork-placeholder-key") -> JsonObject:
        """This server as one provider entry of pi's ``models.json``."""
        return pi_provider_config(self.base_url, self.model_id, self.model_name, api_key=api_key)

    # ---- async life cycle

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for task in list(self._handlers):
            task.cancel()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- background-thread life cycle (for sync code)

    def start_in_thread(self, timeout: float = 10.0) -> Self:
        """Run the server on its own event loop in a daemon thread."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._thread_loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.close())
                loop.close()

        self._thread = threading.Thread(target=run, name="scripted-model-server", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"scripted model server did not start within {timeout} s")
        if errors:
            self._thread = None
            raise errors[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread`."""
        thread, loop = self._thread, self._thread_loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already gone
            asyncio.run_coroutine_threadsafe(self.close(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._thread_loop = None

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- waiting (tests that act while pi is mid-request)

    def wait_for_chat_requests(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until ``count`` chat requests arrived (server in another thread)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.chat_requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{len(self.chat_requests)} chat requests after {timeout} s, wanted {count}"
                    )
                self._cond.wait(remaining)
            return self.chat_requests

    async def wait_for_chat_requests_async(
        self, count: int, timeout: float = 10.0
    ) -> list[RecordedRequest]:
        """Like :meth:`wait_for_chat_requests`, without blocking the event loop."""
        return await asyncio.to_thread(self.wait_for_chat_requests, count, timeout)

    # ---- request handling

    def _pick(self, request: ChatRequest) -> Step:
        script = self.script
        if callable(script):
            return script(request)
        if self._linear is None or self._linear[0] is not script:
            self._linear = (script, _LinearScript(script))
        return self._linear[1](request)

    def _record(self, rec: RecordedRequest) -> None:
        with self._cond:
            self.requests.append(rec)
            self._cond.notify_all()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            return await self._handle(request)
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = raw.decode("utf-8", "replace")
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            received_at=time.time(),
        )
        self._record(rec)

        authorization = request.headers.get("Authorization")
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            return _error_response(401, "invalid API key", "invalid_request_error")

        path = request.path.rstrip("/")
        if request.method == "GET" and path in ("/v1/models", "/models"):
            return web.json_response(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model_id,
                            "object": "model",
                            "created": 0,
                            "owned_by": "piwork",
                            "name": self.model_name,
                        }
                    ],
                }
            )
        if path not in ("/v1/chat/completions", "/chat/completions"):
            return _error_response(404, f"no route {request.method} {request.path}", "not_found")
        if request.method != "POST":
            return _error_response(405, "use POST", "invalid_request_error")
        if not isinstance(body, dict):
            return _error_response(400, "request body must be a JSON object", "invalid_request")

        chat = ChatRequest(body=body, headers=rec.headers)
        step = self._pick(chat)
        rec.step = step
        try:
            return await self._serve(request, chat, step, rec)
        except ConnectionError:
            rec.client_disconnected = True
            return web.Response(status=499)

    async def _serve(
        self, request: web.Request, chat: ChatRequest, step: Step, rec: RecordedRequest
    ) -> web.StreamResponse:
        delay = 0.0
        while isinstance(step, Delay):
            delay += step.seconds
            step = step.then
        if isinstance(step, HttpError):
            if delay and not await self._sleep(request, delay, rec):
                return web.Response(status=499)
            headers = {} if step.sdk_retry else {"x-should-retry": "false"}
            return _error_response(step.status, step.message, "server_error", headers)
        if not chat.stream:
            if delay and not await self._sleep(request, delay, rec):
                return web.Response(status=499)
            return self._non_streaming(chat, step)

        include_usage = bool((chat.body.get("stream_options") or {}).get("include_usage"))
        completion = _Completion(chat.model or self.model_id, include_usage)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        await resp.write(_sse(completion.chunk({"role": "assistant", "content": ""})))
        if delay and not await self._sleep(request, delay, rec):
            return resp

        if isinstance(step, Disconnect):
            for piece in split_text(step.partial_text):
                await self._frame(resp, completion.chunk({"content": piece}))
            transport = request.transport
            if transport is not None:
                transport.abort()
            return resp

        reasoning, text, calls, finish = _reply_parts(step)
        for piece in split_text(reasoning):
            await self._frame(resp, completion.chunk({"reasoning_content": piece}))
        for piece in split_text(text):
            await self._frame(resp, completion.chunk({"content": piece}))
        for index, call in enumerate(calls):
            head = {
                "index": index,
                "id": _call_id(call),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            await self._frame(resp, completion.chunk({"tool_calls": [head]}))
            arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
            for piece in _split_fixed(arguments, self.args_chunk_chars):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                await self._frame(resp, completion.chunk(delta))
        await self._frame(resp, completion.chunk({}, finish_reason=finish))
        if include_usage:
            produced = reasoning + text + "".join(json.dumps(dict(c.arguments)) for c in calls)
            prompt = json.dumps(chat.messages, ensure_ascii=False)
            usage = completion.usage_chunk(_estimate_tokens(prompt), _estimate_tokens(produced))
            await self._frame(resp, usage)
        await self._frame(resp, "[DONE]")
        await resp.write_eof()
        return resp

    async def _frame(self, resp: web.StreamResponse, obj: JsonObject | str) -> None:
        if self.chunk_delay:
            await asyncio.sleep(self.chunk_delay)
        await resp.write(_sse(obj))

    async def _sleep(self, request: web.Request, seconds: float, rec: RecordedRequest) -> bool:
        """Sleep, but give up as soon as the client hangs up. False if it did."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            transport = request.transport
            if transport is None or transport.is_closing():
                rec.client_disconnected = True
                return False
            await asyncio.sleep(min(0.02, remaining))
        return True

    def _non_streaming(self, chat: ChatRequest, step: Step) -> web.Response:
        if isinstance(step, Disconnect | HttpError | Delay):  # Delay/HttpError unwrapped above
            return _error_response(502, "scripted disconnect", "server_error")
        reasoning, text, calls, finish = _reply_parts(step)
        message: JsonObject = {"role": "assistant", "content": text or None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {
                    "id": _call_id(c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
                }
                for c in calls
            ]
        prompt = _estimate_tokens(json.dumps(chat.messages))
        completion = _estimate_tokens(text + reasoning)
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": chat.model or self.model_id,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )


def _error_response(
    status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status, headers=dict(headers or {}))


def pi_provider_config(
    base_url: str,
    model_id: str,
    model_name: str | None = None,
    *,
    api_key: str = "piwork-placeholder-key",
    context_window: int = 128_000,
    max_tokens: int = 4096,
) -> JsonObject:
    """One provider entry for pi's ``models.json`` pointing at an
    OpenAI-compatible server (``api: openai-completions``).

    ``api_key`` is sent as ``Authorization: Bearer <key>``; pi requires one
    for custom providers even when the server ignores it. pi first looks the
    value up as an environment variable *name* (any value, not only
    upper-case ones) and uses it literally only if no such variable is set;
    a leading ``!`` makes it a shell command.
    """
    return {
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": api_key,
        "models": [
            {
                "id": model_id,
                "name": model_name or model_id,
                "contextWindow": context_window,
                "maxTokens": max_tokens,
                "reasoning": False,
                "input": ["text"],
            }
        ],
    }
