"""A fake upstream for the model gateway: OpenAI, Anthropic and Google speaking their
wire protocols on loopback, with the real keys the gateway must add (``world``
fixture, tests/unit/conftest.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from piwork.models.providers import (
    GUEST_PLACEHOLDER_KEY,
    Provider,
)
from piwork.proxy.gateway import ModelGateway, UsageRecord

OPENAI_KEY = "sk-test-openai-REAL-0123456789abcdef"


ANTHROPIC_KEY = "sk-ant-api03-REAL-fedcba9876543210"


GOOGLE_KEY = "AIzaSy-REAL-google-key-000111"


KEYS = {"openai-test": OPENAI_KEY, "anthropic-test": ANTHROPIC_KEY, "google-test": GOOGLE_KEY}


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeUpstream:
    """An aiohttp server playing a provider. ``gate`` holds the second chunk back."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    gate_timed_out: bool = False

    async def record(self, request: web.Request) -> Seen:
        seen = Seen(
            request.method,
            request.path,
            dict(request.query),
            {k.lower(): v for k, v in request.headers.items()},
            await request.read(),
        )
        self.seen.append(seen)
        return seen

    async def wait_gate(self) -> None:
        try:
            await asyncio.wait_for(self.gate.wait(), 10)
        except TimeoutError:
            self.gate_timed_out = True


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n".encode()


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _openai_error(status: int, message: str, code: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": code, "code": code}}, status=status
    )


async def openai_app(fake: FakeUpstream) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        seen = await fake.record(request)
        body = json.loads(seen.body)
        model = body["model"]
        presented = seen.headers.get("authorization", "")[len("Bearer ") :]
        if model == "bad-key":  # real providers echo (part of) the key back
            return _openai_error(
                401, f"Incorrect API key provided: {presented}.", "invalid_api_key"
            )
        if model == "rate-limited":
            limited = _openai_error(429, "Rate limit reached for requests", "rate_limit_exceeded")
            limited.headers["Retry-After"] = "7"
            return limited
        if model == "no-such-model":
            return _openai_error(404, f"The model `{model}` does not exist", "model_not_found")
        if model == "slow":
            await asyncio.sleep(5)
        if not body.get("stream"):
            return web.json_response(
                {
                    "choices": [{"message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delta = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model}
        await resp.write(sse({**delta, "choices": [{"index": 0, "delta": {"content": "Hello"}}]}))
        await fake.wait_gate()
        await resp.write(sse({**delta, "choices": [{"index": 0, "delta": {"content": " world"}}]}))
        await resp.write(
            sse({**delta, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            + sse(
                {
                    **delta,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 1000,
                        "completion_tokens": 20,
                        "prompt_tokens_details": {"cached_tokens": 400},
                    },
                }
            )
            + sse("[DONE]")
        )
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        await fake.record(request)
        return web.json_response({"data": [{"id": "gpt-test"}]})

    async def responses(request: web.Request) -> web.StreamResponse:
        await fake.record(request)
        item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {"id": "resp_1"}},
            {"type": "response.output_item.added", "item": {**item, "content": []}},
            {"type": "response.content_part.added", "part": {"type": "output_text", "text": ""}},
            {"type": "response.output_text.delta", "delta": "Hi"},
            {"type": "response.output_text.delta", "delta": " there"},
            {
                "type": "response.output_item.done",
                "item": {**item, "content": [{"type": "output_text", "text": "Hi there"}]},
            },
            {
                "type": "response.completed",
                "response": {
                    "id": "resp_1",
                    "status": "completed",
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 5,
                        "total_tokens": 55,
                        "input_tokens_details": {"cached_tokens": 10},
                    },
                },
            },
        ]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(sse(event, event["type"]))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/responses", responses)
    app.router.add_route("*", "/{tail:.*}", models)
    return app


async def anthropic_app(fake: FakeUpstream) -> web.Application:
    async def messages(request: web.Request) -> web.StreamResponse:
        seen = await fake.record(request)
        if seen.headers.get("x-api-key") != ANTHROPIC_KEY:
            return web.json_response(
                {
                    "type": "error",
                    "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                },
                status=401,
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-test",
                        "content": [],
                        "stop_reason": None,
                        "usage": {
                            "input_tokens": 11,
                            "cache_read_input_tokens": 3,
                            "cache_creation_input_tokens": 2,
                            "output_tokens": 1,
                        },
                    },
                },
                "message_start",
            )
            + sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
            + sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Bonjour"},
                },
                "content_block_delta",
            )
        )
        await fake.wait_gate()
        await resp.write(
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": " monde"},
                },
                "content_block_delta",
            )
            + sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            + sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 7},
                },
                "message_delta",
            )
            + sse({"type": "message_stop"}, "message_stop")
        )
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    app.router.add_route("*", "/{tail:.*}", anything(fake))  # batches, files, ...
    return app


def anything(fake: FakeUpstream) -> Any:
    """A provider endpoint pi never calls: it answers (as the real one would), and records."""

    async def handler(request: web.Request) -> web.Response:
        await fake.record(request)
        return web.json_response({"data": [{"id": "batch-result-of-another-project"}]})

    return handler


async def google_app(fake: FakeUpstream) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        await fake.record(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            sse(
                {
                    "candidates": [
                        {
                            "content": {"role": "model", "parts": [{"text": "Hallo"}]},
                            "finishReason": "STOP",
                            "index": 0,
                        }
                    ],
                    "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4},
                }
            )
        )
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1beta/models/{model}", generate)
    app.router.add_route("*", "/{tail:.*}", anything(fake))
    return app


@dataclass
class World:
    openai: FakeUpstream
    anthropic: FakeUpstream
    google: FakeUpstream
    demo: FakeUpstream
    providers: list[Provider]
    gateway: ModelGateway
    usage: list[UsageRecord]
    client: aiohttp.ClientSession

    def url(self, path: str) -> str:
        return f"{self.gateway.url}{path}"


async def _dict_keys(name: str) -> str | None:
    return KEYS.get(name)


PLACEHOLDER_AUTH = {"Authorization": f"Bearer {GUEST_PLACEHOLDER_KEY}"}
