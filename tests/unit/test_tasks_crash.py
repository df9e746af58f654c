"""kill -9 at random moments: task.json always parses, the transcript keeps every
line but the one being written, and a dead owner's task shows as interrupted."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piwork.tasks.model import TaskRecord, TaskStatus
from piwork.tasks.store import TaskStore
from piwork.tasks.transcript import (
    DROPPED_KIND,
    DROPPED_SUFFIX,
    REPAIR_KIND,
    ROTATED_KIND,
    TranscriptWriter,
    read_records,
)

ROUNDS = 12


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskStore]:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    with TaskStore() as s:
        yield s


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    """Run ``code`` in a fresh interpreter; it prints ``ready`` once it is busy."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"child did not start: {line!r} {err.decode()}")
    return proc


def kill9(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()
    if proc.stderr:
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


REWRITER = """
    import sys
    from pathlib import Path
    from piwork.tasks.model import Usage
    from piwork.tasks.store import TaskStore
    store = TaskStore(Path(sys.argv[1]))
    store.add_usage(sys.argv[2], Usage(turns=1))
    print("ready", flush=True)
    while True:
        store.add_usage(sys.argv[2], Usage(turns=1, input_tokens=3))
"""


def test_task_json_always_parses_after_kill_9(store: TaskStore) -> None:
    task = store.create("rewritten to death")
    rng = random.Random(1234)
    turns = 0
    for _ in range(ROUNDS):
        proc = spawn(REWRITER, str(store.root), task.id)
        time.sleep(rng.uniform(0.0, 0.15))
        kill9(proc)
        raw = task.task_json.read_bytes()
        record = TaskRecord.model_validate(orjson.loads(raw))  # never half-written
        assert record.usage.turns > turns  # and never an older version
        turns = record.usage.turns
    assert store.get(task.id).record.usage.turns == turns
    # Temp files of the dead writers are swept at start-up.
    store.mark_interrupted()
    assert not list(task.dir.glob(".task.json.*.tmp"))


APPENDER = """
    import random, sys
    from pathlib import Path
    from piwork.tasks.transcript import TranscriptWriter
    w = TranscriptWriter(Path(sys.argv[1]))
    rng = random.Random(int(sys.argv[2]))
    print("ready", flush=True)
    while True:
        seq = w.next_seq
        # Mostly small lines, now and then a big one a kill can cut in half.
        pad = "x" * (rng.choice([10, 100, 4000]) if rng.random() < 0.97 else 2_000_000)
        w.append("n", {"i": seq, "pad": pad})
"""


def test_transcript_survives_kill_9_with_no_loss_and_no_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "transcript.jsonl"
    rng = random.Random(99)
    repairs = 0
    for round_no in range(ROUNDS):
        proc = spawn(APPENDER, str(path), str(round_no))
        time.sleep(rng.uniform(0.01, 0.2))
        kill9(proc)
        with TranscriptWriter(path) as w:  # reopen: repairs a torn tail if there is one
            repairs += w.repaired is not None
            expected_next = w.next_seq
        records, problems = read_records(path)
        assert problems == [], problems
        seqs = [r.seq for r in records]
        # Rotation may delete the oldest segments, and says so in transcript.dropped.
        dropped = path.with_suffix(DROPPED_SUFFIX)
        first = seqs[0] if dropped.exists() else 1
        assert seqs == list(range(first, first + len(seqs))), "a gap or a duplicate"
        assert expected_next == seqs[-1] + 1
        for r in records:  # every record is intact, and its payload says which seq it got
            if r.kind == "n":
                assert r.data["i"] == r.seq
            else:
                assert r.kind in (REPAIR_KIND, ROTATED_KIND, DROPPED_KIND)
    assert sum(r.kind == "n" for r in records) > ROUNDS
    torn = path.with_suffix(".torn")
    assert (repairs == 0) == (not torn.exists())
    print(f"{repairs} torn tail(s) repaired in {ROUNDS} kills")


OWNER = """
    import sys, time
    from pathlib import Path
    from piwork.tasks.store import TaskStore
    store = TaskStore(Path(sys.argv[1]))
    store.claim(sys.argv[2])
    store.transition(sys.argv[2], "running")
    if sys.argv[3] != "running":
        store.transition(sys.argv[2], sys.argv[3])
    store.append_event(sys.argv[2], "pi", {"type": "agent_start"})
    print("ready", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize(
    "status",
    [
        TaskStatus.RUNNING,
        TaskStatus.WAITING_PERMISSION,
        TaskStatus.WAITING_INPUT,
        TaskStatus.PAUSED,
    ],
)
def test_a_task_whose_owner_died_is_interrupted_not_running(
    store: TaskStore, status: TaskStatus
) -> None:
    task = store.create("owned elsewhere")
    proc = spawn(OWNER, str(store.root), task.id, status.value)
    try:
        # While the owner lives, start-up recovery leaves the task alone.
        assert store.mark_interrupted() == []
        assert store.get(task.id).record.status is status
        owner = store.owner(task.id)
        assert owner is not None and owner.pid == proc.pid
    finally:
        kill9(proc)
    assert store.owner(task.id) is None
    assert store.mark_interrupted() == [task.id]
    rec = store.get(task.id).record
    assert rec.status is TaskStatus.INTERRUPTED
    assert rec.interrupted_from is status
    assert rec.running_since is None
    records, problems = read_records(task.transcript_path)
    assert problems == []
    last = records[-1]
    assert last.kind == "status"
    assert last.data["from"] == status.value and last.data["to"] == "interrupted"
    assert last.data["owner"]["pid"] == proc.pid
    assert store.mark_interrupted() == []  # once only
    # The task can be taken over and resumed.
    with store.claim(task.id):
        assert store.transition(task.id, TaskStatus.RUNNING).record.status is TaskStatus.RUNNING


def test_owner_info_detects_a_dead_pid_and_another_boot() -> None:
    from dataclasses import replace

    from piwork.tasks.store import OwnerInfo

    me = OwnerInfo.current()
    assert me.alive()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not replace(me, pid=proc.pid, start_time=None).alive()
    if me.boot_id:
        assert not replace(me, boot_id="another-boot").alive()
    if me.start_time is not None:
        assert not replace(me, start_time=me.start_time + 1).alive()  # pid reused
    assert OwnerInfo.parse(me.to_json()) == me
    assert OwnerInfo.parse(b"garbage") is None


def test_a_half_created_task_is_never_listed_and_is_swept(store: TaskStore) -> None:
    store.root.mkdir(parents=True, exist_ok=True)
    staging = store.root / ".new-abcdef123456"
    staging.mkdir()
    (staging / "task.json").write_text("{")
    old = time.time() - 3600
    os.utime(staging, (old, old))
    assert store.scan().problems == [] and store.list() == []
    store.mark_interrupted()
    assert not staging.exists()
