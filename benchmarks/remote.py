"""Start-up and steer latency of a task on a remote host (``--host``), through added latency.

A TCP proxy on loopback delays every chunk by ``--delay-ms`` each way (the
default 50 ms makes a 100 ms round trip, a distant box). piwork reaches the
host only through it. Without ``--host`` a throwaway Debian sshd is started on
loopback (root and openssh-server needed, as in tests/hosts); with ``--host
NAME`` the box added with ``piwork hosts add`` is used.

Figures (seconds):
  ssh_rtt                 median of 5 ``true`` commands over the SSH connection
  link_open               connect, strict host key, ``check`` on the remote
  start_to_pi_ready       the runner's start: pack present (uploaded on the first
                          run of a fresh root), folder sent, QEMU booted, pi answering
  get_state_rtt           median of 5 RPC round trips to pi through SSH
  steer_to_model_request  a steer sent while a tool runs, until the model request
                          carrying it arrives here, minus the rest of the tool's run
                          (from the tool's end as seen here)

Run: .venv/bin/python -m benchmarks.remote [--delay-ms 50] [--host NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from piwork.config import get_paths
from piwork.hosts import store
from piwork.hosts.connect import connect, fingerprint_matcher, known_as
from piwork.hosts.vm import RemoteLink
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, bash
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from tests.hosts.conftest import running_sshd
from tests.vm.conftest import scripted_provider

STEER = "STEER-MARK please also say hello"


class DelayProxy:
    """Forwards 127.0.0.1:<port> to ``target``, holding every chunk ``delay`` seconds."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*self.target)
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
                    dst.write_eof()
                    return
                dst.write(data)
                await dst.drain()

        sender = asyncio.create_task(later())
        try:
            while True:
                data = await src.read(65536)
                q.put_nowait((time.monotonic() + self.delay, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


@contextlib.contextmanager
def own_sshd() -> Iterator[store.Host]:
    """A throwaway sshd and piwork home (the pack cache stays the person's: packs are big)."""
    tmp = Path(tempfile.mkdtemp(prefix="pwb-"))
    os.environ.setdefault("PIWORK_PACK_CACHE", str(get_paths().cache))
    os.environ["HOME"] = str(tmp / "home")
    os.environ["PIWORK_HOME"] = str(tmp / "piwork")
    (tmp / "home" / ".ssh").mkdir(parents=True)
    try:
        with running_sshd(tmp / "sshd") as sshd:
            host = sshd.host("bench", root=str(tmp / "r"))
            asyncio.run(_trust(host, sshd.fingerprint))
            yield host
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _trust(host: store.Host, fingerprint: str) -> None:
    conn = await connect(host, fingerprint_matcher(fingerprint, None))
    conn.close()
    await conn.wait_closed()


@contextlib.asynccontextmanager
async def delayed(host: store.Host, delay: float) -> AsyncIterator[store.Host]:
    """``host`` reached through the proxy: its (already verified) key trusted at the proxy."""
    direct = await connect(host, None)
    key = direct.get_server_host_key()
    direct.close()
    await direct.wait_closed()
    assert key is not None
    async with DelayProxy((host.hostname, host.port or 22), delay) as proxy:
        via = host.model_copy(update={"name": f"{host.name}-delayed", "hostname": "127.0.0.1",
                                      "port": proxy.port})  # fmt: skip
        with store.known_hosts_file().open("a") as fh:
            fh.write(f"{known_as(via)} {key.export_public_key('openssh').decode().strip()}\n")
        store.save({**store.load(), via.name: via})
        yield via


async def measure(host: store.Host, delay: float) -> dict[str, Any]:
    out: dict[str, Any] = {"delay_ms_each_way": delay * 1000}
    async with delayed(host, delay) as via:
        t = time.monotonic()
        link = await RemoteLink.open(via)
        out["link_open"] = time.monotonic() - t
        rtts = []
        for _ in range(5):
            t = time.monotonic()
            await link.conn.run("true", check=True)
            rtts.append(time.monotonic() - t)
        out["ssh_rtt"] = statistics.median(rtts)
        await link.close()
        out.update(await _task(via))
    return out


async def _task(via: store.Host) -> dict[str, Any]:
    marks: dict[str, float] = {}

    def step(req: ChatRequest) -> Text | ToolCalls:
        if STEER in json.dumps(req.messages) and "steer_seen" not in marks:
            marks["steer_seen"] = time.monotonic()
            return Text("hello, steered")
        if req.assistant_turns_since_user == 0:
            return ToolCalls([bash("sleep 3; echo slept")])
        return Text("done")

    folder = Path(tempfile.mkdtemp(prefix="pwb-folder-"))
    (folder / "README.md").write_text("# bench\n")
    session_box: list[TaskSession] = []

    def sink(ev: RunEvent) -> None:
        if ev.kind is EventKind.TOOL_START and "tool_start" not in marks:
            marks["tool_start"] = time.monotonic()
            asyncio.get_running_loop().create_task(session_box[0].steer(STEER))
            marks["steer_sent"] = time.monotonic()
        elif ev.kind is EventKind.TOOL_END and "tool_end" not in marks:
            marks["tool_end"] = time.monotonic()
        elif ev.kind is EventKind.NOTICE and "pack" in str(ev.data.get("message", "")):
            marks.setdefault("pack_note", 0.0)
            print("  ", ev.data.get("message"))

    async with ScriptedModelServer(step, model_id="scripted") as server:
        req = RunRequest(
            prompt=None, folder=folder, model="scripted/scripted",
            extra_providers=(scripted_provider(server),),  # type: ignore[arg-type]
            host=via.name, assume_yes=True, warm_start=False,
        )  # fmt: skip
        async with TaskSession(req, sink, paths=get_paths()) as session:
            session_box.append(session)
            out: dict[str, Any] = {"start_to_pi_ready": session.timings["start_to_pi_ready"]}
            rtts = []
            for _ in range(5):
                t = time.monotonic()
                await session.rpc.get_state()
                rtts.append(time.monotonic() - t)
            out["get_state_rtt"] = statistics.median(rtts)
            await session.run_prompt("sleep a little")
    shutil.rmtree(folder, ignore_errors=True)
    if "steer_seen" in marks:
        out["steer_to_model_request"] = marks["steer_seen"] - max(
            marks["steer_sent"], marks.get("tool_end", 0.0)
        )
        out["steer_sent_to_model_request"] = marks["steer_seen"] - marks["steer_sent"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--host", help="a host added with `piwork hosts add` (default: own sshd)")
    ap.add_argument("--runs", type=int, default=2, help="task runs (the first may upload)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        host = store.get(args.host) if args.host else stack.enter_context(own_sshd())
        for n in range(args.runs):
            figures = asyncio.run(measure(host, args.delay_ms / 1000))
            print(json.dumps({"run": n + 1, **{k: round(v, 3) for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
