"""One open preview: a loopback listener whose connections become host-opened netmux streams.

Where it listens (review 2, findings 6 and 14): on an address of its own,
``127.a.b.c`` (a, b, c random; Linux routes all of 127.0.0.0/8 to ``lo``), on
a port the kernel picks. The URL names that address, so

* the page's origin ``http://127.a.b.c:<port>`` is one no local allowlist
  trusts: not ``localhost``, ``*.localhost``, ``127.0.0.1`` or ``[::1]`` (Vite's
  default CORS origin, and what other dev tools take for "local"), and its
  cookies are its own (browsers keep cookies per host, not per port);
* a browser connects to exactly that IPv4 address: no name is resolved, so no
  ``::1`` is tried first that another local user could have bound.

Where only 127.0.0.1 can be bound (macOS has no other loopback address by
default) the preview falls back to the name ``<task>-<port>.localhost``, which
browsers resolve to both loopbacks: it is opened only when the same port is
bound on 127.0.0.1 *and* ::1 (or the system has no ::1 at all), never on one
family silently; otherwise the preview is refused with the reason.

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
import errno
import logging
import secrets
from dataclasses import dataclass, field
from typing import Protocol

from piwork.errors import PersonError
from piwork.preview import gate

log = logging.getLogger(__name__)

MAX_WAITING = 64
"""Connections still sending their first head (or waiting for a thaw); more are closed."""

BACKLOG = 64
"""The listen backlog; asyncio also accepts up to this many at once before the
ones over ``MAX_WAITING`` are closed, so it bounds the transient descriptors too."""


BIND_TRIES = 16
"""Addresses (or ports, in the fallback) tried before a preview is refused."""


class PreviewUnavailable(OSError, PersonError):
    """No loopback listener could be made that answers for this user only."""


def pick_address() -> str:
    """A random loopback address away from the ones in common use (127.0.0.1, 127.0.1.1)."""
    a, b, c = 100 + secrets.randbelow(155), 1 + secrets.randbelow(254), 1 + secrets.randbelow(254)
    return f"127.{a}.{b}.{c}"


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
        self.address: str | None = None
        """The preview's own loopback address; None in the ``.localhost`` fallback."""
        self._servers: list[asyncio.Server] = []
        self._conns: set[asyncio.Task[None]] = set()
        self._streams: set[asyncio.Event] = set()
        self._waiting = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}/"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def _listen(self, host: str, port: int) -> asyncio.Server:
        # Loopback only; limit bounds the first head (readuntil) and the reader's buffer.
        return await asyncio.start_server(
            self._accept, host, port, limit=gate.MAX_HEAD, backlog=BACKLOG
        )

    async def start(self) -> None:
        """Listen on an address of the preview's own; raises :class:`PreviewUnavailable`."""
        for _ in range(BIND_TRIES):
            address = pick_address()
            try:
                server = await self._listen(address, 0)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue  # another process has it: another address
                if exc.errno == errno.EADDRNOTAVAIL:
                    await self._start_named()  # only 127.0.0.1 exists here
                    return
                raise
            self._servers = [server]
            self.address = address
            self.host_port = int(server.sockets[0].getsockname()[1])
            self.host = gate.address_host(address, self.host_port)
            return
        raise PreviewUnavailable(f"no free loopback address after {BIND_TRIES} tries")

    async def _start_named(self) -> None:
        """The ``.localhost`` fallback: the same port on 127.0.0.1 and ::1, or nothing.

        Browsers resolve the name to both and may try ::1 first: a port taken there by
        another local user would answer the person's URL, so another port is tried.
        """
        for _ in range(BIND_TRIES):
            v4 = await self._listen("127.0.0.1", 0)
            port = int(v4.sockets[0].getsockname()[1])
            try:
                v6: asyncio.Server | None = await self._listen("::1", port)
            except OSError as exc:
                if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    v4.close()  # ::1 is there and this port is taken on it
                    continue
                v6 = None  # no ::1 on this system: no one can answer there either
            self._servers = [v4, *([v6] if v6 is not None else [])]
            self.host_port = port
            self.host = gate.preview_host(self.task_id, self.guest_port, port)
            return
        raise PreviewUnavailable(
            f"no loopback port free on both 127.0.0.1 and ::1 after {BIND_TRIES} tries "
            "(another program holds them on ::1)"
        )

    async def close(self) -> None:
        """Stop listening and end every connection (the task stopped)."""
        for server in self._servers:
            server.close()
        for done in list(self._streams):
            with contextlib.suppress(Exception):
                await self.mux.close_inbound(done)
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        for server in self._servers:
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
