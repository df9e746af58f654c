"""Worst event-loop stall and peak memory while the host digests a 60 MB tool output.

Host side only, with real parts: GuestChannel, RpcClient, the runner's
transcript recorder and event digestion (TaskSession._on_pi_line/_on_item),
the TaskStore and its transcript on disk. The guest end is a separate process
that writes pi 0.73.1's lines on a unix socket in the supervisor's framing (no
VM: this measures the host's parser, not the VM). A 1 ms ticker on the loop
records how late it runs; the worst lateness is the stall.

Scenarios:
  streamed  a bash tool printing 60 MB: pi sends tool_execution_update with the
            output's last 50 KB; here one per 64 KB chunk (pi throttles; this is
            the worst case), then the end, and assistant text deltas
  oneline   a tool result of 60 MB in a single line (a tool that does not
            truncate): one 60 MB tool_execution_end

Run: .venv/bin/python -m benchmarks.loop_stall [streamed|oneline ...]
Register in `piwork bench` via :func:`measure`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.hostile import peak_rss_mib
from piwork.config import Paths
from piwork.rpc.models import AgentEnd
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus
from tests.helpers.guest_double import Host

TOTAL = 60 * 1024 * 1024
CHUNK = 64 * 1024
TAIL = 50 * 1024

GUEST = textwrap.dedent(
    r"""
    import json, socket, sys
    path, scenario, total, chunk, tail = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    srv = socket.socket(socket.AF_UNIX); srv.bind(path); srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    f = conn.makefile("rb")
    f.readline()  # hello
    seq = 0
    def send(obj_bytes):
        global seq
        seq += 1
        conn.sendall(str(seq).encode() + b" " + obj_bytes + b"\n")
    conn.sendall(b'0 !{"ev":"hello","bootId":"bench","lastSeq":0}\n')
    call = {"toolCallId": "c1", "toolName": "bash"}
    start = {"type": "tool_execution_start", **call, "args": {"command": "cat big"}}
    send(json.dumps(start).encode())
    line = ("y" * 99 + "\n")
    if scenario == "streamed":
        out = ""
        sent = 0
        while sent < total:
            out = (out + line * (chunk // 100))[-tail:]
            sent += chunk
            upd = {"type": "tool_execution_update", **call, "args": {"command": "cat big"},
                   "partialResult": {"content": [{"type": "text", "text": out}]}}
            send(json.dumps(upd).encode())
        result = out
    else:
        result = line * (total // 100)
    send(json.dumps({"type": "tool_execution_end", **call, "isError": False,
                     "result": {"content": [{"type": "text", "text": result}]}}).encode())
    text = ""
    for i in range(300):
        text += "word "
        partial = {"role": "assistant", "content": [{"type": "text", "text": text}]}
        send(json.dumps({"type": "message_update", "message": partial,
                         "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0,
                                                   "delta": "word ", "partial": partial}}).encode())
    usage = {"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}
    final = {"role": "assistant", "content": [{"type": "text", "text": text}],
             "stopReason": "stop", "usage": usage}
    for _ in range(50):
        send(json.dumps({"type": "message_end", "message": final}).encode())
    send(b'{"type":"agent_end","messages":[]}')
    f.readline()
    """
)


class _FakeGuestPath:
    def __init__(self, path: Path) -> None:
        self.path = path


async def measure(scenario: str = "streamed", total: int = TOTAL) -> dict[str, Any]:
    """One run; returns the figures (seconds, MiB, bytes)."""
    with tempfile.TemporaryDirectory(prefix="piwork-stall-") as tmp:
        root = Path(tmp)
        sock = root / "rpc.sock"
        guest = subprocess.Popen(  # noqa: ASYNC220 - once, before the measurement
            [sys.executable, "-c", GUEST, str(sock), scenario, str(total), str(CHUNK), str(TAIL)],
            stdout=subprocess.PIPE,
        )
        assert guest.stdout is not None
        guest.stdout.readline()
        paths = Paths(root / "d", root / "c", root / "s", root / "cfg")
        session = TaskSession(RunRequest(prompt="bench"), paths=paths)
        task = session.store.create("loop stall")
        session.adopt(task)
        session.task = session.store.transition(task.id, TaskStatus.RUNNING)
        host = Host(_FakeGuestPath(sock))  # type: ignore[arg-type]
        # Through the same door as TaskSession.start (big lines are recorded off the loop).
        session.attach_agent(host.agent)
        # As before the door: no one answers the guest's dialogs here (the scenarios
        # count and time lines; answering absurd dialogs would add traffic of its own).
        host.rpc.set_ui_handler(None)
        done = asyncio.Event()
        host.rpc.add_listener(lambda item: done.set() if isinstance(item, AgentEnd) else None)

        worst = 0.0
        worst_cpu = 0.0
        stop = False

        async def ticker() -> None:
            nonlocal worst, worst_cpu
            loop = asyncio.get_running_loop()
            while not stop:
                t = loop.time()
                c = time.thread_time()
                await asyncio.sleep(0.001)
                late = loop.time() - t - 0.001
                if late > worst:
                    # The part of the stall the loop thread spent computing; the rest
                    # is waiting (blocking I/O, or the OS running someone else).
                    worst, worst_cpu = late, time.thread_time() - c

        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        await host.channel.start(timeout=10)
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.monotonic() - started
        assert session.usage is not None
        await session.usage.flush()
        stop = True
        await tick
        await host.channel.close()
        transcript = task.transcript_path
        size = sum(p.stat().st_size for p in task.dir.glob("transcript*.jsonl"))
        await session.close()
        guest.kill()
        guest.wait()
        peak = peak_rss_mib()
        return {
            "scenario": scenario,
            "tool_output_bytes": total,
            "seconds": round(elapsed, 2),
            "worst_loop_stall_ms": round(worst * 1000, 1),
            "worst_stall_cpu_ms": round(worst_cpu * 1000, 1),
            "peak_rss_mib": round(peak, 1),
            "transcript_bytes": size,
            "transcript_exists": transcript.exists(),
        }


def main(argv: list[str]) -> int:
    scenarios = argv or ["streamed", "oneline"]
    for scenario in scenarios:
        # A fresh process per scenario, so peak RSS belongs to that scenario.
        if len(scenarios) > 1:
            subprocess.run([sys.executable, "-m", "benchmarks.loop_stall", scenario], check=True)
            continue
        print(json.dumps(asyncio.run(measure(scenario))), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIWORK_LOG", "warning")
    raise SystemExit(main(sys.argv[1:]))
