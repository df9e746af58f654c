"""Start-up and task timings, measured with the real VM and the demo model.

Figures, not assertions: tests check behaviour, this prints how fast it is.
One round runs every measurement in :data:`MEASUREMENTS` in order; each
returns ``{figure name: value}``. Tasks go to a private data dir so your task
list stays clean.

Adding a figure: write ``def measure_x(ctx: BenchContext) -> dict[str, float]``
and append it to :data:`MEASUREMENTS`, or put a ``measure(ctx)`` function in a
module named in :data:`EXTRA_MEASUREMENT_MODULES` (loaded if importable, so a
branch that adds the module needs no edit here).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from piwork.config import Paths, get_paths
from piwork.pack.node import pi_cli, pi_node
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from piwork.vm.command import Transport

REPO = Path(__file__).resolve().parents[1]
RECORDED_EVENTS = REPO / "benchmarks" / "pi-demo-events.jsonl"
THROUGHPUT_EVENTS = 100_000

# Key names are part of the interface (issue 8): do not rename.
NATIVE = "native pi start"
COLD = "cold start to first RPC reply"
WARM = "warm start to first RPC reply"
PROMPT = "prompt to task end"
PSS = "QEMU PSS after start (MiB)"
THROUGHPUT = "host event throughput (events/s)"


@dataclass
class BenchContext:
    transport: Transport
    accel: str | None
    memory_mb: int
    notes: list[str] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)  # shared between rounds


@dataclass
class Round:
    figures: dict[str, float] = field(default_factory=dict)


Measurement = Callable[[BenchContext], dict[str, float]]


def pss_mib(pid: int | None) -> float:
    """Proportional set size: shared pages (RAM template, page cache) count by share."""
    if pid is None:
        return float("nan")
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


@contextlib.contextmanager
def _scratch() -> Iterator[tuple[Paths, Path]]:
    base = get_paths()
    with tempfile.TemporaryDirectory(prefix="piwork-bench-") as tmp:
        root = Path(tmp)
        paths = Paths(data=root / "data", cache=base.cache, state=root / "state", config=root / "c")
        folder = root / "folder"
        folder.mkdir()
        (folder / "README.md").write_text("# bench\n")
        yield paths, folder


# ---------------------------------------------------------------- native pi


async def _native_pi_start(source: Path = REPO) -> float:
    """pi as ``source`` pins it, started natively with the node it needs (the pinned one)."""
    node = pi_node(source)
    cli = pi_cli(source)
    with tempfile.TemporaryDirectory(prefix="piwork-bench-native-") as tmp:
        root = Path(tmp)
        (root / "agent").mkdir()
        (root / "home").mkdir()
        env = {**os.environ, "PI_CODING_AGENT_DIR": str(root / "agent"), "HOME": str(root / "home")}
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            node,
            str(cli),
            "--mode", "rpc", "--offline", "--no-session",
            "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes",
            cwd=root,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=64 * 1024 * 1024,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b'{"id":"b1","type":"get_state"}\n')
            await proc.stdin.drain()
            async with asyncio.timeout(60):
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        raise RuntimeError("native pi exited before answering get_state")
                    msg = orjson.loads(line)
                    if msg.get("type") == "response" and msg.get("id") == "b1":
                        return time.monotonic() - t0
        finally:
            proc.kill()
            await proc.wait()


def measure_native(ctx: BenchContext) -> dict[str, float]:
    return {NATIVE: asyncio.run(_native_pi_start())}


# ---------------------------------------------------------------- the VM


async def _vm_round(ctx: BenchContext, *, warm: bool, prompt: bool) -> dict[str, float]:
    figures: dict[str, float] = {}
    label = "warm" if warm else "cold"
    with _scratch() as (paths, folder):
        t0 = time.monotonic()
        how: list[str] = []

        def sink(ev: RunEvent) -> None:
            if ev.kind is EventKind.NOTICE and ev.data.get("warm") is not None:
                how.append(str(ev.data["message"]))
                if "template_built" in ev.data:  # the first restore made the template
                    how.append("template built")
                    figures["template build (s)"] = float(ev.data["template_built"])

        req = RunRequest(
            prompt=None,
            folder=folder,
            model="demo",
            accel=ctx.accel,
            transport=ctx.transport,
            memory_mb=ctx.memory_mb,
            warm_start=warm,
        )
        async with TaskSession(req, sink, paths=paths) as session:
            figures[WARM if warm else COLD] = time.monotonic() - t0
            assert session.agent is not None
            figures.update(_stages(label, session))
            figures[f"QEMU PSS after {label} start (MiB)"] = pss_mib(session.agent.qemu_pid)
            if warm and not (how and how[0].startswith("restored") and len(how) == 1):
                # The warm figure is only a warm figure if the VM was restored.
                if "template built" not in how:  # (a round that made it is measured again)
                    ctx.notes.append(f"warm round not restored: {how[0] if how else 'no template'}")
                figures.pop(WARM)
            if prompt:
                t = time.monotonic()
                outcome = await session.run_prompt("Summarise this folder")
                figures[PROMPT] = time.monotonic() - t
                if not outcome.ok:
                    raise RuntimeError(f"benchmark task did not complete: {outcome}")
            t = time.monotonic()
        figures[f"power off ({label})"] = time.monotonic() - t
    return figures


def _stages(label: str, session: TaskSession) -> dict[str, float]:
    """Where the start went, stage by stage (seconds each, not cumulative).

    The runner's part (task record, gateway, egress proxy, pack check, the
    environment disk) comes before the VM; then QEMU's launch, the restore (or
    the boot), the hot-plug of the task's disk, pi's start in the guest, and
    pi's first reply, with the guest's own figures for its part of the last two.
    The guest builds the workbench root meanwhile.
    """
    assert session.agent is not None
    t = session.agent.timings
    r = session.timings
    before_vm = r.get("start_to_pi_ready", 0.0) - r.get("boot_to_pi_ready", 0.0)
    marks = [
        ("host before the VM (task, gateway, proxy, pack, env disk)", before_vm),
        ("  of which the env disk (qemu-img)", r.get("env_disk", 0.0)),
        ("QEMU launched", t.get("qemu_started", 0.0)),
        (
            # From QEMU's launch to the supervisor's hello, either way (so the
            # stages add up to the whole start).
            "restored (device state)" if "restored" in t else "booted to the supervisor",
            t.get("supervisor_ready", 0.0) - t.get("qemu_started", 0.0),
        ),
        ("env disk hot-plugged (QMP)", t.get("env_attached", 0.0) - t.get("supervisor_ready", 0.0)),
        (
            "pi started in the guest",
            t.get("pi_started", 0.0)
            - t.get("env_attached", 0.0)
            - t.get("pi_switch", 0.0)
            - t.get("pi_model", 0.0),
        ),
    ]
    # The guest's own clock (supervisor.js: "started" and "first-output"); the rest
    # of those stages is the host's channel and its replies crossing it.
    if "guest_prepare" in t:
        prepare, go = t["guest_prepare"], t.get("guest_go", 0.0)
        marks += [
            ("  guest: clock and 9p mounts", prepare),
            ("  guest: pi handed the task (go)", go),
        ]
        if "guest_bind" in t:
            marks.append(("  guest: the saved pi bound to the task (env, cwd)", t["guest_bind"]))
    primed = "pi_switch" in t
    if primed:
        # A primed pi (piwork.vm.template): its main() ran in the saved VM; it takes
        # the task's session (the first line it writes is that reply) and model.
        marks += [
            ("pi took the task's session (switch_session)", t["pi_switch"]),
            ("pi's model checked (get_state; set_model if not the task's)", t.get("pi_model", 0.0)),
        ]
    first_reply = r.get("boot_to_pi_ready", 0.0) - t.get("pi_started", 0.0)
    marks.append(("pi's first RPC reply", first_reply))
    if "guest_first_output" in t and "guest_prepare" in t:
        before = t["guest_prepare"] + t.get("guest_go", 0.0) + t.get("guest_bind", 0.0)
        # Cold, the launcher may still be loading pi when it is handed the task.
        what = (
            "switch_session"
            if primed
            else "pi's main()"
            if label == "warm"
            else "pi's load (if unfinished) and main()"
        )
        marks.append((f"  guest: {what} to its first output", t["guest_first_output"] - before))
    if label == "cold":
        # Where the boot went, from the guest's stage marks on the console (host
        # clock, since QEMU's process started; cumulative, unlike the rows above).
        boot = getattr(getattr(session.agent, "vm", None), "stages", None) or {}
        for stage, what in (
            ("init", "/init began (firmware, kernel)"),
            ("rootfs", "pack disk mounted"),
            ("supervisor", "supervisor launched"),
        ):
            if isinstance(boot.get(stage), float):
                marks.append((f"  boot: {what}, since QEMU's launch", boot[stage]))
        # The guest's own clocks (each from its process's start). Under TCG the
        # boot's first node processes (the supervisor and the launcher /init
        # starts beside it) also pay for translating node itself.
        for key, what in (
            ("guest_supervisor_node", "supervisor: node's own start (beside the launcher's)"),
            ("guest_supervisor_main", "supervisor: its modules and main() to its hello"),
            ("guest_launcher_node", "launcher: node's own start (+ restoring pi's snapshot)"),
            ("guest_preloaded", "launcher: the rest of loading pi and the extensions"),
        ):
            if key in t:
                marks.append((f"  guest: {what}", t[key]))
    return {f"{label} stage: {name} (s)": max(0.0, v) for name, v in marks}


def measure_cold(ctx: BenchContext) -> dict[str, float]:
    figures = asyncio.run(_vm_round(ctx, warm=False, prompt=False))
    ctx.cache["cold pss"] = figures["QEMU PSS after cold start (MiB)"]
    return figures


def measure_warm(ctx: BenchContext) -> dict[str, float]:
    """The default path (warm start if it can), then the demo task in it."""
    figures = asyncio.run(_vm_round(ctx, warm=True, prompt=True))
    if "template build (s)" in figures:  # that round made the template: measure a restore
        built = figures["template build (s)"]
        figures = asyncio.run(_vm_round(ctx, warm=True, prompt=True))
        figures["template build (s)"] = built
    restored = WARM in figures
    figures[PSS] = figures["QEMU PSS after warm start (MiB)"] if restored else ctx.cache["cold pss"]
    return figures


# ---------------------------------------------------------------- host event path


def _recorded_stream() -> list[bytes]:
    lines = [ln for ln in RECORDED_EVENTS.read_bytes().splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"{RECORDED_EVENTS} is empty")
    return lines


async def _throughput(lines: list[bytes], n: int, fsync_delay: float = 0.0) -> float:
    """Frame, parse, dispatch and append ``n`` recorded pi lines, as a run does.

    The same objects and hooks as a run: the guest channel's reader, the RPC
    client (which parses each line once and hands it to the line tap), the
    runner's tap (:func:`compact_pi_line` into ``TaskStore.append_event``), and
    the runner's listener on the parsed items.
    """
    from piwork.rpc.client import RpcClient
    from piwork.rpc.framing import MalformedLine
    from piwork.tasks.model import Limits
    from piwork.tasks.store import TaskStore
    from piwork.tasks.transcript import compact_pi_line
    from piwork.vm.channel import Endpoint, GuestChannel

    events = [lines[i % len(lines)] for i in range(n)]
    framed = bytearray(b'0 !{"ev":"hello","bootId":"bench","lastSeq":0}\n')
    for seq, line in enumerate(events, 1):
        framed += b"%d " % seq + line + b"\n"
    with tempfile.TemporaryDirectory(prefix="piwork-bench-tp-") as tmp:
        store = TaskStore(Path(tmp) / "tasks", fsync_delay=fsync_delay)
        task = store.create("throughput", limits=Limits())
        lease = store.claim(task.id)
        store.transcript(task.id)

        async def no_send(_line: bytes) -> None:
            return None

        rpc = RpcClient(send_line=no_send)
        seen = [0]
        rpc.add_listener(lambda _item: seen.__setitem__(0, seen[0] + 1))

        def tap(raw: bytes, parsed: Any) -> None:  # TaskSession._on_pi_line
            if isinstance(parsed, MalformedLine):
                data: Any = {"malformed": raw[:2000].decode("utf-8", "replace")}
            else:
                data = compact_pi_line(parsed)
            store.append_event(task.id, "pi", data)

        rpc.set_line_tap(tap)
        chan = GuestChannel(Endpoint(tcp_port=1), rpc.feed_line, lambda _m: None)
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        reader.feed_data(bytes(framed))
        reader.feed_eof()
        t = time.process_time()
        await chan._read_loop(reader)
        store.transcript(task.id).flush()
        elapsed = time.process_time() - t
        lease.release()
        store.close()
        if chan.last_seq != n:
            raise RuntimeError(f"throughput: {chan.last_seq} of {n} lines went through")
    return n / elapsed


def measure_throughput(ctx: BenchContext) -> dict[str, float]:
    lines = ctx.cache.get("recorded") or _recorded_stream()
    ctx.cache["recorded"] = lines
    return {
        # As the runner does it: each line handed to the kernel at once (a kill -9
        # loses nothing), fsyncs batched every 50 ms (runner.py: TaskStore(fsync_delay=0.05)).
        THROUGHPUT: asyncio.run(_throughput(lines, THROUGHPUT_EVENTS, fsync_delay=0.05)),
        # For comparison: one fsync per event.
        "host event throughput, fsync per event (events/s)": asyncio.run(
            _throughput(lines, THROUGHPUT_EVENTS)
        ),
    }


MEASUREMENTS: list[Measurement] = [
    measure_throughput,
    measure_native,
    measure_cold,
    measure_warm,
]

# Modules with a ``measure(ctx) -> dict[str, float]`` function, run after the above.
EXTRA_MEASUREMENT_MODULES = ["piwork.checkpoints.bench"]


def all_measurements() -> list[Measurement]:
    out = list(MEASUREMENTS)
    for name in EXTRA_MEASUREMENT_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        fn = getattr(mod, "measure", None)
        if callable(fn):
            out.append(fn)
    return out


def one_round(ctx: BenchContext, measurements: list[Measurement] | None = None) -> Round:
    rnd = Round()
    for fn in measurements if measurements is not None else all_measurements():
        rnd.figures.update(fn(ctx))
    return rnd


def summarise(rounds: list[Round]) -> list[tuple[str, float, float, float]]:
    keys = list(dict.fromkeys(k for r in rounds for k in r.figures))
    rows = []
    for k in keys:
        vals = [r.figures[k] for r in rounds if k in r.figures]
        rows.append((k, statistics.median(vals), min(vals), max(vals)))
    return rows
