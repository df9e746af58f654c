"""A hostile guest against the real host stack: figures for floods, huge lines, garbage.

The host side is real (GuestChannel, RpcClient, the runner's recorder and event
digestion, TaskStore + transcript on disk); the guest end is a separate process
writing the supervisor's framing on a unix socket, as fast as it can. No VM:
this measures the host's parser and bounds, not the VM.

  python -m benchmarks.hostile flood [SECONDS]   events as fast as possible
  python -m benchmarks.hostile bigline           one 100 MB line, then normal traffic
  python -m benchmarks.hostile garbage [SECONDS] binary junk, bad JSON, absurd requests
  python -m benchmarks.hostile stop [SECONDS]    /stop 1 s into a flood whose pi never
                                                 confirms the abort: time to the run's end

Each prints one JSON object: peak RSS of the host process, worst event-loop
stall, lines the guest wrote, items the host delivered, how long a get_state
took during the attack, and how long stopping took.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def peak_rss_mib() -> float:
    """This process's peak RSS (MiB) since it started its program.

    ``VmHWM`` belongs to the current address space, so it starts afresh at
    exec; ``ru_maxrss`` does not (Linux carries it over from the process that
    forked us: a bench started by a big pytest would report pytest's peak).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- guest process


def _guest(path: str, scenario: str, seconds: float) -> None:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    conn.setblocking(True)
    reader = conn.makefile("rb")
    reader.readline()  # the host's hello
    conn.sendall(b'0 !{"ev":"hello","bootId":"hostile","lastSeq":0}\n')
    seq = 0
    rng = random.Random(7)
    sent = 0
    pending = b""

    def line(payload: bytes) -> bytes:
        nonlocal seq
        seq += 1
        return str(seq).encode() + b" " + payload + b"\n"

    def answer_commands() -> None:
        nonlocal pending
        while select.select([conn], [], [], 0)[0]:
            data = conn.recv(65536)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                if raw.startswith(b"!"):
                    continue
                cmd = json.loads(raw)
                if scenario == "stop" and cmd["type"] == "abort":
                    continue  # a hostile pi: never confirms the stop
                reply = {
                    "id": cmd["id"],
                    "type": "response",
                    "command": cmd["type"],
                    "success": True,
                    "data": {"isStreaming": True, "isCompacting": False},
                }
                conn.sendall(line(json.dumps(reply).encode()))

    update = json.dumps(
        {
            "type": "message_update",
            "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "x"},
        }
    ).encode()
    garbage: list[bytes] = [
        b"{not json",
        b"\xff\xfe\x00\x01binary\x00",
        b'{"type":"no_such_event","x":1}',
        b'{"id":"never-asked","type":"response","command":"get_state","success":true}',
        b'{"type":"response","command":"prompt","success":false}',
        b'{"type":"extension_ui_request","id":"u1","method":"select","title":"'
        + b"T" * 100_000
        + b'","options":'
        + json.dumps([str(i) for i in range(20_000)]).encode()
        + b"}",
        b'{"type":"extension_ui_request","method":"select"}',
        b'{"type":"extension_ui_request","id":"u2","method":"frobnicate"}',
        b'{"type":"extension_ui_request","id":"u3","method":"confirm","timeout":-5}',
        b"[1,2,3]",
        b'"a string"',
        b'{"type":"tool_execution_end","toolCallId":{"nested":[[[[]]]]}}',
        b'{"type":"message_end","message":{"role":"assistant","content":"not a list",'
        b'"usage":{"input":-1,"cost":"free"}}}',
    ]
    deadline = time.monotonic() + seconds
    if scenario == "bigline":
        big = b'{"type":"tool_execution_end","toolCallId":"c1","result":"' + b"y" * (100 << 20)
        conn.sendall(line(big + b'"}'))
        sent += 1
        deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        batch = []
        for _ in range(500):
            if scenario == "garbage":
                batch.append(line(rng.choice(garbage)))
            else:
                batch.append(line(update))
        try:
            conn.sendall(b"".join(batch))
            sent += len(batch)
            answer_commands()
        except OSError:  # "stop": the host went away mid-flood
            break
    try:
        conn.sendall(line(b'{"type":"agent_end","messages":[]}'))
    except OSError:  # "stop": the host went away mid-flood
        print(json.dumps({"guest_lines": sent}), flush=True)
        return
    sent += 1
    while True:  # keep answering until the host goes
        r, _, _ = select.select([conn], [], [], 30)
        if not r:
            break
        try:
            answer_commands()
            if not select.select([conn], [], [], 0)[0]:
                continue
            if not conn.recv(1, socket.MSG_PEEK):
                break
        except OSError:
            break
    print(json.dumps({"guest_lines": sent}), flush=True)


# ---------------------------------------------------------------- host side


class _GuestAt:
    def __init__(self, path: Path) -> None:
        self.path = path


async def measure(scenario: str, seconds: float = 3.0) -> dict[str, Any]:
    from piwork.config import Paths
    from piwork.rpc.models import AgentEnd
    from piwork.runner import RunRequest, TaskSession
    from piwork.tasks import TaskStatus
    from tests.helpers.guest_double import Host

    with tempfile.TemporaryDirectory(prefix="piwork-hostile-") as tmp:
        root = Path(tmp)
        sock = root / "rpc.sock"
        guest = subprocess.Popen(  # noqa: ASYNC220 - once, before the measurement
            [sys.executable, "-m", "benchmarks.hostile", "guest", str(sock), scenario,
             str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert guest.stdout is not None
        guest.stdout.readline()
        paths = Paths(root / "d", root / "c", root / "s", root / "cfg")
        session = TaskSession(RunRequest(prompt="hostile"), paths=paths)
        task = session.store.create("hostile guest")
        session.adopt(task)
        session.task = session.store.transition(task.id, TaskStatus.RUNNING)
        host = Host(_GuestAt(sock))  # type: ignore[arg-type]
        # Through the same door as TaskSession.start (big lines are recorded off the loop).
        session.attach_agent(host.agent)
        # As before the door: no one answers the guest's dialogs here (the scenarios
        # count and time lines; answering absurd dialogs would add traffic of its own).
        host.rpc.set_ui_handler(None)
        delivered = 0
        done = asyncio.Event()

        def count(item: object) -> None:
            nonlocal delivered
            delivered += 1
            if isinstance(item, AgentEnd):
                done.set()

        host.rpc.add_listener(count)
        worst = 0.0
        stop = False

        worst_cpu = 0.0

        async def ticker() -> None:
            nonlocal worst, worst_cpu
            loop = asyncio.get_running_loop()
            while not stop:
                t = loop.time()
                c = time.thread_time()
                await asyncio.sleep(0.001)
                late = loop.time() - t - 0.001
                if late > worst:
                    # How much of the stall was this thread computing (the rest is
                    # waiting: blocking I/O, or the OS giving the core to others).
                    worst, worst_cpu = late, time.thread_time() - c

        async def close_all() -> float:
            """Close the channel, the RPC client and the session; seconds it took."""
            t = time.monotonic()
            await host.channel.close()
            await host.rpc.aclose()
            await session.close()
            return time.monotonic() - t

        tick = asyncio.create_task(ticker())
        await host.channel.start(timeout=30)
        if scenario == "stop":
            # /stop while the guest floods and never confirms the abort: how long
            # until the run has ended (the rest of the harness does not apply).
            run = asyncio.create_task(session.run_prompt("flood"))
            await asyncio.sleep(1.0)
            t = time.monotonic()
            await session.stop()
            outcome = await asyncio.wait_for(run, 120)
            stop_run_s = time.monotonic() - t
            close_s = await close_all()
            stop = True
            await tick
            out, _ = guest.communicate(timeout=60)
            return {
                "scenario": scenario,
                **json.loads(out.strip().splitlines()[-1]),
                "outcome": outcome.reason,
                "stop_to_run_end_s": round(stop_run_s, 3),
                "close_s": round(close_s, 3),
                "worst_loop_stall_ms": round(worst * 1000, 1),
                "worst_stall_cpu_ms": round(worst_cpu * 1000, 1),
                "peak_rss_mib": round(peak_rss_mib(), 1),
            }
        await asyncio.sleep(min(1.0, seconds / 3))
        t = time.monotonic()
        await host.rpc.get_state(timeout=300)  # in order: behind what is already buffered
        request_s = time.monotonic() - t
        try:
            await asyncio.wait_for(done.wait(), seconds + 120)
        finally:
            stop_s = await close_all()
            stop = True
            await tick
        out, _ = guest.communicate(timeout=60)
        transcript = sum(p.stat().st_size for p in task.dir.glob("transcript*.jsonl"))
        result: dict[str, Any] = {
            "scenario": scenario,
            "seconds": seconds,
            **json.loads(out.strip().splitlines()[-1]),
            "host_items": delivered,
            "get_state_during_attack_s": round(request_s, 3),
            "stop_s": round(stop_s, 3),
            "worst_loop_stall_ms": round(worst * 1000, 1),
            "worst_stall_cpu_ms": round(worst_cpu * 1000, 1),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "transcript_bytes": transcript,
            "oversized_reports": sum(1 for e in host.events if e.get("ev") == "oversized"),
        }
        return result


def main(argv: list[str]) -> int:
    if argv and argv[0] == "guest":
        _guest(argv[1], argv[2], float(argv[3]))
        return 0
    scenario = argv[0] if argv else "flood"
    seconds = float(argv[1]) if len(argv) > 1 else 3.0
    print(json.dumps(asyncio.run(measure(scenario, seconds))), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIWORK_LOG", "warning")
    raise SystemExit(main(sys.argv[1:]))
