"""A hand-written guest end of the netmux that answers CONNECT (host-opened streams).

It stands in for runtime-pack/supervisor/netmux.js in host-only tests of
previews (the VM tests use the real one): each CONNECT to guest port P is
connected to ``127.0.0.1:ports[P]`` on this machine, and bytes are carried
both ways honouring the host's window. It records every CONNECT, so a test
can prove that a refused request never reached "the guest".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

from piwork.vm.netmux import HEADER, MAX_PAYLOAD, WINDOW, Frame, FrameReader, NetMux, encode


class MuxGuest:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ports: dict[int, int]
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.ports = ports
        self.connects: list[int] = []  # guest ports asked for, in order
        self.live: dict[int, asyncio.StreamWriter] = {}
        self.credit: dict[int, int] = {}
        self.credit_event: dict[int, asyncio.Event] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.peak_live = 0

    def send(self, kind: Frame, sid: int, payload: bytes = b"") -> None:
        self.writer.write(encode(kind, sid, payload))

    async def run(self) -> None:
        head = await self.reader.readexactly(HEADER.size)
        _, _, _, length = HEADER.unpack(head)
        self.writer.write(head + await self.reader.readexactly(length))  # echo HELLO
        parser = FrameReader()
        while data := await self.reader.read(65536):
            for kind, sid, payload in parser.feed(data):
                await self.on_frame(kind, sid, payload)

    async def on_frame(self, kind: Frame, sid: int, payload: bytes) -> None:
        if kind is Frame.CONNECT:
            (port,) = struct.unpack(">H", payload)
            self.connects.append(port)
            target = self.ports.get(port)
            try:
                if target is None:
                    raise ConnectionRefusedError
                r, w = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                self.send(Frame.CLOSE, sid)
                return
            self.live[sid] = w
            self.peak_live = max(self.peak_live, len(self.live))
            self.credit[sid] = WINDOW
            self.credit_event[sid] = asyncio.Event()
            task = asyncio.create_task(self.pump(sid, r))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif kind is Frame.DATA and sid in self.live:
            w = self.live[sid]
            w.write(payload)
            with contextlib.suppress(ConnectionError):
                await w.drain()
            self.send(Frame.WINDOW, sid, struct.pack(">I", len(payload)))
        elif kind is Frame.EOF and sid in self.live:
            with contextlib.suppress(OSError):
                self.live[sid].write_eof()
        elif kind is Frame.WINDOW and sid in self.live:
            self.credit[sid] += struct.unpack(">I", payload)[0]
            self.credit_event[sid].set()
        elif kind is Frame.CLOSE:
            gone = self.live.pop(sid, None)
            if gone is not None:
                gone.close()
                self.send(Frame.CLOSE, sid)

    async def pump(self, sid: int, r: asyncio.StreamReader) -> None:
        try:
            while sid in self.live:
                if self.credit[sid] <= 0:
                    self.credit_event[sid].clear()
                    await self.credit_event[sid].wait()
                    continue
                data = await r.read(min(self.credit[sid], MAX_PAYLOAD))
                if not data:
                    self.send(Frame.EOF, sid)
                    return
                self.credit[sid] -= len(data)
                self.send(Frame.DATA, sid, data)
        except ConnectionError:
            pass
        w = self.live.pop(sid, None)
        if w is not None:
            w.close()
            self.send(Frame.CLOSE, sid)


@contextlib.asynccontextmanager
async def mux_with_guest(ports: dict[int, int]) -> AsyncIterator[tuple[NetMux, MuxGuest]]:
    a, b = socket.socketpair()
    mux = NetMux(Path("/nonexistent"), {0: 9})
    hr, hw = await asyncio.open_unix_connection(sock=a)
    gr, gw = await asyncio.open_unix_connection(sock=b)
    serve = asyncio.create_task(mux.serve(hr, hw))
    guest = MuxGuest(gr, gw, ports)
    run = asyncio.create_task(guest.run())
    assert await mux.wait_ready(5)
    try:
        yield mux, guest
    finally:
        await mux.close()
        run.cancel()
        for t in list(guest.tasks):
            t.cancel()
        gw.close()
        for t in (serve, run):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(t, 5)
