"""The egress proxy: per-domain allow/deny for plain HTTP and CONNECT tunnels."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import aiohttp
import pytest

from piwork.proxy.egress import (
    AllowNetError,
    EgressDecision,
    EgressProxy,
    domain_allowed,
    guest_proxy_env,
    normalize_allowed_domain,
    normalize_host,
    proxy_url_with_token,
)
from tests.helpers.egress import Origin, Policy, client_hello, connect_via

# --- plain HTTP ------------------------------------------------------------------


async def test_allowed_plain_http_is_relayed_in_origin_form(origin: Origin) -> None:
    policy = Policy(allowed={"localhost"})
    async with (
        EgressProxy(policy, allow_private_networks=True) as proxy,
        aiohttp.ClientSession() as client,
        client.post(
            f"http://localhost:{origin.http_port}/path?q=1",
            data=b"x" * 10,
            proxy=proxy.url,
            headers={"Proxy-Authorization": "Basic c2VjcmV0"},
        ) as resp,
    ):
        assert resp.status == 200
        assert await resp.text() == "hello from origin; got 10 bytes"
        assert resp.headers["Connection"] == "close"
    [(method, path, headers)] = origin.requests
    assert (method, path) == ("POST", "/path?q=1")
    assert headers["Host"] == f"localhost:{origin.http_port}"
    assert "Proxy-Authorization" not in headers
    assert policy.asked == [("localhost", origin.http_port)]


async def test_plain_http_host_header_is_the_vetted_authority(origin: Origin) -> None:
    """Domain fronting (security review finding 17): the guest's Host never reaches the origin.

    The policy is asked about ``localhost``; a guest Host naming another site
    (a tenant of the same CDN edge), even twice or in another case, is replaced.
    """
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(
            f"GET http://localhost:{origin.http_port}/x HTTP/1.1\r\n"
            "Host: exfil.attacker.example\r\n"
            "host: exfil2.attacker.example\r\n"
            "X-Keep: 1\r\n\r\n".encode()
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    [(_, path, headers)] = origin.requests
    assert path == "/x"
    assert headers["Host"] == f"localhost:{origin.http_port}"
    assert "attacker" not in str(headers)
    assert headers["X-Keep"] == "1"
    assert policy.asked == [("localhost", origin.http_port)]


async def test_denied_plain_http_is_403_with_a_readable_reason(origin: Origin) -> None:
    policy = Policy()
    decisions: list[EgressDecision] = []
    async with (
        EgressProxy(policy, allow_private_networks=True, on_decision=decisions.append) as proxy,
        aiohttp.ClientSession() as client,
        client.get(f"http://localhost:{origin.http_port}/", proxy=proxy.url) as resp,
    ):
        assert resp.status == 403
        text = await resp.text()
    assert "network access to localhost" in text
    assert "not allowed by the network policy" in text
    assert "--allow-net localhost" in text
    assert origin.requests == []
    assert [(d.host, d.allowed, d.reason) for d in decisions] == [("localhost", False, "policy")]


async def test_https_absolute_form_and_origin_form_are_bad_requests() -> None:
    async with EgressProxy(Policy(allowed={"example.com"})) as proxy:
        for target in ("https://example.com/", "/just/a/path"):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"GET {target} HTTP/1.1\r\nHost: example.com\r\n\r\n".encode())
            response = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert response.startswith(b"HTTP/1.1 400 "), response


# --- CONNECT -----------------------------------------------------------------------


async def test_allowed_connect_tunnels_bytes_both_ways(origin: Origin) -> None:
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True) as proxy:
        head, reader, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        assert head.startswith(b"HTTP/1.1 200 ")
        hello = client_hello("localhost")
        writer.write(hello + b"ping")
        await writer.drain()
        echoed = await asyncio.wait_for(reader.readexactly(len(hello) + 4), 5)
        assert echoed == (hello + b"ping").upper()
        writer.write_eof()  # half-close: the echo server finishes, tunnel ends
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert policy.asked == [("localhost", origin.echo_port)]


async def test_denied_connect_is_403_and_never_connects(origin: Origin) -> None:
    async with EgressProxy(Policy(), allow_private_networks=True) as proxy:
        head, reader, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        body = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 403 Forbidden by piwork network policy: localhost")
    assert b"not allowed by the network policy" in body
    assert origin.echo_connections == []


async def test_loopback_is_refused_by_default_even_when_policy_allows(origin: Origin) -> None:
    async with EgressProxy(Policy(allowed={"localhost", "127.0.0.1"})) as proxy:
        for target in (f"localhost:{origin.echo_port}", f"127.0.0.1:{origin.echo_port}"):
            head, reader, writer = await connect_via(proxy, target)
            body = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert head.startswith(b"HTTP/1.1 403 "), head
            assert b"a private or reserved address" in body and b"allow-private" in body
    assert origin.echo_connections == []


async def test_decision_is_asked_once_even_for_concurrent_connections(origin: Origin) -> None:
    policy = Policy(allowed={"localhost"}, delay=0.2)
    async with EgressProxy(policy, allow_private_networks=True) as proxy:
        results = await asyncio.gather(
            *(connect_via(proxy, f"localhost:{origin.echo_port}") for _ in range(3))
        )
        for head, _, writer in results:
            assert head.startswith(b"HTTP/1.1 200 ")
            writer.close()
        head, _, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
    assert policy.asked == [("localhost", origin.echo_port)]


async def test_without_cache_every_connection_asks(origin: Origin) -> None:
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True, cache_decisions=False) as proxy:
        for _ in range(2):
            head, _, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
            assert head.startswith(b"HTTP/1.1 200 ")
            writer.close()
    assert len(policy.asked) == 2


async def test_failing_policy_denies(origin: Origin) -> None:
    async def broken(host: str, port: int) -> bool:
        raise RuntimeError("policy store unavailable")

    async with EgressProxy(broken, allow_private_networks=True) as proxy:
        head, _, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        writer.close()
    assert head.startswith(b"HTTP/1.1 403 ")
    assert origin.echo_connections == []


async def test_junk_host_is_refused_without_asking() -> None:
    policy = Policy(allowed={"good.com"})
    async with EgressProxy(policy) as proxy:
        head, _, writer = await connect_via(proxy, "evil.com@good.com:443")
        writer.close()
    assert head.startswith(b"HTTP/1.1 400 ")
    assert policy.asked == []


# --- helpers -------------------------------------------------------------------------


def test_normalize_host() -> None:
    assert normalize_host("Example.COM.") == "example.com"
    assert normalize_host("bücher.de") == "xn--bcher-kva.de"
    assert normalize_host("[::1]") == "::1"
    assert normalize_host("10.0.0.1") == "10.0.0.1"
    for junk in ("a b.com", "evil.com/x", "", "-bad.com"):
        with pytest.raises(ValueError):
            normalize_host(junk)


def test_guest_env_keeps_the_model_gateway_off_the_proxy() -> None:
    env = guest_proxy_env()
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://10.0.2.101:3128"
    assert "10.0.2.100" in env["NO_PROXY"].split(",")
    assert env["no_proxy"] == env["NO_PROXY"]


# --- the per-run token ----------------------------------------------------------------


async def test_without_the_runs_token_the_proxy_answers_407_and_asks_nothing(
    origin: Origin,
) -> None:
    """Any other local process finding the port gets nothing: no policy question, no connection."""
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True, token="run-token") as proxy:
        bad = ["", "Basic " + base64.b64encode(b"piwork:wrong").decode(), "Bearer run-token"]
        for cred in bad:
            auth = f"Proxy-Authorization: {cred}\r\n" if cred else ""
            head, _, writer = await connect_via(proxy, f"localhost:{origin.echo_port}", auth)
            writer.close()
            assert head.startswith(b"HTTP/1.1 407 "), head
            assert b'proxy-authenticate: basic realm="piwork"' in head.lower()
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://localhost:{origin.http_port}/", proxy=proxy.url) as resp,
        ):
            assert resp.status == 407
    assert policy.asked == [] and origin.requests == [] and origin.echo_connections == []


async def test_the_token_in_the_proxy_url_lets_curl_and_clients_through(origin: Origin) -> None:
    """The guest's proxy URL carries the token as its password; curl (and undici, busybox
    wget) send it as ``Proxy-Authorization: Basic`` on plain requests and on CONNECT."""
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True, token="run-token") as proxy:
        url = proxy_url_with_token(proxy.url, "run-token")
        assert url == f"http://piwork:run-token@127.0.0.1:{proxy.port}"
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--max-time", "10", "-x", url,
            f"http://localhost:{origin.http_port}/via-curl",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        assert out == b"hello from origin; got 0 bytes"
        cred = base64.b64encode(b"piwork:run-token").decode()
        head, reader, writer = await connect_via(
            proxy, f"localhost:{origin.echo_port}", f"Proxy-Authorization: Basic {cred}\r\n"
        )
        assert head.startswith(b"HTTP/1.1 200 ")
        hello = client_hello("localhost")
        writer.write(hello)
        assert await asyncio.wait_for(reader.readexactly(len(hello)), 5) == hello.upper()
        writer.close()
    [(_, path, headers)] = origin.requests
    assert path == "/via-curl" and "Proxy-Authorization" not in headers


def test_guest_proxy_env_carries_the_token_only_in_the_proxy_url() -> None:
    env = guest_proxy_env(proxy_url_with_token("http://10.0.2.101:3128", "t0k"))
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://piwork:t0k@10.0.2.101:3128"
    assert "t0k" not in env["NO_PROXY"]


# --- --allow-net entries ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "normal"),
    [
        ("Example.com", "example.com"),
        ("example.COM.", "example.com"),
        ("*.example.com", "example.com"),
        ("Bücher.de", "xn--bcher-kva.de"),
        ("api.github.com", "api.github.com"),
        ("foo.github.io", "foo.github.io"),
        ("localhost", "localhost"),
    ],
)
def test_allow_net_entries_are_normalised(entry: str, normal: str) -> None:
    assert normalize_allowed_domain(entry) == normal


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("com", "single label"),
        ("internal", "single label"),
        ("co.uk", "public suffix"),
        ("github.io", "public suffix"),
        ("COM.", "single label"),
        ("*", "domain name"),
        ("https://example.com", "domain name"),
        ("example.com:443", "domain name"),
        ("10.0.0.1", "IP address"),
        ("exa mple.com", "domain name"),
        ("", "domain name"),
    ],
)
def test_allow_net_refuses_what_would_open_too_much(entry: str, why: str) -> None:
    with pytest.raises(AllowNetError, match=why):
        normalize_allowed_domain(entry)


def test_a_normalised_entry_matches_the_names_the_proxy_sees() -> None:
    allowed = (normalize_allowed_domain("Example.com."),)
    assert domain_allowed(normalize_host("WWW.Example.COM"), allowed)
    assert domain_allowed(normalize_host("example.com"), allowed)
    assert not domain_allowed(normalize_host("badexample.com"), allowed)
    assert not domain_allowed(normalize_host("example.com.evil.net"), allowed)


def test_the_cli_refuses_a_bad_allow_net_entry_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from piwork.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "hi", "--allow-net", "example.com", "co.uk"])
    assert "public suffix" in capsys.readouterr().err
    args = build_parser().parse_args(["run", "hi", "--allow-net", "Example.COM."])
    assert args.allow_net == ["example.com"]


async def test_concurrent_connections_past_the_cap_are_closed_at_once(origin: Origin) -> None:
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True, max_connections=4) as proxy:
        held = [await connect_via(proxy, f"localhost:{origin.echo_port}") for _ in range(4)]
        for head, _, _ in held:
            assert head.startswith(b"HTTP/1.1 200")
        # The fifth is dropped before anything is read: no answer, no question.
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(f"CONNECT localhost:{origin.echo_port} HTTP/1.1\r\n\r\n".encode())
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert proxy.refused_connections == 1
        assert len(origin.echo_connections) == 4
        # A slot freed is a slot usable again.
        _, _, first = held.pop()
        first.close()
        for _ in range(100):
            try:
                head, _, w = await connect_via(proxy, f"localhost:{origin.echo_port}")
            except (asyncio.IncompleteReadError, ConnectionResetError):
                await asyncio.sleep(0.02)
                continue
            assert head.startswith(b"HTTP/1.1 200")
            w.close()
            break
        else:
            raise AssertionError("the freed slot never came back")
        for _, _, w in held:
            w.close()
