"""TaskStore: creation, lookup, the state machine on disk, bind-once, corruption, rm."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piwork import fsutil
from piwork.tasks.folders import FolderError
from piwork.tasks.model import (
    TRANSITIONS,
    InvalidTransition,
    LimitKind,
    Limits,
    StopReason,
    TaskStatus,
    Usage,
)
from piwork.tasks.settings import DEFAULT_LIMITS
from piwork.tasks.store import (
    AmbiguousTaskId,
    CorruptTask,
    FolderAlreadyBound,
    NotOwner,
    Task,
    TaskBusy,
    TaskNotFound,
    TaskStore,
    TaskStoreError,
    TaskWriteError,
)
from piwork.tasks.transcript import TranscriptBusy, read_records

S = TaskStatus


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskStore]:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    with TaskStore() as s:
        yield s


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    p = tmp_path / "proj"
    p.mkdir()
    return p


def kinds(task: Task) -> list[str]:
    records, problems = read_records(task.transcript_path)
    assert problems == []
    return [r.kind for r in records]


def status_records(task: Task) -> list[tuple[str, str]]:
    records, _ = read_records(task.transcript_path)
    return [(r.data["from"], r.data["to"]) for r in records if r.kind == "status"]


# ---------------------------------------------------------------- create / get / list


def test_create_makes_the_task_directory(store: TaskStore, proj: Path) -> None:
    task = store.create("Fix the build", proj, model="openai/gpt-x")
    assert task.dir.parent == store.root
    for sub in ("state", "outputs", "uploads"):
        assert (task.dir / sub).is_dir()
    doc = orjson.loads(task.task_json.read_bytes())
    assert doc["id"] == task.id
    assert doc["status"] == "idle"
    assert doc["workingFolder"] == str(proj.resolve())
    assert doc["model"] == "openai/gpt-x"
    assert doc["limits"] == DEFAULT_LIMITS.model_dump(mode="json", by_alias=True)
    assert kinds(task) == ["task_created"]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


def test_create_uses_settings_defaults_unless_limits_given(store: TaskStore) -> None:
    from piwork.config import get_paths

    settings = get_paths().settings_file
    settings.parent.mkdir(parents=True)
    settings.write_bytes(orjson.dumps({"tasks": {"defaultLimits": {"maxTurns": 7}}}))
    assert store.create("a").record.limits.max_turns == 7
    assert store.create("b", limits=Limits(max_turns=2)).record.limits.max_turns == 2


def test_create_refuses_a_bad_folder_and_leaves_nothing(store: TaskStore, tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="does not exist"):
        store.create("x", tmp_path / "missing")
    assert store.list() == []


def test_get_accepts_a_unique_prefix(store: TaskStore) -> None:
    task = store.create("t")
    assert store.get(task.id[:4]).id == task.id
    assert store.get(task.id.upper()).id == task.id
    with pytest.raises(TaskNotFound):
        store.get("zzzz")
    with pytest.raises(TaskNotFound):
        store.get("../etc")


def test_an_ambiguous_prefix_names_the_candidates(store: TaskStore) -> None:
    for name in ("abc111", "abc222"):
        (store.root / name).mkdir(parents=True)
    with pytest.raises(AmbiguousTaskId, match="abc111, abc222"):
        store.resolve_id("abc")
    assert store.resolve_id("abc1") == "abc111"


def test_list_is_oldest_first(store: TaskStore) -> None:
    ids = [store.create(f"t{i}").id for i in range(3)]
    assert [t.id for t in store.list()] == ids


# ---------------------------------------------------------------- the state machine


def _reach(store: TaskStore, status: TaskStatus) -> Task:
    """A fresh task, driven to ``status`` along a legal path."""
    task = store.create(f"to {status.value}")
    if status is S.IDLE:
        return task
    if status is S.STOPPED:
        return store.transition(task.id, S.STOPPED, reason=StopReason.CANCELLED)
    lease = store.claim(task.id)
    store.transition(task.id, S.RUNNING)
    if status is S.INTERRUPTED:
        lease.release()
        assert store.mark_interrupted() == [task.id]
        return store.get(task.id)
    if status is not S.RUNNING:
        store.transition(task.id, status)
    return store.get(task.id)


@pytest.mark.parametrize(
    ("src", "dst"),
    # Sorted: a set's order changes with each process's hash seed, and every pytest-xdist
    # worker must collect the same tests in the same order.
    [
        (a, b)
        for a, targets in TRANSITIONS.items()
        for b in sorted(targets, key=lambda s: s.value)
        if b is not S.INTERRUPTED
    ],
)
def test_every_allowed_transition_is_recorded(
    store: TaskStore, src: TaskStatus, dst: TaskStatus
) -> None:
    task = _reach(store, src)
    if task.id not in store._leases:
        store.claim(task.id)
    if dst is S.STOPPED:
        moved = store.transition(task.id, dst, reason=StopReason.ERROR, message="boom")
    else:
        moved = store.transition(task.id, dst)
    on_disk = store.get(task.id).record
    assert moved.record.status is dst and on_disk.status is dst
    assert status_records(task)[-1] == (src.value, dst.value)
    if dst is S.STOPPED:
        assert on_disk.stop is not None and on_disk.stop.message == "boom"
    else:
        assert on_disk.stop is None and on_disk.interrupted_from is None


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.IDLE, S.WAITING_PERMISSION),
        (S.IDLE, S.PAUSED),
        (S.IDLE, S.IDLE),
        (S.RUNNING, S.RUNNING),
        (S.RUNNING, S.IDLE),
        (S.PAUSED, S.WAITING_INPUT),
        (S.STOPPED, S.PAUSED),
        (S.STOPPED, S.STOPPED),
        (S.INTERRUPTED, S.PAUSED),
        (S.INTERRUPTED, S.WAITING_PERMISSION),
        (S.RUNNING, S.INTERRUPTED),
    ],
)
def test_forbidden_transitions_change_nothing(
    store: TaskStore, src: TaskStatus, dst: TaskStatus
) -> None:
    task = _reach(store, src)
    if task.id not in store._leases:
        store.claim(task.id)
    before = task.task_json.read_bytes()
    before_records = status_records(task)
    reason = StopReason.CANCELLED if dst is S.STOPPED else None
    with pytest.raises(InvalidTransition):
        store.transition(task.id, dst, reason=reason)
    assert store.get(task.id).record.status is src
    assert task.task_json.read_bytes() == before
    assert status_records(task) == before_records


def test_stop_needs_a_reason_error_a_message_limit_a_kind(store: TaskStore) -> None:
    task = _reach(store, S.RUNNING)
    with pytest.raises(InvalidTransition, match="needs a reason"):
        store.transition(task.id, S.STOPPED)
    with pytest.raises(InvalidTransition, match="needs a message"):
        store.transition(task.id, S.STOPPED, reason=StopReason.ERROR)
    with pytest.raises(InvalidTransition, match="which limit"):
        store.transition(task.id, S.STOPPED, reason=StopReason.LIMIT)
    with pytest.raises(InvalidTransition, match="only goes with"):
        store.transition(task.id, S.PAUSED, reason=StopReason.COMPLETED)
    stopped = store.transition(task.id, S.STOPPED, reason=StopReason.LIMIT, limit=LimitKind.TOKENS)
    assert stopped.record.stop is not None and stopped.record.stop.limit is LimitKind.TOKENS
    records, _ = read_records(task.transcript_path)
    assert records[-1].data["stop"]["limit"] == "tokens"


def test_active_statuses_need_the_lease(store: TaskStore) -> None:
    task = store.create("t")
    with pytest.raises(NotOwner, match="claim"):
        store.transition(task.id, S.RUNNING)
    with store.claim(task.id):
        store.transition(task.id, S.RUNNING)
    # Stopping needs no lease: the CLI or a recovering app may cancel.
    store.transition(task.id, S.STOPPED, reason=StopReason.CANCELLED)


def test_running_again_after_stop_clears_the_stop(store: TaskStore) -> None:
    task = _reach(store, S.RUNNING)
    store.transition(task.id, S.STOPPED, reason=StopReason.COMPLETED)
    again = store.transition(task.id, S.RUNNING)
    assert again.record.stop is None and again.record.running_since is not None


def test_wall_time_accumulates_only_while_running(store: TaskStore) -> None:
    task = _reach(store, S.RUNNING)
    paused = store.transition(task.id, S.PAUSED)
    assert paused.record.running_since is None
    first = paused.record.usage.wall_seconds
    assert first >= 0
    resumed = store.transition(task.id, S.RUNNING)
    assert resumed.record.usage.wall_seconds == first


def test_usage_adds_up_and_totals_replace(store: TaskStore) -> None:
    task = store.create("t")
    store.add_usage(task.id, Usage(turns=1, input_tokens=10, output_tokens=5, cost_usd=0.5))
    rec = store.add_usage(task.id, Usage(turns=1, cache_read_tokens=100, cost_usd=0.25)).record
    assert (rec.usage.turns, rec.usage.total_tokens, rec.usage.cost_usd) == (2, 115, 0.75)
    rec = store.set_usage(task.id, Usage(turns=9, input_tokens=1, wall_seconds=999)).record
    assert rec.usage.turns == 9 and rec.usage.wall_seconds == 0
    assert store.get(task.id).record.usage == rec.usage


def test_updated_at_moves_forward(store: TaskStore) -> None:
    task = store.create("t")
    later = store.update(task.id, title="renamed")
    assert later.record.updated_at >= task.record.updated_at
    assert later.record.title == "renamed"
    assert kinds(task)[-1] == "task_updated"


# ---------------------------------------------------------------- folder binding


def test_folder_binds_once(store: TaskStore, proj: Path, tmp_path: Path) -> None:
    task = store.create("no folder yet")
    assert task.record.working_folder is None
    bound = store.bind_folder(task.id, proj)
    assert bound.record.working_folder == proj.resolve()
    assert store.bind_folder(task.id, proj).record.working_folder == proj.resolve()  # idempotent
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FolderAlreadyBound, match="cannot change"):
        store.bind_folder(task.id, other)
    assert store.get(task.id).record.working_folder == proj.resolve()
    assert kinds(task).count("folder_bound") == 1


def test_a_task_created_with_a_folder_cannot_rebind(
    store: TaskStore, proj: Path, tmp_path: Path
) -> None:
    task = store.create("t", proj)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FolderAlreadyBound):
        store.bind_folder(task.id, other)


def test_binding_validates_the_folder(store: TaskStore) -> None:
    task = store.create("t")
    with pytest.raises(FolderError, match="system folder"):
        store.bind_folder(task.id, "/etc")
    assert store.get(task.id).record.working_folder is None


# ---------------------------------------------------------------- corruption and write errors


def test_a_corrupt_task_json_is_reported_and_moved_aside(store: TaskStore) -> None:
    good = store.create("good")
    bad = store.create("bad")
    bad.task_json.write_bytes(b'{"id": "' + bad.id.encode() + b'", "tit')
    result = store.scan()
    assert [t.id for t in result.tasks] == [good.id]
    (problem,) = result.problems
    assert "not valid JSON" in problem.message
    assert problem.moved_to is not None and problem.moved_to.read_bytes().endswith(b'"tit')
    # Still reported (not silently dropped) on the next scan, and removable.
    (again,) = store.scan().problems
    assert "missing" in again.message and "corrupt-" in again.message
    with pytest.raises(CorruptTask):
        store.get(bad.id)
    store.rm(bad.id)
    assert store.scan().problems == []


def test_an_invalid_record_is_corrupt_too(store: TaskStore) -> None:
    task = store.create("t")
    doc = orjson.loads(task.task_json.read_bytes())
    doc["status"] = "dancing"
    task.task_json.write_bytes(orjson.dumps(doc))
    with pytest.raises(CorruptTask, match="invalid status") as info:
        store.get(task.id)
    assert info.value.moved_to is not None


def test_a_newer_schema_is_refused_but_left_alone(store: TaskStore) -> None:
    task = store.create("t")
    doc = orjson.loads(task.task_json.read_bytes())
    doc["schemaVersion"] = 99
    task.task_json.write_bytes(orjson.dumps(doc))
    with pytest.raises(TaskStoreError, match="newer piwork"):
        store.get(task.id)
    assert task.task_json.exists()


def test_a_failed_task_json_write_keeps_the_old_version(
    store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = store.create("t")
    before = task.task_json.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil, "fsync_fd", full)  # the one durable writer, under the store
    with pytest.raises(TaskWriteError, match="No space left"):
        store.update(task.id, title="new")
    assert task.task_json.read_bytes() == before
    assert [p.name for p in task.dir.iterdir() if p.name.endswith(".tmp")] == []


# ---------------------------------------------------------------- ownership and rm


def test_claim_is_exclusive_and_released(store: TaskStore) -> None:
    task = store.create("t")
    lease = store.claim(task.id)
    with pytest.raises(TaskBusy, match="already claimed"):
        store.claim(task.id)
    with TaskStore(store.root) as other, pytest.raises(TaskBusy, match=f"process {os.getpid()}"):
        other.claim(task.id, timeout=0.1)
    owner = store.owner(task.id)
    assert owner is not None and owner.pid == os.getpid()
    lease.release()
    assert store.owner(task.id) is None
    with TaskStore(store.root) as other:
        other.claim(task.id).release()


def test_releasing_the_lease_hands_the_transcript_over(store: TaskStore) -> None:
    task = store.create("t")
    lease = store.claim(task.id)
    store.append_event(task.id, "pi", {"n": 1})
    with TaskStore(store.root) as other:
        with pytest.raises(TranscriptBusy):
            other.transcript(task.id)
        lease.release()
        other.append_event(task.id, "pi", {"n": 2})
    # Without a lease nothing stays open: both stores can append in turn.
    store.append_event(task.id, "pi", {"n": 3})
    records, problems = read_records(task.transcript_path)
    assert problems == []
    assert [r.data["n"] for r in records if r.kind == "pi"] == [1, 2, 3]
    assert [r.seq for r in records] == list(range(1, len(records) + 1))


def test_mark_interrupted_leaves_owned_tasks_alone(store: TaskStore) -> None:
    task = _reach(store, S.WAITING_INPUT)
    with TaskStore(store.root) as other:
        assert other.mark_interrupted() == []
    assert store.get(task.id).record.status is S.WAITING_INPUT


def test_rm_refuses_an_active_or_owned_task_unless_forced(store: TaskStore) -> None:
    task = _reach(store, S.RUNNING)
    with TaskStore(store.root) as other:
        with pytest.raises(TaskBusy, match="in use by process"):
            other.rm(task.id)
        other.rm(task.id, force=True)
    assert not task.dir.exists()
    assert [p for p in store.root.iterdir()] == []


def test_rm_of_an_idle_task(store: TaskStore) -> None:
    task = store.create("t")
    store.rm(task.id[:5])
    with pytest.raises(TaskNotFound):
        store.get(task.id)
