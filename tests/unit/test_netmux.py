"""The host end of the guest's network multiplexer, driven by a fake (hostile) guest.

The guest side is a raw socket speaking the frame format by hand, so every
test can break the protocol on purpose; the targets are real TCP servers on
loopback. Framing is fuzzed with hypothesis.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piwork.vm.netmux import (
    HEADER,
    HOST_IDS,
    MAX_PAYLOAD,
    MAX_STREAMS,
    WINDOW,
    Frame,
    FrameReader,
    NetMux,
    ProtocolError,
    encode,
)

# --------------------------------------------------------------------------- framing

frames = st.lists(
    st.tuples(
        st.sampled_from(list(Frame)),
        st.integers(0, 65535),
        st.binary(max_size=300),
    ),
    max_size=20,
)


@given(frames, st.lists(st.integers(1, 64), min_size=1, max_size=10))
def test_frames_survive_any_chunking(
    items: list[tuple[Frame, int, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode(k, s, p) for k, s, p in items)
    parser = FrameReader()
    got: list[tuple[Frame, int, bytes]] = []
    pos = 0
    i = 0
    while pos < len(wire):
        n = cuts[i % len(cuts)]
        got += parser.feed(wire[pos : pos + n])
        pos += n
        i += 1
    assert got == items
    assert parser.buffered == 0


@given(st.binary(max_size=2000))
def test_any_bytes_give_frames_or_a_protocol_error_and_a_bounded_buffer(data: bytes) -> None:
    parser = FrameReader()
    try:
        parser.feed(data)
    except ProtocolError:
        return
    assert parser.buffered < HEADER.size + MAX_PAYLOAD


def test_oversized_and_unknown_frames_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="max"):
        FrameReader().feed(HEADER.pack(Frame.DATA, 0, 1, MAX_PAYLOAD + 1))
    with pytest.raises(ProtocolError, match="unknown"):
        FrameReader().feed(HEADER.pack(9, 0, 1, 0))
    with pytest.raises(ProtocolError, match="flags"):
        FrameReader().feed(HEADER.pack(Frame.DATA, 1, 1, 0))
    with pytest.raises(ValueError):
        encode(Frame.DATA, 1, b"x" * (MAX_PAYLOAD + 1))


# --------------------------------------------------------------------------- a fake guest


class Guest:
    """The guest end of the port, written by hand (so it can misbehave)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = FrameReader()
        self.inbox: list[tuple[Frame, int, bytes]] = []

    async def handshake(self, junk: bytes = b"") -> None:
        head = await self.reader.readexactly(HEADER.size)
        kind, _, sid, length = HEADER.unpack(head)
        payload = await self.reader.readexactly(length)
        assert (kind, sid) == (Frame.HELLO, 0)
        self.send_raw(junk + head + payload)

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, kind: Frame, sid: int, payload: bytes = b"") -> None:
        self.writer.write(encode(kind, sid, payload))

    async def next(self, timeout: float = 5.0) -> tuple[Frame, int, bytes]:
        while not self.inbox:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("the host closed the port")
            self.inbox += self.parser.feed(data)
        return self.inbox.pop(0)

    async def wait_for(
        self, kind: Frame, sid: int, timeout: float = 5.0
    ) -> tuple[Frame, int, bytes]:
        skipped = []
        try:
            while True:
                f = await self.next(timeout)
                if f[0] is kind and f[1] == sid:
                    return f
                skipped.append(f)
        finally:
            self.inbox[:0] = skipped

    async def closed_by_host(self, timeout: float = 5.0) -> bool:
        try:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    return True
        except ConnectionError:
            return True  # reset: the host closed while we were still writing
        except TimeoutError:
            return False


class Target:
    """A loopback TCP server: echoes (upper-cased) or holds connections open."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.server: asyncio.Server | None = None
        self.live = 0
        self.peak = 0
        self.accepted = 0
        self.received = bytearray()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.live += 1
        self.accepted += 1
        self.peak = max(self.peak, self.live)
        try:
            while data := await reader.read(65536):
                self.received += data
                if self.mode == "echo":
                    writer.write(data.upper())
                    await writer.drain()
            if self.mode == "echo":
                writer.write(b"BYE")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self.live -= 1
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def mux_pair(
    targets: dict[int, int], *, junk: bytes = b"", handshake: bool = True
) -> AsyncIterator[tuple[NetMux, Guest, asyncio.Task[None]]]:
    a, b = socket.socketpair()
    mux = NetMux(Path("/nonexistent"), targets)
    hr, hw = await asyncio.open_unix_connection(sock=a)
    gr, gw = await asyncio.open_unix_connection(sock=b)
    serve = asyncio.create_task(mux.serve(hr, hw))
    guest = Guest(gr, gw)
    if handshake:
        await guest.handshake(junk)
        assert await mux.wait_ready(5)
    try:
        yield mux, guest, serve
    finally:
        gw.close()
        await mux.close()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(serve, 5)


@pytest.fixture
async def echo() -> AsyncIterator[Target]:
    t = Target("echo")
    await t.start()
    yield t
    await t.close()


@pytest.fixture
async def hold() -> AsyncIterator[Target]:
    t = Target("hold")
    await t.start()
    yield t
    await t.close()


async def test_a_stream_reaches_its_target_both_ways_with_half_close(echo: Target) -> None:
    async with mux_pair({0: echo.port}, junk=b"stale bytes of an earlier connection") as (
        _mux,
        g,
        _serve,
    ):
        g.send(Frame.OPEN, 7, b"\x00")
        g.send(Frame.DATA, 7, b"hello")
        _, _, data = await g.wait_for(Frame.DATA, 7)
        assert data == b"HELLO"
        g.send(Frame.EOF, 7)
        got = b""
        while True:
            kind, _sid, payload = await g.next()
            if kind is Frame.DATA:
                got += payload
            elif kind is Frame.EOF:
                break
        assert got == b"BYE"  # the target saw our EOF, answered, and closed
        await g.wait_for(Frame.CLOSE, 7)  # both ways done: the host ends the stream
        g.send(Frame.CLOSE, 7)


async def test_streams_past_the_cap_are_refused_and_the_target_never_sees_them(
    hold: Target,
) -> None:
    async with mux_pair({0: hold.port}) as (mux, g, _serve):
        for sid in range(1, MAX_STREAMS + 21):
            g.send(Frame.OPEN, sid, b"\x00")
        refused = set()
        for _ in range(20):
            kind, sid, _ = await g.next()
            assert kind is Frame.CLOSE
            refused.add(sid)
        assert refused == set(range(MAX_STREAMS + 1, MAX_STREAMS + 21))
        for _ in range(100):
            if hold.live == MAX_STREAMS:
                break
            await asyncio.sleep(0.02)
        assert hold.live == MAX_STREAMS and mux.stats.peak_streams == MAX_STREAMS
        # A closed stream frees its slot for a new one.
        for sid in refused:
            g.send(Frame.CLOSE, sid)
        g.send(Frame.CLOSE, 1)
        await g.wait_for(Frame.CLOSE, 1)
        g.send(Frame.OPEN, 1000, b"\x00")
        for _ in range(100):
            if hold.accepted == MAX_STREAMS + 1:
                break
            await asyncio.sleep(0.02)
        assert hold.accepted == MAX_STREAMS + 1
        assert hold.peak == MAX_STREAMS


async def test_a_guest_that_never_answers_closes_is_cut_off(hold: Target) -> None:
    async with mux_pair({0: hold.port}, handshake=True) as (mux, g, serve):
        for sid in range(1, 65535):
            g.send(Frame.OPEN, sid, b"\x00")
            if sid % 256 == 0:
                await asyncio.sleep(0)
            if serve.done():
                break
        assert await g.closed_by_host()
        assert "unanswered" in (mux.stats.closed_reason or "")
        assert mux.active_streams == 0


async def test_overrunning_the_window_closes_only_that_stream(hold: Target) -> None:
    async with mux_pair({0: hold.port}) as (mux, g, serve):
        g.send(Frame.OPEN, 1, b"\x00")
        g.send(Frame.OPEN, 2, b"\x00")
        # The target does not read fast enough to matter: the window counts bytes
        # not yet credited back, and we send far more than one window at once.
        chunk = b"x" * MAX_PAYLOAD
        for _ in range(WINDOW // MAX_PAYLOAD + 4):
            g.send(Frame.DATA, 1, chunk)
        await g.wait_for(Frame.CLOSE, 1)
        assert mux.stats.overruns == 1
        assert not serve.done()
        g.send(Frame.CLOSE, 1)
        g.send(Frame.DATA, 2, b"still fine")
        for _ in range(100):
            if b"still fine" in hold.received:
                break
            await asyncio.sleep(0.02)
        assert b"still fine" in hold.received


async def test_host_to_guest_data_waits_for_the_guests_window(echo: Target) -> None:
    async with mux_pair({0: echo.port}) as (_mux, g, _serve):
        g.send(Frame.OPEN, 3, b"\x00")
        total = outstanding = received = 0
        # Send 3 windows' worth (honouring the host's credits), crediting nothing back.
        while total < 3 * WINDOW:
            while outstanding + MAX_PAYLOAD > WINDOW:
                kind, _, payload = await g.next()
                if kind is Frame.WINDOW:
                    outstanding -= struct.unpack(">I", payload)[0]
                else:
                    assert kind is Frame.DATA
                    received += len(payload)
            g.send(Frame.DATA, 3, b"a" * MAX_PAYLOAD)
            total += MAX_PAYLOAD
            outstanding += MAX_PAYLOAD
        with contextlib.suppress(TimeoutError):
            while True:
                kind, _, payload = await g.next(timeout=1.0)
                if kind is Frame.DATA:
                    received += len(payload)
        assert received == WINDOW  # the host stopped at our window
        g.send(Frame.WINDOW, 3, struct.pack(">I", WINDOW))
        more = 0
        with contextlib.suppress(TimeoutError):
            while True:
                kind, _, payload = await g.next(timeout=1.0)
                if kind is Frame.DATA:
                    more += len(payload)
        assert more == WINDOW
        # More credit than a window is a broken guest.
        g.send(Frame.WINDOW, 3, struct.pack(">I", WINDOW + 1))
        assert await g.closed_by_host()


async def test_targets_are_numbers_the_run_chose(echo: Target) -> None:
    async with mux_pair({0: echo.port}) as (mux, g, _serve):
        g.send(Frame.OPEN, 1, b"\x01")  # egress: not in this run
        assert (await g.next())[:2] == (Frame.CLOSE, 1)
        assert mux.stats.refused == 1
        g.send(Frame.OPEN, 2, b"\x05")  # no such target
        assert await g.closed_by_host()
        assert "unknown target" in (mux.stats.closed_reason or "")


def test_targets_are_validated() -> None:
    with pytest.raises(ValueError):
        NetMux(Path("/x"), {2: 80})
    with pytest.raises(ValueError):
        NetMux(Path("/x"), {0: 0})


bad_frames = st.one_of(
    st.binary(min_size=1, max_size=64),  # anything at all
    st.builds(  # a header that claims too much
        lambda k, s, n: HEADER.pack(k, 0, s, n),
        st.integers(0, 255),
        st.integers(0, 65535),
        st.integers(MAX_PAYLOAD + 1, 2**32 - 1),
    ),
    st.builds(lambda s: encode(Frame.HELLO, s, b"again"), st.integers(0, 65535)),
    st.builds(lambda p: encode(Frame.WINDOW, 1, p), st.binary(max_size=8)),
    st.builds(lambda s, p: encode(Frame.OPEN, s, p), st.integers(0, 65535), st.binary(max_size=3)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bad_frames, min_size=1, max_size=6))
def test_garbage_never_crashes_the_host_and_leaves_nothing_open(junk: list[bytes]) -> None:
    async def scenario() -> None:
        target = Target("hold")
        await target.start()
        try:
            async with mux_pair({0: target.port, 1: target.port}) as (mux, g, serve):
                g.send(Frame.OPEN, 1, b"\x00")
                g.send(Frame.DATA, 1, b"ok")
                for item in junk:
                    g.send_raw(item)
                # Whatever frame the junk left half-read, this completes it and then
                # is a header of unknown type: the port must be closed.
                g.send_raw(b"\xff" * (MAX_PAYLOAD + 2 * HEADER.size))
                await g.writer.drain()
                assert await g.closed_by_host(timeout=5)
                assert serve.done() and serve.exception() is None
                assert mux.stats.closed_reason is not None
                assert mux.active_streams == 0
                for _ in range(100):
                    if target.live == 0:
                        break
                    await asyncio.sleep(0.01)
                assert target.live == 0
        finally:
            await target.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- host-opened streams


class Client:
    """A host-side client connection (what a browser is to a preview), as a socket pair."""

    @classmethod
    async def make(cls) -> tuple[Client, asyncio.StreamReader, asyncio.StreamWriter]:
        a, b = socket.socketpair()
        mine_r, mine_w = await asyncio.open_unix_connection(sock=a)
        their_r, their_w = await asyncio.open_unix_connection(sock=b)
        return cls(mine_r, mine_w), their_r, their_w

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer


async def test_a_host_opened_stream_carries_bytes_both_ways_and_ends_on_close(
    echo: Target,
) -> None:
    async with mux_pair({0: echo.port}) as (mux, g, _serve):
        client, r, w = await Client.make()
        done = await mux.open_inbound(8000, r, w, b"GET / HTTP/1.1\r\n\r\n")
        assert done is not None
        kind, sid, payload = await g.next()
        assert (kind, payload) == (Frame.CONNECT, struct.pack(">H", 8000))
        assert sid >= HOST_IDS
        assert await g.wait_for(Frame.DATA, sid) == (Frame.DATA, sid, b"GET / HTTP/1.1\r\n\r\n")
        # Guest -> client, credited back as the client takes it.
        g.send(Frame.DATA, sid, b"HTTP/1.1 200 OK\r\n\r\nhi")
        assert await client.reader.readexactly(21) == b"HTTP/1.1 200 OK\r\n\r\nhi"
        _, _, credit = await g.wait_for(Frame.WINDOW, sid)
        assert struct.unpack(">I", credit)[0] == 21
        # Client -> guest after the head (a WebSocket frame, say).
        client.writer.write(b"\x81\x02hi")
        assert (await g.wait_for(Frame.DATA, sid))[2] == b"\x81\x02hi"
        assert mux.inbound_streams == 1 and mux.stats.peak_inbound == 1
        # The guest ends it: the client's connection closes, the id is answered.
        g.send(Frame.CLOSE, sid)
        assert await client.reader.read() == b""
        await g.wait_for(Frame.CLOSE, sid)
        assert done.is_set() and mux.inbound_streams == 0


async def test_host_opened_streams_are_capped_and_frozen_while_paused(echo: Target) -> None:
    async with mux_pair({0: echo.port}) as (mux, g, _serve):
        clients = []
        events = []
        for _ in range(MAX_STREAMS + 5):
            client, r, w = await Client.make()
            clients.append((client, w))
            events.append(await mux.open_inbound(3000, r, w))
        assert sum(e is not None for e in events) == MAX_STREAMS
        assert mux.stats.inbound_refused == 5 and mux.inbound_streams == MAX_STREAMS
        sids: set[int] = set()
        while len(sids) < MAX_STREAMS:
            kind, sid, _ = await g.next()
            assert kind is Frame.CONNECT
            sids.add(sid)
        assert all(HOST_IDS <= s <= 0xFFFF for s in sids)
        # Paused: a client's bytes stay on the host until the thaw.
        mux.freeze_inbound()
        first = min(sids)
        idx = sorted(sids).index(first)
        clients[idx][0].writer.write(b"while paused")
        with pytest.raises(TimeoutError):
            await g.wait_for(Frame.DATA, first, timeout=0.5)
        mux.thaw_inbound()
        assert (await g.wait_for(Frame.DATA, first))[2] == b"while paused"
        # close_inbound ends one stream from the host side.
        ev = events[idx]
        assert ev is not None
        await mux.close_inbound(ev)
        await g.wait_for(Frame.CLOSE, first)
        assert ev.is_set() and mux.inbound_streams == MAX_STREAMS - 1


async def test_a_guest_overrunning_a_host_opened_stream_loses_only_that_stream(
    echo: Target,
) -> None:
    async with mux_pair({0: echo.port}) as (mux, g, serve):
        a, ra, wa = await Client.make()
        b, rb, wb = await Client.make()
        assert await mux.open_inbound(3000, ra, wa) is not None
        assert await mux.open_inbound(3001, rb, wb) is not None
        sid_a = (await g.next())[1]
        sid_b = (await g.next())[1]
        # Client a never reads: once its socket buffers are full the host stops
        # crediting, and a guest that sends on regardless overruns the window.
        for _ in range(64):
            g.send(Frame.DATA, sid_a, b"x" * MAX_PAYLOAD)
        await g.wait_for(Frame.CLOSE, sid_a)
        assert mux.stats.overruns == 1 and not serve.done()
        g.send(Frame.DATA, sid_b, b"fine")
        assert await b.reader.readexactly(4) == b"fine"
        del a


async def test_a_guest_that_sends_connect_or_opens_a_host_id_is_cut_off(echo: Target) -> None:
    for frame in (
        encode(Frame.CONNECT, HOST_IDS, b"\x1f\x40"),
        encode(Frame.OPEN, HOST_IDS, b"\x00"),
    ):
        async with mux_pair({0: echo.port}) as (mux, g, _serve):
            g.send_raw(frame)
            assert await g.closed_by_host()
            assert mux.stats.closed_reason is not None
            assert "CONNECT" in mux.stats.closed_reason or "host-side" in mux.stats.closed_reason


async def test_no_host_opened_stream_before_the_guest_answers_hello(echo: Target) -> None:
    async with mux_pair({0: echo.port}, handshake=False) as (mux, _g, _serve):
        _client, r, w = await Client.make()
        assert await mux.open_inbound(3000, r, w) is None
        assert mux.stats.inbound_refused == 1


async def test_a_refused_host_opened_stream_tells_the_client_and_a_served_one_does_not(
    echo: Target,
) -> None:
    async with mux_pair({0: echo.port}) as (mux, g, _serve):
        client, r, w = await Client.make()
        assert await mux_open(mux, r, w) is not None
        sid = (await g.next())[1]
        g.send(Frame.CLOSE, sid)  # the guest could not connect: nothing listens
        assert await client.reader.read() == b"NOTHING THERE"
        # Once the guest has answered, its CLOSE is a plain close (no extra bytes).
        client, r, w = await Client.make()
        assert await mux_open(mux, r, w) is not None
        sid = (await g.wait_for(Frame.CONNECT, sid + 1))[1]
        g.send(Frame.DATA, sid, b"HTTP/1.1 200 OK")
        g.send(Frame.CLOSE, sid)
        assert await client.reader.read() == b"HTTP/1.1 200 OK"


async def mux_open(
    mux: NetMux, r: asyncio.StreamReader, w: asyncio.StreamWriter
) -> asyncio.Event | None:
    return await mux.open_inbound(3000, r, w, refused=b"NOTHING THERE")
