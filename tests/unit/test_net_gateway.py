"""Model calls through the upstream proxy, over TLS signed by a CA the host adds.

The provider is a scripted model server behind TLS for ``model.test``, a name
only the test's proxies resolve (as a company proxy resolves names the host
cannot); its certificate comes from a test CA (trustme) that piwork trusts only
as an added CA. The proxies must see the CONNECT/SOCKS target and encrypted
bytes, never the key.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme

from piwork.models.providers import Provider
from piwork.models.scripted import ScriptedModelServer, Text
from piwork.net import cas as netcas
from piwork.net.upstream import ProxyKind, Upstream, UpstreamProxy, gateway_connector
from piwork.proxy.gateway import ModelGateway
from tests.helpers.net import HttpConnectProxy, Socks5Proxy, TlsFront

SECRET = "sk-upstream-test-0123456789abcdef-SECRET"
TOKEN = "guest-token-for-this-test"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA(organization_name="piwork test inspecting CA")


@pytest.fixture
async def tls_model(ca: trustme.CA) -> AsyncIterator[tuple[ScriptedModelServer, TlsFront]]:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("model.test").configure_cert(server_ctx)
    server = ScriptedModelServer([Text("hello through the proxy")], api_key=SECRET)
    async with server:
        front = TlsFront(server.port, server_ctx)
        async with front:
            yield server, front


def provider_at(server: ScriptedModelServer, front: TlsFront) -> Provider:
    base = server.as_provider("corp", name="corp model")
    return base.model_copy(
        update={
            "base_url": f"https://model.test:{front.port}/v1",
            "auth": "bearer",
            "key_required": True,
        }
    )


def trusted(ca: trustme.CA, tmp_path: Path) -> ssl.SSLContext:
    pem = tmp_path / "inspecting-ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    certs, notes = netcas.parse_certs(pem.read_bytes(), "test")
    assert certs and not notes
    return netcas.ssl_context(certs)


async def call(gateway: ModelGateway, provider: Provider) -> tuple[int, str]:
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{gateway.url}/p/{provider.name}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as r,
    ):
        return r.status, await r.text()


def gateway_for(provider: Provider, upstream: Upstream, ctx: ssl.SSLContext) -> ModelGateway:
    return ModelGateway(
        [provider],
        lambda name: SECRET,
        guest_token=TOKEN,
        allowed_models=("scripted",),
        connector=lambda: gateway_connector(upstream, provider.upstream_origin, lambda: ctx),
    )


@pytest.mark.parametrize("kind", ["http", "socks5h"])
async def test_model_calls_tunnel_through_the_proxy_and_it_never_sees_the_key(
    kind: str,
    tls_model: tuple[ScriptedModelServer, TlsFront],
    ca: trustme.CA,
    tmp_path: Path,
) -> None:
    server, front = tls_model
    provider = provider_at(server, front)
    proxy_server = (
        HttpConnectProxy(hosts={"model.test": "127.0.0.1"}, credentials=("alice", "pw"))
        if kind == "http"
        else Socks5Proxy(hosts={"model.test": "127.0.0.1"}, credentials=("alice", "pw"))
    )
    async with proxy_server:
        proxy = UpstreamProxy(ProxyKind(kind), "127.0.0.1", proxy_server.port, "alice", "pw")
        async with gateway_for(provider, Upstream(proxy, proxy), trusted(ca, tmp_path)) as gw:
            status, text = await call(gw, provider)
    assert status == 200, text
    assert "hello through the proxy" in text
    assert server.chat_requests[-1].headers.get("authorization") == f"Bearer {SECRET}"
    log = proxy_server.log
    assert log.targets == [("model.test", front.port)]
    if kind == "http":
        assert log.heads == [f"CONNECT model.test:{front.port} HTTP/1.1"]
    assert len(log.seen) > 500  # the TLS handshake and the request went through it
    for secret in (SECRET, TOKEN, "chat/completions"):
        assert secret.encode() not in log.seen, secret


async def test_an_untrusted_certificate_says_how_to_trust_the_ca(
    tls_model: tuple[ScriptedModelServer, TlsFront],
) -> None:
    server, front = tls_model
    provider = provider_at(server, front)
    async with HttpConnectProxy(hosts={"model.test": "127.0.0.1"}) as proxy_server:
        proxy = UpstreamProxy(ProxyKind.HTTP, "127.0.0.1", proxy_server.port)
        async with gateway_for(provider, Upstream(proxy, proxy), netcas.ssl_context([])) as gw:
            status, text = await call(gw, provider)
    assert status == 502, text
    assert "certificate of model.test is not trusted" in text
    assert "piwork network ca add FILE" in text
    assert server.chat_requests == []


async def test_a_refusing_proxy_is_named_in_the_models_error(
    tls_model: tuple[ScriptedModelServer, TlsFront], ca: trustme.CA, tmp_path: Path
) -> None:
    server, front = tls_model
    provider = provider_at(server, front)
    async with HttpConnectProxy(refuse=frozenset({"model.test"})) as proxy_server:
        proxy = UpstreamProxy(ProxyKind.HTTP, "127.0.0.1", proxy_server.port, source="$HTTPS_PROXY")
        async with gateway_for(provider, Upstream(proxy, proxy), trusted(ca, tmp_path)) as gw:
            status, text = await call(gw, provider)
    assert status == 502, text
    assert f"upstream proxy {proxy.url} refused model.test:{front.port}" in text
    assert "403 Forbidden by the test proxy" in text
    assert SECRET not in text


async def test_loopback_and_no_proxy_providers_go_direct() -> None:
    proxy = UpstreamProxy(ProxyKind.HTTP, "p", 1, no_proxy=("corp",))
    upstream = Upstream(proxy, proxy)
    ctx = lambda: netcas.ssl_context([])  # noqa: E731
    local = gateway_connector(upstream, "http://127.0.0.1:11434", ctx)
    corp = gateway_connector(upstream, "https://llm.corp", ctx)
    assert type(local) is aiohttp.TCPConnector and type(corp) is aiohttp.TCPConnector
    tunnel = gateway_connector(upstream, "https://api.example.com", ctx)
    assert type(tunnel) is not aiohttp.TCPConnector and isinstance(tunnel, aiohttp.TCPConnector)
    # a plain-HTTP provider is tunnelled too: its key never crosses the proxy in clear text
    plain = gateway_connector(upstream, "http://llm.example.com:8000", ctx)
    assert type(plain) is type(tunnel)
    for connector in (local, corp, tunnel, plain):
        await connector.close()
