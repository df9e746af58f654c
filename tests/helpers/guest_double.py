"""A fake guest supervisor end on a unix socket, for testing the host's parser.

It speaks the channel framing of docs/guest-protocol.md (``<seq> <payload>``
lines, ``hello`` on connect) so the real :class:`GuestChannel`, the real
:class:`RpcClient` and the real ``AgentVm`` event handling can be fed hostile
input. It is not a VM and claims nothing about the VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from piwork.agent import AgentVm, PiDoor
from piwork.rpc.client import RpcClient
from piwork.vm.channel import Endpoint, GuestChannel
from tests.helpers.fake_agent import NoVmDoors


class FakeGuest:
    """The guest end. ``send_pi``/``send_raw`` write lines; ``commands`` holds pi lines received."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.boot_id = "boot-1"
        self.seq = 0
        self.history: list[tuple[int, bytes]] = []
        """Numbered lines sent, for the replay after a reconnect."""
        self.commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._on_client, str(self.path), limit=1 << 20
        )

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self._server is not None:
            self._server.close()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        with contextlib.suppress(Exception):
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"!"):
                    op = orjson.loads(line[1:])
                    if op.get("op") == "hello":
                        hello = {"ev": "hello", "bootId": self.boot_id, "lastSeq": self.seq}
                        writer.write(b"0 !" + orjson.dumps(hello) + b"\n")
                        # Replay what the host has not seen, as the supervisor does.
                        after = int(op.get("after") or 0)
                        for seq, data in self.history:
                            if seq > after:
                                writer.write(data)
                        await writer.drain()
                        self.connected.set()
                    continue
                self.commands.put_nowait(orjson.loads(line))

    async def send_raw(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)
        await self.writer.drain()

    async def send_pi(self, payload: bytes | dict[str, Any]) -> None:
        if isinstance(payload, dict):
            payload = orjson.dumps(payload)
        self.seq += 1
        data = str(self.seq).encode() + b" " + payload + b"\n"
        self.history.append((self.seq, data))
        await self.send_raw(data)

    async def next_command(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.commands.get(), timeout)

    def drop(self) -> None:
        """Cut the connection (the host reconnects)."""
        assert self.writer is not None
        self.connected.clear()
        self.writer.close()


class DoubleAgent(NoVmDoors, PiDoor):
    """The run's door to pi (``piwork.agent.PiDoor``, the real one) over the fake guest.

    No VM behind it: pausing and diagnosing a VM exit are not what these tests
    are about, so they fail loudly if a test reaches them.
    """

    def __init__(self, rpc: RpcClient, on_supervisor_event: Any) -> None:
        self.rpc = rpc
        self._pi_started: asyncio.Future[int] | None = None
        self.pi_exit = asyncio.get_running_loop().create_future()
        self.stderr_tail: list[str] = []
        self.on_supervisor_event = on_supervisor_event
        self.timings: dict[str, float] = {}

    async def stop(self, *, graceful: bool = True) -> None:
        """The fake guest's channel belongs to the test: nothing to power off."""

    async def pause(self) -> None:
        raise NotImplementedError("no VM behind the guest double")

    async def resume(self) -> None:
        raise NotImplementedError("no VM behind the guest double")

    async def exit_diagnosis(self, wait: float = 1.0) -> None:
        return None

    @property
    def qemu_pid(self) -> int | None:
        return None


class Host:
    """The host side wired as AgentVm wires it: channel -> AgentVm events -> RpcClient."""

    def __init__(self, guest: FakeGuest, **client_kwargs: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.rpc = RpcClient(self._send, **client_kwargs)
        # The real door to pi, and the real AgentVm handler for supervisor events.
        self.agent = DoubleAgent(self.rpc, self.events.append)
        self.channel = GuestChannel(
            Endpoint(unix_path=guest.path),
            self.rpc.feed_line,
            self._on_event,
            prepare_pi_line=self.rpc.prepare_line,  # as AgentVm wires it
            on_prepared_pi_line=lambda _line, prepared: self.rpc.feed_prepared(prepared),  # type: ignore[arg-type]
        )

    def _on_event(self, msg: dict[str, Any]) -> None:
        AgentVm._on_supervisor_event(self.agent, msg)  # type: ignore[arg-type]

    async def _send(self, line: bytes) -> None:
        await self.channel.send_pi_line(line)


@contextlib.asynccontextmanager
async def guest_and_host(**client_kwargs: Any) -> AsyncIterator[tuple[FakeGuest, Host]]:
    with tempfile.TemporaryDirectory(prefix="pw-hostile-") as tmp:
        guest = FakeGuest(Path(tmp) / "rpc.sock")
        await guest.start()
        host = Host(guest, **client_kwargs)
        await host.channel.start(timeout=5)
        try:
            yield guest, host
        finally:
            await host.channel.close()
            await host.rpc.aclose()
            await guest.close()
