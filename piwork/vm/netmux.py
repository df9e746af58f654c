"""The guest's TCP connections, multiplexed over one virtio-serial port.

The VM has no network card (virtio transport): the guest supervisor listens
on the two addresses pi and its tools use (model gateway ``10.0.2.100:80``,
egress proxy ``10.0.2.101:3128``, both on the guest's ``lo``) and carries
each accepted connection as a *stream* over the virtio-serial port
``piwork.net``. This module is the host end: it demultiplexes the streams
and connects each one to ``127.0.0.1:<port>`` of the gateway or the egress
proxy, inside piwork's own event loop. No process is started per connection
(slirp's ``guestfwd ... cmd:`` forked one, so a connect loop in the guest was
a fork bomb on the host).

Wire format (both directions), every integer big-endian::

    header  = type:u8  flags:u8 (0)  stream:u16  length:u32      (8 bytes)
    payload = <length> bytes, length <= MAX_PAYLOAD (64 KiB)

    HELLO  0  stream 0, payload "PWMUX2" + 8-byte nonce. The host sends one
              on every new connection of the port; the guest resets every
              stream and echoes it. Before the echo the host discards what
              it reads (bytes a previous connection left behind). A guest of
              another protocol version (an older "PWMUX1") never echoes it:
              the host reports "no reply to HELLO" and the run does not start.
    OPEN   1  guest -> host: a new stream; payload 1 byte, the target
              (0 gateway, 1 egress). Never text: the guest cannot name a host.
              Ids 1..0x7fff only.
    DATA   2  payload: stream bytes (at least 1).
    EOF    3  no more DATA from the sender on this stream (half-close).
    CLOSE  4  the stream is over both ways (abort or normal end). A side that
              receives CLOSE for a stream it has open tears it down and
              answers CLOSE; one that had already sent CLOSE just forgets it.
              An id is reused only after both CLOSEs.
    WINDOW 5  payload u32: the receiver has delivered that many more bytes;
              the sender may send that much more DATA on the stream.
    CONNECT 6 host -> guest: a new stream opened from the host side (a
              preview, piwork/preview); payload u16, the guest port. The guest
              connects it to its own loopback (never a port below 1024) or
              answers CLOSE. Ids 0x8000..0xffff only, so both sides can open
              streams without ever picking the same id.

Flow control: each side may have at most ``WINDOW`` (256 KiB) unacknowledged
DATA bytes per stream in flight, whichever side opened the stream. Limits the
host enforces on the guest: at most ``MAX_STREAMS`` (64) open guest-opened
streams (further OPENs get CLOSE) and at most ``MAX_STREAMS`` host-opened ones
(further host connections are refused before a CONNECT is sent); DATA past
the window closes that stream; a frame that breaks the format (unknown type,
oversized length, OPEN of a live id, of a host id or of a bad target, a
CONNECT from the guest, window overflow) closes the whole port with the
reason logged, and the guest has no network until the next run. Every buffer
is bounded: per stream at most one window, the port's writer waits for QEMU
to take its bytes before more are queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from piwork import errors

log = logging.getLogger(__name__)

HEADER = struct.Struct(">BBHI")
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024
MAX_STREAMS = 64
MAGIC = b"PWMUX2"
NONCE_BYTES = 8
HELLO_LEN = len(MAGIC) + NONCE_BYTES
MAX_RESYNC_BYTES = 4 * 1024 * 1024
"""Bytes the host will discard while waiting for the guest's HELLO echo."""
CONNECT_TIMEOUT = 10.0
READ_CHUNK = 256 * 1024

TARGET_GATEWAY = 0
TARGET_EGRESS = 1
TARGET_INBOUND = -1
"""A host-opened stream's target: it carries a host connection into a guest port."""
HOST_IDS = 0x8000
"""Stream ids from here up are opened by the host (CONNECT), below by the guest (OPEN)."""


class Frame(IntEnum):
    HELLO = 0
    OPEN = 1
    DATA = 2
    EOF = 3
    CLOSE = 4
    WINDOW = 5
    CONNECT = 6


class ProtocolError(errors.ProtocolError):
    """The guest broke the framing: the port is closed."""


def encode(kind: Frame, stream: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return HEADER.pack(kind, 0, stream, len(payload)) + payload


def hello(nonce: bytes) -> bytes:
    return encode(Frame.HELLO, 0, MAGIC + nonce)


class FrameReader:
    """Incremental, bounded frame parser: ``feed`` bytes, get whole frames back."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Frame, int, bytes]]:
        self._buf += data
        frames: list[tuple[Frame, int, bytes]] = []
        while len(self._buf) >= HEADER.size:
            kind, flags, stream, length = HEADER.unpack_from(self._buf)
            if kind not in Frame._value2member_map_:
                raise ProtocolError(f"unknown frame type {kind}")
            if flags != 0:
                raise ProtocolError(f"frame flags {flags} (must be 0)")
            if length > MAX_PAYLOAD:
                raise ProtocolError(f"frame of {length} bytes (max {MAX_PAYLOAD})")
            if len(self._buf) < HEADER.size + length:
                break
            payload = bytes(self._buf[HEADER.size : HEADER.size + length])
            del self._buf[: HEADER.size + length]
            frames.append((Frame(kind), stream, payload))
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


@dataclass
class _Stream:
    id: int
    target: int
    closing: bool = False  # we sent CLOSE; waiting for the guest's
    send_credit: int = WINDOW  # bytes we may still send to the guest
    unacked: int = 0  # guest bytes received and not yet credited back
    eof_in: bool = False
    eof_out: bool = False
    pending: list[bytes] = field(default_factory=list)  # before the connection is up
    writer: asyncio.StreamWriter | None = None
    credit_event: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    pumping: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set once torn down
    answered: bool = False  # the guest sent DATA or EOF (for a host-opened stream: it connected)
    refused_reply: bytes = b""  # host-opened: written to the client if the guest refuses

    @property
    def inbound(self) -> bool:
        return self.target == TARGET_INBOUND


@dataclass
class MuxStats:
    opened: int = 0
    refused: int = 0
    overruns: int = 0
    peak_streams: int = 0
    closed_reason: str | None = None
    inbound_opened: int = 0
    inbound_refused: int = 0
    peak_inbound: int = 0


class NetMux:
    """Host end of the ``piwork.net`` port: connects to ``socket_path`` (QEMU's chardev)."""

    def __init__(
        self,
        socket_path: Path,
        targets: dict[int, int],
        *,
        alive: Callable[[], bool] = lambda: True,
        max_streams: int = MAX_STREAMS,
        host: str = "127.0.0.1",
    ) -> None:
        for target, port in targets.items():
            if target not in (TARGET_GATEWAY, TARGET_EGRESS) or not 0 < port < 65536:
                raise ValueError(f"bad netmux target {target} -> {port}")
        self.socket_path = socket_path
        self.targets = dict(targets)
        self.alive = alive
        self.max_streams = max_streams
        self.host = host
        self.stats = MuxStats()
        self._streams: dict[int, _Stream] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._wlock = asyncio.Lock()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._next_inbound = HOST_IDS
        self._thawed = asyncio.Event()  # cleared while host-opened streams are frozen
        self._thawed.set()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Connect in the background (retrying while QEMU starts) and serve the port."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="netmux")

    async def wait_ready(self, timeout: float) -> bool:
        """True once the guest answered HELLO (its supervisor serves the port)."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    @property
    def active_streams(self) -> int:
        """Open streams, both directions (each holds at most one host connection)."""
        return sum(1 for st in self._streams.values() if not st.closing)

    @property
    def outbound_streams(self) -> int:
        """Guest-opened streams with a connection (or one being made) to a host target."""
        return sum(1 for st in self._streams.values() if not st.closing and not st.inbound)

    @property
    def inbound_streams(self) -> int:
        """Host-opened streams (previews) still open."""
        return sum(1 for st in self._streams.values() if not st.closing and st.inbound)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self._teardown()

    async def _run(self) -> None:
        while not self._closed:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
            except OSError as exc:  # not there yet (QEMU starting), or refused
                if not self.alive():
                    self.stats.closed_reason = f"the VM is gone ({exc})"
                    return
                await asyncio.sleep(0.05)
                continue
            await self.serve(reader, writer)
            return  # one connection per run: the guest does not get a second try

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection of the port until EOF or a protocol error."""
        self._writer = writer
        nonce = os.urandom(NONCE_BYTES)
        try:
            await self._send(hello(nonce))
            rest = await self._resync(reader, hello(nonce))
            self._ready.set()
            parser = FrameReader()
            frames = parser.feed(rest)
            while True:
                for kind, stream, payload in frames:
                    await self._dispatch(kind, stream, payload)
                data = await reader.read(READ_CHUNK)
                if not data:
                    self.stats.closed_reason = "the VM closed the port"
                    return
                frames = parser.feed(data)
        except ProtocolError as exc:
            self.stats.closed_reason = f"protocol error: {exc}"
            log.warning("netmux: closing the guest's network port: %s", exc)
        except (ConnectionError, OSError) as exc:
            self.stats.closed_reason = f"port error: {exc}"
            log.debug("netmux: port dropped: %s", exc)
        finally:
            self._ready.clear()
            await self._teardown()

    async def _resync(self, reader: asyncio.StreamReader, want: bytes) -> bytes:
        """Discard bytes until the guest's echo of our HELLO; return what follows it."""
        buf = b""
        discarded = 0
        while True:
            idx = buf.find(want)
            if idx >= 0:
                return buf[idx + len(want) :]
            keep = len(want) - 1
            if len(buf) > keep:
                discarded += len(buf) - keep
                buf = buf[-keep:]
            if discarded > MAX_RESYNC_BYTES:
                raise ProtocolError(f"no HELLO echo within {MAX_RESYNC_BYTES} bytes")
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionError("the VM closed the port before answering HELLO")
            buf += data

    async def _teardown(self) -> None:
        for st in list(self._streams.values()):
            self._drop(st)
        self._streams.clear()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # ------------------------------------------------------------ sending
    async def _send(self, frame: bytes) -> None:
        writer = self._writer
        if writer is None:
            return
        async with self._wlock:
            writer.write(frame)
            await writer.drain()  # bounded: wait while QEMU has not taken the bytes

    def _spawn(self, st: _Stream, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        st.tasks.add(task)
        task.add_done_callback(st.tasks.discard)

    # ------------------------------------------------------------ guest frames
    async def _dispatch(self, kind: Frame, sid: int, payload: bytes) -> None:
        if kind is Frame.HELLO:
            raise ProtocolError("a second HELLO from the guest")
        if kind is Frame.CONNECT:
            raise ProtocolError("CONNECT from the guest (only the host opens those)")
        if sid == 0:
            raise ProtocolError(f"{kind.name} on stream 0")
        st = self._streams.get(sid)
        if kind is Frame.OPEN:
            await self._on_open(sid, payload, st)
            return
        if st is None:
            return  # a stream already forgotten (frames crossing our CLOSE): ignore
        if kind is Frame.CLOSE:
            if not st.closing:
                if st.inbound and not st.answered and st.refused_reply and st.writer:
                    # Nothing listens on that guest port (yet): say so instead of a bare close.
                    with contextlib.suppress(OSError, RuntimeError):
                        st.writer.write(st.refused_reply)
                await self._send(encode(Frame.CLOSE, sid))
            self._forget(st)
            return
        if st.closing:
            return  # crossing our CLOSE
        if kind is Frame.DATA:
            await self._on_data(st, payload)
        elif kind is Frame.EOF:
            if payload or st.eof_in:
                raise ProtocolError(f"bad EOF on stream {sid}")
            st.eof_in = True
            st.answered = True
            if st.writer is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    st.writer.write_eof()
            await self._maybe_finish(st)
        elif kind is Frame.WINDOW:
            if len(payload) != 4:
                raise ProtocolError(f"WINDOW payload of {len(payload)} bytes")
            (inc,) = struct.unpack(">I", payload)
            st.send_credit += inc
            if st.send_credit > WINDOW:
                raise ProtocolError(f"window overflow on stream {sid}")
            st.credit_event.set()

    async def _on_open(self, sid: int, payload: bytes, st: _Stream | None) -> None:
        if st is not None:
            raise ProtocolError(f"OPEN of stream {sid}, which is in use")
        if len(payload) != 1:
            raise ProtocolError(f"OPEN payload of {len(payload)} bytes")
        target = payload[0]
        if target not in (TARGET_GATEWAY, TARGET_EGRESS):
            raise ProtocolError(f"OPEN of unknown target {target}")
        if sid >= HOST_IDS:
            raise ProtocolError(f"OPEN of stream {sid}, a host-side id")
        if sum(1 for s in self._streams.values() if not s.inbound) >= 4 * self.max_streams:
            # Closed streams the guest never answered: it is not following the protocol.
            raise ProtocolError(f"{len(self._streams)} streams held, most of them unanswered")
        port = self.targets.get(target)
        if port is None or self.outbound_streams >= self.max_streams:
            # Refused (this run has no such target, or the cap is reached): the id is
            # held until the guest's CLOSE answers ours, like any other close.
            self.stats.refused += 1
            self._streams[sid] = _Stream(sid, target, closing=True)
            await self._send(encode(Frame.CLOSE, sid))
            return
        st = _Stream(sid, target)
        self._streams[sid] = st
        self.stats.opened += 1
        self.stats.peak_streams = max(self.stats.peak_streams, self.outbound_streams)
        self._spawn(st, self._connect(st, port))

    async def _on_data(self, st: _Stream, payload: bytes) -> None:
        if not payload or st.eof_in:
            raise ProtocolError(f"bad DATA on stream {st.id}")
        st.answered = True
        st.unacked += len(payload)
        if st.unacked > WINDOW:
            # The guest overran its window: this stream ends, the port goes on.
            self.stats.overruns += 1
            await self._abort(st)
            return
        if st.writer is None:
            st.pending.append(payload)  # bounded by the window
            return
        st.writer.write(payload)
        self._pump_credit(st)

    def _pump_credit(self, st: _Stream) -> None:
        if not st.pumping:
            st.pumping = True
            self._spawn(st, self._credit(st))

    async def _credit(self, st: _Stream) -> None:
        """Give the guest its window back as the target takes the bytes."""
        try:
            while st.unacked and st.writer is not None and not st.closing:
                await st.writer.drain()
                n, st.unacked = st.unacked, 0
                if n and not st.closing:
                    await self._send(encode(Frame.WINDOW, st.id, struct.pack(">I", n)))
        except (ConnectionError, OSError):
            await self._abort(st)
        finally:
            st.pumping = False

    # ------------------------------------------------------------ host side
    async def _connect(self, st: _Stream, port: int) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            log.debug("netmux: stream %d: cannot reach port %d: %s", st.id, port, exc)
            await self._abort(st)
            return
        if st.closing or self._streams.get(st.id) is not st:
            writer.close()
            return
        st.writer = writer
        for chunk in st.pending:
            writer.write(chunk)
        st.pending.clear()
        if st.eof_in:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        if st.unacked:
            self._pump_credit(st)
        await self._upstream(st, reader)

    async def _upstream(self, st: _Stream, reader: asyncio.StreamReader) -> None:
        """Target (or, for a host-opened stream, the host client) -> guest, within the
        guest's window."""
        try:
            while not st.closing:
                if st.inbound and not self._thawed.is_set():
                    await self._thawed.wait()  # frozen: the connection is kept, no data
                    continue
                if st.send_credit <= 0:
                    st.credit_event.clear()
                    await st.credit_event.wait()
                    continue
                data = await reader.read(min(st.send_credit, MAX_PAYLOAD))
                if st.inbound and not self._thawed.is_set():
                    await self._thawed.wait()  # read just before the freeze: held, one chunk
                if st.closing:
                    return
                if not data:
                    st.eof_out = True
                    await self._send(encode(Frame.EOF, st.id))
                    await self._maybe_finish(st)
                    return
                st.send_credit -= len(data)
                await self._send(encode(Frame.DATA, st.id, data))
        except (ConnectionError, OSError):
            await self._abort(st)

    async def _maybe_finish(self, st: _Stream) -> None:
        if st.eof_in and st.eof_out and not st.closing:
            await self._abort(st)

    async def _abort(self, st: _Stream) -> None:
        """We end the stream: CLOSE to the guest, forget it when the guest answers."""
        if st.closing or self._streams.get(st.id) is not st:
            return
        st.closing = True
        self._drop(st)
        await self._send(encode(Frame.CLOSE, st.id))

    def _drop(self, st: _Stream) -> None:
        st.closing = True
        st.done.set()
        st.credit_event.set()
        st.pending.clear()
        if st.writer is not None:
            st.writer.close()
            st.writer = None
        current = asyncio.current_task()
        for task in list(st.tasks):
            if task is not current:
                task.cancel()

    def _forget(self, st: _Stream) -> None:
        self._drop(st)
        self._streams.pop(st.id, None)

    # ------------------------------------------------------------ host-opened streams
    async def open_inbound(
        self,
        port: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first: bytes = b"",
        *,
        refused: bytes = b"",
    ) -> asyncio.Event | None:
        """Carry a host connection into guest ``port`` (a preview): CONNECT, then a
        byte pipe both ways, bounded like a guest-opened stream.

        ``first`` is what the caller already read from the connection (at most
        one window); ``refused`` is written to it if the guest closes the stream
        before sending anything (nothing listens on the port). Returns an event
        set when the stream is over (``writer`` is closed by then), or None when
        the stream cannot be opened (the port is not up, or ``max_streams``
        host-opened streams are open); the caller still owns ``writer`` then.
        """
        if not 0 < port < 65536:
            raise ValueError(f"bad guest port {port}")
        if len(first) > WINDOW:
            raise ValueError(f"{len(first)} bytes before the stream opens (max {WINDOW})")
        if self._writer is None or not self.ready or self.inbound_streams >= self.max_streams:
            self.stats.inbound_refused += 1
            return None
        held = sum(1 for s in self._streams.values() if s.inbound)
        if held >= 4 * self.max_streams:
            self.stats.inbound_refused += 1  # closed ones the guest has not answered yet
            return None
        sid = self._next_inbound
        while sid in self._streams:
            sid = HOST_IDS + (sid + 1 - HOST_IDS) % HOST_IDS
        self._next_inbound = HOST_IDS + (sid + 1 - HOST_IDS) % HOST_IDS
        st = _Stream(sid, TARGET_INBOUND, refused_reply=refused)
        st.writer = writer
        self._streams[sid] = st
        self.stats.inbound_opened += 1
        self.stats.peak_inbound = max(self.stats.peak_inbound, self.inbound_streams)
        await self._send(encode(Frame.CONNECT, sid, struct.pack(">H", port)))
        for i in range(0, len(first), MAX_PAYLOAD):
            chunk = first[i : i + MAX_PAYLOAD]
            st.send_credit -= len(chunk)
            await self._send(encode(Frame.DATA, sid, chunk))
        self._spawn(st, self._upstream(st, reader))
        return st.done

    async def close_inbound(self, done: asyncio.Event) -> None:
        """End the host-opened stream whose ``open_inbound`` returned ``done``."""
        for st in list(self._streams.values()):
            if st.done is done:
                await self._abort(st)

    def freeze_inbound(self) -> None:
        """Stop carrying host-client bytes into the guest (the task is paused);
        connections stay open."""
        self._thawed.clear()

    def thaw_inbound(self) -> None:
        self._thawed.set()
