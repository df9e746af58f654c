"""Where a change set comes from: the agent's layer in a VM, or the changes waiting in the store.

:class:`LayerSource` talks to the guest's layer service over a stream the
caller opens (a netmux stream into the VM, local or on a ``--host`` box) and
says whether the person changed a path after the agent's layer took it:

- a path piwork wrote before: the person changed it iff its stat is not what
  piwork's write left (``written``);
- otherwise, for a ``--host`` run, against the copy the remote was sent (its
  sha256, ``baseline``): the agent started from exactly that;
- otherwise (a local run, whose lower layer is the live folder), iff it changed
  after the agent's layer began (``base_ns``: the task's first checkpoint): the
  guest caches what it reads of the folder (9p ``cache=loose``), so the version
  the agent's copy started from may predate an edit of the person's however
  long ago it was made; such a path keeps the person's version, the agent's
  lands beside it. (Without ``base_ns``: since the previous change set.)

:class:`StoredSource` replays changes already fetched (``piwork apply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from piwork.changes.entry import Change, Kind
from piwork.changes.folder import Seen
from piwork.changes.store import ObjectStore
from piwork.changes.wire import MAX_LINE, LayerClient, LayerError, Scan

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def person_changed_since(
    seen: Seen, written: tuple[int, ...] | None, since_ns: int, baseline: str | None = None
) -> bool:
    if written is not None:
        return tuple(seen.signature) != tuple(written)
    if baseline is not None:
        return seen.change.kind is not Kind.FILE or seen.change.sha256 != baseline
    return seen.ctime_ns >= since_ns or seen.mtime_ns >= since_ns


class LayerSource:
    def __init__(
        self,
        connect: Connect,
        *,
        started_ns: int | None = None,
        baseline: Callable[[str], str | None] | None = None,
    ) -> None:
        self.connect = connect
        self.baseline = baseline
        self._client: LayerClient | None = None
        self._last_ns = started_ns if started_ns is not None else time.time_ns()
        self._prev_ns = self._last_ns
        self.base_ns: int | None = None
        """When the agent's layer began (the run sets it from the task's history)."""

    async def _open(self) -> LayerClient:
        if self._client is None:
            try:
                reader, writer = await asyncio.wait_for(self.connect(), 30)
            except (OSError, TimeoutError) as exc:
                raise LayerError(f"cannot reach the guest's layer service: {exc}") from exc
            self._client = LayerClient(reader, writer)
        return self._client

    async def scan(self, max_entries: int) -> Scan:
        self._prev_ns, self._last_ns = self._last_ns, time.time_ns()
        client = await self._open()
        try:
            return await client.scan(max_entries)
        except BaseException:
            await self.close()
            raise

    async def read(self, change: Change, max_bytes: int) -> bytes:
        client = await self._open()
        try:
            return await client.read(change, max_bytes)
        except LayerError:
            await self.close()
            raise

    async def read_many(
        self, changes: list[Change], max_bytes: int
    ) -> AsyncIterator[tuple[Change, bytes | None, str | None]]:
        client = await self._open()
        try:
            async for item in client.read_many(changes, max_bytes):
                yield item
        except LayerError:
            await self.close()
            raise

    def person_changed(self, seen: Seen, written: tuple[int, ...] | None) -> bool:
        base = self.baseline(seen.change.path) if self.baseline is not None else None
        if self.baseline is not None and base is None and written is None:
            return seen.change.kind is not Kind.GONE  # the remote had no such file
        since = self.base_ns if self.base_ns is not None else self._prev_ns
        return person_changed_since(seen, written, since, base)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()


class StoredSource:
    """Changes the host already holds (fetched when they were taken), e.g. held ones."""

    def __init__(self, changes: list[Change], store: ObjectStore, since: dict[str, float]) -> None:
        self.changes = changes
        self.store = store
        self.since = since
        """When the host took each change (a later change of the person's is a conflict);
        a path not named here: from now on."""
        self._now = time.time()

    async def scan(self, max_entries: int) -> Scan:
        return Scan(
            changes=self.changes[:max_entries],
            truncated=len(self.changes) > max_entries,
            partial=True,
        )

    async def read(self, change: Change, max_bytes: int) -> bytes:
        assert change.sha256 is not None
        return await asyncio.to_thread(self.store.get, change.sha256)

    async def read_many(
        self, changes: list[Change], max_bytes: int
    ) -> AsyncIterator[tuple[Change, bytes | None, str | None]]:
        for c in changes:
            yield c, await self.read(c, max_bytes), None

    def person_changed(self, seen: Seen, written: tuple[int, ...] | None) -> bool:
        since = self.since.get(seen.change.path, self._now)
        return person_changed_since(seen, written, int(since * 1e9))


__all__ = ["MAX_LINE", "Connect", "LayerSource", "StoredSource", "person_changed_since"]
