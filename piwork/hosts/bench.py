"""``piwork bench --host NAME``: start-up and steer latency of tasks on a remote host.

Every byte to the host goes through a TCP relay on loopback that holds each
chunk ``delay`` seconds each way (50 ms: a 100 ms round trip, a distant box),
so the figures show what the SSH hops cost: RPC, the console, QMP, the netmux
(model requests come back through it to the gateway here) and the folder sync
all ride that one connection. The host key is still checked as the host's own
(:func:`piwork.hosts.connect.routed`); nothing is added to the hosts file or
known_hosts. Tasks go to a private data dir; the model is a scripted local
server (piwork.models.scripted), so no key and no internet are needed.

Figures (seconds):
  ssh round trip                  median of 5 ``true`` commands over the connection
  link open                       connect, strict host key, ``check`` there
  cold start to first RPC reply   the runner's start with the saved VM off
  warm start to first RPC reply   restored from the saved VM on the host (made
                                  first if missing: "template build" says so)
  RPC round trip                  median of 5 ``get_state`` to pi through SSH
  through the relay (MiB)         what the round sent and received (the pack on a
                                  first visit, the folder, the VM's streams)
  steer to model request          a steer sent while a tool runs, until the model
                                  request carrying it arrives here, counted from
                                  the tool's end as seen here (pi holds steers
                                  until the running tool is done)
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from piwork.agent import Agent, AgentVm
from piwork.bench import COLD, WARM, _scratch
from piwork.hosts.connect import connect, routed
from piwork.hosts.store import Host
from piwork.hosts.vm import RemoteLink
from piwork.models.providers import Provider
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, bash
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession

STEER = "STEER-MARK please also say hello"
SSH_RTT = "ssh round trip"
LINK_OPEN = "link open (connect, host key, check)"
RPC_RTT = "RPC round trip (get_state)"
STEER_LATENCY = "steer to model request"
TEMPLATE = "template build on the host (s)"
RELAYED = "through the relay (MiB)"


class DelayProxy:
    """Forwards 127.0.0.1:<port> to ``target``, holding every chunk ``delay`` seconds."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self.bytes = 0
        """Carried so far, both ways: the proof that the connections went through it."""
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._conns:  # connections still open (a link being closed meanwhile)
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            w.close()
            return
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w), return_exceptions=True)
        w.close()
        uw.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def later() -> None:
            while True:
                due, data = await q.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                dst.write(data)
                await dst.drain()

        sender = asyncio.create_task(later())
        try:
            while True:
                data = await src.read(65536)
                self.bytes += len(data)
                q.put_nowait((time.monotonic() + self.delay, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


@contextlib.asynccontextmanager
async def delayed(host: Host, delay: float) -> AsyncIterator[DelayProxy]:
    """Connections to ``host`` (this process's) go through a delaying relay meanwhile."""
    async with DelayProxy((host.hostname, host.port or 22), delay) as proxy:
        with routed(host.name, ("127.0.0.1", proxy.port)):
            yield proxy


async def measure_link(host: Host) -> dict[str, float]:
    t = time.monotonic()
    link = await RemoteLink.open(host)
    figures = {LINK_OPEN: time.monotonic() - t}
    rtts = []
    for _ in range(5):
        t = time.monotonic()
        await link.conn.run("true", check=True)
        rtts.append(time.monotonic() - t)
    figures[SSH_RTT] = statistics.median(rtts)
    await link.close()
    return figures


class _Task:
    """One benchmark task on the host: start it, note how it booted, optionally steer."""

    def __init__(self, host: Host, provider: Provider, *, warm: bool, notes: list[str]) -> None:
        self.host = host
        self.provider = provider
        self.warm = warm
        self.notes = notes
        self.marks: dict[str, float] = {}
        self.modes: list[dict[str, Any]] = []
        self.session: TaskSession | None = None

    def sink(self, ev: RunEvent) -> None:
        marks = self.marks
        if ev.kind is EventKind.NOTICE:
            msg = str(ev.data.get("message", ""))
            if "warm" in ev.data:
                self.modes.append(dict(ev.data))
            if msg.startswith("pack "):
                self.notes.append(msg)
        elif ev.kind is EventKind.TOOL_START and "tool_start" not in marks:
            marks["tool_start"] = time.monotonic()
            assert self.session is not None
            asyncio.get_running_loop().create_task(self.session.steer(STEER))
            marks["steer_sent"] = time.monotonic()
        elif ev.kind is EventKind.TOOL_END and "tool_end" not in marks:
            marks["tool_end"] = time.monotonic()

    async def run(self, *, steer: bool) -> dict[str, float]:
        figures: dict[str, float] = {}
        with _scratch() as (paths, folder):
            req = RunRequest(
                prompt=None,
                folder=folder,
                model=f"{self.provider.name}/scripted",
                extra_providers=(self.provider,),
                host=self.host.name,
                assume_yes=True,
                warm_start=self.warm,
            )
            t0 = time.monotonic()
            async with TaskSession(req, self.sink, paths=paths) as session:
                self.session = session
                figures[WARM if self.warm else COLD] = time.monotonic() - t0
                agent = session.agent
                if agent is not None:
                    figures.update(stages("warm" if self.warm else "cold", session, agent))
                if steer and isinstance(agent, AgentVm):
                    rtts = []
                    for _ in range(5):
                        t = time.monotonic()
                        await agent.rpc.get_state()
                        rtts.append(time.monotonic() - t)
                    figures[RPC_RTT] = statistics.median(rtts)
                    outcome = await session.run_prompt("sleep a little")
                    if not outcome.ok:
                        raise RuntimeError(f"the benchmark task did not complete: {outcome}")
        built = next((m["template_built"] for m in self.modes if "template_built" in m), None)
        if built is not None:
            figures[TEMPLATE] = float(built)
        if self.warm and not any(m.get("warm") is True for m in self.modes):
            said = self.modes[-1].get("message") if self.modes else "no boot notice"
            self.notes.append(f"warm round not restored: {said}")
            figures.pop(WARM)
        m = self.marks
        if steer and "steer_seen" in m and "steer_sent" in m:
            figures[STEER_LATENCY] = m["steer_seen"] - max(m["steer_sent"], m.get("tool_end", 0))
        return figures


def stages(label: str, session: TaskSession, agent: Agent) -> dict[str, float]:
    """Where a remote start went (seconds each): what piwork bench shows for a local one,
    plus the SSH link, the pack's check there, the task folders and environment disk sent."""
    t, r = agent.timings, session.timings
    sent = t.get("remote_pack", 0.0) + t.get("remote_folders", 0.0) + t.get("remote_env", 0.0)
    boot = r.get("boot_to_pi_ready", 0.0)
    marks = [
        ("host before the VM (gateway, proxy, link)", r.get("start_to_pi_ready", 0.0) - boot),
        ("  of which SSH link and check", t.get("link_open", 0.0)),
        ("pack sent (first visit) or checked there", t.get("remote_pack", 0.0)),
        ("task folders sent", t.get("remote_folders", 0.0)),
        ("environment disk and layers sent", t.get("remote_env", 0.0)),
        ("QEMU launched there", t.get("qemu_started", 0.0)),
        (
            "restored (device state)" if "restored" in t else "booted to the supervisor",
            t.get("restored", t.get("supervisor_ready", 0.0) - t.get("qemu_started", 0.0)),
        ),
        ("pi started in the guest", t.get("pi_started", 0.0) - t.get("env_attached", 0.0)),
        ("pi's first RPC reply", boot - sent - t.get("pi_started", 0.0)),
    ]
    return {f"{label} stage: {name} (s)": max(0.0, v) for name, v in marks}


def _step(marks_of: list[_Task]) -> Any:
    def step(req: ChatRequest) -> Text | ToolCalls:
        marks = marks_of[-1].marks
        if STEER in orjson.dumps(req.messages).decode() and "steer_seen" not in marks:
            marks["steer_seen"] = time.monotonic()
            return Text("hello, steered")
        if req.assistant_turns_since_user == 0:
            return ToolCalls([bash("sleep 3; echo slept")])
        return Text("done")

    return step


def scripted_provider(server: ScriptedModelServer) -> Provider:
    return server.as_provider(
        "bench", contextWindow=128_000, maxTokens=4096, reasoning=False, input=("text",)
    )


async def measure(host: Host, delay: float, notes: list[str]) -> dict[str, float]:
    """One round: the link, a cold start, a warm start with a steered prompt."""
    tasks: list[_Task] = []
    async with ScriptedModelServer(_step(tasks), model_id="scripted") as server:
        provider = scripted_provider(server)
        async with delayed(host, delay) as relay:
            figures = await measure_link(host)
            tasks.append(_Task(host, provider, warm=False, notes=notes))
            figures.update(await tasks[-1].run(steer=False))
            tasks.append(_Task(host, provider, warm=True, notes=notes))
            warm = await tasks[-1].run(steer=True)
            if TEMPLATE in warm:  # that start made the saved VM: measure a restore too
                tasks.append(_Task(host, provider, warm=True, notes=notes))
                warm = {**await tasks[-1].run(steer=True), TEMPLATE: warm[TEMPLATE]}
            figures.update(warm)
        figures[RELAYED] = relay.bytes / (1 << 20)
    return figures


def run_rounds(host: Host, delay: float, rounds: int) -> tuple[list[dict[str, float]], list[str]]:
    notes: list[str] = []
    out = [asyncio.run(measure(host, delay, notes)) for _ in range(rounds)]
    return out, notes


async def trust(host: Host, fingerprint: str) -> None:
    """Accept ``host``'s key if it shows ``fingerprint`` (benchmarks/remote.py's own sshd)."""
    from piwork.hosts.connect import fingerprint_matcher

    conn = await connect(host, fingerprint_matcher(fingerprint, None))
    conn.close()
    await conn.wait_closed()


__all__ = ["DelayProxy", "delayed", "measure", "run_rounds", "trust"]
