"""Two owners of one task, and several processes acting on one data dir."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson

from piwork.policy.audit import AuditLog
from piwork.policy.store import PolicyStore
from piwork.tasks.store import TaskStore
from piwork.tasks.transcript import read_records

ROOT = Path(__file__).resolve().parents[2]
PIWORK = Path(sys.executable).with_name("piwork")

HOLDER = """
    import sys, time
    from pathlib import Path
    from piwork.tasks.store import TaskStore
    store = TaskStore(Path(sys.argv[1]))
    lease = store.claim(sys.argv[2])
    print("ready", flush=True)
    time.sleep(600)
"""


def _spawn(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready", proc.stderr.read() if proc.stderr else ""
    return proc


def test_a_second_run_of_the_same_task_is_refused_naming_the_holder(tmp_path: Path) -> None:
    env = {**os.environ, "PIWORK_HOME": str(tmp_path / "home")}
    tasks = tmp_path / "home" / "data" / "tasks"
    store = TaskStore(tasks)
    task = store.create("owned elsewhere")
    holder = _spawn(HOLDER, str(tasks), task.id, env=env)
    try:
        started = time.monotonic()
        second = subprocess.run(
            [str(PIWORK), "resume", task.id, "go on", "--yes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode != 0
    assert f"in use by process {holder.pid}" in second.stderr, second.stderr
    assert took < 20, "the refusal must come before any VM is started"
    # The holder's claim did not change the task, and the refused run left no trace.
    assert store.get(task.id).record.status.value == "idle"


WORKER = """
    import random, sys, time
    from pathlib import Path
    from piwork.policy.audit import AuditEntry, AuditLog
    from piwork.policy.rules import Action, Rule, Verdict
    from piwork.policy.store import PolicyStore
    from piwork.tasks.model import Usage
    from piwork.tasks.store import TaskStore, TaskBusy
    home, task_id, role = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    store = TaskStore(home / "tasks")
    policy = PolicyStore(home / "policy.json")
    audit = AuditLog(home / "audit.jsonl")
    rng = random.Random(role)
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        if role == "runner":
            store.add_usage(task_id, Usage(turns=1, input_tokens=1))
            store.append_event(task_id, "pi", {"i": i, "pad": "x" * rng.choice([10, 5000])})
            audit.append(AuditEntry(task_id, "read", f"/r/{i}", "allow", "rule"))
        elif role == "cli":
            store.mark_interrupted()
            store.list()
            store.update(task_id, title=f"renamed {i}")
            policy.add(Rule(Action.READ, Verdict.ALLOW, pattern=f"/p/{i % 7}/**"))
            audit.append(AuditEntry(task_id, "write", f"/c/{i}", "deny", "person"))
        else:
            t = store.create(f"app task {i}")
            store.append_event(t.id, "note", {"i": i})
            policy.remove(policy.load()[0].id) if i % 3 == 0 and policy.load() else None
"""


def test_cli_runner_and_app_on_one_data_dir_never_corrupt_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = TaskStore(home / "tasks")
    task = store.create("shared")
    rng = random.Random(5)
    for _round in range(6):
        procs = [_spawn(WORKER, str(home), task.id, role) for role in ("runner", "cli", "app")]
        time.sleep(rng.uniform(0.3, 1.0))
        for proc in rng.sample(procs, len(procs)):  # kill -9 each, at a random moment
            proc.kill()
            time.sleep(rng.uniform(0, 0.05))
        for proc in procs:
            proc.wait()
        # Everything parses, nothing is left half-written.
        result = store.scan()
        assert result.problems == [], result.problems
        for t in result.tasks:
            _records, problems = read_records(t.transcript_path)
            assert [p for p in problems if p.reason != "incomplete last line"] == []
        PolicyStore(home / "policy.json").load()
        assert PolicyStore(home / "policy.json").check() is None
        lines = (home / "audit.jsonl").read_bytes().splitlines()
        bad = [x for x in lines[:-1] if x and not _parses(x)]
        assert bad == [], bad[:3]
    # A new writer repairs any torn transcript tail left by a kill.
    store.mark_interrupted()
    for t in store.scan().tasks:
        with store.claim(t.id):
            store.append_event(t.id, "check", {})
        _records, problems = read_records(t.transcript_path)
        assert problems == []
    assert list(AuditLog(home / "audit.jsonl").read())


def _parses(raw: bytes) -> bool:
    try:
        return isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return False
