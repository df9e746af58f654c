"""The task state machine, as a table, and the record's on-disk shape."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from piwork.tasks.model import (
    TRANSITIONS,
    LimitKind,
    Limits,
    StopInfo,
    StopReason,
    TaskRecord,
    TaskStatus,
    Usage,
    can_transition,
)

S = TaskStatus

# Written out independently of the implementation: the state machine.
EXPECTED: set[tuple[TaskStatus, TaskStatus]] = {
    (S.IDLE, S.RUNNING),
    (S.IDLE, S.STOPPED),
    (S.RUNNING, S.WAITING_PERMISSION),
    (S.RUNNING, S.WAITING_INPUT),
    (S.RUNNING, S.PAUSED),
    (S.RUNNING, S.STOPPED),
    (S.RUNNING, S.INTERRUPTED),
    (S.WAITING_PERMISSION, S.RUNNING),
    (S.WAITING_PERMISSION, S.PAUSED),
    (S.WAITING_PERMISSION, S.STOPPED),
    (S.WAITING_PERMISSION, S.INTERRUPTED),
    (S.WAITING_INPUT, S.RUNNING),
    (S.WAITING_INPUT, S.PAUSED),
    (S.WAITING_INPUT, S.STOPPED),
    (S.WAITING_INPUT, S.INTERRUPTED),
    (S.PAUSED, S.RUNNING),
    (S.PAUSED, S.STOPPED),
    (S.PAUSED, S.INTERRUPTED),
    (S.INTERRUPTED, S.RUNNING),
    (S.INTERRUPTED, S.STOPPED),
    (S.STOPPED, S.RUNNING),
}


def test_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(TaskStatus)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(TaskStatus, TaskStatus)))
def test_transition_table_matches_the_spec(src: TaskStatus, dst: TaskStatus) -> None:
    assert can_transition(src, dst) == ((src, dst) in EXPECTED)


def test_nothing_goes_back_to_idle_and_no_self_loops() -> None:
    for src in TaskStatus:
        assert not can_transition(src, S.IDLE)
        assert not can_transition(src, src)


def test_stop_info_requires_message_for_error_and_kind_for_limit() -> None:
    with pytest.raises(ValidationError, match="needs a message"):
        StopInfo(reason=StopReason.ERROR)
    with pytest.raises(ValidationError, match="which limit"):
        StopInfo(reason=StopReason.LIMIT)
    with pytest.raises(ValidationError, match="only meaningful"):
        StopInfo(reason=StopReason.COMPLETED, limit=LimitKind.TURNS)
    assert StopInfo(reason=StopReason.LIMIT, limit=LimitKind.COST).limit is LimitKind.COST


def _record(**kw: object) -> TaskRecord:
    now = datetime.now(UTC)
    return TaskRecord.model_validate(
        {"id": "abc", "title": "t", "createdAt": now, "updatedAt": now, **kw}
    )


def test_record_is_camel_case_on_disk_and_round_trips() -> None:
    rec = _record(model="anthropic/claude", limits={"maxTurns": 3})
    doc = rec.to_json_dict()
    assert {"createdAt", "updatedAt", "workingFolder", "schemaVersion", "usage"} <= set(doc)
    assert doc["createdAt"].endswith("Z")
    assert TaskRecord.model_validate(doc) == rec


def test_unknown_keys_from_a_newer_version_survive_a_rewrite() -> None:
    rec = _record(futureField={"x": 1})
    assert rec.to_json_dict()["futureField"] == {"x": 1}


def test_naive_timestamps_and_empty_titles_are_refused() -> None:
    with pytest.raises(ValidationError):
        TaskRecord(id="a", title="t", created_at=datetime.now(), updated_at=datetime.now(UTC))
    with pytest.raises(ValidationError, match="title"):
        _record(title="   ")


def test_limits_report_the_first_exhausted_budget() -> None:
    limits = Limits(max_turns=3, max_wall_time_seconds=60, max_tokens=1000, max_cost_usd=1.0)
    assert limits.exceeded(Usage(), 0) is None
    assert limits.exceeded(Usage(turns=3), 0) is LimitKind.TURNS
    assert limits.exceeded(Usage(), 60) is LimitKind.WALL_TIME
    assert limits.exceeded(Usage(input_tokens=600, cache_read_tokens=400), 0) is LimitKind.TOKENS
    assert limits.exceeded(Usage(cost_usd=1.5), 0) is LimitKind.COST
    assert Limits().exceeded(Usage(turns=10**6, cost_usd=1e9), 1e9) is None


def test_wall_time_counts_the_open_running_segment() -> None:
    start = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
    rec = _record(usage={"wallSeconds": 10}, runningSince=start, limits={"maxWallTimeSeconds": 35})
    assert rec.wall_seconds(start + timedelta(seconds=30)) == pytest.approx(40)
    assert rec.limit_reached(start + timedelta(seconds=30)) is LimitKind.WALL_TIME


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValidationError):
        Limits(max_turns=0)
    with pytest.raises(ValidationError):
        Limits.model_validate({"maxTurns": 5, "maxTurnz": 1})
