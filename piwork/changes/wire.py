"""The host end of the guest's layer service (runtime-pack/supervisor/layer.js).

A byte stream (a netmux stream the host opens into the guest) carrying JSON
request lines from the host and, from the guest, JSON lines and raw file
bytes. The guest is hostile: every line is bounded (:data:`MAX_LINE`), every
entry validated (:func:`piwork.changes.entry.parse_entry`), the number of
entries bounded by the caller, a file's bytes bounded by the size asked for
and checked against the sha256 the scan reported, and each step has a timeout.
A broken answer ends the conversation with :class:`LayerError`; nothing of it
is used.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from piwork.changes.entry import Change, EntryError, parse_entry
from piwork.errors import ProtocolError

MAX_LINE = 64 * 1024
SCAN_TIMEOUT = 300.0
"""Seconds for a whole scan (the guest hashes what changed: a big venv takes a while)."""
READ_TIMEOUT = 120.0


class LayerError(ProtocolError, RuntimeError):
    """The guest's layer service broke its protocol, or did not answer in time."""


@dataclass
class Scan:
    changes: list[Change] = field(default_factory=list)
    truncated: bool = False
    """The guest had more entries than asked for: the rest comes with a later scan."""
    refused: list[str] = field(default_factory=list)
    """Why entries were refused (each once; names never shown raw)."""
    errors: list[str] = field(default_factory=list)
    """What the guest said it could not read (its text, to be sanitised before display)."""
    partial: bool = False
    """Only some of the layer (changes the host already holds, re-applied): what it does
    not name has not vanished from the layer."""


class LayerClient:
    """One conversation with the layer service over ``reader``/``writer``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def _send(self, msg: dict[str, Any]) -> None:
        self.writer.write(orjson.dumps(msg) + b"\n")
        await self.writer.drain()

    async def _line(self) -> dict[str, Any]:
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            raise LayerError(
                f"a line from the guest's layer service over {MAX_LINE} bytes"
            ) from exc
        except asyncio.IncompleteReadError as exc:
            raise LayerError("the guest's layer service closed the stream") from exc
        if len(line) > MAX_LINE:
            raise LayerError(f"a line from the guest's layer service over {MAX_LINE} bytes")
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LayerError("the guest's layer service sent a line that is not JSON") from exc
        if not isinstance(msg, dict):
            raise LayerError("the guest's layer service sent a line that is not an object")
        return msg

    async def scan(self, max_entries: int, *, timeout: float = SCAN_TIMEOUT) -> Scan:
        """Every entry of the agent's layer (at most ``max_entries``), validated."""
        try:
            return await asyncio.wait_for(self._scan(max_entries), timeout)
        except TimeoutError as exc:
            raise LayerError(f"the guest's layer scan took longer than {timeout:.0f} s") from exc

    async def _scan(self, max_entries: int) -> Scan:
        await self._send({"op": "scan", "max": max_entries})
        out = Scan()
        seen: set[str] = set()
        refused: dict[str, None] = {}
        received = 0
        while True:
            msg = await self._line()
            if "done" in msg:
                done = msg["done"]
                if not isinstance(done, dict):
                    raise LayerError("the guest's layer scan ended with a malformed summary")
                out.truncated = done.get("truncated") is True or received > max_entries
                errors = done.get("errors")
                if isinstance(errors, list):
                    out.errors = [str(e)[:300] for e in errors[:20]]
                out.refused = list(refused)[:50]
                return out
            received += 1
            if received > max_entries:
                out.truncated = True
                continue  # read to the end of the scan, keep nothing more
            try:
                change = parse_entry(msg.get("e"))
            except EntryError as exc:
                refused[str(exc)] = None
                continue
            if change.path in seen:
                refused["a path reported twice"] = None
                continue
            seen.add(change.path)
            out.changes.append(change)

    async def read(self, change: Change, max_bytes: int, *, timeout: float = READ_TIMEOUT) -> bytes:
        """The bytes of ``change`` (a file), checked against its size cap and sha256."""
        try:
            return await asyncio.wait_for(self._read(change, max_bytes), timeout)
        except TimeoutError as exc:
            raise LayerError(
                f"reading a file of the layer took longer than {timeout:.0f} s"
            ) from exc

    async def _read(self, change: Change, max_bytes: int) -> bytes:
        await self._request_read(change, max_bytes)
        return await self._answer_read(change, max_bytes)

    async def read_many(
        self, changes: list[Change], max_bytes: int, *, window: int = 32
    ) -> AsyncIterator[tuple[Change, bytes | None, str | None]]:
        """``read`` for many files, pipelined (up to ``window`` requests in flight: a
        round trip to the guest costs more than a small file's bytes). Yields
        ``(change, bytes, None)`` or ``(change, None, why it was not read)`` in order."""
        queue = list(changes)
        sent = 0
        for c in queue[:window]:
            await self._request_read(c, max_bytes)
            sent += 1
        for c in queue:
            try:
                data = await asyncio.wait_for(self._answer_read(c, max_bytes), READ_TIMEOUT)
            except FileChanged as exc:
                yield c, None, str(exc)
            except TimeoutError as exc:
                raise LayerError(
                    f"reading a file of the layer took longer than {READ_TIMEOUT:.0f} s"
                ) from exc
            else:
                yield c, data, None
            if sent < len(queue):
                await self._request_read(queue[sent], max_bytes)
                sent += 1

    async def _request_read(self, change: Change, max_bytes: int) -> None:
        raw = os.fsencode(change.path)
        await self._send({"op": "read", "p": base64.b64encode(raw).decode(), "max": max_bytes})

    async def _answer_read(self, change: Change, max_bytes: int) -> bytes:
        head = await self._line()
        if "error" in head:
            raise FileChanged(str(head["error"])[:200])
        size = head.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= max_bytes:
            raise LayerError("the guest's layer service announced a file of the wrong size")
        try:
            data = await self.reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise LayerError("the guest's layer service closed the stream mid-file") from exc
        if hashlib.sha256(data).hexdigest() != change.sha256:
            raise FileChanged("its content changed since the scan")
        return data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class FileChanged(ProtocolError):
    """One file could not be read as scanned (gone, grown, replaced): it waits for the next scan."""
