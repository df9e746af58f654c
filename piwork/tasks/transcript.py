"""``transcript.jsonl``: every event the host saw for a task, append-only.

Each line is one complete record, ``{"seq": n, "t": "...Z", "kind": ..., "data": ...}``
followed by ``\\n``, handed to the kernel in a single ``os.write``. So:

* a ``kill -9`` of the writer loses nothing that ``append`` returned from (the
  bytes are in the page cache), and at worst leaves the line being written torn;
* a machine crash loses at most what was not yet fsynced: nothing with the
  default ``fsync_delay=0``, at most ``fsync_delay`` seconds of lines otherwise
  (never lines before those, since fsync covers the whole file).

**Torn last line (decision).** On open, bytes after the last ``\\n`` are a line
a crashed writer did not finish. They are *moved* to ``transcript.torn`` (one
JSON line per repair: time, offset, length and the bytes as ``text`` or
``base64``), the transcript is truncated back to its last complete line, and a
``transcript_repair`` record noting the move is appended. The transcript stays
clean JSONL and nothing is silently dropped. (If the torn tail happens to be a
whole record missing only its newline, it is kept and the newline added.)

**Write errors.** ``ENOSPC``/``EIO`` raise :class:`TranscriptWriteError`. A
partially written line is truncated away, the record keeps its seq and stays
queued in memory; the next :meth:`TranscriptWriter.append` or
:meth:`TranscriptWriter.retry` writes queued records first, in order.

One writer per file: the writer holds ``flock`` on the transcript while open,
so a second writer (which would duplicate seqs) fails fast with
:class:`TranscriptBusy`. Readers need no lock.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from piwork.errors import StoreError
from piwork.fsutil import fsync_dir, fsync_fd
from piwork.tasks.model import iso_z, utc_now

log = logging.getLogger(__name__)

TORN_SUFFIX = ".torn"
DROPPED_SUFFIX = ".dropped"
REPAIR_KIND = "transcript_repair"
ROTATED_KIND = "transcript_rotated"
DROPPED_KIND = "transcript_segment_dropped"
MAX_BYTES = 32 * 1024 * 1024
"""A transcript file past this size is rotated to ``transcript.<n>.jsonl``."""
KEEP_SEGMENTS = 4
"""Rotated segments kept; the oldest beyond this is deleted, and a record says so."""
MAX_PENDING = 1000
MAX_PENDING_BYTES = 8 * 1024 * 1024
"""Bound on records held in memory while the disk refuses them (then TranscriptFull)."""
_CHUNK = 1 << 16


# --------------------------------------------------------------------------- durable I/O


def _os_write(fd: int, data: memoryview) -> int:
    """The one place transcript bytes reach the kernel (tests inject errors here)."""
    return os.write(fd, data)


def _os_fsync(fd: int) -> None:
    fsync_fd(fd)


_stamp: tuple[int, str] = (-1, "")


def _timestamp() -> str:
    """``iso_z(utc_now())``, cheaper: the text up to the second is made once a second."""
    global _stamp
    now = time.time()
    sec = int(now)
    cached_sec, prefix = _stamp
    if sec != cached_sec:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(sec))
        _stamp = (sec, prefix)
    return f"{prefix}{min(int((now - sec) * 1000), 999):03d}Z"


# --------------------------------------------------------------------------- what pi said


def compact_pi_line(obj: dict[str, Any]) -> dict[str, Any]:
    """The transcript form of one pi line: deltas, not running totals.

    pi repeats the whole partial message in every ``message_update`` (and the
    accumulated output in every ``tool_execution_update``), so storing lines
    verbatim makes one long answer cost O(n²) bytes. The delta and the final
    message (``message_end``, ``tool_execution_end``) carry everything; the
    repeated snapshots are left out, and the record says so (``"compacted"``).
    """
    kind = obj.get("type")
    if kind == "message_update":
        out = {k: v for k, v in obj.items() if k != "message"}
        ame = obj.get("assistantMessageEvent")
        if isinstance(ame, dict):
            out["assistantMessageEvent"] = {
                k: v for k, v in ame.items() if k not in ("partial", "message")
            }
        out["compacted"] = True
        return out
    if kind == "tool_execution_update":
        out = {k: v for k, v in obj.items() if k not in ("partialResult", "args")}
        out["compacted"] = True
        return out
    return obj


def _sync_and_close(fd: int) -> None:
    try:
        _os_fsync(fd)
    except OSError as exc:
        log.error("transcript: could not sync a rotated segment: %s", exc)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- errors


class TranscriptError(StoreError):
    """Base class for transcript problems."""


class TranscriptBusy(TranscriptError):
    """Another writer has this transcript open."""


class TranscriptWriteError(TranscriptError):
    """The disk refused a record (full, I/O error). The record is queued for retry.

    ``record`` is the record that failed; ``pending`` how many records are
    queued in memory (including it); ``durable_only`` is True when the bytes
    were written but fsync failed (nothing is queued in that case).
    """

    def __init__(
        self,
        path: Path,
        cause: OSError,
        record: dict[str, Any] | None,
        pending: int,
        *,
        durable_only: bool = False,
    ) -> None:
        self.path = path
        self.errno = cause.errno
        self.record = record
        self.pending = pending
        self.durable_only = durable_only
        what = "could not flush" if durable_only else "could not write"
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        hint = (
            " Free some disk space; queued records are written on the next append or retry()."
            if cause.errno == errno.ENOSPC
            else ""
        )
        queued = "" if durable_only else f" ({pending} record(s) held in memory)"
        super().__init__(f"{what} transcript {path}: {reason}{queued}.{hint}")


class TranscriptFull(TranscriptWriteError):
    """The disk keeps refusing and the in-memory queue is at its bound.

    The record was *not* queued: the caller must stop producing records (the
    runner stops the task with this message) rather than pile them in memory.
    """


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Record:
    seq: int
    t: str
    kind: str
    data: Any
    line_no: int


@dataclass(frozen=True)
class MalformedLine:
    line_no: int
    offset: int
    reason: str
    excerpt: str

    def __str__(self) -> str:
        return f"line {self.line_no} (byte {self.offset}): {self.reason}: {self.excerpt!r}"


def _excerpt(raw: bytes, limit: int = 80) -> str:
    text = raw.rstrip(b"\n").decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "…"


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None, "missing or invalid 'seq'"
    if not isinstance(obj.get("t"), str) or not isinstance(obj.get("kind"), str):
        return None, "missing 't' or 'kind'"
    return obj, ""


def segment_paths(path: Path) -> list[Path]:
    """Rotated segments of ``path`` (``transcript.<n>.jsonl``), oldest first."""
    found: list[tuple[int, Path]] = []
    for p in path.parent.glob(f"{path.stem}.*{path.suffix}"):
        middle = p.name[len(path.stem) + 1 : len(p.name) - len(path.suffix)]
        if middle.isdigit():
            found.append((int(middle), p))
    return [p for _, p in sorted(found)]


class TranscriptReader:
    """Iterate a transcript's records; bad lines go to :attr:`problems`, never raise.

    Rotated segments (``transcript.<n>.jsonl``) are read first, oldest first,
    then the live file. A missing file reads as empty. A last line without
    ``\\n`` is reported as incomplete (a writer is mid-line, or crashed before
    the file was repaired).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[MalformedLine] = []

    def __iter__(self) -> Iterator[Record]:
        self.problems = []
        last_seq = 0
        for segment in [*segment_paths(self.path), self.path]:
            last_seq = yield from self._read(segment, last_seq)

    def _read(self, path: Path, last_seq: int) -> Generator[Record, None, int]:
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            return last_seq
        with fh:
            offset = 0
            for line_no, raw in enumerate(fh, start=1):
                here = offset
                offset += len(raw)
                if not raw.endswith(b"\n"):
                    self.problems.append(
                        MalformedLine(line_no, here, "incomplete last line", _excerpt(raw))
                    )
                    break
                obj, why = _parse(raw)
                if obj is None:
                    self.problems.append(MalformedLine(line_no, here, why, _excerpt(raw)))
                    continue
                seq = int(obj["seq"])
                if seq <= last_seq:
                    self.problems.append(
                        MalformedLine(
                            line_no, here, f"seq {seq} does not follow {last_seq}", _excerpt(raw)
                        )
                    )
                last_seq = max(last_seq, seq)
                yield Record(seq, obj["t"], obj["kind"], obj.get("data"), line_no)
        return last_seq


def read_records(path: Path) -> tuple[list[Record], list[MalformedLine]]:
    reader = TranscriptReader(path)
    records = list(reader)
    return records, reader.problems


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class RepairNote:
    """What :class:`TranscriptWriter` did to a torn tail when it opened the file."""

    offset: int
    length: int
    action: str  # "moved" (to transcript.torn) or "completed" (newline added)
    moved_to: Path | None


class TranscriptWriter:
    """The single appender of one transcript. Thread-safe.

    Opening waits up to ``lock_timeout`` seconds for another writer to close.

    ``fsync_delay`` > 0 batches fsyncs: a background thread syncs at most that
    many seconds after a write (keep it ≤ 0.05). ``flush()``/``close()`` sync
    at once.
    """

    def __init__(
        self,
        path: Path,
        *,
        fsync_delay: float = 0.0,
        lock_timeout: float = 2.0,
        max_bytes: int = MAX_BYTES,
        keep_segments: int = KEEP_SEGMENTS,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        if fsync_delay < 0:
            raise ValueError("fsync_delay must be >= 0")
        self.path = path
        self.max_bytes = max_bytes
        self.keep_segments = keep_segments
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self.torn_path = path.with_suffix(TORN_SUFFIX)
        self._fsync_delay = fsync_delay
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pending: deque[tuple[dict[str, Any], bytes]] = deque()
        self._sync_due: float | None = None
        self._sync_error: OSError | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self.repaired: RepairNote | None = None

        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            self._acquire(lock_timeout)
            if not existed:
                fsync_dir(path.parent)
            self._size = os.fstat(self._fd).st_size
            self._repair_tail()
            self._next_seq = (self._scan_last_seq() or self._last_segment_seq()) + 1
        except BaseException:
            os.close(self._fd)
            raise
        if self.repaired is not None:
            note = self.repaired
            data: dict[str, Any] = {
                "offset": note.offset,
                "tornBytes": note.length,
                "action": note.action,
            }
            if note.moved_to is not None:
                data["movedTo"] = note.moved_to.name
            self.append(REPAIR_KIND, data)

    def _acquire(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TranscriptBusy(
                        f"transcript {self.path} is already open for writing elsewhere"
                    ) from None
                time.sleep(0.01)

    # ---- open-time repair

    def _repair_tail(self) -> None:
        if self._size == 0 or os.pread(self._fd, 1, self._size - 1) == b"\n":
            return
        good = self._last_newline_end()
        tail = os.pread(self._fd, self._size - good, good)
        obj, _ = _parse(tail)
        if obj is not None and int(obj["seq"]) > self._scan_last_seq(end=good):
            # A whole record that lost only its newline: keep it.
            self._write_all(memoryview(b"\n"))
            self._size += 1
            _os_fsync(self._fd)
            self.repaired = RepairNote(good, len(tail), "completed", None)
            return
        entry: dict[str, Any] = {"t": iso_z(utc_now()), "offset": good, "length": len(tail)}
        try:
            entry["text"] = tail.decode("utf-8")
        except UnicodeDecodeError:
            entry["base64"] = base64.b64encode(tail).decode("ascii")
        # Save first, truncate second: a crash in between only duplicates the note.
        tfd = os.open(self.torn_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(tfd, orjson.dumps(entry) + b"\n")
            fsync_fd(tfd)
        finally:
            os.close(tfd)
        fsync_dir(self.path.parent)
        os.ftruncate(self._fd, good)
        fsync_fd(self._fd)
        self._size = good
        self.repaired = RepairNote(good, len(tail), "moved", self.torn_path)
        log.warning(
            "transcript %s: moved a torn last line (%d bytes at offset %d) to %s",
            self.path,
            len(tail),
            good,
            self.torn_path.name,
        )

    def _last_segment_seq(self) -> int:
        """The last seq of the newest rotated segment (the live file is new or empty)."""
        segments = segment_paths(self.path)
        if not segments:
            return 0
        last = 0
        reader = TranscriptReader(segments[-1])
        for rec in reader._read(segments[-1], 0):
            last = rec.seq
        return last

    def _last_newline_end(self) -> int:
        """Offset just past the last ``\\n`` in the file (0 if there is none)."""
        pos = self._size
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            chunk = os.pread(self._fd, step, pos)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return pos + idx + 1
        return 0

    def _scan_last_seq(self, end: int | None = None) -> int:
        """The seq of the last parseable record before ``end``, scanning backwards."""
        pos = self._size if end is None else end
        carry = b""
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            buf = os.pread(self._fd, step, pos) + carry
            parts = buf.split(b"\n")
            carry, complete = (parts[0], parts[1:]) if pos > 0 else (b"", parts)
            for raw in reversed(complete):
                if raw.strip():
                    obj, _ = _parse(raw)
                    if obj is not None:
                        return int(obj["seq"])
        return 0

    # ---- appending

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def pending(self) -> int:
        """Records held in memory because the disk refused them."""
        return len(self._pending)

    def append(self, kind: str, data: Any = None) -> dict[str, Any]:
        """Write one record and return it. Raises :class:`TranscriptWriteError` (record queued).

        ``data`` must be JSON-serialisable by orjson; a ``TypeError`` is raised
        before any seq is used if it is not.
        """
        with self._lock:
            self._check_open()
            record: dict[str, Any] = {
                "seq": self._next_seq,
                "t": _timestamp(),
                "kind": kind,
                "data": data,
            }
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
            if not self._pending and (self._size == 0 or self._size + len(line) <= self.max_bytes):
                # The common case, kept short (every pi line comes here): nothing
                # queued, no rotation due. The same steps as _drain, for one line.
                self._raise_sync_error()
                start = self._size
                self._next_seq += 1
                try:
                    self._write_all(memoryview(line))
                except OSError as exc:
                    self._undo_partial(start)
                    self._pending.append((record, line))
                    self._pending_bytes += len(line)
                    raise TranscriptWriteError(self.path, exc, record, 1) from exc
                self._size = start + len(line)
                if self._fsync_delay <= 0:
                    self._sync_now()
                else:
                    self._schedule_sync()
                return record
            if self._pending and (
                len(self._pending) >= self.max_pending
                or self._pending_bytes + len(line) > self.max_pending_bytes
            ):
                # The disk refused the queue's head and still does: do not grow.
                try:
                    self._drain()
                except TranscriptWriteError as exc:
                    raise TranscriptFull(
                        self.path,
                        OSError(exc.errno or errno.ENOSPC, os.strerror(exc.errno or errno.ENOSPC)),
                        record,
                        len(self._pending),
                    ) from exc
            self._next_seq += 1
            self._pending.append((record, line))
            self._pending_bytes += len(line)
            self._drain()
            return record

    def retry(self) -> int:
        """Write queued records now; returns how many were written."""
        with self._lock:
            self._check_open()
            before = len(self._pending)
            self._drain()
            return before

    def flush(self) -> None:
        """Write queued records and fsync now, whatever ``fsync_delay`` says."""
        with self._lock:
            self._check_open()
            self._drain(sync_now=True)

    def _drain(self, *, sync_now: bool = False) -> None:
        self._raise_sync_error()
        wrote = False
        while self._pending:
            record, line = self._pending[0]
            if self._size > 0 and self._size + len(line) > self.max_bytes:
                self._rotate()
            start = self._size
            try:
                self._write_all(memoryview(line))
            except OSError as exc:
                self._undo_partial(start)
                raise TranscriptWriteError(self.path, exc, record, len(self._pending)) from exc
            self._size = start + len(line)
            self._pending.popleft()
            self._pending_bytes -= len(line)
            wrote = True
        if wrote or sync_now:
            if self._fsync_delay <= 0 or sync_now:
                self._sync_now()
            else:
                self._schedule_sync()

    def _rotate(self) -> None:
        """Move the full file to the next ``transcript.<n>.jsonl`` and start a new one.

        Seqs continue across files; a ``transcript_rotated`` record in the new file
        names the segment before it, and deleting the oldest segment (beyond
        ``keep_segments``) is itself recorded: nothing goes silently.
        """
        segments = segment_paths(self.path)
        index = int(segments[-1].name.split(".")[-2]) + 1 if segments else 1
        target = self.path.with_name(f"{self.path.stem}.{index}{self.path.suffix}")
        try:
            os.rename(self.path, target)
            new_fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            log.warning("transcript %s: could not rotate (%s); growing instead", self.path, exc)
            return
        fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new file: nobody else has it
        old_fd, self._fd = self._fd, new_fd
        old_size, self._size = self._size, 0
        # The full segment is synced and closed by a thread: a 32 MiB fsync would
        # stall whoever is appending (the event loop).
        threading.Thread(
            target=_sync_and_close, args=(old_fd,), name="transcript-rotate", daemon=True
        ).start()
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)
        notes: list[tuple[str, dict[str, Any]]] = [
            (ROTATED_KIND, {"previous": target.name, "bytes": old_size})
        ]
        segments.append(target)
        while len(segments) > self.keep_segments:
            oldest = segments.pop(0)
            size = oldest.stat().st_size if oldest.exists() else 0
            dropped = {"file": oldest.name, "bytes": size}
            notes.append((DROPPED_KIND, dropped))
            # Noted first in a small side file that never rotates (so the note outlives
            # its segment), deleted second: a kill in between never drops a segment
            # without a word.
            with contextlib.suppress(OSError):
                side = os.open(
                    self.path.with_suffix(DROPPED_SUFFIX),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                    0o600,
                )
                try:
                    os.write(side, orjson.dumps({"t": iso_z(utc_now()), **dropped}) + b"\n")
                finally:
                    os.close(side)
            with contextlib.suppress(OSError):
                oldest.unlink()
            log.warning("transcript %s: deleted the oldest segment %s", self.path, oldest.name)
        # The notes take fresh seqs, so they follow the records already queued.
        for kind, data in notes:
            note = {"seq": self._next_seq, "t": iso_z(utc_now()), "kind": kind, "data": data}
            self._next_seq += 1
            line = orjson.dumps(note) + b"\n"
            self._pending.append((note, line))
            self._pending_bytes += len(line)

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            n = _os_write(self._fd, view[done:])
            if n <= 0:
                raise OSError(errno.EIO, "write() made no progress")
            done += n

    def _undo_partial(self, start: int) -> None:
        try:
            if os.fstat(self._fd).st_size > start:
                os.ftruncate(self._fd, start)
        except OSError:
            # The torn bytes stay; the next open moves them to transcript.torn.
            log.exception("transcript %s: could not truncate a partial line", self.path)

    def _sync_now(self) -> None:
        self._sync_due = None
        try:
            _os_fsync(self._fd)
        except OSError as exc:
            raise TranscriptWriteError(self.path, exc, None, 0, durable_only=True) from exc

    def _schedule_sync(self) -> None:
        if self._sync_due is None:
            self._sync_due = time.monotonic() + self._fsync_delay
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._sync_loop, name=f"transcript-sync:{self.path.parent.name}"
                )
                self._thread.daemon = True
                self._thread.start()
            self._cond.notify()

    def _sync_loop(self) -> None:
        with self._cond:
            while not self._closed:
                if self._sync_due is None:
                    self._cond.wait()
                    continue
                delay = self._sync_due - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._sync_due = None
                # fsync without the lock: appends (the event loop) must not wait for
                # the disk. A duplicate of the fd, so a rotate or close meanwhile
                # cannot pull the file from under the sync.
                try:
                    fd = os.dup(self._fd)
                except OSError as exc:
                    self._sync_error = exc
                    continue
                self._cond.release()
                try:
                    _os_fsync(fd)
                except OSError as exc:
                    self._sync_error = exc
                finally:
                    os.close(fd)
                    self._cond.acquire()

    def _raise_sync_error(self) -> None:
        if self._sync_error is not None:
            exc, self._sync_error = self._sync_error, None
            raise TranscriptWriteError(self.path, exc, None, 0, durable_only=True) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise TranscriptError(f"transcript {self.path} is closed")

    # ---- life cycle

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Write what is queued, fsync, release the file. Queued records that still
        cannot be written are logged as lost (the caller saw the error already)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._drain(sync_now=True)
            except TranscriptError:
                log.error(
                    "transcript %s closed with %d unwritten record(s)", self.path, self.pending
                )
            finally:
                self._closed = True
                self._cond.notify_all()
                os.close(self._fd)
        if self._thread is not None:
            self._thread.join(timeout=1)

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
