"""Previews end to end: the agent serves a page in the VM, the person opens it here.

Real `piwork run` subprocesses (each with its own ``PIWORK_HOME`` whose
providers.json points at the scripted model server in this process), a real
VM, the real pi; the agent's bash tool starts tests/vm/preview_server.js (Node's
http module) in the guest. The test reads the preview URL from ``--json``.

The URL names the preview's own loopback address (``127.a.b.c``, review 2
finding 6): the test connects there and sends the URL's host as ``Host`` -
exactly what a browser sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.preview import PreviewChoice, PreviewQuestion
from piwork.preview.manager import MAX_PORTS, MAX_REPORTED
from piwork.preview.server import BACKLOG, MAX_WAITING
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from piwork.vm.netmux import MAX_STREAMS
from tests.helpers.cli import Cli, make_home
from tests.helpers.vm import scripted_provider

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1500)]

PIWORK = [sys.executable, "-m", "piwork.cli.main"]
SERVER_JS = (Path(__file__).parent / "preview_server.js").read_text()
NODE = "/opt/piwork/node/bin/node"


def serve(extra: int = 0, seconds: int = 900) -> str:
    return (
        f"cat > /tmp/preview_server.js <<'PIWORK_EOF'\n{SERVER_JS}\nPIWORK_EOF\n"
        f"{NODE} /tmp/preview_server.js 8000 {extra} {seconds}"
    )


def script(req: ChatRequest) -> Step:
    i = req.assistant_turns_since_user
    text = req.last_user_text
    if i == 0 and "many listeners" in text:
        return ToolCalls([bash(serve(extra=200, seconds=20), timeout=120)])
    if i == 0 and "serve the page" in text:
        return ToolCalls([bash(serve(), timeout=900)])
    return Text("served")


@pytest.fixture(scope="module")
async def model_server() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer(script, model_id="scripted")
    async with server:
        yield server


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def wait_for(
    cli: Cli, pred: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        for seen in cli.events:
            if pred(seen):
                return seen
        while (ev := await cli.next_event()) is not None:
            if pred(ev):
                return ev
    raise AssertionError(f"the run ended first: {cli.events[-8:]}\nstderr:\n{cli.stderr}")


async def piwork(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *PIWORK, *args, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def raw(where: tuple[str, int], data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*where)
    try:
        writer.write(data)
        async with asyncio.timeout(30):
            return await reader.read()
    finally:
        writer.close()


async def test_the_agents_page_and_websocket_open_through_the_preview_url(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    env = make_home(tmp_path, model_server)
    cli = await Cli.start(
        env, tmp_path / "run.err",
        "run", "serve the page", "--model", "scripted/scripted", "--json", "--yes",
    )  # fmt: skip
    try:
        ev = await wait_for(
            cli, lambda e: e["event"] == "preview" and e.get("state") == "opened", 900
        )
        task_id = ev["task"]
        assert ev["port"] == 8000 and ev["by"] == "assume-yes"
        url = ev["url"]
        host = urlsplit(url).netloc
        address, host_port = ev["address"], int(host.rsplit(":", 1)[1])
        assert url == f"http://{address}:{host_port}/"
        assert address.startswith("127.") and address != "127.0.0.1"
        where = (address, host_port)
        # `piwork preview TASK PORT` finds it from another process.
        code, out, err = await piwork(env, "preview", task_id[:6], "8000")
        assert code == 0 and out.strip() == url, err
        base = f"http://{host}"
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the server may still be starting when the port opens
                async with http.get(base + "/") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.2)
            async with http.get(base + "/") as resp:
                assert resp.status == 200
                assert await resp.text() == f"hello from the guest (Host: {host})"
            async with http.get(base + "/big?n=3000000") as resp:
                assert len(await resp.read()) == 3_000_000
            async with http.ws_connect(base + "/ws", origin=f"http://{host}") as ws:
                for i in range(10):
                    await ws.send_str(f"ping {i} " + "x" * (i * 50))
                    assert await ws.receive_str() == f"echo: ping {i} " + "x" * (i * 50)

            async def stats() -> dict[str, int]:
                """One new connection each time (so the guest counts exactly one)."""
                req = f"GET /stats HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                answer = await raw(where, req.encode())
                assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
                data: dict[str, int] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
                return data

            # Another Host (another local app's name, a rebinding attacker's) or a
            # foreign Origin is refused on the host: the guest never sees it.
            before = await stats()
            for head, status in [
                (f"GET / HTTP/1.1\r\nHost: attacker.example:{host_port}\r\n\r\n", b"421"),
                (f"GET / HTTP/1.1\r\nHost: localhost:{host_port}\r\n\r\n", b"421"),
                (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{host_port}\r\n\r\n", b"421"),
                (
                    f"GET / HTTP/1.1\r\nHost: {task_id[:8]}-8000.localhost:{host_port}\r\n\r\n",
                    b"421",
                ),
                (
                    f"GET / HTTP/1.1\r\nHost: {host}\r\nOrigin: http://localhost:5173\r\n\r\n",
                    b"403",
                ),
                (f"GET / HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\n\r\n", b"403"),
            ]:
                assert (await raw(where, head.encode())).startswith(b"HTTP/1.1 " + status)
            after = await stats()
            assert after["total"] == before["total"] + 1  # only the second /stats arrived

            # 200 connections at once (long polls): the host stays bounded.
            pid = cli.proc.pid
            fd0 = fds(pid)
            rss0 = rss_mib(pid)
            conns = []
            peak_fds = fd0
            for _ in range(200):
                r, w = await asyncio.open_connection(*where)
                w.write(f"GET /hold HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                conns.append((r, w))
                peak_fds = max(peak_fds, fds(pid))
            for _ in range(20):
                await asyncio.sleep(0.25)
                peak_fds = max(peak_fds, fds(pid))

            # A connection the netmux cannot take is turned away promptly: answered
            # 503, or (beyond MAX_WAITING heads in flight at once, which a loaded host
            # reaches) closed at accept. Either way it ends; the held ones do not.
            async def outcome(r: asyncio.StreamReader) -> bytes:
                try:
                    return await r.read()
                except ConnectionError:
                    return b""

            reads = [asyncio.ensure_future(outcome(r)) for r, _w in conns]
            for _ in range(80):  # up to 20 s on a loaded host; the held ones never end
                if sum(t.done() for t in reads) >= 200 - MAX_STREAMS:
                    break
                await asyncio.sleep(0.25)
            ended = [t for t in reads if t.done()]
            answers = [t.result() for t in ended]
            busy = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
            assert all(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers), {
                a[:40] for a in answers
            }
            for t in reads:
                t.cancel()
            for _r, w in conns:
                w.close()
            await asyncio.sleep(1.0)
            held = await stats()  # every stream was busy with a long poll until now
            print(
                f"\n--- 200 connections: fds {fd0} -> peak {peak_fds}, guest {held}, "
                f"turned away: {len(ended)} (503: {busy})"
            )
            assert held["peak"] <= MAX_STREAMS, held
            assert len(ended) >= 200 - MAX_STREAMS
            # Bounded by constants, not by the 200: streams, heads in flight, one
            # accept burst not yet closed, and a few of the task's own.
            bound = MAX_STREAMS + MAX_WAITING + BACKLOG + 16
            assert peak_fds - fd0 <= bound, (fd0, peak_fds, bound)
            async with http.get(base + "/release") as resp:
                assert resp.status == 200
            assert rss_mib(pid) - rss0 < 64
            # Still serving afterwards.
            async with http.get(base + "/") as resp:
                assert resp.status == 200
            async with http.get(base + "/done") as resp:
                assert resp.status == 200
        done = await wait_for(cli, lambda e: e["event"] == "done", 300)
        assert done["reason"] == "completed", cli.stderr
        async with asyncio.timeout(120):
            while await cli.next_event() is not None:  # the events of closing the task
                pass
        assert await asyncio.wait_for(cli.proc.wait(), 120) == 0
    finally:
        if cli.proc.returncode is None:
            cli.proc.kill()
            await cli.proc.wait()
    closed = [e for e in cli.events if e["event"] == "preview" and e.get("state") == "closed"]
    assert [e["port"] for e in closed] == [8000]
    # The task stopped: the preview is gone, connecting is refused.
    with pytest.raises(OSError):
        await asyncio.open_connection(*where)
    code, _out, err = await piwork(env, "preview", task_id)
    assert code == 1 and "no open preview" in err


async def test_with_no_one_to_ask_no_port_opens_even_with_200_listeners(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    env = make_home(tmp_path, model_server)
    policy = tmp_path / "policy.json"  # commands may run; previews are not mentioned
    rules = [
        {"id": f"r-{action}", "action": action, "verdict": "allow", "scope": "global",
         "scopeValue": None, "pattern": None, "created": ""}
        for action in ("shell", "outside-scope")
    ]  # fmt: skip
    policy.write_text(json.dumps({"version": 1, "rules": rules}))
    cli = await Cli.start(
        env, tmp_path / "run.err",
        "run", "serve with many listeners", "--model", "scripted/scripted", "--json",
        "--policy", str(policy),
    )  # fmt: skip
    try:
        await wait_for(cli, lambda e: e["event"] == "ready", 900)
        pid = cli.proc.pid
        fd0, rss0 = fds(pid), rss_mib(pid)
        peaks = {"fds": float(fd0), "rss": rss0}

        async def sample() -> None:
            while True:
                with contextlib.suppress(OSError):
                    peaks["fds"] = max(peaks["fds"], fds(pid))
                    peaks["rss"] = max(peaks["rss"], rss_mib(pid))
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample())
        try:
            refused = await wait_for(
                cli, lambda e: e["event"] == "preview" and e.get("port") == 8000, 300
            )
            await wait_for(cli, lambda e: e["event"] == "done", 300)
        finally:
            sampler.cancel()
        peak_fds, peak_rss = peaks["fds"], peaks["rss"]
        task_dir = Path(env["PIWORK_HOME"], "data", "tasks", refused["task"])
        assert not (task_dir / "previews.json").exists()
        assert await asyncio.wait_for(cli.proc.wait(), 120) == 0, cli.stderr
    finally:
        if cli.proc.returncode is None:
            cli.proc.kill()
            await cli.proc.wait()
    previews = [e for e in cli.events if e["event"] == "preview"]
    print(f"\n--- {len(previews)} preview events; fds {fd0} -> {peak_fds:.0f}")
    print(f"--- piwork RSS {rss0:.0f} -> {peak_rss:.0f} MiB")
    assert (
        refused["state"] == "refused" and refused["by"] == "no-terminal" and refused["url"] is None
    )
    assert all(e["state"] == "refused" and e["url"] is None for e in previews)
    # The guest reported its lowest MAX_REPORTED ports (8000 and 9000...); each was
    # decided once, and the person would have been asked about MAX_PORTS at most.
    ports = [e["port"] for e in previews]
    assert len(ports) == len(set(ports)) and len(ports) <= MAX_REPORTED
    assert sum(1 for e in previews if e["by"] == "no-terminal") <= MAX_PORTS
    assert len(ports) >= MAX_PORTS  # the listeners were really seen
    assert peak_fds - fd0 <= 16 and peak_rss - rss0 < 64
    tool = next(e for e in cli.events if e["event"] == "tool_end")
    assert tool["ok"], tool


class PreviewAnswering:
    """A front end that lets commands run and opens previews for this task."""

    def __init__(self) -> None:
        self.previews: list[PreviewQuestion] = []

    async def permission(self, request: object) -> Choice:
        return Choice.ALLOW_ONCE

    async def question(self, *args: object) -> None:
        return None

    async def preview(self, question: PreviewQuestion) -> PreviewChoice:
        self.previews.append(question)
        return PreviewChoice.TASK


async def test_a_paused_task_keeps_its_preview_connections_and_they_work_again_after(
    model_server: ScriptedModelServer,
) -> None:
    asker = PreviewAnswering()
    events: list[RunEvent] = []
    previewed = asyncio.Event()

    def sink(ev: RunEvent) -> None:
        events.append(ev)
        if ev.kind is EventKind.PREVIEW:
            previewed.set()

    req = RunRequest(
        prompt=None,
        model="scripted/scripted",
        title="preview pause",
        extra_providers=(scripted_provider(model_server),),  # type: ignore[arg-type]
    )
    async with TaskSession(req, sink, asker) as session:
        run = asyncio.create_task(session.run_prompt("serve the page"))
        try:
            await asyncio.wait_for(previewed.wait(), 600)
            ev = next(e.data for e in events if e.kind is EventKind.PREVIEW)
            assert ev["state"] == "opened" and ev["by"] == "person"
            assert [q.port for q in asker.previews] == [8000]
            assert session.previews is not None
            assert [p.url for p in session.previews.list()] == [ev["url"]]  # what the app lists
            host = urlsplit(ev["url"]).netloc
            base = f"http://{host}"
            async with aiohttp.ClientSession() as http:
                for _ in range(100):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(base + "/") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.2)
                async with http.ws_connect(base + "/ws", origin=f"http://{host}") as ws:
                    await ws.send_str("before")
                    assert await ws.receive_str() == "echo: before"
                    await session.pause_vm()
                    await ws.send_str("while paused")
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(ws.receive_str(), 2)
                    await session.resume_vm()
                    # The connection was kept: the message sent while paused arrives now.
                    assert await asyncio.wait_for(ws.receive_str(), 60) == "echo: while paused"
                    await ws.send_str("after")
                    assert await asyncio.wait_for(ws.receive_str(), 60) == "echo: after"
                async with http.get(base + "/done") as resp:
                    assert resp.status == 200
            outcome = await asyncio.wait_for(run, 300)
            assert outcome.ok
        finally:
            if not run.done():
                run.cancel()
    closed = [e.data for e in events if e.kind is EventKind.PREVIEW and e.data["state"] == "closed"]
    assert [c["port"] for c in closed] == [8000]
