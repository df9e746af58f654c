"""One open preview: a loopback listener whose connections become host-opened netmux streams.

Each accepted connection's first request head is checked (``gate``) before a
byte reaches the guest; then the connection is a byte pipe into the guest
port (WebSockets, long polls and keep-alive all work), bounded by the
netmux's window and its cap on host-opened streams. Connections beyond what
the netmux takes get 503 and are closed. While the task is paused, new and
open connections are kept but carry nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Protocol

from piwork.preview import gate

log = logging.getLogger(__name__)

MAX_WAITING = 64
"""Connections still sending their first head (or waiting for a thaw); more are closed."""

BACKLOG = 64
"""The listen backlog; asyncio also accepts up to this many at once before the
ones over ``MAX_WAITING`` are closed, so it bounds the transient descriptors too."""


class Mux(Protocol):
    """What a preview needs of :class:`piwork.vm.netmux.NetMux`."""

    async def open_inbound(
        self,
        port: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first: bytes = b"",
        *,
        refused: bytes = b"",
    ) -> asyncio.Event | None: ...

    async def close_inbound(self, done: asyncio.Event) -> None: ...


@dataclass
class PreviewStats:
    accepted: int = 0
    refused: int = 0
    """Heads refused (wrong Host, Origin, malformed, too big, too slow)."""
    busy: int = 0
    """Connections closed because the netmux took no more streams (503) or too many waited."""
    streams: int = 0
    """Connections carried into the guest."""
    refusals: list[int] = field(default_factory=list)
    """Status codes of the last refusals (at most 20), for tests and the log."""


class PreviewServer:
    def __init__(self, mux: Mux, task_id: str, guest_port: int, thawed: asyncio.Event) -> None:
        self.mux = mux
        self.task_id = task_id
        self.guest_port = guest_port
        self.thawed = thawed
        self.stats = PreviewStats()
        self.host_port = 0
        self.host = ""
        self._server: asyncio.Server | None = None
        self._server6: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._streams: set[asyncio.Event] = set()
        self._waiting = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}/"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def start(self) -> None:
        # Loopback only; limit bounds the first head (readuntil) and the reader's buffer.
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", 0, limit=gate.MAX_HEAD, backlog=BACKLOG
        )
        self.host_port = int(self._server.sockets[0].getsockname()[1])
        self.host = gate.preview_host(self.task_id, self.guest_port, self.host_port)
        # Browsers resolve *.localhost to ::1 as well as 127.0.0.1 and may try ::1
        # first: listen there too when the port is free on it (loopback still).
        with contextlib.suppress(OSError):
            self._server6 = await asyncio.start_server(
                self._accept, "::1", self.host_port, limit=gate.MAX_HEAD, backlog=BACKLOG
            )

    async def close(self) -> None:
        """Stop listening and end every connection (the task stopped)."""
        for server in (self._server, self._server6):
            if server is not None:
                server.close()
        for done in list(self._streams):
            with contextlib.suppress(Exception):
                await self.mux.close_inbound(done)
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        for server in (self._server, self._server6):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 5)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self._waiting >= MAX_WAITING:
            self.stats.busy += 1
            writer.close()
            return
        task = asyncio.create_task(self._serve(reader, writer))
        self._conns.add(task)
        task.add_done_callback(self._conns.discard)

    def _note_refusal(self, status: int) -> None:
        self.stats.refused += 1
        self.stats.refusals = [*self.stats.refusals[-19:], status]

    async def _answer(self, writer: asyncio.StreamWriter, verdict: gate.Verdict) -> None:
        with contextlib.suppress(Exception):
            writer.write(gate.refusal(verdict))
            await asyncio.wait_for(writer.drain(), 5)
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handed_over = False
        self._waiting += 1
        try:
            head, refused = await gate.read_head(reader)
            if refused is None:
                refused = gate.check_head(head, self.host)
                refused = None if refused.ok else refused
            if refused is not None:
                self._note_refusal(refused.status)
                if refused.status:  # 0: the client went away, there is no one to answer
                    await self._answer(writer, refused)
                return
            await self.thawed.wait()  # paused: the connection waits, nothing reaches the guest
            nothing = gate.Verdict(
                False, 502, f"nothing answers on port {self.guest_port} in the VM (yet)"
            )
            done = await self.mux.open_inbound(
                self.guest_port, reader, writer, head, refused=gate.refusal(nothing)
            )
            if done is None:
                self.stats.busy += 1
                await self._answer(
                    writer, gate.Verdict(False, 503, "too many open connections to this preview")
                )
                return
            handed_over = True
            self.stats.streams += 1
            self._waiting -= 1
            self._streams.add(done)
            try:
                await done.wait()  # the netmux closes the writer when the stream ends
            finally:
                self._streams.discard(done)
        except asyncio.CancelledError:
            pass
        finally:
            if not handed_over:
                self._waiting -= 1
                writer.close()
