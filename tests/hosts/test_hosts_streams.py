"""Remote unix sockets through SSH direct-streamlocal channels, against a real sshd."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.streams import StreamUnavailable, open_socket, open_streams
from tests.helpers.hosts import Sshd


async def test_a_remote_socket_is_a_local_stream_with_eof(sshd: Sshd) -> None:
    d = Path(tempfile.mkdtemp(prefix="pws-"))
    path = d / "echo.sock"
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF (half-close crosses SSH)
        got.append(data)
        writer.write(data.upper())
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, str(path))
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    try:
        reader, writer = await open_streams(conn, str(path))
        payload = os.urandom(3 << 20).hex().encode()  # 6 MiB: more than any window
        writer.write(payload)
        writer.write_eof()
        back = await asyncio.wait_for(reader.read(), 60)
        assert back == payload.upper() and got == [payload]
        writer.close()
        with pytest.raises(StreamUnavailable, match="cannot reach"):
            await open_socket(conn, str(d / "absent.sock"))
    finally:
        conn.close()
        await conn.wait_closed()
        server.close()
        await asyncio.to_thread(shutil.rmtree, d, True)
