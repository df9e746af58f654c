"""The egress proxy's test doubles: a policy that records what it was asked, the origin
servers behind the proxy, and raw client bytes (a TLS ClientHello, a CONNECT)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field

from piwork.proxy.egress import EgressProxy


@dataclass
class Policy:
    allowed: set[str] = field(default_factory=set)
    asked: list[tuple[str, int]] = field(default_factory=list)
    delay: float = 0.0

    async def __call__(self, host: str, port: int) -> bool:
        self.asked.append((host, port))
        if self.delay:
            await asyncio.sleep(self.delay)
        return host in self.allowed


@dataclass
class Origin:
    """A plain HTTP server and a TCP echo server on loopback."""

    http_port: int
    echo_port: int
    requests: list[tuple[str, str, dict[str, str]]]
    echo_connections: list[int]
    echo_received: bytearray = field(default_factory=bytearray)


def client_hello(server_name: str | None) -> bytes:
    """The first flight of a real TLS client (OpenSSL, through Python's ssl) asking
    for ``server_name``: a ClientHello record, SNI and all."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = ssl.create_default_context()
    if server_name is None:
        ctx.check_hostname = False
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def connect_via(
    proxy: EgressProxy, target: str, extra: str = ""
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return head, reader, writer
