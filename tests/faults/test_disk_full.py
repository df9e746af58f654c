"""Disk full while writing the transcript, task.json, the policy and the audit log.

A real tmpfs of 512 KiB is filled to the last byte. After each fault: every file
still parses, nothing written before the fault is lost, memory stays bounded,
and the error says what to do.
"""

from __future__ import annotations

import orjson
import pytest

from piwork.policy.audit import AuditEntry, AuditLog
from piwork.policy.rules import Action, Rule, Verdict
from piwork.policy.store import PolicyStore
from piwork.tasks.model import StopReason, TaskStatus
from piwork.tasks.store import TaskStore, TaskWriteError
from piwork.tasks.transcript import (
    TranscriptFull,
    TranscriptWriteError,
    TranscriptWriter,
    read_records,
)
from tests.helpers.disk import SmallDisk

PAD = "x" * 900


def test_transcript_on_a_full_disk_holds_a_bounded_queue_and_loses_nothing(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.root / "transcript.jsonl"
    writer = TranscriptWriter(path, max_pending=50)
    written = [writer.append("before", {"i": i})["seq"] for i in range(20)]
    small_disk.fill()
    queued: list[int] = []
    full = 0
    for i in range(5000):  # a flood while the disk is full
        try:
            queued.append(writer.append("during", {"i": i, "pad": PAD})["seq"])
        except TranscriptFull as exc:
            full += 1
            assert "No space left" in str(exc) and "Free some disk space" in str(exc)
        except TranscriptWriteError as exc:
            assert exc.record is not None
            queued.append(exc.record["seq"])
        assert writer.pending <= 50
    assert full > 4000, "the queue must stop growing once it is at its bound"
    small_disk.free()
    writer.retry()
    writer.close()
    records, problems = read_records(path)
    assert problems == []
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert set(written) <= set(seqs), "a record written before the fault was lost"
    assert set(queued) <= set(seqs), "a record accepted into the queue was lost"


def test_task_json_on_a_full_disk_keeps_the_previous_version(small_disk: SmallDisk) -> None:
    store = TaskStore(small_disk.root / "tasks")
    task = store.create("disk full")
    lease = store.claim(task.id)
    store.transition(task.id, TaskStatus.RUNNING)
    before = task.task_json.read_bytes()
    small_disk.fill()
    with pytest.raises(TaskWriteError, match="No space left"):
        store.transition(task.id, TaskStatus.STOPPED, reason=StopReason.COMPLETED)
    assert task.task_json.read_bytes() == before
    assert store.get(task.id).record.status is TaskStatus.RUNNING
    assert not list(task.dir.glob(".task.json.*.tmp")), "a temp file was left behind"
    small_disk.free()
    store.transition(task.id, TaskStatus.STOPPED, reason=StopReason.COMPLETED)
    lease.release()
    store.close()
    assert store.get(task.id).record.status is TaskStatus.STOPPED


def test_policy_on_a_full_disk_keeps_every_rule_it_had(small_disk: SmallDisk) -> None:
    policy = PolicyStore(small_disk.root / "policy.json")
    first = policy.add(Rule(Action.READ, Verdict.ALLOW, pattern="/a/**"))
    small_disk.fill()
    with pytest.raises(OSError, match="No space left"):
        policy.add(Rule(Action.WRITE, Verdict.ALLOW, pattern="/b/" + "p" * 4000))
    small_disk.free()
    assert [r.id for r in policy.load()] == [first.id]
    assert policy.check() is None, "the policy file was damaged"


def test_audit_log_on_a_full_disk_never_merges_a_torn_line_into_the_next(
    small_disk: SmallDisk,
) -> None:
    audit = AuditLog(small_disk.root / "audit.jsonl")

    def entry(i: int, pad: str = "") -> AuditEntry:
        return AuditEntry("t", "read", f"/f{i}{pad}", "allow", "rule")

    audit.append(entry(1))
    small_disk.fill()  # the log's last page still has room: the next line is cut short
    with pytest.raises(OSError, match="No space left"):
        audit.append(entry(2, "x" * 4000))
    small_disk.free()
    audit.append(entry(3))
    targets = [e["target"] for e in audit.read()]
    assert targets[0] == "/f1" and targets[-1] == "/f3", targets
    raw = (small_disk.root / "audit.jsonl").read_bytes()
    assert b'"/f2' in raw, "the test did not produce a torn line"
    assert orjson.loads(raw.splitlines()[-1])["target"] == "/f3"


def test_a_task_whose_transcript_cannot_be_saved_stops_with_a_clear_reason(
    small_disk: SmallDisk,
) -> None:
    from piwork.config import Paths
    from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession

    paths = Paths(
        data=small_disk.root / "d", cache=small_disk.root / "c",
        state=small_disk.root / "s", config=small_disk.root / "cfg",
    )  # fmt: skip
    events: list[RunEvent] = []
    session = TaskSession(RunRequest(prompt="x"), events.append, paths=paths)
    task = session.store.create("fills the disk")
    session.adopt(task)
    session.task = session.store.transition(task.id, TaskStatus.RUNNING)
    small_disk.fill()
    for i in range(3000):  # pi keeps talking
        session.note("pi", {"type": "message_update", "i": i, "pad": PAD})
    assert session.stop_reason is not None
    reason, message, _ = session.stop_reason
    assert reason is StopReason.ERROR
    assert message is not None
    assert "disk is full" in message and "piwork resume" in message
    assert session.stop_requested
    assert session.store.transcript(task.id).pending <= 1000
    assert any(e.kind is EventKind.ERROR for e in events)
    small_disk.free()
    session.store.close()
