"""`piwork` itself killed (SIGKILL) at random points of real VM runs (issue 11).

The real CLI runs as a subprocess with its own ``PIWORK_HOME``; the scripted
model server in this process is the remote LLM. One task goes through it all:

0. ``piwork run``: QEMU is killed while the VM starts (the warm restore, then
   the cold-boot fallback): the run fails saying what happened and what to do;
1. ``piwork resume``, piwork killed at three points, in a seeded random order,
   each at a seeded random moment: while the VM starts, mid-stream (the model's
   answer streaming through pi), and while a permission question is open at a
   terminal (a pty);
2. ``piwork resume --yes``: the task completes.

After every kill: QEMU dies with piwork (the parent-death signal), no child of
piwork is left, the task shows as interrupted, task.json and the policy parse,
and no transcript line written before the kill is lost. The seed is printed;
``PIWORK_FAULT_SEED=<seed>`` replays a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piwork.config import Paths, get_paths
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash, split_text
from piwork.tasks import TaskStatus
from piwork.tasks.transcript import read_records
from tests.helpers.cli import PIWORK, Cli, make_home, run_cli, task_dir
from tests.helpers.faults import Story, assert_no_orphans, check_after_fault, counting
from tests.helpers.procs import alive, qemu_children

pytestmark = pytest.mark.vm

ANSWER = " ".join(f"s{i:03d}" for i in range(80))


def vm_children(pid: int) -> list[int]:
    """piwork's QEMU children that are VMs (not its `qemu --version` probe)."""
    found = []
    for child in qemu_children(pid):
        with contextlib.suppress(OSError):
            if b"-name\0piwork-" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from the process table)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


class Terminal:
    """A pty for a CLI run's stdin and stderr (a person at a terminal), drained."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.output = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return  # EIO: every holder of the slave end is gone
            if not data:
                return
            self.output += data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.slave)
        self._reader.join(5)
        with contextlib.suppress(OSError):
            os.close(self.master)


class Home:
    def __init__(self, tmp: Path, server: ScriptedModelServer) -> None:
        self.tmp = tmp
        self.env = make_home(tmp, server)
        root = Path(self.env["PIWORK_HOME"])
        paths = Paths(root / "data", get_paths().cache, root / "state", root / "config")
        self.folder = tmp / "project"
        self.folder.mkdir()
        self.story = Story(paths, self.folder, server)
        self.logs = 0

    def log(self, name: str) -> Path:
        self.logs += 1
        return self.tmp / f"{self.logs:02d}-{name}.log"

    @property
    def task_id(self) -> str:
        assert self.story.task_id is not None
        return self.story.task_id

    def transcript_now(self) -> None:
        """What the transcript holds now: all of it must survive what comes next."""
        self.story.records, problems = read_records(
            task_dir(self.env, self.task_id) / "transcript.jsonl"
        )
        assert problems == [], problems

    def status(self) -> str:
        try:
            raw = json.loads((task_dir(self.env, self.task_id) / "task.json").read_text())
        except (OSError, ValueError):
            return ""
        return str(raw.get("status"))


async def wait_for(what: str, pred: Callable[[], bool], cli: Cli, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if cli.proc.returncode is not None:
            raise AssertionError(f"piwork exited before {what}: {cli.stderr}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        await asyncio.sleep(0.02)


async def start_tty(home: Home, *args: str) -> tuple[Cli, Terminal]:
    """The CLI as a person runs it: stdin and stderr a terminal (so it asks), no --json."""
    term = Terminal()
    log = home.log("tty-stdout")
    try:
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *PIWORK, *args, stdin=term.slave, stdout=out, stderr=term.slave,
                env=home.env, start_new_session=True,
            )  # fmt: skip
    finally:
        os.close(term.slave)
    term.slave = -1
    return Cli(proc, log), term


async def kill_piwork(home: Home, cli: Cli, point: str, was: str = "running") -> None:
    """SIGKILL piwork; QEMU and every other child must go with it."""
    qemu = vm_children(cli.proc.pid)
    children = children_of(cli.proc.pid)
    assert len(qemu) == 1, f"{point}: expected one QEMU child, found {qemu}"
    home.transcript_now()
    os.kill(cli.proc.pid, signal.SIGKILL)
    if cli.proc.stdout is not None:
        await cli.finish(10)  # the events it wrote before it died
    await asyncio.wait_for(cli.proc.wait(), 10)
    for _ in range(300):  # 15 s: the kernel delivers the parent-death signal at once
        if not any(alive(p) for p in children):
            break
        await asyncio.sleep(0.05)
    left = [p for p in children if alive(p)]
    assert not left, f"{point}: children of the killed piwork still alive: {left}"
    await assert_no_orphans(home.task_id, ())
    await check_interrupted(home, point, was)


async def check_interrupted(home: Home, point: str, was: str) -> None:
    rc, out, err = await run_cli(home.env, "tasks", "list", "--json")
    assert rc == 0, err
    listed = {t["id"]: t for t in json.loads(out)}
    task = listed[home.task_id]
    assert task["status"] == "interrupted" and task["interruptedFrom"] == was, (point, task)
    check_after_fault(home.story)  # task.json, policy, transcript prefix
    home.story.faults.append(point)


# --------------------------------------------------------------------------- the kill points


async def kill_during_vm_start(home: Home, rng: random.Random) -> str:
    """Killed while the saved VM is restored, or just after, while pi is started."""
    at = rng.choice(["qemu started", "vm restored"])
    # pi is ready soon after the restore on a fast machine: no delay there.
    jitter = rng.uniform(0.0, 0.2) if at == "qemu started" else 0.0
    home.story.server.script = counting(Text("unused: piwork dies before asking"))
    cli = await Cli.start(home.env, home.log("start"), "resume", home.task_id, "--yes", "--json")
    try:
        if at == "qemu started":
            await wait_for("QEMU", lambda: bool(vm_children(cli.proc.pid)), cli, 120)
        else:
            await cli.wait_event(lambda e: e["event"] == "boot" and e["stage"] == "restored", 120)
        await asyncio.sleep(jitter)
        await kill_piwork(home, cli, f"piwork SIGKILL during VM start ({at} +{jitter:.2f}s)")
    finally:
        cli.kill()
    seen = [e["event"] for e in cli.events]
    assert "ready" not in seen and "prompt" not in seen, seen
    return f"VM start ({at} +{jitter:.2f}s)"


async def kill_mid_stream(home: Home, rng: random.Random) -> str:
    """Killed while the model's answer streams through pi, after a random number of pieces."""
    pieces = len(split_text(ANSWER))
    after = rng.randint(3, pieces // 2)
    server = home.story.server
    server.script = counting(Text(ANSWER))
    server.chunk_delay = 0.05
    cli = await Cli.start(home.env, home.log("stream"), "resume", home.task_id, "--yes", "--json")
    try:
        for _ in range(after):
            await cli.wait_event(lambda e: e["event"] == "text", 180)
        await kill_piwork(home, cli, f"piwork SIGKILL mid-stream (after {after} text deltas)")
    finally:
        server.chunk_delay = 0.0
        cli.kill()
    return f"mid-stream ({after}/{pieces} deltas)"


async def kill_during_question(home: Home, rng: random.Random) -> str:
    """Killed while a permission question waits for the person at the terminal."""
    delay = rng.uniform(0.0, 1.0)
    victim = home.folder / "victim.txt"
    victim.write_text("keep me\n")
    home.story.server.script = counting(ToolCalls([bash("rm victim.txt")]), Text("removed"))
    cli, term = await start_tty(home, "resume", home.task_id)
    try:
        await wait_for("the question", lambda: home.status() == "waiting_permission", cli, 180)
        await asyncio.sleep(delay)
        point = f"piwork SIGKILL during a permission question (+{delay:.2f}s)"
        await kill_piwork(home, cli, point, was="waiting_permission")
    finally:
        cli.kill()
        term.close()
    assert b"victim.txt" in term.output, term.output[-2000:]
    assert victim.read_text() == "keep me\n"
    return f"permission question (+{delay:.2f}s)"


# --------------------------------------------------------------------------- the story


async def test_piwork_killed_at_random_points_then_the_task_resumes_to_completion(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    seed = int(os.environ.get("PIWORK_FAULT_SEED") or time.time_ns() % 1_000_000)
    print(f"\n[fault seed] PIWORK_FAULT_SEED={seed}")
    rng = random.Random(seed)
    home = Home(tmp_path, model_server)
    t0 = time.monotonic()

    # 0. QEMU killed while the VM starts: the run fails and says what to do.
    model_server.script = counting(Text("unused: the VM never starts"))
    cli = await Cli.start(
        home.env, home.log("run"), "run", "count, then wait", "--folder", str(home.folder),
        "--model", "scripted/scripted", "--yes", "--json",
    )  # fmt: skip
    killed: list[int] = []
    try:
        home.story.task_id = (await cli.wait_event(lambda e: e["event"] == "task", 60))["id"]
        while cli.proc.returncode is None and len(killed) < 3:
            for pid in vm_children(cli.proc.pid):
                if pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            await asyncio.sleep(0.01)
        code = await cli.finish(60)
    finally:
        cli.kill()
    err = cli.stderr
    print(f"QEMU killed {len(killed)}x at start; piwork said: {err.strip()[:400]}")
    assert code == 1, err
    notices = [str(e.get("message")) for e in cli.events if e["event"] == "notice"]
    assert len(killed) == 2 and any(n.startswith("cold boot: ") for n in notices), (killed, notices)
    assert "piwork: the VM exited while starting: " in err, err
    assert f"`piwork resume {home.task_id}` tries again" in err and "`piwork doctor`" in err
    assert "Last console output:" in err and "Traceback" not in err and "VmStartFailed" not in err
    check_after_fault(home.story)

    # 1. piwork killed at three points, in a random order.
    legs = [kill_during_vm_start, kill_mid_stream, kill_during_question]
    rng.shuffle(legs)
    points = []
    for leg in legs:
        t = time.monotonic()
        points.append(await leg(home, rng))
        print(f"killed at {points[-1]} after {time.monotonic() - t:.1f}s")

    # 2. Resumed: the task completes, with its whole history.
    model_server.script = counting(Text("all done after three crashes"))
    cli = await Cli.start(home.env, home.log("resume"), "resume", home.task_id, "--yes", "--json")
    try:
        code = await cli.finish(300)
    finally:
        cli.kill()
    done: dict[str, Any] = cli.events[-1]
    assert code == 0 and done["event"] == "done" and done["reason"] == "completed", (
        cli.events[-3:],
        cli.stderr,
    )
    store = check_after_fault(home.story)
    assert store.get(home.task_id).record.status is TaskStatus.STOPPED
    statuses = [r.data for r in home.story.records if r.kind == "status"]
    assert sum(s.get("to") == "interrupted" for s in statuses) == 3, statuses
    await assert_no_orphans(home.task_id, ())
    print(f"survived: {home.story.faults}; {time.monotonic() - t0:.1f}s in all")
