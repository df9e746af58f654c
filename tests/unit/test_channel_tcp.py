"""The guest channel over the tcp transport, against a stand-in for QEMU's forwarded port.

QEMU's slirp accepts every connection to the ``hostfwd`` port at once, before
the guest has said anything, and resets it when the guest refuses it. At boot,
between /init configuring eth0 and the supervisor listening, the guest refuses
every connection, and the host's channel tries again every 0.1 s: seen in a
real VM (12 such attempts, each ``ConnectionResetError`` right after the
connect, then the supervisor answered). Those attempts never reached a
supervisor; they are not the loss of a connection, so ``reconnects`` (what the
TCP transport's secret test holds at 0 while other local users knock) must
not count them. The stand-in here is a plain TCP listener playing both parts:
slirp's resets, then the supervisor's side of docs/guest-protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

import orjson

from piwork.vm.channel import Endpoint, GuestChannel

SECRET = b"0123456789abcdef" * 4


class ForwardedPort:
    """127.0.0.1:<port> as slirp forwards it: the first ``refuse`` connections are reset
    (the guest had nothing listening), the rest reach a supervisor that wants the secret."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.connections = 0
        self.auth_lines: list[bytes] = []
        self.answered: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections <= self.refuse:
            # slirp closing the host's socket after the guest's RST: a reset, not a FIN.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            return
        with contextlib.suppress(ConnectionError):
            self.auth_lines.append((await reader.readline()).rstrip(b"\n"))
            if self.auth_lines[-1] != b"auth " + SECRET:
                writer.close()
                return
            while line := await reader.readline():
                if line.startswith(b'!{"op":"hello"'):
                    hello = {"ev": "hello", "bootId": "boot-1", "lastSeq": 0}
                    writer.write(b"0 !" + orjson.dumps(hello) + b"\n")
                    await writer.drain()
                    self.answered.append(writer)

    async def __aenter__(self) -> ForwardedPort:
        self.server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        for writer in self.answered:
            writer.close()
        self.server.close()


@contextlib.asynccontextmanager
async def channel_to(port: int) -> AsyncIterator[GuestChannel]:
    channel = GuestChannel(
        Endpoint(tcp_port=port, tcp_secret=SECRET), lambda _line: None, lambda _msg: None
    )
    try:
        yield channel
    finally:
        await channel.close()


async def test_attempts_the_guest_refused_before_its_supervisor_answered_are_not_reconnects() -> (
    None
):
    async with ForwardedPort(refuse=12) as fwd, channel_to(fwd.port) as channel:
        await channel.start(timeout=10)
        assert fwd.connections == 13 and fwd.auth_lines == [b"auth " + SECRET]
        assert channel.reconnects == 0  # today's code counted all 12 here
        assert channel.unanswered == 12
        # A connection the supervisor had answered, lost: that is a reconnect.
        fwd.answered[0].close()
        for _ in range(100):
            if len(fwd.answered) == 2:
                break
            await asyncio.sleep(0.05)
        await channel.wait_ready(10)
        assert channel.reconnects == 1 and channel.unanswered == 12


async def test_a_connection_closed_for_a_wrong_secret_is_not_a_reconnect_either() -> None:
    async with ForwardedPort(refuse=0) as fwd:
        wrong = GuestChannel(
            Endpoint(tcp_port=fwd.port, tcp_secret=b"f" * 64), lambda _l: None, lambda _m: None
        )
        task = asyncio.create_task(wrong.start(timeout=1.5))
        with contextlib.suppress(Exception):
            await task
        await wrong.close()
        assert fwd.connections >= 3 and fwd.answered == []
        assert wrong.reconnects == 0 and wrong.unanswered >= 3
