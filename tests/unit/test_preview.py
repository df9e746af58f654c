"""Previews on the host: the Host/Origin gate, the policy, bounds, pause and close.

The host end is real (NetMux, PreviewServer, Previews, the policy store and
audit log, aiohttp clients and servers on loopback); the guest end of the
netmux is the hand-written MuxGuest (tests/vm/test_vm_preview.py runs the
real one in a VM). Every request that is refused must never reach the guest:
MuxGuest records each CONNECT.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from piwork.policy import AuditLog, Choice, PolicyStore
from piwork.policy.request import host_target
from piwork.policy.rules import Action, Rule, Scope, Target, TaskContext, Verdict
from piwork.preview import (
    PreviewChoice,
    PreviewQuestion,
    Previews,
    gate,
    parse_ports,
    read_previews,
    state,
)
from piwork.preview.manager import MAX_PORTS, MAX_REPORTED
from piwork.preview.server import PreviewServer
from piwork.vm.netmux import MAX_STREAMS
from tests.helpers.mux_guest import MuxGuest, mux_with_guest

TASK = "0123456789ab"

# --------------------------------------------------------------------------- the gate


def head(host: str, *extra: str, target: str = "/") -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_the_url_names_the_previews_own_address_or_the_task_and_both_ports() -> None:
    assert gate.address_host("127.123.4.5", 41234) == "127.123.4.5:41234"
    assert state.url_for(TASK, 8000, 41234, "127.123.4.5") == "http://127.123.4.5:41234/"
    assert gate.preview_host(TASK, 8000, 41234) == "01234567-8000.localhost:41234"
    assert state.url_for(TASK, 8000, 41234) == "http://01234567-8000.localhost:41234/"


def test_only_the_previews_own_host_and_origin_pass() -> None:
    me = "01234567-8000.localhost:41234"
    assert gate.check_head(head(me), me).ok
    assert gate.check_head(head(me.upper()), me).ok  # host names are case-insensitive
    assert gate.check_head(head(me, f"Origin: http://{me}"), me).ok
    refused = {
        # another local app's name, plain localhost, a rebinding attacker's name
        "localhost:41234": 421,
        "127.0.0.1:41234": 421,
        "attacker.example:41234": 421,
        "01234567-8000.localhost:41235": 421,
        "01234567-8001.localhost:41234": 421,
        "01234567-8000.localhost": 421,
    }
    for host, status in refused.items():
        verdict = gate.check_head(head(host), me)
        assert (verdict.ok, verdict.status) == (False, status), host
    cases = [
        (head(me, "Origin: http://evil.example"), 403),
        (head(me, "Origin: null"), 403),
        (head(me, f"Origin: http://{me}", "Origin: http://evil.example"), 403),
        (head(me, f"Host: {me}"), 400),  # two Host headers
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # none
        (head(me, target="http://evil.example/"), 400),  # absolute-form names another host
        (head(me, target="*"), 400),
        (b"GET / HTTP/1.1\r\nHost: " + me.encode() + b"\r\nX: \xff\r\n\r\n", 400),
        (b"\x16\x03\x01 TLS hello\r\n\r\n", 400),
        (head(me, "Bad Header Name: x"), 400),
    ]
    for raw, status in cases:
        verdict = gate.check_head(raw, me)
        assert (verdict.ok, verdict.status) == (False, status), raw
    answer = gate.refusal(gate.check_head(head("evil.example"), me))
    assert (
        answer.startswith(b"HTTP/1.1 421 Misdirected Request\r\n")
        and b"Connection: close" in answer
    )


# --------------------------------------------------------------------------- fixtures


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def __call__(self, data: dict[str, Any]) -> None:
        self.events.append(data)
        self.changed.set()

    async def wait(self, port: int, state_: str, timeout: float = 10) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for ev in self.events:
                    if ev["port"] == port and ev["state"] == state_:
                        return ev
                self.changed.clear()
                await self.changed.wait()


class Asker:
    """A front end that answers previews (and records the questions)."""

    def __init__(self, answer: PreviewChoice | None) -> None:
        self.answer = answer
        self.asked: list[PreviewQuestion] = []

    async def preview(self, question: PreviewQuestion) -> PreviewChoice | None:
        self.asked.append(question)
        return self.answer

    async def permission(self, request: Any) -> Choice | None:
        raise AssertionError("a preview asker is asked through preview()")


class PermissionOnly:
    def __init__(self, answer: Choice | None) -> None:
        self.answer = answer
        self.asked: list[Any] = []

    async def permission(self, request: Any) -> Choice | None:
        self.asked.append(request)
        return self.answer


async def guest_app() -> tuple[web.AppRunner, int, dict[str, int]]:
    """What the agent would serve: a page, a WebSocket echo, a long poll."""
    seen = {"requests": 0}
    release = asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        seen["requests"] += 1
        return web.Response(text=f"hello from the guest, {request.host}")

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (3 * 1024 * 1024))

    async def hold(request: web.Request) -> web.Response:
        seen["requests"] += 1
        await release.wait()
        return web.Response(text="released")

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                await ws.send_str("echo: " + msg.data)
        return ws

    app = web.Application()
    app.add_routes(
        [web.get("/", page), web.get("/big", big), web.get("/hold", hold), web.get("/ws", echo)]
    )
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port, seen


class Setup:
    def __init__(
        self, previews: Previews, rec: Recorder, guest: MuxGuest, mux: Any, tmp: Path
    ) -> None:
        self.previews = previews
        self.rec = rec
        self.guest = guest
        self.mux = mux
        self.tmp = tmp

    def store(self) -> PolicyStore:
        return PolicyStore(self.tmp / "policy.json")


@contextlib.asynccontextmanager
async def previews_for(
    tmp: Path, asker: Any, *, assume_yes: bool = False, folder: Path | None = None
) -> AsyncIterator[tuple[Setup, dict[str, int]]]:
    runner, port, seen = await guest_app()
    task_dir = tmp / "task"
    task_dir.mkdir(exist_ok=True)
    ctx = TaskContext(task_id=TASK, working_folder=folder)
    try:
        async with mux_with_guest({8000: port}) as (mux, guest):
            previews = Previews(
                TASK,
                task_dir,
                ctx,
                PolicyStore(tmp / "policy.json"),
                AuditLog(tmp / "audit.jsonl"),
                assume_yes=assume_yes,
            )
            rec = Recorder()
            previews.start(mux, asker, rec)
            try:
                yield Setup(previews, rec, guest, mux, tmp), seen
            finally:
                await previews.close()
    finally:
        await runner.cleanup()


def endpoint(ev: dict[str, Any]) -> tuple[str, int, str]:
    """(the preview's own address, its port, the Host a browser sends) of an opened event."""
    address, port = ev["address"], ev["hostPort"]
    assert ev["url"] == f"http://{address}:{port}/"
    return address, port, f"{address}:{port}"


async def raw_request(where: tuple[str, int], data: bytes, timeout: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection(*where)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            return await reader.read()
    finally:
        writer.close()


# --------------------------------------------------------------------------- end to end


async def test_an_allowed_port_serves_pages_a_websocket_and_big_bodies(tmp_path: Path) -> None:
    asker = Asker(PreviewChoice.TASK)
    async with previews_for(tmp_path, asker) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        ev = await s.rec.wait(8000, "opened")
        address, host_port, host = endpoint(ev)
        assert ev["by"] == "person" and address.startswith("127.") and address != "127.0.0.1"
        assert len(asker.asked) == 1 and asker.asked[0].port == 8000
        base = f"http://{host}"
        async with aiohttp.ClientSession(headers={"Host": host}) as http:
            for _ in range(3):  # keep-alive: later requests on the same connection
                async with http.get(base + "/") as resp:
                    assert resp.status == 200
                    assert await resp.text() == f"hello from the guest, {host}"
            async with http.get(base + "/big") as resp:
                assert len(await resp.read()) == 3 * 1024 * 1024
            async with http.ws_connect(base + "/ws", origin=f"http://{host}") as ws:
                for i in range(20):
                    await ws.send_str(f"m{i}")
                    assert await ws.receive_str() == f"echo: m{i}"
        assert s.guest.connects and set(s.guest.connects) == {8000}
        # Another process finds it: the state file, checked.
        assert read_previews(s.previews.task_dir, TASK) == s.previews.list()
        # The answer is a task rule: asked once per task, audited.
        rules = s.store().load()
        assert [(r.action, r.verdict, r.scope, r.pattern) for r in rules] == [
            (Action.PREVIEW, Verdict.ALLOW, Scope.task(TASK), "8000")
        ]
        audit = [orjson.loads(x) for x in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
        assert audit[-1]["action"] == "preview" and audit[-1]["decision"] == "allow"
    # Closed with the task: the event says so, the file is gone, connections refused.
    ev = await s.rec.wait(8000, "closed")
    assert not (s.previews.task_dir / state.FILE_NAME).exists()
    with pytest.raises(OSError):
        await asyncio.open_connection(address, host_port)


async def test_other_hosts_and_origins_are_refused_before_reaching_the_guest(
    tmp_path: Path,
) -> None:
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        address, port, me = endpoint(await s.rec.wait(8000, "opened"))
        for data, status in [
            (head(f"attacker.example:{port}"), b"421"),  # DNS rebinding
            (head(f"localhost:{port}"), b"421"),
            (head(f"127.0.0.1:{port}"), b"421"),
            (head(f"01234567-8000.localhost:{port}"), b"421"),
            (head(address), b"421"),
            (head(me, f"Origin: http://localhost:{port}"), b"403"),
            (head(me, f"Origin: http://127.0.0.1:{port}"), b"403"),
            (head(me, "Origin: http://evil.example"), b"403"),
            (head(me, target="http://evil.example/"), b"400"),
            (b"x" * (gate.MAX_HEAD + 10), b"431"),
            (
                head(
                    me, "Upgrade: websocket", "Connection: Upgrade", "Origin: http://evil.example"
                ),
                b"403",
            ),
        ]:
            answer = await raw_request((address, port), data)
            assert answer.startswith(b"HTTP/1.1 " + status), (data[:60], answer[:80])
        assert s.guest.connects == [] and seen["requests"] == 0  # nothing reached the guest
        assert s.mux.stats.inbound_opened == 0
        # The right Host passes (the same listener, the same guest).
        answer = await raw_request((address, port), head(me, "Connection: close"))
        assert answer.startswith(b"HTTP/1.1 200") and s.guest.connects == [8000]


async def test_a_port_nothing_listens_on_answers_502(tmp_path: Path) -> None:
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8001]})  # the server is gone
        address, port, me = endpoint(await s.rec.wait(8001, "opened"))
        answer = await raw_request((address, port), head(me))
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway") and b"port 8001" in answer
        assert s.guest.connects == [8001]


async def test_a_slow_head_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "HEAD_TIMEOUT", 0.3)
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        address, port, _me = endpoint(await s.rec.wait(8000, "opened"))
        answer = await raw_request((address, port), b"GET / HTTP/1.1\r\nHost: x")  # never ends
        assert answer.startswith(b"HTTP/1.1 408") and s.guest.connects == []


async def test_200_connections_stay_within_the_stream_cap_and_leave_nothing_behind(
    tmp_path: Path,
) -> None:
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        address, port, me = endpoint(await s.rec.wait(8000, "opened"))
        fds_before = len(os.listdir("/proc/self/fd"))
        conns = []
        for _ in range(200):
            r, w = await asyncio.open_connection(address, port)
            w.write(head(me, target="/hold"))  # a long poll: each holds its stream
            conns.append((r, w))
        await asyncio.sleep(1.0)
        server = s.previews.server(8000)
        assert server is not None
        assert s.mux.inbound_streams <= MAX_STREAMS and s.mux.stats.peak_inbound <= MAX_STREAMS
        assert s.guest.peak_live <= MAX_STREAMS
        # The rest were answered 503 (or closed while too many waited), not queued.
        busy = 0
        for r, _w in conns:
            with contextlib.suppress(TimeoutError):
                got = await asyncio.wait_for(r.read(), 0.05)
                busy += got.startswith(b"HTTP/1.1 503") or got == b""
        assert busy >= 200 - MAX_STREAMS
        assert server.stats.busy >= 200 - MAX_STREAMS
        for _r, w in conns:
            w.close()
        for _ in range(100):
            if s.mux.inbound_streams == 0 and server.open_connections == 0:
                break
            await asyncio.sleep(0.05)
        assert s.mux.inbound_streams == 0 and server.open_connections == 0
        await asyncio.sleep(0.2)
        assert len(os.listdir("/proc/self/fd")) <= fds_before + 5  # nothing leaked


async def test_paused_previews_keep_connections_and_carry_nothing(tmp_path: Path) -> None:
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        address, port, me = endpoint(await s.rec.wait(8000, "opened"))
        s.previews.pause()
        r, w = await asyncio.open_connection(address, port)
        w.write(head(me, "Connection: close"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(1), 0.5)
        assert s.guest.connects == [] and not r.at_eof()
        s.previews.resume()
        got = await asyncio.wait_for(r.read(), 10)
        assert got.startswith(b"HTTP/1.1 200")
        w.close()


# --------------------------------------------------------------------------- asking


async def test_with_no_one_to_ask_the_port_stays_closed(tmp_path: Path) -> None:
    asker = PermissionOnly(None)  # what DenyAsker answers
    async with previews_for(tmp_path, asker) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        ev = await s.rec.wait(8000, "refused")
        assert ev["by"] == "no-terminal" and ev["url"] is None and "no one to ask" in ev["reason"]
        assert s.previews.list() == [] and s.guest.connects == []
        assert not (s.previews.task_dir / state.FILE_NAME).exists()
        assert s.store().load() == []  # nothing remembered: the next run asks again
        # A permission-only front end was asked with the preview action, host-built.
        (req,) = asker.asked
        assert req.action is Action.PREVIEW and "port 8000" in req.question


async def test_never_is_remembered_for_the_folder_and_a_rule_decides_without_asking(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    asker = Asker(PreviewChoice.NEVER)
    async with previews_for(tmp_path, asker, folder=folder) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        assert (await s.rec.wait(8000, "refused"))["by"] == "person"
    (rule,) = PolicyStore(tmp_path / "policy.json").load()
    assert (rule.verdict, rule.scope, rule.pattern) == (Verdict.DENY, Scope.folder(folder), "8000")
    again = Asker(PreviewChoice.TASK)
    async with previews_for(tmp_path, again, folder=folder) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        ev = await s.rec.wait(8000, "refused")
        assert ev["by"] == "rule" and again.asked == []
    # An allow rule opens it without asking (e.g. `piwork policy allow preview 8000`).
    store = PolicyStore(tmp_path / "policy.json")
    store.add_many([Rule(Action.PREVIEW, Verdict.ALLOW, Scope.task(TASK), pattern="8000")])
    async with previews_for(tmp_path, again, folder=folder) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        assert (await s.rec.wait(8000, "opened"))["by"] == "rule" and again.asked == []


async def test_assume_yes_opens_for_this_run_only(tmp_path: Path) -> None:
    async with previews_for(tmp_path, PermissionOnly(None), assume_yes=True) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        assert (await s.rec.wait(8000, "opened"))["by"] == "assume-yes"
        assert s.store().load() == []


async def test_guest_reports_are_bounded_and_each_port_is_decided_once(tmp_path: Path) -> None:
    assert parse_ports({"ev": "exit"}) is None
    assert parse_ports({"ev": "ports", "ports": "8000"}) == []
    bad: list[Any] = [80, 0, -1, 70000, True, "9000", 3000.5, None, 3000, 3000, 5000]
    assert parse_ports({"ev": "ports", "ports": bad}) == [3000, 5000]
    assert len(parse_ports({"ev": "ports", "ports": list(range(2000, 2200))}) or []) == 64
    asker = Asker(None)
    async with previews_for(tmp_path, asker) as (s, _seen):
        for i in range(50):  # a guest cycling through 3,200 ports, 64 at a time
            first = 2000 + 64 * i
            report = list(range(first, first + 64))
            s.previews.on_supervisor_message({"ev": "ports", "ports": report})
        await s.rec.wait(2000 + MAX_PORTS - 1, "refused")
        await asyncio.sleep(0.2)
        assert len(asker.asked) == MAX_PORTS  # the person is asked about MAX_PORTS at most
        ports = [e["port"] for e in s.rec.events]
        assert len(ports) == len(set(ports)) == MAX_REPORTED  # then nothing more, at all
        limited = [e for e in s.rec.events if e.get("by") == "limit"]
        assert len(limited) == MAX_REPORTED - MAX_PORTS


def test_a_guest_permission_request_cannot_name_a_preview() -> None:
    forged = Target(Action.PREVIEW, op="preview", tool="8000")
    assert host_target(forged).action is Action.SHELL
    assert host_target(Target(Action.PREVIEW, tool="8000")).action is Action.SHELL


# --------------------------------------------------------------------------- the state file


def test_the_state_file_is_checked_and_the_url_rebuilt(tmp_path: Path) -> None:
    info = state.PreviewInfo(8000, 41234, state.url_for(TASK, 8000, 41234))
    state.write(tmp_path, TASK, [info])
    assert (tmp_path / state.FILE_NAME).stat().st_mode & 0o777 == 0o600
    assert state.read(tmp_path, TASK) == [info]
    assert state.read(tmp_path, "ffffffffffff") == []  # another task's file
    doc = orjson.loads((tmp_path / state.FILE_NAME).read_bytes())
    doc["previews"] = [
        {"port": 8000, "hostPort": 41234, "url": "javascript:alert(1)"},
        {"port": 0, "hostPort": 1},
        {"port": True, "hostPort": 2},
        "junk",
    ]
    (tmp_path / state.FILE_NAME).write_bytes(orjson.dumps(doc))
    assert state.read(tmp_path, TASK) == [info]  # the URL is rebuilt, junk dropped
    own = state.PreviewInfo(8001, 41235, "http://127.9.8.7:41235/", "127.9.8.7")
    doc["previews"] = [own.to_json()] + [
        {"port": 8002, "hostPort": 41236, "address": bad}
        for bad in ("10.0.0.1", "127.1.2.3.evil.example", "127.001.2.3", "::1", 127, "")
    ]
    (tmp_path / state.FILE_NAME).write_bytes(orjson.dumps(doc))
    assert state.read(tmp_path, TASK) == [own]  # only a loopback address becomes a URL
    doc["started"] += 1  # the same pid, another process (the pid was reused)
    (tmp_path / state.FILE_NAME).write_bytes(orjson.dumps(doc))
    assert state.read(tmp_path, TASK) == []
    doc["started"] -= 1
    doc["pid"] = 2**22 + 12345  # no such process: the previews are gone with it
    (tmp_path / state.FILE_NAME).write_bytes(orjson.dumps(doc))
    assert state.read(tmp_path, TASK) == []
    (tmp_path / state.FILE_NAME).write_bytes(b"{" * 100_000)
    assert state.read(tmp_path, TASK) == []
    state.write(tmp_path, TASK, [])
    assert not (tmp_path / state.FILE_NAME).exists()


# --------------------------------------------------------------------------- `piwork preview`


def test_piwork_preview_prints_the_running_tasks_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from piwork.cli.main import main
    from piwork.config import get_paths
    from piwork.tasks import TaskStore

    store = TaskStore(get_paths().tasks)
    task = store.create("serve a page", None, model="demo")
    store.close()
    assert main(["preview", task.id[:6]]) == 1
    assert "no open preview" in capsys.readouterr().err
    infos = [
        state.PreviewInfo(8000, 41234, state.url_for(task.id, 8000, 41234)),
        state.PreviewInfo(5173, 41235, state.url_for(task.id, 5173, 41235)),
    ]
    state.write(task.dir, task.id, infos)
    assert main(["preview", task.id, "5173"]) == 0
    assert capsys.readouterr().out.strip() == infos[1].url
    assert main(["preview", task.id, "--json"]) == 0
    rows = [orjson.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["url"] for r in rows] == [i.url for i in infos]
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    assert main(["preview", task.id, "8000", "--open"]) == 0
    assert opened == [infos[0].url]
    assert main(["preview", task.id, "9999"]) == 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["preview", task.id, "http://evil"])  # not a port


# --------------------------------------------------------------------------- the origin


# Vite's default `server.cors.origin` (Vite docs, server.cors): what a dev server the person
# runs for another project answers CORS reads from. The review's finding 6.
VITE_DEFAULT_CORS = re.compile(
    r"^https?://(?:(?:[^:]+\.)?localhost|127\.0\.0\.1|\[::1\])(?::\d+)?$"
)


async def test_each_preview_has_an_origin_local_dev_servers_do_not_trust(tmp_path: Path) -> None:
    """A page at ``*.localhost`` could read the person's Vite dev servers; a preview now
    runs at an address of its own, and answers only there."""
    asker = Asker(PreviewChoice.TASK)
    async with previews_for(tmp_path, asker) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000, 8001]})
        one = endpoint(await s.rec.wait(8000, "opened"))
        two = endpoint(await s.rec.wait(8001, "opened"))
        assert one[0] != two[0], "each preview its own address: its own cookies, its own origin"
        for address, port, host in (one, two):
            assert VITE_DEFAULT_CORS.match(f"http://{host}") is None
            assert ipaddress.IPv4Address(address) in ipaddress.IPv4Network("127.0.0.0/8")
            # Nothing of the preview's on the addresses local tools trust.
            for other in ("127.0.0.1", "::1"):
                with pytest.raises(OSError):
                    await asyncio.open_connection(other, port)
        # The fallback name would be trusted: the reason it is only a fallback.
        assert VITE_DEFAULT_CORS.match(f"http://{gate.preview_host(TASK, 8000, one[1])}")
        # The person's browser sends the right Host; a page elsewhere cannot name it.
        answer = await raw_request(one[:2], head(one[2], "Connection: close"))
        assert answer.startswith(b"HTTP/1.1 200")
        answer = await raw_request(one[:2], head(two[2], "Connection: close"))
        assert answer.startswith(b"HTTP/1.1 421")
        assert read_previews(s.previews.task_dir, TASK) == s.previews.list()
        assert {p.address for p in s.previews.list()} == {one[0], two[0]}


def _only_127_0_0_1(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Make this machine look like macOS: no loopback address but 127.0.0.1 (and ::1)."""
    real = PreviewServer._listen
    calls: list[tuple[str, int]] = []

    async def listen(self: PreviewServer, host: str, port: int) -> asyncio.Server:
        calls.append((host, port))
        if host not in ("127.0.0.1", "::1"):
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        return await real(self, host, port)

    monkeypatch.setattr(PreviewServer, "_listen", listen)
    return calls


async def test_the_localhost_fallback_is_bound_on_both_families_or_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 14: another local user holding ``[::1]:<port>`` would answer the URL (browsers
    try ::1 first for ``*.localhost``); the preview now moves to a port it holds on both."""
    calls = _only_127_0_0_1(monkeypatch)
    real = PreviewServer._listen
    squatted: list[socket.socket] = []

    async def squat_first(self: PreviewServer, host: str, port: int) -> asyncio.Server:
        if host == "::1" and not squatted:  # someone else is already on [::1]:<port>
            other = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            other.bind(("::1", port))
            other.listen()
            squatted.append(other)
        return await real(self, host, port)

    monkeypatch.setattr(PreviewServer, "_listen", squat_first)
    try:
        async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
            s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
            ev = await s.rec.wait(8000, "opened")
            port = ev["hostPort"]
            host = f"01234567-8000.localhost:{port}"
            assert ev["address"] is None and ev["url"] == f"http://{host}/"
            taken = squatted[0].getsockname()[1]
            assert port != taken, "the squatted port was never published"
            assert ("::1", taken) in calls and ("::1", port) in calls
            for family in ("127.0.0.1", "::1"):  # the same preview on both families
                answer = await raw_request((family, port), head(host, "Connection: close"))
                assert answer.startswith(b"HTTP/1.1 200"), family
    finally:
        for sock in squatted:
            sock.close()


async def test_no_url_when_no_port_is_free_on_both_families(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _only_127_0_0_1(monkeypatch)
    real = PreviewServer._listen

    async def v6_always_taken(self: PreviewServer, host: str, port: int) -> asyncio.Server:
        if host == "::1":
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return await real(self, host, port)

    monkeypatch.setattr(PreviewServer, "_listen", v6_always_taken)
    async with previews_for(tmp_path, Asker(PreviewChoice.TASK)) as (s, _seen):
        s.previews.on_supervisor_message({"ev": "ports", "ports": [8000]})
        ev = await s.rec.wait(8000, "refused")
        assert ev["url"] is None and "::1" in ev["reason"]
        assert s.previews.list() == [] and s.guest.connects == []
