"""``piwork tasks list | show | rm | export``: the task store from the command line.

Every command first runs start-up recovery (:meth:`TaskStore.mark_interrupted`),
so a task whose owner died shows as ``interrupted``, never as still running.

``export`` writes a ``.tar.gz`` holding ``<id>/task.json``,
``<id>/transcript.jsonl`` (and ``transcript.torn`` if present) and
``<id>/export.json`` (format, time, piwork version); ``--files`` adds
``state/``, ``outputs/`` and ``uploads/``. A tarball rather than one JSON file
so the transcript is carried byte for byte, however large, and so the same
format can take the task's files.

Task records hold guest text (a stop message carries the supervisor's and pi's
words; the transcript is the agent's): every such string is printed through
:mod:`piwork.textsafe`, and ``--json`` is ASCII-only JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Any

import orjson

from piwork import __version__, sharefs
from piwork.checkpoints import CheckpointError, checkpoints_size, gc_task, tree_size
from piwork.env import EnvStore, allocated_bytes
from piwork.fsutil import atomic_writer
from piwork.tasks.model import ACTIVE_STATUSES, TaskStatus, iso_z, utc_now
from piwork.tasks.store import SUBDIRS, Task, TaskStore, TaskStoreError
from piwork.tasks.transcript import (
    DROPPED_SUFFIX,
    TORN_SUFFIX,
    TranscriptReader,
    segment_paths,
)
from piwork.textsafe import sanitize, sanitize_block

EXPORT_FORMAT = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = subparsers.add_parser("tasks", help="list, inspect, remove and export tasks")
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION")

    p = sub.add_parser("list", help="list tasks (stopped ones only with --all)")
    p.add_argument("--json", action="store_true", help="print the task records as JSON")
    p.add_argument("--all", action="store_true", help="include stopped tasks")
    p.set_defaults(func=cmd_list)
    tasks.set_defaults(func=cmd_list, json=False, all=False)

    p = sub.add_parser("show", help="show one task (ID may be a unique prefix)")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--transcript", action="store_true", help="also print the transcript")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("rm", help="delete a task and all its files")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("--force", action="store_true", help="even if it is running or in use")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("export", help="write a task's record and transcript to a .tar.gz")
    p.add_argument("task_id", metavar="ID")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="archive to write ('-' for stdout; default piwork-task-ID.tar.gz)",
    )
    p.add_argument(
        "--files", action="store_true", help="also include state/, outputs/ and uploads/"
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "gc", help="remove stored versions that no checkpoint or waiting change needs any more"
    )
    p.add_argument("--max-bytes", type=int, metavar="N", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gc)


def _error(msg: str) -> int:
    # one prefix for every error (piwork.cli.main); the message may quote guest text
    print(f"piwork: {sanitize_block(msg, indent='  ')}", file=sys.stderr)
    return 1


def _open_store() -> TaskStore:
    store = TaskStore()
    try:
        for task_id in store.mark_interrupted():
            print(f"piwork tasks: task {task_id} was interrupted", file=sys.stderr)
    except (TaskStoreError, OSError) as exc:
        print(f"piwork tasks: start-up recovery failed: {exc}", file=sys.stderr)
    return store


def _print_json(obj: Any) -> None:
    """ASCII-only JSON: guest text in it reaches the terminal as ``\\uXXXX``, never raw."""
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=True) + "\n")


def _status_text(task: Task) -> str:
    rec = task.record
    if rec.status is TaskStatus.STOPPED and rec.stop is not None:
        detail = rec.stop.reason.value
        if rec.stop.limit is not None:
            detail += f": {rec.stop.limit.value}"
        return f"stopped ({detail})"
    if rec.status is TaskStatus.INTERRUPTED and rec.interrupted_from is not None:
        return f"interrupted (was {rec.interrupted_from.value})"
    return rec.status.value


def _age(task: Task) -> str:
    seconds = max(0.0, (utc_now() - task.record.updated_at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def cmd_list(args: argparse.Namespace) -> int:
    with _open_store() as store:
        result = store.scan()
    for problem in result.problems:
        print(f"piwork tasks: {sanitize_block(problem.message)}", file=sys.stderr)
    shown = [
        t for t in reversed(result.tasks) if args.all or t.record.status is not TaskStatus.STOPPED
    ]
    hidden = len(result.tasks) - len(shown)
    if args.json:
        _print_json([t.record.to_json_dict() for t in shown])
        return 0
    if not shown:
        print("no tasks" + (f" ({hidden} stopped; use --all)" if hidden else ""))
        return 0
    rows = [("ID", "STATUS", "UPDATED", "TITLE")]
    rows += [
        (t.id, _status_text(t), _age(t), sanitize(t.record.title, one_line=True)) for t in shown
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3])
    if hidden:
        print(f"({hidden} stopped task(s) not shown; use --all)")
    return 0


def _transcript_json(task: Task) -> tuple[list[dict[str, Any]], list[str]]:
    reader = TranscriptReader(task.transcript_path)
    records = [{"seq": r.seq, "t": r.t, "kind": r.kind, "data": r.data} for r in reader]
    return records, [str(p) for p in reader.problems]


def _env_json(task_dir: Path) -> dict[str, Any] | None:
    """The task's writable environment disk (piwork.env): space used, its cap, its base."""
    env = EnvStore(task_dir.parent.parent / "envs", task_dir.parent).task_env(task_dir)
    if env is None:
        return None
    return {
        "disk": str(env.disk),
        "bytes": allocated_bytes(env.disk),
        "cap": env.size,
        "base": env.base,
    }


def _env_text(task_dir: Path) -> str:
    env = _env_json(task_dir)
    if env is None:
        return "(none)"
    base = f"on layer {env['base']}" if env["base"] else "from the clean workbench"
    return f"{env['bytes'] / 1e6:.1f} MB used of {env['cap'] / 2**30:.0f} GiB, {base}"


def cmd_show(args: argparse.Namespace) -> int:
    with _open_store() as store:
        # A TaskStoreError (no such task, ambiguous id) is shown by piwork.cli.main.
        task = store.get(args.task_id)
        owner = store.owner(task.id)
    problems: list[str] = []
    if args.json:
        out: dict[str, Any] = {"task": task.record.to_json_dict(), "dir": str(task.dir)}
        out["bytes"], out["checkpointBytes"] = tree_size(task.dir), checkpoints_size(task)
        out["environment"] = _env_json(task.dir)
        if args.transcript:
            out["transcript"], problems = _transcript_json(task)
        _print_json(out)
    else:
        rec = task.record
        usage = rec.usage
        lim = rec.limits
        lines = [
            ("id", rec.id),
            ("title", rec.title),
            ("status", _status_text(task)),
            ("created", iso_z(rec.created_at)),
            ("updated", f"{iso_z(rec.updated_at)} ({_age(task)})"),
            ("folder", str(rec.working_folder) if rec.working_folder else "(none yet)"),
            ("model", rec.model or "(default)"),
            (
                "usage",
                f"{usage.turns} turns, {usage.total_tokens} tokens "
                f"({usage.input_tokens} in, {usage.output_tokens} out, "
                f"{usage.cache_read_tokens} cache read, {usage.cache_write_tokens} cache write), "
                f"${usage.cost_usd:.4f}, {rec.wall_seconds():.0f}s running",
            ),
            (
                "limits",
                f"turns {lim.max_turns or '∞'}, wall time "
                f"{f'{lim.max_wall_time_seconds:.0f}s' if lim.max_wall_time_seconds else '∞'}, "
                f"tokens {lim.max_tokens or '∞'}, cost "
                f"{f'${lim.max_cost_usd:.2f}' if lim.max_cost_usd else '∞'}",
            ),
            ("dir", str(task.dir)),
            ("size", _size_text(task)),
            ("env", _env_text(task.dir)),
        ]
        if rec.stop is not None and rec.stop.message:
            lines.insert(3, ("message", rec.stop.message))
        if owner is not None:
            lines.append(("owner", f"process {owner.pid} on {owner.hostname} since {owner.since}"))
        for key, value in lines:
            # Continuation lines are indented: guest text cannot pass for a field of ours.
            print(f"{key:>8}  {sanitize_block(value, indent=' ' * 10)}")
        if args.transcript:
            print()
            reader = TranscriptReader(task.transcript_path)
            for r in reader:
                data = json.dumps(r.data, ensure_ascii=True) if r.data is not None else ""
                if len(data) > 120:
                    data = data[:119] + "…"
                kind = sanitize(r.kind, one_line=True)
                print(f"{r.seq:>6}  {sanitize(r.t, one_line=True)}  {kind:<18} {data}")
            problems = [str(p) for p in reader.problems]
    for problem in problems:
        print(f"piwork tasks: transcript {sanitize_block(problem)}", file=sys.stderr)
    return 0


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _size_text(task: Task) -> str:
    return f"{_mib(tree_size(task.dir))} (checkpoints {_mib(checkpoints_size(task))})"


def cmd_gc(args: argparse.Namespace) -> int:
    """Checkpoints: drop stored versions nothing names (a checkpoint's cost already
    follows what changed; none is dropped)."""
    with _open_store() as store:
        for task in store.list():
            try:
                res = gc_task(store, task, args.max_bytes)
            except (CheckpointError, TaskStoreError, OSError) as exc:
                print(f"piwork tasks gc: {task.id}: {exc}", file=sys.stderr)
                continue
            if res is None:
                continue
            dropped = f", dropped the {res.dropped} oldest checkpoints" if res.dropped else ""
            print(f"{task.id}: {_mib(res.bytes_before)} -> {_mib(res.bytes_after)}{dropped}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    with _open_store() as store:
        full = store.resolve_id(args.task_id)  # errors: shown by piwork.cli.main
        store.rm(full, force=args.force)
    print(f"removed task {full}")
    return 0


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


def write_export(task: Task, out: IO[bytes], *, files: bool = False) -> None:
    """Write the export tarball for ``task`` to the binary stream ``out``."""
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        meta = {
            "format": EXPORT_FORMAT,
            "exportedAt": iso_z(utc_now()),
            "piwork": __version__,
            "taskId": task.id,
        }
        _add_bytes(tar, f"{task.id}/export.json", orjson.dumps(meta, option=orjson.OPT_INDENT_2))
        _add_bytes(
            tar,
            f"{task.id}/task.json",
            orjson.dumps(task.record.to_json_dict(), option=orjson.OPT_INDENT_2),
        )
        transcript = task.transcript_path
        for path in (
            *segment_paths(transcript),  # rotated segments, oldest first
            transcript,
            transcript.with_suffix(TORN_SUFFIX),
            transcript.with_suffix(DROPPED_SUFFIX),
        ):
            if path.exists():
                tar.add(path, arcname=f"{task.id}/{path.name}", recursive=False)
        if files:
            for sub in SUBDIRS:
                if (task.dir / sub).is_dir():
                    _add_share(tar, task.dir / sub, f"{task.id}/{sub}")


def _add_share(tar: tarfile.TarFile, root: Path, arcname: str) -> None:
    """Add a share the guest can write without following anything it planted there.

    Entries are listed with ``lstat`` and every file is opened beneath ``root``
    with ``O_NOFOLLOW`` and checked with ``fstat``: a link stays a link in the
    archive and a file swapped for a link after the listing is skipped, so an
    export can never pick up host files from outside the share.
    """
    dir_info = tarfile.TarInfo(arcname)
    dir_info.type = tarfile.DIRTYPE
    dir_info.mode = 0o700
    dir_info.mtime = int(time.time())
    tar.addfile(dir_info)
    for entry in sharefs.walk_beneath(root):
        name = f"{arcname}/{entry.path}"
        info = tarfile.TarInfo(name)
        info.mtime = int(entry.stat.st_mtime)
        info.mode = entry.stat.st_mode & 0o777
        try:
            if entry.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.is_link:
                info.type = tarfile.SYMTYPE
                info.linkname = sharefs.readlink_beneath(root, entry.path)
                tar.addfile(info)
            elif entry.is_file:
                fd = sharefs.open_beneath(root, entry.path, os.O_RDONLY | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    info.size = st.st_size
                    tar.addfile(info, _Exactly(fh, st.st_size))
            # FIFOs, sockets and device nodes are never opened or archived.
        except OSError as exc:
            print(f"piwork tasks: skipped {name}: {exc.strerror or exc}", file=sys.stderr)


class _Exactly(io.RawIOBase):
    """``size`` bytes of ``fh``, zero-padded if the file shrank while it was read."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self._fh = fh
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n < 0 else min(n, self._left)
        data = self._fh.read(n) or b"\0" * n
        self._left -= len(data)
        return data


def cmd_export(args: argparse.Namespace) -> int:
    with _open_store() as store:
        task = store.get(args.task_id)  # errors: shown by piwork.cli.main
    if task.record.status in ACTIVE_STATUSES:
        print(
            f"piwork tasks: note: task {task.id} is {task.record.status.value}; "
            "the export is a snapshot",
            file=sys.stderr,
        )
    if args.output == "-":
        write_export(task, sys.stdout.buffer, files=args.files)
        sys.stdout.buffer.flush()
        return 0
    target = Path(args.output or f"piwork-task-{task.id}.tar.gz").expanduser()
    try:  # a failed export leaves no half archive (piwork.fsutil, the one durable writer)
        with atomic_writer(target) as fh:
            write_export(task, fh, files=args.files)
    except OSError as exc:
        return _error(f"cannot write {target}: {exc.strerror or exc}")
    print(f"exported task {task.id} to {target}")
    return 0
