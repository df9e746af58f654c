"""Latency and throughput through a preview, next to the same server run on the host.

A real `piwork run --yes --json` (its own PIWORK_HOME, the scripted model
server in this process as its model) whose agent starts
tests/vm/preview_server.js in the VM; the preview URL comes from the run's
``preview`` event. Three sides, the same figures each: through the preview
(host client -> preview listener -> netmux -> guest server); inside the guest
(benchmarks/preview_client.js against the same server on the guest's loopback,
run before the host measures: what the guest's Node costs without the netmux
hop); and host-local (the same server script under the host's ``node``). For
each: a 10 MB download (ROUNDS times) and 1,000 small requests one after
another on one kept-alive connection, plus the same 1,000 with 8 connections
at once.

  python -m benchmarks.preview [--rounds N] [--json]

Figures only, never asserted (timings are not tested). TCG here: the guest's
CPU is emulated, so the preview's figures are the guest's Node under TCG plus
the netmux (virtio-serial) hop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash

ROOT = Path(__file__).resolve().parent.parent
SERVER_JS = ROOT / "tests" / "vm" / "preview_server.js"
CLIENT_JS = ROOT / "benchmarks" / "preview_client.js"
MB10 = 10 * 1024 * 1024
SMALL = 1000


def _script(rounds: int) -> Callable[[ChatRequest], Step]:
    def choose(req: ChatRequest) -> Step:
        if req.assistant_turns_since_user == 0:
            node = "/opt/piwork/node/bin/node"
            server, client = SERVER_JS.read_text(), CLIENT_JS.read_text()
            cmd = (
                f"cat > /tmp/preview_server.js <<'PIWORK_EOF'\n{server}\nPIWORK_EOF\n"
                f"cat > /tmp/preview_client.js <<'PIWORK_EOF'\n{client}\nPIWORK_EOF\n"
                f"{node} /tmp/preview_server.js 8000 & sleep 2; "
                f"{node} /tmp/preview_client.js 8000 {rounds} /mnt/outputs/in-guest.json; wait"
            )
            return ToolCalls([bash(cmd, timeout=3600)])
        return Text("served")

    return choose


def _home(root: Path, server: ScriptedModelServer) -> dict[str, str]:
    home = root / "home"
    (home / "config").mkdir(parents=True)
    model = {"id": "scripted", "name": "scripted", "contextWindow": 128000, "maxTokens": 4096}
    provider = {"baseUrl": server.base_url, "api": "openai-completions", "auth": "none"}
    providers = {"providers": {"scripted": {**provider, "models": [model]}}}
    (home / "config" / "providers.json").write_text(json.dumps(providers))
    return {**os.environ, "PIWORK_HOME": str(home)}


async def _measure(base: str, host: str, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    headers = {"Host": host}
    conn = aiohttp.TCPConnector(limit=8)
    async with aiohttp.ClientSession(headers=headers, connector=conn) as http:
        for _ in range(50):  # the server may still be starting
            try:
                async with http.get(base + "/") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        secs = []
        for _ in range(rounds):
            t = time.perf_counter()
            async with http.get(f"{base}/big?n={MB10}") as resp:
                got = 0
                async for chunk in resp.content.iter_chunked(256 * 1024):
                    got += len(chunk)
            secs.append(time.perf_counter() - t)
            assert got == MB10, got
        out["download_10mb_s"] = secs
        out["download_mib_per_s"] = [MB10 / 2**20 / s for s in secs]
        lat = []
        t0 = time.perf_counter()
        for _ in range(SMALL):
            t = time.perf_counter()
            async with http.get(base + "/") as resp:
                await resp.read()
            lat.append(time.perf_counter() - t)
        out["small_sequential_total_s"] = time.perf_counter() - t0
        lat.sort()
        out["small_latency_ms"] = {
            "p50": lat[len(lat) // 2] * 1000,
            "p90": lat[int(len(lat) * 0.9)] * 1000,
            "p99": lat[int(len(lat) * 0.99)] * 1000,
            "mean": statistics.fmean(lat) * 1000,
        }

        async def one() -> None:
            async with http.get(base + "/") as resp:
                await resp.read()

        t0 = time.perf_counter()
        for i in range(0, SMALL, 8):
            await asyncio.gather(*(one() for _ in range(min(8, SMALL - i))))
        took = time.perf_counter() - t0
        out["small_8_at_once_total_s"] = took
        out["small_8_at_once_req_per_s"] = SMALL / took
    return out


async def _preview(rounds: int, tmp: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    async with ScriptedModelServer(_script(rounds), model_id="scripted") as server:
        env = _home(tmp, server)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "piwork.cli.main", "run", "serve the page",
            "--model", "scripted/scripted", "--json", "--yes",
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            url = None
            t0 = time.monotonic()
            while url is None:
                line = await asyncio.wait_for(proc.stdout.readline(), 1200)
                if not line:
                    raise RuntimeError("the run ended before a preview opened")
                ev = json.loads(line)
                if ev["event"] == "preview" and ev.get("state") == "opened":
                    url = ev["url"]
            meta = {"to_preview_s": time.monotonic() - t0, "url": url}
            outputs = Path(env["PIWORK_HOME"], "data", "tasks", ev["task"], "outputs")
            in_guest_file = outputs / "in-guest.json"
            for _ in range(1800):  # the guest measures first, alone
                if in_guest_file.exists():
                    break
                await asyncio.sleep(1)
            in_guest = json.loads(in_guest_file.read_text())
            host = urlsplit(url).netloc
            port = int(host.rsplit(":", 1)[1])
            figures = await _measure(f"http://127.0.0.1:{port}", host, rounds)
            async with (
                aiohttp.ClientSession(headers={"Host": host}) as http,
                http.get(f"http://127.0.0.1:{port}/done") as resp,
            ):
                await resp.read()
            await asyncio.wait_for(proc.wait(), 300)
            return figures, in_guest, meta
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _host_local(rounds: int) -> dict[str, Any] | None:
    node = shutil.which("node")
    if node is None:
        return None
    port = 18_000 + os.getpid() % 1000
    proc = await asyncio.create_subprocess_exec(
        node, str(SERVER_JS), str(port), stdout=subprocess.DEVNULL
    )
    try:
        return await _measure(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", rounds)
    finally:
        proc.kill()
        await proc.wait()


def _summary(name: str, f: dict[str, Any]) -> str:
    dl = statistics.median(f["download_10mb_s"])
    rate = statistics.median(f["download_mib_per_s"])
    lat = f["small_latency_ms"]
    return (
        f"{name:<12} 10 MB: {dl:6.3f} s ({rate:7.1f} MiB/s) | 1,000 small, one after another: "
        f"{f['small_sequential_total_s']:6.2f} s "
        f"(p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms) "
        f"| 8 at once: {f['small_8_at_once_req_per_s']:7.0f} req/s"
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3, help="10 MB downloads per side")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="piwork-bench-preview-") as tmp:
        load = os.getloadavg()[0]
        preview, in_guest, meta = await _preview(args.rounds, Path(tmp))
        local = await _host_local(args.rounds)
    result = {
        "preview": preview,
        "in_guest": in_guest,
        "host_local": local,
        "meta": {**meta, "load_1min": load},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"load {load:.1f}; preview opened {meta['to_preview_s']:.0f} s after `piwork run`")
        print(_summary("preview", preview))
        print(_summary("in-guest", in_guest) if "error" not in in_guest else in_guest)
        print(_summary("host-local", local) if local else "host-local: no `node` on this host")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
