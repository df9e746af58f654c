"""A model that speaks another of its provider's APIs (pi 1.x: OpenRouter's Claude
models are anthropic-messages at https://openrouter.ai/api, the rest openai-completions
at https://openrouter.ai/api/v1) reaches the right upstream path through the gateway,
and pi's catalog (the pack's pi-models.json) says which API each model speaks."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from aiohttp import web

from piwork.config import repo_root
from piwork.models.providers import BUILTIN_PROVIDERS, Provider
from piwork.pack import node, picatalog
from piwork.pack.node import pi_node
from piwork.proxy.gateway import ModelGateway
from tests.helpers.gateway import ANTHROPIC_KEY, FakeUpstream, _serve, anthropic_app

PI_AI = repo_root() / node.PI_SOURCE / "node_modules" / node.PI_AI_PACKAGE
PROBE = """
const [piAi, modelJson, apiKey] = process.argv.slice(2);
const { completeSimple } = await import(piAi);
const model = JSON.parse(modelJson);
const msg = await completeSimple(model, { messages: [{ role: "user", content: "hi",
  timestamp: Date.now() }] }, { apiKey, maxRetries: 0 });
console.log(JSON.stringify({ stopReason: msg.stopReason, errorMessage: msg.errorMessage ?? null,
  text: msg.content.filter((c) => c.type === "text").map((c) => c.text).join("") }));
"""


def catalog() -> picatalog.PiCatalog:
    doc = picatalog.extract(PI_AI, "pinned")
    return picatalog.PiCatalog.model_validate(doc)


def test_openrouters_claude_models_speak_anthropic_messages_in_the_pinned_pi() -> None:
    """The fact the route exists for; if pi moves them back, the route is just unused."""
    or_models = catalog().models("openrouter")
    apis = {m.api for m in or_models}
    assert {"openai-completions", "anthropic-messages"} <= apis
    (openrouter,) = [p for p in BUILTIN_PROVIDERS if p.name == "openrouter"]
    assert set(apis) <= {openrouter.api, *openrouter.alt_apis}, apis


def test_every_api_of_the_builtin_providers_models_is_carried() -> None:
    cat = catalog()
    for provider in BUILTIN_PROVIDERS:
        for m in cat.models(provider.name):
            assert provider.route(m.api) is not None, (provider.name, m.id, m.api)


def test_the_defaults_and_listed_models_are_in_the_pinned_pis_catalog() -> None:
    cat = catalog()
    for provider in BUILTIN_PROVIDERS:
        if not provider.pi_builtin:
            continue
        ids = {m.id for m in cat.models(provider.name)}
        assert provider.default_model in ids, (provider.name, provider.default_model)
        assert set(provider.known_models) <= ids, (provider.name, provider.known_models)


def test_a_route_is_a_sibling_with_the_same_key_and_auth() -> None:
    (openrouter,) = [p for p in BUILTIN_PROVIDERS if p.name == "openrouter"]
    assert openrouter.route("openai-completions") is openrouter
    routed = openrouter.route("anthropic-messages")
    assert routed is not None
    assert (routed.name, routed.api, routed.base_url) == (
        "openrouter-anthropic-messages",
        "anthropic-messages",
        "https://openrouter.ai/api",
    )
    assert (routed.credential_name, routed.auth) == ("openrouter", openrouter.auth)
    assert routed.gateway_base_url() == "http://10.0.2.100/p/openrouter-anthropic-messages/api"
    assert openrouter.route("google-generative-ai") is None


async def test_pi_ais_anthropic_client_reaches_the_routed_upstream_path(tmp_path: Path) -> None:
    """The real pi-ai client, given the routed baseUrl, lands on <base>/v1/messages of the
    alternate API's upstream, with the provider's key added by the gateway."""
    fake = FakeUpstream()
    root = web.Application()
    root.add_subapp("/api", await anthropic_app(fake))
    runner, url = await _serve(root)
    provider = Provider(
        name="router-test",
        api="openai-completions",
        base_url=f"{url}/api/v1",
        auth="x-api-key",
        key_name="anthropic-test",
        alt_apis={"anthropic-messages": f"{url}/api"},
    )
    routed = provider.route("anthropic-messages")
    assert routed is not None

    async def keys(name: str) -> str | None:
        return ANTHROPIC_KEY if name == "anthropic-test" else None

    try:
        async with ModelGateway(
            {p.name: p for p in (provider, routed)}, keys, task_id="t", allowed_models=("c-1",)
        ) as gateway:
            free = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
            model = {"id": "c-1", "name": "c-1", "api": "anthropic-messages",
                     "provider": "router-test", "baseUrl": routed.gateway_base_url(gateway.url),
                     "reasoning": False, "input": ["text"], "contextWindow": 1000,
                     "maxTokens": 100, "cost": free}  # fmt: skip
            probe = tmp_path / "probe.mjs"
            probe.write_text(PROBE)
            proc = await asyncio.create_subprocess_exec(
                pi_node(repo_root()),
                str(probe),
                (PI_AI / "dist" / "compat.js").as_uri(),
                json.dumps(model),
                "piwork-gateway-placeholder",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await runner.cleanup()
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["stopReason"] == "stop", result
    assert [s.path for s in fake.seen] == ["/api/v1/messages"]
    assert fake.seen[0].headers["x-api-key"] == ANTHROPIC_KEY
