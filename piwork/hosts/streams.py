"""Remote unix sockets (QEMU's QMP, console, RPC and netmux ports) reached through SSH.

Each connection is an SSH *direct-streamlocal* channel (asyncssh
``open_unix_connection``) to the socket's path on the remote. The rest of
piwork speaks asyncio streams (and qemu.qmp wants a socket), so the channel is
joined to one end of an anonymous ``socketpair()``: no socket file and no
listening port is opened on either machine, and the far end behaves exactly
like QEMU's socket (EOF, half-close) for the code that reads it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncssh

from piwork.errors import VmError
from piwork.vm.channel import STREAM_LIMIT, Endpoint
from piwork.vm.netmux import NetMux

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
_pumps: set[asyncio.Task[None]] = set()

ConnGetter = Callable[[], asyncssh.SSHClientConnection]


class StreamUnavailable(ConnectionError, VmError):
    """The remote socket is not there (yet) or the SSH link is down."""


async def _pump_in(src: asyncssh.SSHReader[bytes], dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (asyncssh.Error, OSError, ConnectionError):
        dst.close()


async def _pump_out(src: asyncio.StreamReader, dst: asyncssh.SSHWriter[bytes]) -> None:
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        dst.write_eof()
    except (asyncssh.Error, OSError, ConnectionError):
        dst.close()


def _spawn(coro: Awaitable[None], name: str) -> asyncio.Task[None]:
    task = asyncio.ensure_future(coro)
    task.set_name(name)
    _pumps.add(task)
    task.add_done_callback(_pumps.discard)
    return task


async def open_socket(conn: asyncssh.SSHClientConnection, path: str) -> socket.socket:
    """A local socket whose peer is ``path`` on the remote, carried by one SSH channel."""
    try:
        ssh_reader, ssh_writer = await conn.open_unix_connection(path, encoding=None)
    except (asyncssh.Error, OSError) as exc:
        raise StreamUnavailable(
            f"cannot reach {path} on the remote: {exc} (if it exists there, the remote sshd "
            "must allow AllowStreamLocalForwarding yes and AllowTcpForwarding yes or local)"
        ) from exc
    mine, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=theirs, limit=STREAM_LIMIT)
    inbound = _spawn(_pump_in(ssh_reader, writer), f"ssh-in {path}")
    outbound = _spawn(_pump_out(reader, ssh_writer), f"ssh-out {path}")

    async def close_when_done() -> None:
        await asyncio.gather(inbound, outbound, return_exceptions=True)
        writer.close()
        ssh_writer.close()

    _spawn(close_when_done(), f"ssh-close {path}")
    return mine


async def open_streams(
    conn: asyncssh.SSHClientConnection, path: str, *, limit: int = STREAM_LIMIT
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = await open_socket(conn, path)
    return await asyncio.open_unix_connection(sock=sock, limit=limit)


async def open_retrying(
    conn: asyncssh.SSHClientConnection,
    path: str,
    *,
    alive: Callable[[], bool],
    timeout: float = 30.0,
) -> socket.socket:
    """Like :func:`open_socket`, waiting while QEMU creates the socket."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await open_socket(conn, path)
        except StreamUnavailable:
            if not alive() or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


class RemoteEndpoint(Endpoint):
    """The supervisor's RPC port on the remote: every (re)connection is a new channel.

    ``conn`` is asked each time, so after an SSH reconnect the channel's own
    reconnect goes through the new connection.
    """

    _conn: ConnGetter
    _path: str

    def __init__(self, conn: ConnGetter, path: str) -> None:
        super().__init__()
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_path", path)

    def describe(self) -> str:
        return f"remote:{self._path}"

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await open_streams(self._conn(), self._path)
        except StreamUnavailable as exc:
            raise ConnectionRefusedError(str(exc)) from exc


class RemoteNetMux(NetMux):
    """The netmux port on the remote; its streams still go to the gateway and proxy *here*."""

    def __init__(
        self,
        conn: ConnGetter,
        path: str,
        targets: dict[int, int],
        *,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        # NetMux only keeps socket_path for _run, replaced here: nothing local is opened.
        super().__init__(Path(path), targets, alive=alive)
        self._conn = conn
        self._path = path
        self.reconnects = 0

    async def _run(self) -> None:
        """Serve the port, connecting again after a drop of the SSH channel under it.

        Locally a closed port means the VM is done; here it may be a dropped SSH
        connection with the VM still running, so the port is connected again and
        the HELLO handshake resets the streams (the guest's open connections are
        closed; new ones work). A protocol error still ends the guest's network.
        """
        while not self._closed:
            try:
                reader, writer = await open_streams(self._conn(), self._path)
            except StreamUnavailable as exc:
                if not self.alive():
                    self.stats.closed_reason = f"the VM is gone ({exc})"
                    return
                await asyncio.sleep(0.05)
                continue
            await self.serve(reader, writer)
            if (self.stats.closed_reason or "").startswith("protocol error") or not self.alive():
                return
            self.reconnects += 1
            await asyncio.sleep(0.2)
