"""Start-up and task timings, measured with the real VM and the demo model.

Figures, not assertions: tests check behaviour, this prints how fast it is.
Each round boots a fresh VM, runs the demo task in a scratch folder and
powers off; tasks go to a private data dir so your task list stays clean.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from piwork.config import Paths, get_paths
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from piwork.vm.command import Transport


@dataclass
class Round:
    figures: dict[str, float] = field(default_factory=dict)


def _rss_mib(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def one_round(transport: Transport, accel: str | None, memory_mb: int) -> Round:
    base = get_paths()
    with tempfile.TemporaryDirectory(prefix="piwork-bench-") as tmp:
        root = Path(tmp)
        paths = Paths(data=root / "data", cache=base.cache, state=root / "state", config=root / "c")
        folder = root / "folder"
        folder.mkdir()
        (folder / "README.md").write_text("# bench\n")
        rnd = Round()
        t0 = time.monotonic()

        def sink(ev: RunEvent) -> None:
            if ev.kind is EventKind.BOOT:
                rnd.figures[f"boot:{ev.data['stage']}"] = ev.elapsed

        req = RunRequest(
            prompt=None,
            folder=folder,
            model="demo",
            accel=accel,
            transport=transport,
            memory_mb=memory_mb,
        )
        async with TaskSession(req, sink, paths=paths) as session:
            rnd.figures["first RPC reply"] = time.monotonic() - t0
            assert session.agent is not None
            rnd.figures["QEMU RSS after start (MiB)"] = _rss_mib(session.agent.vm.pid)
            pong = await session.agent.channel.ping()
            rnd.figures["guest MemAvailable (MiB)"] = (pong.get("memAvailableKb") or 0) / 1024
            rnd.figures["channel ping RTT (ms)"] = pong["rtt"] * 1000
            t = time.monotonic()
            outcome = await session.run_prompt("Summarise this folder")
            rnd.figures["prompt to task end"] = time.monotonic() - t
            rnd.figures["QEMU RSS after task (MiB)"] = _rss_mib(session.agent.vm.pid)
            if not outcome.ok:
                raise RuntimeError(f"benchmark task did not complete: {outcome}")
            t = time.monotonic()
        rnd.figures["power off"] = time.monotonic() - t
        rnd.figures["run to task end"] = (
            rnd.figures["first RPC reply"] + rnd.figures["prompt to task end"]
        )
        return rnd


def summarise(rounds: list[Round]) -> list[tuple[str, float, float, float]]:
    keys = list(dict.fromkeys(k for r in rounds for k in r.figures))
    rows = []
    for k in keys:
        vals = [r.figures[k] for r in rounds if k in r.figures]
        rows.append((k, statistics.median(vals), min(vals), max(vals)))
    return rows
