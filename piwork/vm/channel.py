"""The host end of the guest supervisor's channel (docs/guest-protocol.md).

Lines from the guest are ``<seq> <payload>``. After each (re)connection the
host says ``hello`` with the last seq it processed; the supervisor replays
everything newer. Numbered lines are therefore accepted strictly in order:
anything at or below the last seq is a duplicate and dropped, anything read
before the hello reply belongs to the previous connection's stream and is
ignored (the replay brings it again, in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from piwork import errors

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024 * 1024
"""Longest line kept (seq, space and payload); a longer one is skipped and reported."""
MAX_GAPS = 100
"""Gaps remembered (the latest ones); each is also reported as an event."""
BIG_LINE = 1024 * 1024
"""Lines longer than this are joined and parsed in a worker thread, not on the loop."""
READ_CHUNK = 256 * 1024
STREAM_LIMIT = 1024 * 1024
"""The stream's buffer limit: the transport stops reading past twice this (back-pressure)."""
YIELD_EVERY = 0.005
"""Seconds of reading after which the reader lets other tasks run."""

PiLineHandler = Callable[[bytes], None]
PiLinePreparer = Callable[[bytes], object]
"""Runs in a worker thread for a big pi line (parse it, record it); the result goes to
the prepared-line handler on the loop."""
PreparedPiLineHandler = Callable[[bytes, object], None]
EventHandler = Callable[[dict[str, Any]], None]


@dataclass
class _ReadState:
    greeted: bool = False
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    skipped: int = 0  # bytes of a too-long line being dropped (0: none)
    head: bytes = b""


def _split_big(parts: list[bytes], prepare: PiLinePreparer | None) -> tuple[bytes, bytes, object]:
    """In a worker thread: join a big line, split off its seq, prepare a pi payload."""
    line = b"".join(parts)
    parts.clear()
    seq_text, _, payload = line.partition(b" ")
    del line
    prepared = None
    if prepare is not None and not payload.startswith(b"!"):
        prepared = prepare(payload)
    return seq_text, payload, prepared


class ChannelError(RuntimeError, errors.VmError):
    pass


@dataclass(frozen=True)
class Endpoint:
    """Where the supervisor is reachable: a unix socket (virtio) or a TCP port."""

    unix_path: Path | None = None
    tcp_port: int | None = None
    tcp_secret: bytes | None = field(default=None, repr=False)
    """The TCP transport's per-run secret: sent first on every connection."""

    def describe(self) -> str:
        return str(self.unix_path) if self.unix_path else f"127.0.0.1:{self.tcp_port}"

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.unix_path is not None:
            return await asyncio.open_unix_connection(str(self.unix_path), limit=STREAM_LIMIT)
        assert self.tcp_port is not None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.tcp_port, limit=STREAM_LIMIT
        )
        if self.tcp_secret is not None:
            writer.write(b"auth " + self.tcp_secret + b"\n")
        return reader, writer


class GuestChannel:
    """A reconnecting, loss-free line channel to the guest supervisor."""

    def __init__(
        self,
        endpoint: Endpoint,
        on_pi_line: PiLineHandler,
        on_event: EventHandler,
        *,
        alive: Callable[[], bool] = lambda: True,
        prepare_pi_line: PiLinePreparer | None = None,
        on_prepared_pi_line: PreparedPiLineHandler | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.on_pi_line = on_pi_line
        self.prepare_pi_line = prepare_pi_line
        self.on_prepared_pi_line = on_prepared_pi_line
        self.on_event = on_event
        self.alive = alive
        self.last_seq = 0
        self.boot_id: str | None = None
        self.reconnects = 0
        """Connections the supervisor had answered (its hello reply) that were lost."""
        self.unanswered = 0
        """Connections closed before the supervisor answered them: on the tcp transport,
        QEMU's slirp accepts every connection to the forwarded port at once and closes it
        when the guest refuses it (at boot, before the supervisor listens). Not a loss."""
        self._answered = False
        self.gaps: list[tuple[int, int]] = []
        self._writer: asyncio.StreamWriter | None = None
        self._ready = asyncio.Event()  # connected and hello answered
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._pongs: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ping_id = 0
        self._write_lock = asyncio.Lock()

    # ------------------------------------------------------------ lifecycle
    async def start(self, timeout: float = 120.0) -> None:
        """Connect (retrying while the VM comes up) and run the reader in the background."""
        self._task = asyncio.create_task(self._run(), name="guest-channel")
        await self.wait_ready(timeout)

    async def wait_ready(self, timeout: float) -> None:
        ready = asyncio.ensure_future(self._ready.wait())
        assert self._task is not None
        done, _ = await asyncio.wait(
            {ready, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            if self._task in done:
                self._task.result()  # re-raise what killed the reader
            raise ChannelError(
                f"the guest supervisor did not answer on {self.endpoint.describe()} "
                f"within {timeout:.0f}s"
            )

    async def close(self) -> None:
        self._closed = True
        await self._drop_connection()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def reconnect(self) -> None:
        """Drop the connection on purpose (tests, recovery) and wait for the next one."""
        await self._drop_connection()
        await self.wait_ready(60)

    async def _drop_connection(self) -> None:
        self._ready.clear()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _run(self) -> None:
        while not self._closed:
            try:
                reader, writer = await self.endpoint.open()
            except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
                if not self.alive():
                    raise ChannelError("the VM is gone; the guest channel cannot connect") from None
                await asyncio.sleep(0.1)
                continue
            self._writer = writer
            self._answered = False
            try:
                await self._send_raw(
                    b"!" + orjson.dumps({"op": "hello", "after": self.last_seq}) + b"\n", force=True
                )
                await self._read_loop(reader)
            except (ConnectionError, OSError) as exc:
                log.debug("guest channel dropped: %s", exc)
            finally:
                self._ready.clear()
                if self._writer is writer:
                    self._writer = None
                writer.close()
            if self._closed:
                return
            if not self.alive():
                raise ChannelError("the VM exited; the guest channel closed")
            if self._answered:
                self.reconnects += 1
            else:
                self.unanswered += 1
            await asyncio.sleep(0.1)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        """Split the stream into lines and handle each, in order, until EOF.

        The stream is read in chunks and split here (one C-level split per
        chunk, not a ``readuntil`` per line). A line longer than
        :data:`BIG_LINE` is gathered in pieces, bounded by :data:`MAX_LINE`
        (beyond it the line is skipped and reported), and joined and parsed in
        a worker thread: a 60 MB tool result does not stall the loop. Every
        :data:`YIELD_EVERY` seconds of work the reader lets other tasks run,
        so a flooding guest cannot starve a stop.
        """
        loop = asyncio.get_running_loop()
        state = _ReadState()
        budget_end = loop.time() + YIELD_EVERY
        while True:
            chunk = await reader.read(READ_CHUNK)
            if not chunk:
                return  # EOF: the peer closed (a partial last line is dropped)
            newline = chunk.find(b"\n")
            if newline < 0:
                await self._gather(state, chunk)
                continue
            if state.parts or state.skipped:
                await self._gather(state, chunk[:newline])
                await self._end_gathered(state)
                rest = chunk[newline + 1 :]
            else:
                rest = chunk
            lines = rest.split(b"\n")
            tail = lines.pop()
            for line in lines:
                self._handle_line(state, line)
                if loop.time() >= budget_end:
                    # A flooding guest must not starve everything else on the loop
                    # (a stop included).
                    await asyncio.sleep(0)
                    budget_end = loop.time() + YIELD_EVERY
            if tail:
                await self._gather(state, tail)
            if loop.time() >= budget_end:
                await asyncio.sleep(0)
                budget_end = loop.time() + YIELD_EVERY

    async def _gather(self, state: _ReadState, piece: bytes) -> None:
        """Keep a piece of a line whose end has not arrived yet (bounded by MAX_LINE)."""
        if state.skipped:
            state.skipped += len(piece)
            return
        state.parts.append(piece)
        state.size += len(piece)
        if state.size > MAX_LINE:
            # Too long to keep: remember its head, count the rest, drop the bytes.
            head = b""
            for part in state.parts:
                head += part[: 4096 - len(head)]
                if len(head) >= 4096:
                    break
            state.head = head
            state.skipped = state.size
            state.parts.clear()
            state.size = 0

    async def _end_gathered(self, state: _ReadState) -> None:
        """The gathered line is complete: report it (too long) or handle it."""
        if state.skipped:
            total, head = state.skipped, state.head
            state.skipped, state.head = 0, b""
            self._report_oversized(total, head, state.greeted)
            return
        parts, state.parts, state.size = state.parts, [], 0
        if sum(len(p) for p in parts) <= BIG_LINE:
            self._handle_line(state, b"".join(parts))
            return
        # A big line: join, split off the seq and (for pi's lines) parse it in a
        # worker thread, then hand it on from the loop as any other line.
        prepare = self.prepare_pi_line
        seq_text, payload, prepared = await asyncio.to_thread(_split_big, parts, prepare)
        self._handle_payload(state, seq_text, payload, prepared, prepare is not None)

    def _handle_line(self, state: _ReadState, line: bytes) -> None:
        seq_text, _, payload = line.partition(b" ")
        self._handle_payload(state, seq_text, payload, None, False)

    def _handle_payload(
        self,
        state: _ReadState,
        seq_text: bytes,
        payload: bytes,
        prepared: object,
        is_prepared: bool,
    ) -> None:
        try:
            seq = int(seq_text)
        except ValueError:
            line = seq_text + b" " + payload[:200]
            self.on_event({"ev": "malformed", "line": line[:200].decode("utf-8", "replace")})
            return
        if seq == 0:
            msg = self._parse_event(payload)
            if msg is None:
                return
            try:
                state.greeted = self._on_transient(msg) or state.greeted
            except (KeyError, TypeError, ValueError) as exc:
                # A bad control line is the guest's problem, never the reader's death.
                log.warning("guest channel: dropped a malformed %r line: %s", msg.get("ev"), exc)
                self.on_event({"ev": "malformed", "line": payload[:200].decode("utf-8", "replace")})
            return
        if not state.greeted or seq <= self.last_seq:
            return
        if seq != self.last_seq + 1:
            # Bounded like the replay's own gap reports: a guest jumping its
            # numbering forever must not grow host memory.
            self.gaps = [*self.gaps[-(MAX_GAPS - 1) :], (self.last_seq + 1, seq - 1)]
            self.on_event({"ev": "gap", "from": self.last_seq + 1, "to": seq - 1})
        self.last_seq = seq
        if payload.startswith(b"!"):
            msg = self._parse_event(payload)
            if msg is not None:
                self.on_event(msg)
        elif is_prepared and self.on_prepared_pi_line is not None:
            self.on_prepared_pi_line(payload, prepared)
        else:
            self.on_pi_line(payload)

    def _on_transient(self, msg: dict[str, Any]) -> bool:
        """Handle an unnumbered line; True if it was the hello reply."""
        ev = msg.get("ev")
        if ev == "hello":
            boot = msg.get("bootId")
            previous = self.boot_id
            if previous is not None and boot != previous:
                # A different supervisor (the VM rebooted, or /init restarted a crashed
                # one): its numbering starts again, and the pi we knew is gone.
                self.last_seq = 0
                restarted = {"ev": "restarted", "bootId": boot, "previous": previous}
                self.on_event({**restarted, "pi": msg.get("pi")})
            self.boot_id = boot
            self._answered = True
            self._ready.set()
            return True
        if ev == "pong":
            fut = self._pongs.pop(int(msg.get("id") or 0), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif ev == "gap":
            start, end = int(msg["from"]), int(msg["to"])
            self.gaps = [*self.gaps[-(MAX_GAPS - 1) :], (start, end)]
            self.last_seq = max(self.last_seq, end)
            self.on_event(msg)
        return False

    def _report_oversized(self, total: int, first: bytes, greeted: bool) -> None:
        """A line longer than MAX_LINE was dropped; the RPC layer hears of it with its head."""
        seq_text, _, head = first.partition(b" ")
        try:
            seq = int(seq_text)
        except ValueError:
            seq = -1
        if seq > 0 and (not greeted or seq <= self.last_seq):
            return  # a replayed copy of a line already reported
        if seq == self.last_seq + 1:
            self.last_seq = seq
        self.on_event({"ev": "oversized", "bytes": total, "seq": seq, "head": head[:200]})

    def _parse_event(self, payload: bytes) -> dict[str, Any] | None:
        try:
            msg = orjson.loads(payload[1:])
        except orjson.JSONDecodeError:
            self.on_event({"ev": "malformed", "line": payload[:200].decode("utf-8", "replace")})
            return None
        return msg if isinstance(msg, dict) else None

    # ------------------------------------------------------------ sending
    async def _send_raw(self, data: bytes, *, force: bool = False) -> None:
        async with self._write_lock:
            while True:
                if not force:
                    await self._ready.wait()
                writer = self._writer
                if writer is None:
                    if force:
                        raise ConnectionError("not connected")
                    await asyncio.sleep(0.05)
                    continue
                writer.write(data)
                await writer.drain()
                return

    async def send_pi_line(self, line: bytes) -> None:
        """Send one line to pi's stdin (waits through a reconnect, never drops it)."""
        if line.endswith(b"\n"):
            line = line[:-1]
        if line.startswith(b"!") or b"\n" in line:
            raise ValueError("a pi line must be one JSON object without newlines")
        await self._send_raw(line + b"\n")

    async def send_op(self, op: str, **fields: Any) -> None:
        await self._send_raw(b"!" + orjson.dumps({"op": op, **fields}) + b"\n")

    async def ping(self, timeout: float = 10.0) -> dict[str, Any]:
        self._ping_id += 1
        pid = self._ping_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pongs[pid] = fut
        started = time.monotonic()
        await self.send_op("ping", id=pid)
        try:
            msg = await asyncio.wait_for(fut, timeout)
        finally:
            self._pongs.pop(pid, None)
        msg["rtt"] = time.monotonic() - started
        return msg
