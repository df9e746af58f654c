"""What a task *is* on disk: the ``task.json`` record and its state machine.

The allowed transitions are data (:data:`TRANSITIONS`), not scattered ``if``s,
so the runner, the UI and the tests all read the same table.

::

    idle ──> running <──> waiting_permission | waiting_input | paused
      │         │                 │
      │         └────> stopped(reason) <──┘        reason: completed, cancelled,
      └──────────────> stopped(cancelled)                  error(message), limit(which)

    running | waiting_* | paused ──> interrupted   (owner process died; set at start-up)
    interrupted ──> running | stopped               (resume or give up)
    stopped ──> running                              (a follow-up prompt resumes pi's session)

``interrupted`` is only ever set by :meth:`TaskStore.mark_interrupted`, never
by a live runner, so a task that was running when the host died is never shown
as still running.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from piwork.errors import StoreError

SCHEMA_VERSION = 1


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso_z(when: datetime) -> str:
    """``2024-05-01T12:00:00.123Z``: UTC, millisecond precision, sortable as text."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _require_aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a timezone (UTC)")
    # Milliseconds, like the file: a record equals itself after a round trip.
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


Timestamp = Annotated[
    datetime, AfterValidator(_require_aware), PlainSerializer(iso_z, return_type=str)
]


class TaskStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    WAITING_PERMISSION = "waiting_permission"
    WAITING_INPUT = "waiting_input"
    PAUSED = "paused"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"


class StopReason(StrEnum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    ERROR = "error"
    LIMIT = "limit"


class LimitKind(StrEnum):
    TURNS = "turns"
    WALL_TIME = "wall_time"
    TOKENS = "tokens"
    COST = "cost"


#: Statuses that need a live owner process (one holding the task's owner lock).
ACTIVE_STATUSES: frozenset[TaskStatus] = frozenset(
    {
        TaskStatus.RUNNING,
        TaskStatus.WAITING_PERMISSION,
        TaskStatus.WAITING_INPUT,
        TaskStatus.PAUSED,
    }
)

_S = TaskStatus
#: from-status -> statuses it may move to. ``interrupted`` is reachable only
#: through :meth:`TaskStore.mark_interrupted`.
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    _S.IDLE: frozenset({_S.RUNNING, _S.STOPPED}),
    _S.RUNNING: frozenset(
        {_S.WAITING_PERMISSION, _S.WAITING_INPUT, _S.PAUSED, _S.STOPPED, _S.INTERRUPTED}
    ),
    _S.WAITING_PERMISSION: frozenset({_S.RUNNING, _S.PAUSED, _S.STOPPED, _S.INTERRUPTED}),
    _S.WAITING_INPUT: frozenset({_S.RUNNING, _S.PAUSED, _S.STOPPED, _S.INTERRUPTED}),
    _S.PAUSED: frozenset({_S.RUNNING, _S.STOPPED, _S.INTERRUPTED}),
    _S.INTERRUPTED: frozenset({_S.RUNNING, _S.STOPPED}),
    _S.STOPPED: frozenset({_S.RUNNING}),
}
del _S


class InvalidTransition(ValueError, StoreError):
    """A status change the state machine does not allow (or is missing its reason)."""

    def __init__(
        self, task_id: str, current: TaskStatus, target: TaskStatus, why: str = ""
    ) -> None:
        self.task_id = task_id
        self.current = current
        self.target = target
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing"
        detail = why or f"allowed from {current.value}: {allowed}"
        super().__init__(
            f"task {task_id}: cannot go from {current.value} to {target.value} ({detail})"
        )


def can_transition(current: TaskStatus, target: TaskStatus) -> bool:
    return target in TRANSITIONS[current]


class _Model(BaseModel):
    """camelCase on disk, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, validate_assignment=True
    )


class Limits(_Model):
    """Per-task budget. ``None`` means unlimited."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = Field(default=None, gt=0)
    max_wall_time_seconds: float | None = Field(default=None, gt=0)
    #: Counted like pi's ``usage.totalTokens``: input + output + cache read + cache write.
    max_tokens: int | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, gt=0)

    def exceeded(self, usage: Usage, wall_seconds: float) -> LimitKind | None:
        """The first limit reached (turns, wall time, tokens, cost), or ``None``."""
        if self.max_turns is not None and usage.turns >= self.max_turns:
            return LimitKind.TURNS
        if self.max_wall_time_seconds is not None and wall_seconds >= self.max_wall_time_seconds:
            return LimitKind.WALL_TIME
        if self.max_tokens is not None and usage.total_tokens >= self.max_tokens:
            return LimitKind.TOKENS
        if self.max_cost_usd is not None and usage.cost_usd >= self.max_cost_usd:
            return LimitKind.COST
        return None


class Usage(_Model):
    """Running totals for a task, across every pi session and VM boot."""

    turns: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    #: Seconds spent in ``running`` (closed segments only; see
    #: :meth:`TaskRecord.wall_seconds` for the live value). Waiting for the
    #: person and being paused do not count against ``maxWallTimeSeconds``.
    wall_seconds: float = Field(default=0.0, ge=0)

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def plus(self, other: Usage) -> Usage:
        return Usage(
            turns=self.turns + other.turns,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            wall_seconds=self.wall_seconds + other.wall_seconds,
        )


class StopInfo(_Model):
    """Why a task stopped. ``message`` is required for ``error``, ``limit`` for ``limit``."""

    reason: StopReason
    message: str | None = None
    limit: LimitKind | None = None
    at: Timestamp = Field(default_factory=utc_now)

    @model_validator(mode="after")
    def _consistent(self) -> StopInfo:
        if self.reason is StopReason.ERROR and not self.message:
            raise ValueError("a stop with reason 'error' needs a message")
        if self.reason is StopReason.LIMIT and self.limit is None:
            raise ValueError("a stop with reason 'limit' must say which limit")
        if self.reason is not StopReason.LIMIT and self.limit is not None:
            raise ValueError("'limit' is only meaningful for reason 'limit'")
        return self


class TaskRecord(_Model):
    """The content of ``task.json``.

    Unknown keys are kept and written back (``extra="allow"``) so an older
    piwork does not strip what a newer one added.
    """

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    id: str
    title: str
    status: TaskStatus = TaskStatus.IDLE
    created_at: Timestamp
    updated_at: Timestamp
    #: Absolute, symlink-resolved path; bound at most once (see TaskStore.bind_folder).
    working_folder: Path | None = None
    #: ``provider/modelId`` as pi names it, or None for pi's default.
    model: str | None = None
    limits: Limits = Field(default_factory=Limits)
    usage: Usage = Field(default_factory=Usage)
    #: Set when status is ``stopped``; cleared when the task runs again.
    stop: StopInfo | None = None
    #: The status a task had when its owner died (set with ``interrupted``).
    interrupted_from: TaskStatus | None = None
    #: Start of the current ``running`` segment, for wall-time accounting.
    running_since: Timestamp | None = None

    @field_validator("title")
    @classmethod
    def _title(cls, value: str) -> str:
        value = " ".join(value.split())
        if not value:
            raise ValueError("title must not be empty")
        return value

    def wall_seconds(self, now: datetime | None = None) -> float:
        """Time spent running so far, including the open segment."""
        total = self.usage.wall_seconds
        if self.running_since is not None:
            total += max(0.0, ((now or utc_now()) - self.running_since).total_seconds())
        return total

    def limit_reached(self, now: datetime | None = None) -> LimitKind | None:
        """Which of the task's limits is used up, if any. The runner checks this."""
        return self.limits.exceeded(self.usage, self.wall_seconds(now))

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
