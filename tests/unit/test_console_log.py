"""console.log is written by the host from QEMU's console socket and stays bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from piwork.vm.machine import ConsoleLog


async def test_a_guest_printing_without_end_never_grows_the_log_past_its_cap(
    tmp_path: Path,
) -> None:
    log = ConsoleLog(tmp_path / "console.log", max_bytes=64 * 1024)
    sock = tmp_path / "c.sock"
    await log.start(sock)
    try:
        _, qemu = await asyncio.open_unix_connection(str(sock))
        line = b"piwork: a guest that prints forever\n"
        for _ in range(200):
            qemu.write(line * 100)  # ~720 KiB in all, 11x the cap
            await qemu.drain()
        qemu.write(b"piwork: stage=last uptime=1.0\n")
        await qemu.drain()
        # A second connection (anyone but QEMU) is not served.
        r2, w2 = await asyncio.open_unix_connection(str(sock))
        w2.write(b"forged console line\n")
        await w2.drain()
        with contextlib.suppress(ConnectionResetError):  # closed with our line unread
            assert await asyncio.wait_for(r2.read(), 5) == b""
        qemu.close()
        for _ in range(100):
            if (tmp_path / "console.log").read_bytes().endswith(b"uptime=1.0\n"):
                break
            await asyncio.sleep(0.02)
    finally:
        await log.close()
    current = (tmp_path / "console.log").read_bytes()
    previous = (tmp_path / "console.1.log").read_bytes()
    assert len(current) <= 64 * 1024 and len(previous) == 64 * 1024
    assert current.endswith(b"piwork: stage=last uptime=1.0\n")
    assert b"forged" not in current + previous
    assert log.rotations >= 10
    assert sorted(os.listdir(tmp_path)) == ["c.sock", "console.1.log", "console.log"]
