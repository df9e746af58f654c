"""A task's previews: the one collaborator the run hands guest port reports to.

Life of a preview:

1. the guest supervisor reports the ports something listens on (the
   ``ports`` supervisor event, docs/guest-protocol.md) - untrusted input: at
   most ``MAX_REPORTED`` ports per report and per run are ever considered
   (``MAX_PORTS`` of them decided, the rest refused), ports below 1024 never;
2. each new port is decided once per run, one at a time: a ``preview`` rule,
   else the person (``piwork.preview.policy``); no one to ask keeps it closed;
3. an allowed port gets a loopback listener on an address of its own
   (``PreviewServer``) and a URL ``http://127.a.b.c:<hostport>/``; the run
   emits a ``preview`` event ``{port, url, state: opened|closed|refused}`` and the
   open previews are written to ``<task>/previews.json`` for other processes;
4. pause freezes every preview (connections kept, no data); close (the task
   stops) ends them all and removes the file.

The run constructs one :class:`Previews` and calls :meth:`start`,
:meth:`on_supervisor_message`, :meth:`pause`/:meth:`resume` and
:meth:`close`; nothing else of the run is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piwork.policy import AuditLog, PolicyStore
from piwork.policy.rules import TaskContext
from piwork.preview import state
from piwork.preview.policy import PreviewPolicy, ask, question_for
from piwork.preview.server import Mux, PreviewServer
from piwork.preview.state import PreviewInfo

log = logging.getLogger(__name__)

MIN_PORT = 1024
MAX_REPORTED = 64
"""Ports read from one report; the rest are ignored."""
MAX_PORTS = 32
"""Distinct ports decided per run; later ones are refused without asking."""

Emit = Callable[[dict[str, Any]], None]


def parse_ports(msg: dict[str, Any]) -> list[int] | None:
    """The ports of a ``ports`` supervisor event, validated; None if it is not one."""
    if msg.get("ev") != "ports":
        return None
    raw = msg.get("ports")
    if not isinstance(raw, list):
        return []
    out: list[int] = []
    for value in raw[:MAX_REPORTED]:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and MIN_PORT <= value <= 65535
            and value not in out
        ):
            out.append(value)
    return out


class Previews:
    def __init__(
        self,
        task_id: str,
        task_dir: Path,
        ctx: TaskContext,
        store: PolicyStore,
        audit: AuditLog,
        *,
        assume_yes: bool = False,
    ) -> None:
        self.task_id = task_id
        self.task_dir = task_dir
        self.policy = PreviewPolicy(store, audit, ctx)
        self.ctx = ctx
        self.assume_yes = assume_yes
        self.listening: list[int] = []
        """The guest's last reported listening ports."""
        self._mux: Any = None
        self._asker: Any = None
        self._emit: Emit = lambda data: None
        self._decided: set[int] = set()
        self._servers: dict[int, PreviewServer] = {}
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._closed = False

    # ------------------------------------------------------------ the run's API
    def start(self, netmux: Mux, asker: Any, emit: Emit) -> None:
        """Begin: ``emit(data)`` sends a ``preview`` event ({port, url, state, ...})."""
        self._mux = netmux
        self._asker = asker
        self._emit = emit
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="previews")

    def on_supervisor_message(self, msg: dict[str, Any]) -> None:
        ports = parse_ports(msg)
        if ports is None or self._closed:
            return
        self.listening = ports
        for port in ports:
            if port in self._decided:
                continue
            if len(self._decided) >= MAX_REPORTED:
                continue  # a guest cycling through ports: no more events, no more memory
            self._decided.add(port)
            if len(self._decided) > MAX_PORTS:
                self._emit(
                    {
                        "port": port,
                        "url": None,
                        "state": "refused",
                        "by": "limit",
                        "reason": f"more than {MAX_PORTS} ports listened on in this run",
                    }
                )
                continue
            self._queue.put_nowait(port)

    def pause(self) -> None:
        """The task is paused: previews keep their connections but carry nothing."""
        self._thawed.clear()
        if self._mux is not None and hasattr(self._mux, "freeze_inbound"):
            self._mux.freeze_inbound()

    def resume(self) -> None:
        self._thawed.set()
        if self._mux is not None and hasattr(self._mux, "thaw_inbound"):
            self._mux.thaw_inbound()

    async def close(self) -> None:
        """The task stopped: every preview closes (connections refused from now on)."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(BaseException):
                await self._worker
        servers, self._servers = self._servers, {}
        for server in servers.values():
            await server.close()
        with contextlib.suppress(OSError):
            await asyncio.to_thread(state.remove, self.task_dir)
        for port, server in servers.items():
            self._emit({"port": port, "url": server.url, "state": "closed"})

    def list(self) -> list[PreviewInfo]:
        """The open previews, by guest port."""
        return [
            PreviewInfo(port, s.host_port, s.url, s.address)
            for port, s in sorted(self._servers.items())
        ]

    def server(self, port: int) -> PreviewServer | None:
        return self._servers.get(port)

    # ------------------------------------------------------------ deciding and opening
    async def _work(self) -> None:
        while True:
            port = await self._queue.get()
            try:
                await self._decide(port)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one port's failure must not stop the others
                log.exception("preview of port %d failed", port)
                self._emit(
                    {
                        "port": port,
                        "url": None,
                        "state": "refused",
                        "by": "error",
                        "reason": str(exc),
                    }
                )

    async def _decide(self, port: int) -> None:
        answer = await asyncio.to_thread(self.policy.decide_by_rule, port)
        if answer is None:
            if self.assume_yes:
                reply: Any = None
            else:
                reply = await ask(self._asker, question_for(port, self.ctx))
            answer = await asyncio.to_thread(
                self.policy.record, port, reply, assume_yes=self.assume_yes
            )
        if self._closed:
            return
        if not answer.open:
            reason = {
                "no-terminal": "no one to ask: previews stay closed",
                "rule": f"by the rule {answer.rule}",
                "person": "you said no",
            }.get(answer.by, answer.by)
            self._emit(
                {"port": port, "url": None, "state": "refused", "by": answer.by, "reason": reason}
            )
            return
        server = PreviewServer(self._mux, self.task_id, port, self._thawed)
        await server.start()
        self._servers[port] = server
        await asyncio.to_thread(state.write, self.task_dir, self.task_id, self.list())
        self._emit(
            {
                "port": port,
                "url": server.url,
                "state": "opened",
                "by": answer.by,
                "hostPort": server.host_port,
                "address": server.address,
                **({"rule": answer.rule} if answer.rule else {}),
            }
        )
