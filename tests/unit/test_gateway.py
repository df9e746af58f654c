"""The model gateway, against fake providers on loopback.

Each fake upstream records exactly what reached it, so the tests can check
that the real key was added, the guest's placeholder removed, and that a
streamed answer passes through as it is produced.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from yarl import URL

from piwork.config import repo_root
from piwork.models.providers import (
    GUEST_PLACEHOLDER_KEY,
    Provider,
    render_guest_models_json,
)
from piwork.pack.node import pi_node
from piwork.proxy.gateway import ModelGateway
from tests.helpers.gateway import (
    ANTHROPIC_KEY,
    GOOGLE_KEY,
    KEYS,
    OPENAI_KEY,
    PLACEHOLDER_AUTH,
    World,
    _dict_keys,
)


async def read_until(
    content: aiohttp.StreamReader, marker: bytes, got: bytearray, timeout: float = 5.0
) -> None:
    async def _read() -> None:
        while marker not in got:
            chunk = await content.readany()
            if not chunk:
                raise AssertionError(f"stream ended before {marker!r}: {bytes(got)!r}")
            got.extend(chunk)

    await asyncio.wait_for(_read(), timeout)


# --- the key goes in, the placeholder goes out -------------------------------


async def test_openai_request_gets_real_key_and_loses_placeholder(world: World) -> None:
    async with world.client.get(
        world.url("/p/openai-test/v1/models?key=guest-sent-this&limit=5"),
        headers={**PLACEHOLDER_AUTH, "x-api-key": GUEST_PLACEHOLDER_KEY, "X-Keep": "yes"},
    ) as resp:
        assert resp.status == 200
        assert await resp.json() == {"data": [{"id": "gpt-test"}]}
    [seen] = world.openai.seen
    assert seen.path == "/v1/models"
    assert seen.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "x-api-key" not in seen.headers
    assert seen.query == {"limit": "5"}  # the guest's ?key= is gone
    assert "x-keep" not in seen.headers  # only the headers pi's SDKs send pass
    assert GUEST_PLACEHOLDER_KEY not in json.dumps(seen.headers)


async def test_anthropic_request_uses_x_api_key_not_bearer(world: World) -> None:
    async with world.client.post(
        world.url("/p/anthropic-test/v1/messages"),
        headers={
            "x-api-key": GUEST_PLACEHOLDER_KEY,
            "anthropic-version": "2023-06-01",
            "Authorization": "Bearer something-else",
        },
        json={"model": "claude-test", "stream": True, "messages": []},
    ) as resp:
        world.anthropic.gate.set()
        assert resp.status == 200
        await resp.read()
    [seen] = world.anthropic.seen
    assert seen.headers["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in seen.headers
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert json.loads(seen.body)["model"] == "claude-test"


async def test_google_uses_goog_header_and_keeps_alt_sse(world: World) -> None:
    async with world.client.post(
        world.url("/p/google-test/v1beta/models/gemini-test:streamGenerateContent?alt=sse"),
        headers={"x-goog-api-key": GUEST_PLACEHOLDER_KEY},
        json={"contents": []},
    ) as resp:
        assert resp.status == 200
        assert b"Hallo" in await resp.read()
    [seen] = world.google.seen
    assert seen.path == "/v1beta/models/gemini-test:streamGenerateContent"
    assert seen.query == {"alt": "sse"}
    assert seen.headers["x-goog-api-key"] == GOOGLE_KEY
    [rec] = world.usage
    assert (rec.provider, rec.model, rec.input_tokens, rec.output_tokens) == (
        "google-test",
        "gemini-test",
        9,
        4,
    )


async def test_keyless_provider_sends_no_credential_at_all(world: World) -> None:
    async with world.client.get(
        world.url("/p/piwork-demo/v1/models"), headers=PLACEHOLDER_AUTH
    ) as r:
        assert r.status == 200
    [seen] = world.demo.seen
    assert "authorization" not in seen.headers
    assert GUEST_PLACEHOLDER_KEY not in json.dumps(seen.headers)


async def test_unknown_header_carrying_the_placeholder_is_dropped(world: World) -> None:
    async with world.client.get(
        world.url("/p/openai-test/v1/models"),
        headers={"X-Portkey-Api-Key": GUEST_PLACEHOLDER_KEY, "Connection": "x-hop", "X-Hop": "1"},
    ) as resp:
        assert resp.status == 200
    [seen] = world.openai.seen
    assert "x-portkey-api-key" not in seen.headers
    assert "x-hop" not in seen.headers  # named in Connection: hop-by-hop


# --- nothing the guest can read holds a key ------------------------------------


async def test_rendered_models_json_never_holds_a_key(world: World) -> None:
    rendered = json.dumps(render_guest_models_json(world.providers))
    for key in KEYS.values():
        assert key not in rendered
    assert GUEST_PLACEHOLDER_KEY in rendered


async def test_upstream_error_echoing_the_key_is_scrubbed(world: World) -> None:
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "bad-key", "stream": True, "messages": []},
    ) as resp:
        raw = await resp.read()
        headers = json.dumps(dict(resp.headers))
    assert resp.status == 401
    assert OPENAI_KEY not in raw.decode() and OPENAI_KEY not in headers
    message = json.loads(raw)["error"]["message"]
    assert "rejected the API key" in message
    assert "piwork auth set openai-test" in message
    assert "Incorrect API key provided: [redacted]" in message


async def test_streamed_responses_never_hold_a_key(world: World) -> None:
    world.openai.gate.set()
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "gpt-test", "stream": True, "messages": []},
    ) as resp:
        seen = (await resp.read()).decode() + json.dumps(dict(resp.headers))
    for key in KEYS.values():
        assert key not in seen


# --- streaming -------------------------------------------------------------------------


async def test_openai_sse_arrives_incrementally(world: World) -> None:
    """The upstream holds chunk 2 back until chunk 1 came out of the gateway."""
    got = bytearray()
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "gpt-test", "stream": True, "messages": []},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        await read_until(resp.content, b"Hello", got)
        assert b" world" not in got
        world.openai.gate.set()
        await read_until(resp.content, b"[DONE]", got)
    assert not world.openai.gate_timed_out
    assert b" world" in got


async def test_anthropic_sse_arrives_incrementally_and_usage_is_recorded(world: World) -> None:
    got = bytearray()
    async with world.client.post(
        world.url("/p/anthropic-test/v1/messages"),
        headers={"x-api-key": GUEST_PLACEHOLDER_KEY},
        json={"model": "claude-test", "stream": True, "messages": []},
    ) as resp:
        await read_until(resp.content, b"Bonjour", got)
        assert b"monde" not in got
        world.anthropic.gate.set()
        await read_until(resp.content, b"message_stop", got)
        await resp.read()
    assert not world.anthropic.gate_timed_out
    [rec] = world.usage
    assert rec.task_id == "t-1"
    assert (rec.provider, rec.model) == ("anthropic-test", "claude-test")
    assert (rec.input_tokens, rec.output_tokens) == (11, 7)
    assert (rec.cache_read_tokens, rec.cache_write_tokens) == (3, 2)
    assert rec.cost_usd is None  # no prices known for this model


async def test_openai_usage_chunk_is_recorded_with_cost(world: World) -> None:
    world.openai.gate.set()
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "gpt-test", "stream": True, "messages": []},
    ) as resp:
        await resp.read()
    [rec] = world.usage
    assert (rec.input_tokens, rec.cache_read_tokens, rec.output_tokens) == (600, 400, 20)
    assert rec.cost_usd == pytest.approx((600 * 2.0 + 20 * 8.0 + 400 * 0.5) / 1e6)
    assert world.gateway.totals.requests == 1
    assert world.gateway.totals.output_tokens == 20


async def test_non_streamed_json_usage_is_recorded(world: World) -> None:
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "gpt-test", "messages": []},
    ) as resp:
        assert (await resp.json())["choices"][0]["message"]["content"] == "hi"
    [rec] = world.usage
    assert (rec.input_tokens, rec.output_tokens) == (5, 2)


async def test_chunked_request_body_is_relayed(world: World) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"model": "gpt-test", '
        await asyncio.sleep(0.01)
        yield b'"messages": [], "stream": false}'

    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"), headers=PLACEHOLDER_AUTH, data=body()
    ) as resp:
        assert resp.status == 200
    assert json.loads(world.openai.seen[0].body) == {
        "model": "gpt-test",
        "messages": [],
        "stream": False,
    }


# --- readable errors -------------------------------------------------------------


async def _post_error(world: World, model: str) -> tuple[int, dict[str, Any], str]:
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": model, "stream": True, "messages": []},
    ) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After", "")


async def test_rate_limit_becomes_readable_and_keeps_retry_after(world: World) -> None:
    status, body, retry = await _post_error(world, "rate-limited")
    assert (status, retry) == (429, "7")
    assert body["error"]["message"].startswith("openai-test rate limit or quota exceeded")
    assert "retry after 7 s" in body["error"]["message"]


async def test_unknown_model_becomes_readable(world: World) -> None:
    status, body, _ = await _post_error(world, "no-such-model")
    assert status == 404
    assert "no-such-model" in body["error"]["message"]
    assert "does not exist" in body["error"]["message"]


async def test_anthropic_errors_use_anthropic_shape_with_top_level_message(world: World) -> None:
    bad = dict(KEYS, **{"anthropic-test": "sk-ant-wrong"})

    async def keys(name: str) -> str | None:
        return bad.get(name)

    async with (
        ModelGateway(world.providers, keys) as gw,
        world.client.post(
            f"{gw.url}/p/anthropic-test/v1/messages",
            headers={"x-api-key": GUEST_PLACEHOLDER_KEY},
            json={"model": "claude-test", "messages": []},
        ) as resp,
    ):
        body = await resp.json()
    assert resp.status == 401
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "invalid x-api-key" in body["message"]
    assert "piwork auth set anthropic-test" in body["message"]


async def test_missing_key_is_refused_before_contacting_provider(world: World) -> None:
    async def no_keys(name: str) -> str | None:
        return None

    async with (
        ModelGateway(world.providers, no_keys) as gw,
        world.client.post(
            f"{gw.url}/p/openai-test/v1/chat/completions",
            headers=PLACEHOLDER_AUTH,
            json={"model": "gpt-test", "messages": []},
        ) as resp,
    ):
        body = await resp.json()
    assert resp.status == 401
    assert "piwork auth set openai-test" in body["error"]["message"]
    assert world.openai.seen == []


async def test_unreachable_provider_is_a_readable_502(world: World) -> None:
    dead = Provider(
        name="dead",
        api="openai-completions",
        base_url="http://127.0.0.1:9/v1",
        auth="none",
        key_required=False,
    )
    async with (
        ModelGateway([dead], _dict_keys, connect_timeout=2.0) as gw,
        world.client.post(
            f"{gw.url}/p/dead/v1/chat/completions", json={"model": "m", "messages": []}
        ) as resp,
    ):
        body = await resp.json()
    assert resp.status == 502
    assert "could not reach dead at http://127.0.0.1:9" in body["error"]["message"]


async def test_slow_provider_is_a_readable_504(world: World) -> None:
    status, body, _ = await _post_error(world, "slow")
    assert status == 504
    assert "did not answer in time" in body["error"]["message"]


async def test_upstream_stalling_mid_stream_cuts_the_guest_connection(world: World) -> None:
    """After the status line is sent, a stall can only be reported by closing."""
    got = bytearray()
    async with world.client.post(
        world.url("/p/openai-test/v1/chat/completions"),
        headers=PLACEHOLDER_AUTH,
        json={"model": "gpt-test", "stream": True},
    ) as resp:
        assert resp.status == 200
        await read_until(resp.content, b"Hello", got)
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.read(), 5)  # read_timeout is 1 s; gate never opens


async def test_unknown_provider_is_404_naming_the_known_ones(world: World) -> None:
    async with world.client.get(world.url("/p/nope/v1/models")) as resp:
        body = await resp.json()
    assert resp.status == 404
    assert "unknown provider 'nope'" in body["error"]["message"]
    assert "openai-test" in body["error"]["message"]


async def test_paths_outside_the_provider_prefix_are_refused(world: World) -> None:
    async with world.client.get(world.url("/p/openai-test/admin")) as resp:
        assert resp.status == 404
    async with world.client.get(
        URL(world.url("/p/openai-test/v1/%2e%2e/admin"), encoded=True)
    ) as resp:
        assert resp.status == 400
    assert world.openai.seen == []


# --- the task token ---------------------------------------------------------------


async def test_guest_token_is_required_when_configured_and_never_forwarded(world: World) -> None:
    token = "piwork-task-token-abc123"
    async with ModelGateway(world.providers, _dict_keys, guest_token=token) as gw:
        async with world.client.get(f"{gw.url}/p/openai-test/v1/models") as resp:
            assert resp.status == 401
        async with world.client.get(
            f"{gw.url}/p/openai-test/v1/models", headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            assert resp.status == 200
    [seen] = world.openai.seen
    assert seen.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert token not in json.dumps(seen.headers)


async def test_sync_key_provider_is_supported(world: World) -> None:
    calls: list[str] = []

    def sync_keys(name: str) -> str | None:
        calls.append(name)
        return KEYS.get(name)

    async with (
        ModelGateway(world.providers, sync_keys) as gw,
        world.client.get(f"{gw.url}/p/openai-test/v1/models") as resp,
    ):
        assert resp.status == 200
    assert calls == ["openai-test"]


# --- models.json and the gateway agree --------------------------------------------


async def test_rendered_base_urls_route_to_the_paths_pi_would_have_used(world: World) -> None:
    """pi appends its API path to ``baseUrl``; the upstream must see the real one."""
    rendered = render_guest_models_json(world.providers, gateway_base=world.gateway.url)
    base = {name: entry["baseUrl"] for name, entry in rendered["providers"].items()}
    for fake in (world.openai, world.anthropic, world.demo):
        fake.gate.set()
    calls = [
        (f"{base['openai-test']}/chat/completions", world.openai, "/v1/chat/completions"),
        (f"{base['anthropic-test']}/v1/messages", world.anthropic, "/v1/messages"),
        (
            f"{base['google-test']}/models/g:streamGenerateContent?alt=sse",
            world.google,
            "/v1beta/models/g:streamGenerateContent",
        ),
        (f"{base['piwork-demo']}/chat/completions", world.demo, "/v1/chat/completions"),
    ]
    for url, fake, upstream_path in calls:
        body = {"contents": []} if fake is world.google else {"model": "gpt-test", "stream": True}
        async with world.client.post(url, headers=PLACEHOLDER_AUTH, json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        assert fake.seen[-1].path == upstream_path


PI_AI_CANDIDATES = (
    # pi 1.x keeps the old api-dispatching complete()/completeSimple() in compat.js.
    repo_root() / "runtime-pack/pi/node_modules/@earendil-works/pi-ai/dist/compat.js",
    repo_root() / "runtime-pack/pi/node_modules/@mariozechner/pi-ai/dist/index.js",
)
PI_AI = next((p for p in PI_AI_CANDIDATES if p.exists()), PI_AI_CANDIDATES[-1])
PROBE = """
const [piAi, specJson] = process.argv.slice(2);
const { completeSimple } = await import(piAi);
const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA" +
  "hKmMIQAAAABJRU5ErkJggg==";
const out = [];
for (const s of JSON.parse(specJson)) {
  const model = { id: s.model, name: s.model, api: s.api, provider: s.provider,
    baseUrl: s.baseUrl, reasoning: true, input: ["text", "image"], contextWindow: 100000,
    maxTokens: 1000, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 } };
  const usage = { input: 1, output: 1, cacheRead: 0, cacheWrite: 0, totalTokens: 2,
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
  const t = Date.now();
  const responses = s.api === "openai-responses";
  const id = (n) => (responses ? `call_${n}|fc_${n}` : `call_${n}`);
  // What a coding session holds: a system prompt, tools, an image, thinking with its
  // signature, two tool calls and their results (one with an image), another prompt.
  const signature = responses
    ? JSON.stringify({ type: "reasoning", id: "rs_1", encrypted_content: "enc",
        summary: [{ type: "summary_text", text: "let me think" }] })
    : s.api === "openai-completions" ? "reasoning_content" : "c2lnbmF0dXJl";
  const assistant = { role: "assistant", api: s.api, provider: s.provider, model: s.model,
    usage, stopReason: "toolUse", timestamp: t, content: [
      { type: "thinking", thinking: "let me think", thinkingSignature: signature },
      { type: "text", text: "I'll look" },
      { type: "toolCall", id: id(1), name: "bash", arguments: { command: "ls" } },
      { type: "toolCall", id: id(2), name: "read", arguments: { path: "x.png" } },
    ] };
  const context = { systemPrompt: "You are a coding agent.", tools: [
      { name: "bash", description: "run a command", parameters: { type: "object",
        properties: { command: { type: "string" } }, required: ["command"] } },
      { name: "read", description: "read a file", parameters: { type: "object",
        properties: { path: { type: "string" } }, required: ["path"] } },
    ], messages: [
      { role: "user", timestamp: t, content: [{ type: "text", text: "hi" },
        { type: "image", mimeType: "image/png", data: png }] },
      assistant,
      { role: "toolResult", toolCallId: id(1), toolName: "bash", isError: false, timestamp: t,
        content: [{ type: "text", text: "x.png" }] },
      { role: "toolResult", toolCallId: id(2), toolName: "read", isError: false, timestamp: t,
        content: [{ type: "text", text: "an image" },
          { type: "image", mimeType: "image/png", data: png }] },
      { role: "user", content: "go on", timestamp: t },
    ] };
  const simple = { role: "user", content: "hi", timestamp: t };
  for (const [ctx, reasoning] of [[{ messages: [simple] }, undefined], [context, undefined],
                                  [context, "high"]]) {
    const msg = await completeSimple(model, ctx,
      { apiKey: s.apiKey, maxRetries: 0, reasoning, sessionId: "session-1" });
    out.push({ provider: s.provider, stopReason: msg.stopReason,
      errorMessage: msg.errorMessage ?? null,
      text: msg.content.filter((c) => c.type === "text").map((c) => c.text).join("") });
  }
}
console.log(JSON.stringify(out));
"""


def _require_pi() -> None:
    if not PI_AI.exists():
        pytest.fail("these tests need node and runtime-pack/pi/node_modules: run scripts/setup.sh")


needs_pi = pytest.mark.usefixtures("_pi_runtime")


@pytest.fixture
def _pi_runtime() -> None:
    _require_pi()


SDK_PROVIDERS = ("openai-test", "openai-resp-test", "anthropic-test", "google-test")


async def run_pi_sdks(gateway: ModelGateway, providers: list[Provider], tmp_path: Any) -> Any:
    """Ask each provider once through pi-ai's own clients, as configured for the guest."""
    rendered = render_guest_models_json(providers, gateway_base=gateway.url)
    specs = [
        {
            "provider": name,
            "api": entry["api"],
            "baseUrl": entry["baseUrl"],
            "model": entry["models"][0]["id"],
            "apiKey": entry["apiKey"],
        }
        for name, entry in rendered["providers"].items()
        if name in SDK_PROVIDERS
    ]
    probe = tmp_path / "probe.mjs"
    probe.write_text(PROBE)
    proc = await asyncio.create_subprocess_exec(
        pi_node(repo_root()),  # the node pi needs (pi 1.x: >= 22.19), the pinned one here
        str(probe),
        PI_AI.as_uri(),
        json.dumps(specs),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    results: dict[str, Any] = {}
    for r in json.loads(out):  # every call of a provider must end the same way
        assert results.setdefault(r["provider"], r) == r, (results[r["provider"]], r)
    return results


@needs_pi
async def test_pis_own_sdks_talk_through_the_gateway(world: World, tmp_path: Any) -> None:
    """pi-ai's real clients, given the rendered baseUrl and the placeholder: a plain
    prompt, and a session with tools, images, thinking and tool results, with and
    without reasoning. All pass the gateway's body, header and query allowlists."""
    for fake in (world.openai, world.anthropic, world.google):
        fake.gate.set()
    results = await run_pi_sdks(world.gateway, world.providers, tmp_path)
    assert results["openai-test"]["text"] == "Hello world", results
    assert results["anthropic-test"]["text"] == "Bonjour monde", results
    assert results["google-test"]["text"] == "Hallo", results
    assert results["openai-resp-test"]["text"] == "Hi there", results
    resp_usage = next(u for u in world.usage if u.provider == "openai-resp-test")
    assert (resp_usage.model, resp_usage.input_tokens, resp_usage.cache_read_tokens) == (
        "gpt-resp",
        40,
        10,
    )
    assert resp_usage.output_tokens == 5
    assert {r["errorMessage"] for r in results.values()} == {None}
    assert world.openai.seen[-1].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert world.anthropic.seen[-1].headers["x-api-key"] == ANTHROPIC_KEY
    assert world.google.seen[-1].headers["x-goog-api-key"] == GOOGLE_KEY
    for fake in (world.openai, world.anthropic, world.google):
        assert GUEST_PLACEHOLDER_KEY not in json.dumps(fake.seen[-1].headers)


@needs_pi
async def test_pi_shows_gateway_errors_as_sentences(world: World, tmp_path: Any) -> None:
    async def no_keys(name: str) -> str | None:
        return None

    async with ModelGateway(world.providers, no_keys) as gateway:
        results = await run_pi_sdks(gateway, world.providers, tmp_path)
    assert set(results) == set(SDK_PROVIDERS)
    for name, result in results.items():
        assert result["stopReason"] == "error", result
        assert f"No API key for provider '{name}'" in result["errorMessage"], result
        assert "piwork auth set" in result["errorMessage"], result


# --- one task, one provider, one model; every response counted ------------------------


async def test_only_the_allowed_model_goes_upstream_even_in_a_chunked_body(world: World) -> None:
    gateway = ModelGateway(
        [world.providers[0]], _dict_keys, allowed_models=("gpt-test",), read_timeout=1.0
    )

    def body(model: str) -> Any:
        async def gen() -> AsyncIterator[bytes]:
            yield b'{"messages": [], "stream": false, '
            await asyncio.sleep(0.01)
            yield f'"model": "{model}"}}'.encode()

        return gen()

    async with gateway:
        for model, status in (("gpt-pricey", 403), ("gpt-test", 200)):
            async with world.client.post(
                f"{gateway.url}/p/openai-test/v1/chat/completions",
                headers=PLACEHOLDER_AUTH,
                data=body(model),
            ) as resp:
                assert resp.status == status, await resp.text()
        async with world.client.post(
            f"{gateway.url}/p/anthropic-test/v1/messages", headers=PLACEHOLDER_AUTH, json={}
        ) as resp:
            assert resp.status == 404  # another provider is not routed at all
    assert [json.loads(s.body)["model"] for s in world.openai.seen] == ["gpt-test"]
    assert world.anthropic.seen == []


async def test_a_response_without_readable_usage_is_counted_by_estimate(world: World) -> None:
    async with world.client.get(
        world.url("/p/openai-test/v1/models"), headers=PLACEHOLDER_AUTH
    ) as r:
        assert r.status == 200
        size = len(await r.read())
    [rec] = world.usage
    assert rec.estimated and rec.output_tokens == -(-size // 4) and rec.output_tokens > 0


async def test_a_refusing_admit_keeps_requests_from_going_upstream(world: World) -> None:
    verdict: list[str | None] = ["this task reached its tokens limit"]
    gateway = ModelGateway([world.providers[0]], _dict_keys, admit=lambda: verdict[0])

    async def call() -> tuple[int, str]:
        async with world.client.post(
            f"{gateway.url}/p/openai-test/v1/chat/completions",
            headers=PLACEHOLDER_AUTH,
            json={"model": "gpt-test", "messages": []},
        ) as resp:
            return resp.status, await resp.text()

    async with gateway:
        status, text = await call()
        assert status == 429 and "tokens limit" in text
        assert world.openai.seen == []
        verdict[0] = None  # the limit was raised
        assert (await call())[0] == 200
    assert len(world.openai.seen) == 1


async def test_concurrent_model_requests_are_capped(world: World) -> None:
    """Every request is admitted before any reports usage: a cap bounds the overshoot."""
    gateway = ModelGateway([world.providers[0]], _dict_keys, max_concurrent=2, read_timeout=5.0)
    body = {"model": "gpt-test", "stream": True, "messages": []}
    async with gateway:
        url = f"{gateway.url}/p/openai-test/v1/chat/completions"
        held = [
            await world.client.post(url, headers=PLACEHOLDER_AUTH, json=body) for _ in range(2)
        ]  # both stream their first chunk, then wait on the upstream's gate
        async with world.client.post(url, headers=PLACEHOLDER_AUTH, json=body) as third:
            assert third.status == 429
            assert "at most 2" in await third.text()
        assert len(world.openai.seen) == 2
        world.openai.gate.set()
        for resp in held:
            await resp.read()
            resp.release()
        async with world.client.post(url, headers=PLACEHOLDER_AUTH, json=body) as fourth:
            assert fourth.status == 200
            await fourth.read()


# --- keys scoped by endpoint (SECURITY-REVIEW.md finding 3) ----------------------------

NOT_MODEL_CALLS = (
    # The review's reproduction: body-less requests that reached Anthropic with the key.
    ("anthropic-test", "GET", "/v1/messages/batches", None),
    ("anthropic-test", "GET", "/v1/messages/batches/msgbatch_1/results", None),
    ("anthropic-test", "POST", "/v1/messages/batches/msgbatch_1/cancel", None),
    ("anthropic-test", "DELETE", "/v1/files/file_1", None),
    ("anthropic-test", "POST", "/v1/messages/count_tokens", {"model": "claude-test"}),
    ("anthropic-test", "POST", "/v1/messages/", {"model": "claude-test"}),
    ("anthropic-test", "HEAD", "/v1/models", None),
    ("openai-test", "GET", "/v1/files", None),
    ("openai-test", "GET", "/v1/files/file-1/content", None),
    ("openai-test", "DELETE", "/v1/files/file-1", None),
    ("openai-test", "POST", "/v1/batches/batch_1/cancel", None),
    ("openai-test", "DELETE", "/v1/vector_stores/vs_1", None),
    ("openai-test", "POST", "/v1/batches", {"model": "gpt-test"}),
    ("openai-test", "GET", "/v1/models/gpt-test/../../files", None),
    ("openai-test", "GET", "/v1/models/x%2F..%2F..%2Ffiles", None),
    ("openai-test", "GET", "/v1//chat/completions", None),
    ("google-test", "GET", "/v1beta/files", None),
    ("google-test", "DELETE", "/v1beta/cachedContents/c1", None),
    ("google-test", "POST", "/v1beta/models/gemini-test:batchGenerateContent", {"x": 1}),
    ("google-test", "GET", "/v1beta/tunedModels", None),
)


@pytest.mark.parametrize(("provider", "method", "path", "body"), NOT_MODEL_CALLS)
async def test_only_model_calls_reach_the_provider_with_the_key(
    world: World, provider: str, method: str, path: str, body: Any
) -> None:
    async with world.client.request(
        method,
        URL(world.url(f"/p/{provider}{path}"), encoded=True),
        headers=PLACEHOLDER_AUTH,
        json=body,
    ) as resp:
        assert resp.status in (400, 403), (resp.status, await resp.text())
        if method != "HEAD" and resp.status == 403:
            assert "is not a model call" in (await resp.json())["error"]["message"]
    assert world.openai.seen == world.anthropic.seen == world.google.seen == []


async def test_every_model_call_names_an_allowed_model(world: World) -> None:
    """With a task's model set, a call without a model (or with another) never goes up."""
    [anthropic] = [p for p in world.providers if p.name == "anthropic-test"]
    async with ModelGateway([anthropic], _dict_keys, allowed_models=("claude-test",)) as gw:
        cases: list[tuple[str, str, Any, int]] = [
            ("POST", "/v1/messages", None, 400),  # body-less: the review's bypass
            ("POST", "/v1/messages", {"messages": []}, 403),  # no model named
            ("POST", "/v1/messages", {"model": "claude-opus"}, 403),
            ("GET", "/v1/models/claude-opus", None, 403),
            ("GET", "/v1/models", None, 200),  # model listing goes up
        ]
        for method, path, body, status in cases:
            async with world.client.request(
                method, f"{gw.url}/p/anthropic-test{path}", headers=PLACEHOLDER_AUTH, json=body
            ) as resp:
                assert resp.status == status, (method, path, body, await resp.text())
    assert [(s.method, s.path) for s in world.anthropic.seen] == [("GET", "/v1/models")]
    assert world.anthropic.seen[0].headers["x-api-key"] == ANTHROPIC_KEY
