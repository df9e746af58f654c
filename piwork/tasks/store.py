"""The task store: one directory per task, safe against crashes at any instant.

Layout (``<data dir>/tasks/<id>/``)::

    task.json            the TaskRecord, replaced atomically on every change
    transcript.jsonl     append-only event log (see transcript.py)
    transcript.torn      only after a crash tore the transcript's last line
    state/               guest /mnt/state: pi's session file and agent state
    outputs/             guest /mnt/outputs (rw)
    uploads/             guest /mnt/uploads (ro in the guest)
    owner.lock           flock'ed by the live owner; holds its pid/boot id (JSON)
    .task.lock           short flock around each read-modify-write of task.json
    task.json.corrupt-*  a task.json that did not parse, moved aside

Rules the runner relies on:

* ``task.json`` is written to a temp file, fsynced, ``os.replace``d over the
  old one and the directory fsynced: readers see the old or the new record,
  never half of one, even across ``kill -9`` or power loss.
* A task may only enter ``running``/``waiting_*``/``paused`` while this store
  holds its :class:`TaskLease` (:meth:`TaskStore.claim`). The lease is an
  ``flock`` the kernel drops when the owner dies, which is how
  :meth:`TaskStore.mark_interrupted` tells a live task from an orphan.
* One ``TaskStore`` per process: it keeps each task's transcript writer open
  (see :meth:`TaskStore.transcript`), and transcripts allow one writer.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
from pydantic import ValidationError

from piwork.config import get_paths
from piwork.errors import PersonError, StoreError
from piwork.fsutil import atomic_write_bytes, fsync_dir
from piwork.tasks.folders import validate_working_folder
from piwork.tasks.model import (
    ACTIVE_STATUSES,
    SCHEMA_VERSION,
    InvalidTransition,
    LimitKind,
    Limits,
    StopInfo,
    StopReason,
    TaskRecord,
    TaskStatus,
    Usage,
    can_transition,
    iso_z,
    utc_now,
)
from piwork.tasks.settings import load_task_settings
from piwork.tasks.transcript import (
    TranscriptError,
    TranscriptWriteError,
    TranscriptWriter,
)

log = logging.getLogger(__name__)

TASK_JSON = "task.json"
TRANSCRIPT = "transcript.jsonl"
OWNER_LOCK = "owner.lock"
META_LOCK = ".task.lock"
SUBDIRS = ("state", "outputs", "uploads")

_ID_RE = re.compile(r"^[0-9a-z][0-9a-z_-]{0,63}$")
_TMP_RE = re.compile(r"^\.task\.json\.(\d+)\.[0-9a-f]+\.tmp$")
_STAGING_PREFIX = ".new-"
_TRASH_PREFIX = ".trash-"


# --------------------------------------------------------------------------- errors


class TaskStoreError(StoreError):
    """Base class; ``str()`` is meant for people."""


class TaskNotFound(TaskStoreError, PersonError):
    pass


class AmbiguousTaskId(TaskStoreError, PersonError):
    def __init__(self, prefix: str, matches: list[str]) -> None:
        self.prefix = prefix
        self.matches = matches
        super().__init__(f"task id '{prefix}' is ambiguous: it matches {', '.join(matches)}")


class CorruptTask(TaskStoreError):
    """``task.json`` is unreadable. If it was moved aside, ``moved_to`` says where."""

    def __init__(self, task_dir: Path, reason: str, moved_to: Path | None = None) -> None:
        self.task_dir = task_dir
        self.reason = reason
        self.moved_to = moved_to
        where = f"; the bad file was moved to {moved_to}" if moved_to else ""
        super().__init__(f"task {task_dir.name}: task.json is unusable ({reason}){where}")


class TaskBusy(TaskStoreError, PersonError):
    """Another live process owns the task (or it is active and ``force`` was not given)."""

    def __init__(self, task_id: str, message: str, owner: OwnerInfo | None = None) -> None:
        self.task_id = task_id
        self.owner = owner
        super().__init__(message)


class NotOwner(TaskStoreError):
    pass


class FolderAlreadyBound(TaskStoreError, PersonError):
    def __init__(self, task_id: str, bound: Path, requested: Path) -> None:
        self.task_id = task_id
        self.bound = bound
        self.requested = requested
        super().__init__(
            f"task {task_id} already works in {bound}; a task's folder cannot change "
            f"(asked for {requested}). Create a new task for that folder."
        )


class TaskWriteError(TaskStoreError):
    """task.json could not be written; the previous version is intact."""

    def __init__(self, path: Path, cause: OSError) -> None:
        self.path = path
        self.errno = cause.errno
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        super().__init__(f"could not save {path}: {reason} (the previous version is intact)")


# --------------------------------------------------------------------------- ownership


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), to detect pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class OwnerInfo:
    """Who owns a task; written into ``owner.lock`` for people and as a fallback
    where ``flock`` is not supported."""

    pid: int
    hostname: str
    boot_id: str | None
    start_time: int | None
    since: str

    @classmethod
    def current(cls) -> OwnerInfo:
        pid = os.getpid()
        return cls(pid, socket.gethostname(), _boot_id(), _process_start(pid), iso_z(utc_now()))

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "pid": self.pid,
                "hostname": self.hostname,
                "bootId": self.boot_id,
                "startTime": self.start_time,
                "since": self.since,
            }
        )

    @classmethod
    def parse(cls, raw: bytes) -> OwnerInfo | None:
        try:
            obj = orjson.loads(raw)
            return cls(
                int(obj["pid"]),
                str(obj.get("hostname", "")),
                obj.get("bootId"),
                obj.get("startTime"),
                str(obj.get("since", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool:
        """Best guess without flock: same boot, pid exists, same process start time."""
        if self.hostname and self.hostname != socket.gethostname():
            return True  # another machine (shared folder): cannot tell, assume alive
        boot = _boot_id()
        if self.boot_id and boot and self.boot_id != boot:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        start = _process_start(self.pid)
        return not (self.start_time is not None and start is not None and start != self.start_time)


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _try_flock(fd: int) -> bool | None:
    """True: locked. False: someone else holds it. None: flock unsupported here."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            return None
        raise
    return True


def _read_owner(fd: int) -> OwnerInfo | None:
    try:
        return OwnerInfo.parse(os.pread(fd, 4096, 0))
    except OSError:
        return None


class TaskLease:
    """Proof that this process owns a task. Release it (or exit) to give it up."""

    def __init__(self, store: TaskStore, task_id: str, fd: int, info: OwnerInfo) -> None:
        self.store = store
        self.task_id = task_id
        self.info = info
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the task up. A task left active becomes interrupted at the next start-up."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        self.store._forget_lease(self.task_id, self)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing drops the flock

    def __enter__(self) -> TaskLease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """A task's record plus where its files live. A snapshot: re-``get`` for news."""

    dir: Path
    record: TaskRecord

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def task_json(self) -> Path:
        return self.dir / TASK_JSON

    @property
    def transcript_path(self) -> Path:
        return self.dir / TRANSCRIPT

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def outputs_dir(self) -> Path:
        return self.dir / "outputs"

    @property
    def uploads_dir(self) -> Path:
        return self.dir / "uploads"

    @property
    def owner_lock(self) -> Path:
        return self.dir / OWNER_LOCK


@dataclass(frozen=True)
class TaskProblem:
    """A task directory that could not be loaded (reported, never hidden)."""

    task_dir: Path
    message: str
    moved_to: Path | None = None


@dataclass
class ScanResult:
    tasks: list[Task] = field(default_factory=list)
    problems: list[TaskProblem] = field(default_factory=list)


def _write_atomic(path: Path, payload: bytes) -> None:
    """task.json, durably (``piwork.fsutil``, the one durable writer); a failure is a
    TaskWriteError and the previous version stays."""
    try:
        atomic_write_bytes(path, payload)
    except OSError as exc:
        raise TaskWriteError(path, exc) from exc


def _dump(record: TaskRecord) -> bytes:
    return orjson.dumps(record.to_json_dict(), option=orjson.OPT_INDENT_2) + b"\n"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TaskStore:
    """All tasks under ``root`` (default ``get_paths().tasks``)."""

    def __init__(self, root: Path | None = None, *, fsync_delay: float = 0.0) -> None:
        self.root = root if root is not None else get_paths().tasks
        self._fsync_delay = fsync_delay
        self._lock = threading.RLock()
        self._leases: dict[str, TaskLease] = {}
        self._transcripts: dict[str, TranscriptWriter] = {}
        self._meta_held: set[Path] = set()

    # ---- lookup

    def _task_dirs(self) -> Iterator[Path]:
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return
        for entry in entries:
            if _ID_RE.match(entry.name) and entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)

    def resolve_id(self, prefix: str) -> str:
        """The full id of the one task whose id starts with ``prefix``."""
        prefix = prefix.strip().lower()
        if not prefix or not _ID_RE.match(prefix):
            raise TaskNotFound(f"'{prefix}' is not a task id")
        matches = [d.name for d in self._task_dirs() if d.name.startswith(prefix)]
        if not matches:
            raise TaskNotFound(f"no task with id '{prefix}' in {self.root}")
        if prefix in matches:
            return prefix
        if len(matches) > 1:
            raise AmbiguousTaskId(prefix, matches)
        return matches[0]

    def get(self, task_id: str) -> Task:
        """Load a task by id or unique id prefix. Raises TaskNotFound, CorruptTask."""
        task_dir = self.root / self.resolve_id(task_id)
        return Task(task_dir, self._load(task_dir))

    def scan(self) -> ScanResult:
        """Every loadable task (oldest first) plus a problem for each that is not."""
        result = ScanResult()
        for task_dir in self._task_dirs():
            try:
                result.tasks.append(Task(task_dir, self._load(task_dir)))
            except CorruptTask as exc:
                result.problems.append(TaskProblem(task_dir, str(exc), exc.moved_to))
            except TaskStoreError as exc:
                result.problems.append(TaskProblem(task_dir, str(exc)))
        result.tasks.sort(key=lambda t: (t.record.created_at, t.id))
        return result

    def list(self) -> list[Task]:
        """Every loadable task, oldest first. Problems are logged; use scan() to see them."""
        result = self.scan()
        for problem in result.problems:
            log.warning("%s", problem.message)
        return result.tasks

    # ---- reading and writing task.json

    def _load(self, task_dir: Path) -> TaskRecord:
        path = task_dir / TASK_JSON
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            aside = sorted(task_dir.glob(TASK_JSON + ".corrupt-*"))
            hint = (
                f"; earlier copies moved aside: {', '.join(p.name for p in aside)}" if aside else ""
            )
            raise CorruptTask(task_dir, f"task.json is missing{hint}") from None
        except OSError as exc:
            raise TaskStoreError(f"cannot read {path}: {exc.strerror}") from exc
        reason = self._check(task_dir, raw)
        if isinstance(reason, TaskRecord):
            return reason
        # Re-check under the write lock so we never move aside a file a writer
        # has just replaced with a good one.
        with self._meta_lock(task_dir):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                raise CorruptTask(task_dir, "task.json is missing") from None
            again = self._check(task_dir, raw)
            if isinstance(again, TaskRecord):
                return again
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
            moved = task_dir / f"{TASK_JSON}.corrupt-{stamp}"
            os.replace(path, moved)
            fsync_dir(task_dir)
        log.error("task %s: task.json is corrupt (%s); moved to %s", task_dir.name, again, moved)
        raise CorruptTask(task_dir, again, moved)

    def _check(self, task_dir: Path, raw: bytes) -> TaskRecord | str:
        """The record, or why the bytes are corrupt. Raises for non-corrupt refusals."""
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return f"not valid JSON: {exc}"
        if not isinstance(obj, dict):
            return "not a JSON object"
        version = obj.get("schemaVersion")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise TaskStoreError(
                f"task {task_dir.name} was written by a newer piwork (schema {version}, "
                f"this one reads {SCHEMA_VERSION}); upgrade piwork to open it"
            )
        try:
            record = TaskRecord.model_validate(obj)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "record"
            return f"invalid {loc}: {first['msg']}"
        if record.id != task_dir.name:
            raise TaskStoreError(
                f"task {task_dir.name}: task.json says its id is '{record.id}'; "
                "rename the directory back or fix the id"
            )
        return record

    @contextlib.contextmanager
    def _meta_lock(self, task_dir: Path, timeout: float = 10.0) -> Iterator[None]:
        with self._lock:
            if task_dir in self._meta_held:  # re-entered (a load inside an update)
                yield
                return
            fd = os.open(task_dir / META_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                deadline = time.monotonic() + timeout
                while _try_flock(fd) is False:
                    if time.monotonic() > deadline:
                        raise TaskStoreError(
                            f"task {task_dir.name}: timed out waiting for another process "
                            "writing task.json"
                        )
                    time.sleep(0.01)
                self._meta_held.add(task_dir)
                try:
                    yield
                finally:
                    self._meta_held.discard(task_dir)
            finally:
                os.close(fd)

    def _update(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> Task:
        task_dir = self.root / self.resolve_id(task_id)
        with self._meta_lock(task_dir):
            current = self._load(task_dir)
            updated = change(current.model_copy(deep=True))
            updated.updated_at = max(utc_now(), current.updated_at)
            _write_atomic(task_dir / TASK_JSON, _dump(updated))
        return Task(task_dir, updated)

    # ---- transcript

    def transcript(self, task_id: str) -> TranscriptWriter:
        """This store's writer for the task's transcript, opened on first use.

        It stays open while this store holds the task's lease and is closed
        when the lease is released (or by :meth:`close`), so other processes
        can write once the task is no longer ours.
        """
        full = self.resolve_id(task_id)
        with self._lock:
            writer = self._transcripts.get(full)
            if writer is None or writer.closed:
                writer = TranscriptWriter(
                    self.root / full / TRANSCRIPT, fsync_delay=self._fsync_delay
                )
                self._transcripts[full] = writer
            return writer

    def append_event(self, task_id: str, kind: str, data: Any = None) -> dict[str, Any]:
        """Record an event the host received. Raises TranscriptWriteError (record kept).

        Without this store's lease the writer is opened for this one record and
        closed again (so queued records do not outlive the call).
        """
        writer = self._transcripts.get(task_id)
        if writer is not None and task_id in self._leases and not writer.closed:
            # The hot path (every pi line of a run): a full id we hold, its writer open.
            # No directory scan to resolve the id, no lock beyond the writer's own.
            return writer.append(kind, data)
        full = self.resolve_id(task_id)
        try:
            return self.transcript(full).append(kind, data)
        finally:
            if full not in self._leases:
                self._close_transcript(full)

    def _note(self, task_id: str, kind: str, data: Any) -> None:
        """Transcript entry for a change already committed to task.json.

        A write error here is logged, not raised: the change stands, and the
        record stays queued in the writer, written before the next event.
        """
        try:
            self.append_event(task_id, kind, data)
        except TranscriptWriteError as exc:
            log.warning("%s", exc)
        except TranscriptError as exc:
            log.error("task %s: cannot record %s in the transcript: %s", task_id, kind, exc)

    def _close_transcript(self, task_id: str) -> None:
        with self._lock:
            writer = self._transcripts.pop(task_id, None)
        if writer is not None:
            writer.close()

    # ---- life cycle

    def create(
        self,
        title: str,
        folder: str | os.PathLike[str] | None = None,
        *,
        model: str | None = None,
        limits: Limits | None = None,
    ) -> Task:
        """Make a new idle task. ``limits`` default to settings.json's defaultLimits.

        Raises FolderError for a bad folder, SettingsError for a broken settings file.
        """
        working = self._validate_folder(folder) if folder is not None else None
        if limits is None:
            limits = load_task_settings().default_limits
        self.root.mkdir(parents=True, exist_ok=True)
        now = utc_now()
        for _ in range(20):
            task_id = secrets.token_hex(6)
            if not (self.root / task_id).exists():
                break
        else:  # pragma: no cover - 48 random bits
            raise TaskStoreError("could not pick a free task id")
        record = TaskRecord(
            id=task_id,
            title=title,
            created_at=now,
            updated_at=now,
            working_folder=working,
            model=model,
            limits=limits,
        )
        # Build the whole directory under a hidden name, then rename it into
        # place: a crash never leaves a half-made task that lists.
        staging = self.root / f"{_STAGING_PREFIX}{task_id}"
        staging.mkdir(mode=0o700)
        try:
            for sub in SUBDIRS:
                (staging / sub).mkdir(mode=0o700)
            _write_atomic(staging / TASK_JSON, _dump(record))
            with TranscriptWriter(staging / TRANSCRIPT) as writer:
                writer.append("task_created", record.to_json_dict())
            fsync_dir(staging)
            os.rename(staging, self.root / task_id)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(self.root)
        return Task(self.root / task_id, record)

    def _validate_folder(self, folder: str | os.PathLike[str]) -> Path:
        return validate_working_folder(folder, protected=[self.root])

    def bind_folder(self, task_id: str, folder: str | os.PathLike[str]) -> Task:
        """Give a task its working folder. Once bound it never changes; binding the
        same folder again is a no-op. Raises FolderError, FolderAlreadyBound."""
        path = self._validate_folder(folder)
        changed = False

        def change(rec: TaskRecord) -> TaskRecord:
            nonlocal changed
            if rec.working_folder is not None:
                if rec.working_folder != path:
                    raise FolderAlreadyBound(rec.id, rec.working_folder, path)
                return rec
            rec.working_folder = path
            changed = True
            return rec

        task = self._update(task_id, change)
        if changed:
            self._note(task.id, "folder_bound", {"folder": str(path)})
        return task

    def update(
        self,
        task_id: str,
        *,
        title: str | None = None,
        model: str | None = None,
        limits: Limits | None = None,
    ) -> Task:
        """Change a task's title, model or limits (recorded in the transcript)."""
        changes: dict[str, Any] = {}

        def change(rec: TaskRecord) -> TaskRecord:
            if title is not None:
                rec.title = title
                changes["title"] = rec.title
            if model is not None:
                rec.model = model
                changes["model"] = model
            if limits is not None:
                rec.limits = limits
                changes["limits"] = limits.model_dump(mode="json", by_alias=True)
            return rec

        task = self._update(task_id, change)
        if changes:
            self._note(task.id, "task_updated", changes)
        return task

    def transition(
        self,
        task_id: str,
        status: TaskStatus | str,
        *,
        reason: StopReason | None = None,
        message: str | None = None,
        limit: LimitKind | None = None,
    ) -> Task:
        """Move a task to ``status`` if :data:`TRANSITIONS` allows it.

        ``stopped`` needs ``reason`` (``error`` also ``message``, ``limit`` also
        ``limit``). Entering an active status needs this store's lease
        (:meth:`claim`). Recorded in task.json, then as a ``status`` transcript
        record. Raises InvalidTransition, NotOwner.
        """
        status = TaskStatus(status)  # a str is accepted for callers parsing JSON
        full = self.resolve_id(task_id)
        if status in ACTIVE_STATUSES and full not in self._leases:
            raise NotOwner(
                f"task {full}: claim it (TaskStore.claim) before moving it to {status.value}"
            )
        stop: StopInfo | None = None
        problem = ""
        if status is TaskStatus.STOPPED:
            if reason is None:
                problem = "a stop needs a reason"
            else:
                try:
                    stop = StopInfo(reason=StopReason(reason), message=message, limit=limit)
                except ValidationError as exc:
                    problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        elif reason is not None or limit is not None:
            problem = "a reason or limit only goes with 'stopped'"
        elif status is TaskStatus.INTERRUPTED:
            problem = "only mark_interrupted() sets interrupted"
        previous: builtins.list[TaskStatus] = []

        def change(rec: TaskRecord) -> TaskRecord:
            if problem:
                raise InvalidTransition(rec.id, rec.status, status, problem)
            if not can_transition(rec.status, status):
                raise InvalidTransition(rec.id, rec.status, status)
            previous.append(rec.status)
            now = utc_now()
            _close_running_segment(rec, now)
            rec.status = status
            rec.stop = stop
            rec.interrupted_from = None
            if status is TaskStatus.RUNNING:
                rec.running_since = now
            return rec

        task = self._update(full, change)
        data: dict[str, Any] = {"from": previous[0].value, "to": status.value}
        if stop is not None:
            data["stop"] = stop.model_dump(mode="json", by_alias=True, exclude_none=True)
        if message is not None and stop is None:
            data["message"] = message
        self._note(full, "status", data)
        return task

    def add_usage(self, task_id: str, delta: Usage) -> Task:
        """Add one message's or turn's usage (``turns=1`` at each ``turn_end``)."""
        return self._update(task_id, lambda rec: _set_usage(rec, rec.usage.plus(delta)))

    def set_usage(self, task_id: str, totals: Usage) -> Task:
        """Replace token/cost/turn totals (e.g. from ``get_session_stats``); wall time is kept."""

        def change(rec: TaskRecord) -> TaskRecord:
            return _set_usage(
                rec, totals.model_copy(update={"wall_seconds": rec.usage.wall_seconds})
            )

        return self._update(task_id, change)

    # ---- ownership

    def claim(self, task_id: str, *, timeout: float = 2.0) -> TaskLease:
        """Become the task's owner (hold its ``owner.lock``) until release or exit.

        Raises TaskBusy, naming the owner, if another live process has it.
        """
        full = self.resolve_id(task_id)
        with self._lock:
            if full in self._leases:
                raise TaskBusy(full, f"task {full} is already claimed by this process")
            fd = os.open(
                self.root / full / OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            try:
                deadline = time.monotonic() + timeout
                while True:
                    got = _try_flock(fd)
                    if got is None:
                        other = _read_owner(fd)
                        if other is not None and other.pid != os.getpid() and other.alive():
                            got = False
                        else:
                            got = True
                    if got:
                        break
                    if time.monotonic() >= deadline:
                        owner = _read_owner(fd)
                        who = (
                            f"process {owner.pid} on {owner.hostname}"
                            if owner
                            else "another process"
                        )
                        raise TaskBusy(full, f"task {full} is in use by {who}", owner)
                    time.sleep(0.05)
                info = OwnerInfo.current()
                os.ftruncate(fd, 0)
                os.pwrite(fd, info.to_json(), 0)
            except BaseException:
                os.close(fd)
                raise
            lease = TaskLease(self, full, fd, info)
            self._leases[full] = lease
            return lease

    def _forget_lease(self, task_id: str, lease: TaskLease) -> None:
        with self._lock:
            if self._leases.get(task_id) is lease:
                del self._leases[task_id]
        self._close_transcript(task_id)

    def owner(self, task_id: str) -> OwnerInfo | None:
        """The live owner of a task (possibly this process), or None."""
        full = self.resolve_id(task_id)
        lease = self._leases.get(full)
        if lease is not None:
            return lease.info
        path = self.root / full / OWNER_LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            got = _try_flock(fd)
            info = _read_owner(fd)
            if got is None:
                return info if info is not None and info.alive() else None
            if got:
                return None
            return info or OwnerInfo(0, "", None, None, "")
        finally:
            os.close(fd)

    def mark_interrupted(self) -> builtins.list[str]:
        """Start-up recovery: orphaned active tasks become ``interrupted``.

        A task in running/waiting_*/paused whose ``owner.lock`` nobody holds lost
        its owner (crash, kill, reboot). Its open running segment is closed at
        its last recorded update. Also removes leftovers of interrupted writes
        (temp files of dead writers, half-created and half-deleted task dirs).
        Returns the ids marked.
        """
        self._sweep()
        marked: builtins.list[str] = []
        for task in self.scan().tasks:
            if task.record.status not in ACTIVE_STATUSES or task.id in self._leases:
                continue
            fd = os.open(task.owner_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                got = _try_flock(fd)
                owner = _read_owner(fd)
                if got is None:
                    got = owner is None or not owner.alive()
                if got and self._interrupt(task.id, owner):
                    marked.append(task.id)
            finally:
                os.close(fd)
        return marked

    def _interrupt(self, task_id: str, owner: OwnerInfo | None) -> bool:
        was: builtins.list[TaskStatus] = []

        def change(rec: TaskRecord) -> TaskRecord:
            if rec.status in ACTIVE_STATUSES:  # re-checked under the write lock
                was.append(rec.status)
                _close_running_segment(rec, rec.updated_at)
                rec.interrupted_from = rec.status
                rec.status = TaskStatus.INTERRUPTED
            return rec

        self._update(task_id, change)
        if not was:
            return False
        data: dict[str, Any] = {"from": was[0].value, "to": TaskStatus.INTERRUPTED.value}
        if owner is not None:
            data["owner"] = orjson.loads(owner.to_json())
        self._note(task_id, "status", data)
        log.info("task %s was %s when its owner went away: interrupted", task_id, was[0].value)
        return True

    def _sweep(self) -> None:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith((_STAGING_PREFIX, _TRASH_PREFIX)) and entry.is_dir(
                follow_symlinks=False
            ):
                staging = entry.name.startswith(_STAGING_PREFIX)
                if staging and self._creation_in_progress(Path(entry.path)):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
        for task_dir in self._task_dirs():
            for tmp in task_dir.glob(".task.json.*.tmp"):
                m = _TMP_RE.match(tmp.name)
                if m and not _pid_alive(int(m.group(1))):
                    with contextlib.suppress(OSError):
                        tmp.unlink()

    @staticmethod
    def _creation_in_progress(staging: Path) -> bool:
        # Creation takes milliseconds; a staging dir younger than a minute may
        # belong to a live create() in another process.
        try:
            return time.time() - staging.stat().st_mtime < 60
        except OSError:
            return False

    def rm(self, task_id: str, *, force: bool = False) -> None:
        """Delete a task and all its files. An active or owned task needs ``force``.

        Works on a task whose task.json is corrupt, too.
        """
        full = self.resolve_id(task_id)
        task_dir = self.root / full
        status: TaskStatus | None = None
        try:
            status = self._load(task_dir).status
        except TaskStoreError:
            status = None
        if not force:
            owner = self.owner(full)
            if owner is not None:
                raise TaskBusy(
                    full,
                    f"task {full} is in use by process {owner.pid}; stop it first or use --force",
                    owner,
                )
            if status is not None and status in ACTIVE_STATUSES:
                raise TaskBusy(full, f"task {full} is {status.value}; stop it first or use --force")
        lease = self._leases.get(full)
        if lease is not None:
            lease.release()
        self._close_transcript(full)
        trash = self.root / f"{_TRASH_PREFIX}{full}-{secrets.token_hex(3)}"
        os.rename(task_dir, trash)
        fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)  # leftovers go at the next sweep

    def close(self) -> None:
        """Flush and close transcripts, release leases."""
        with self._lock:
            writers = list(self._transcripts.values())
            self._transcripts.clear()
            leases = list(self._leases.values())
        for writer in writers:
            writer.close()
        for lease in leases:
            lease.release()

    def __enter__(self) -> TaskStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _close_running_segment(rec: TaskRecord, end: datetime) -> None:
    if rec.running_since is not None:
        spent = max(0.0, (end - rec.running_since).total_seconds())
        rec.usage = rec.usage.model_copy(update={"wall_seconds": rec.usage.wall_seconds + spent})
        rec.running_since = None


def _set_usage(rec: TaskRecord, usage: Usage) -> TaskRecord:
    rec.usage = usage
    return rec
