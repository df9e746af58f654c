"""``piwork changes TASK`` and ``piwork undo TASK``: review and roll back the agent's edits.

Both read the task's checkpoints (see :mod:`piwork.checkpoints`). ``changes``
lists what the agent added, modified or deleted in the whole task or in one
turn, with diffs; ``--json`` prints ``{"task", "turn", "limits": {"maxFileBytes",
"maxFiles"}, "checkpoints", "changes": [{"path", "status", "binary", "diff", "note"}]}``
(``note``: why a file has no diff). ``undo`` restores the
folder (or some files) and prints how to undo the undo.

Everything printed that came from the folder (file names, diffs, notes, error
messages naming files) goes through :mod:`piwork.textsafe`: the agent chose
those bytes, and a raw ESC could erase a diff line on screen or write the
clipboard. ``--json`` is ASCII-only JSON (every other character as ``\\uXXXX``)
for the same reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from piwork.checkpoints import (
    MAX_FILES,
    CheckpointError,
    TaskRunning,
    UndoConflict,
    list_checkpoints,
    task_changes,
    undo,
)
from piwork.tasks.settings import SettingsError, load_task_settings
from piwork.tasks.store import TaskStore, TaskStoreError
from piwork.textsafe import sanitize, sanitize_block


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "changes", help="show what the agent changed in a task's folder (per turn, with diffs)"
    )
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--turn", type=int, metavar="N", help="only what turn N changed")
    p.add_argument("--json", action="store_true", help="print checkpoints and changes as JSON")
    p.add_argument("--stat", action="store_true", help="list files only, no diffs")
    p.set_defaults(func=cmd_changes)

    p = subparsers.add_parser(
        "undo", help="restore a task's folder (or some files) to an earlier checkpoint"
    )
    p.add_argument("task_id", metavar="TASK")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--turn", type=int, metavar="N", help="undo only what turn N changed")
    which.add_argument(
        "--to", metavar="CHECKPOINT", help="go back to this checkpoint (default: task start)"
    )
    p.add_argument(
        "--file", action="append", metavar="PATH", help="only this file or folder (repeatable)"
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite files changed since the agent's changes"
    )
    p.set_defaults(func=cmd_undo)


def _full_id(task_id: str) -> str:
    with TaskStore() as store:
        return store.resolve_id(task_id)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _one(text: object) -> str:
    return sanitize(text, one_line=True)


def _fail(cmd: str, exc: Exception) -> None:
    print(f"piwork {cmd}: {sanitize_block(exc, indent='  ')}", file=sys.stderr)


def _max_file_bytes() -> int | None:
    try:
        return load_task_settings().checkpoint_max_file_bytes
    except SettingsError:  # reported by the commands that need the setting
        return None


def _limits() -> str:
    """The recording caps, shown with every review (what is beyond them is in no checkpoint)."""
    cap = _max_file_bytes()
    size = (
        f"files up to {cap / 1048576:.1f} MiB (tasks.checkpointMaxFileBytes)"
        if cap is not None
        else "files up to the tasks.checkpointMaxFileBytes size"
    )
    return (
        f"recorded: {size}, at most {MAX_FILES:,} files; ignored files too "
        "(no .gitignore applies); names git refuses and nested repositories are not"
    )


def cmd_changes(args: argparse.Namespace) -> int:
    try:
        task_id = _full_id(args.task_id)
        checkpoints = list_checkpoints(task_id)
        changes = task_changes(task_id, turn=args.turn) if checkpoints else []
    except (TaskStoreError, CheckpointError) as exc:
        _fail("changes", exc)
        return 1
    if args.json:
        out: dict[str, Any] = {
            "task": task_id,
            "turn": args.turn,
            "limits": {"maxFileBytes": _max_file_bytes(), "maxFiles": MAX_FILES},
            "checkpoints": [
                {
                    "id": c.id,
                    "turn": c.turn,
                    "label": c.label,
                    "createdAt": c.created_at,
                    "notes": list(c.notes),
                }
                for c in checkpoints
            ],
            "changes": [
                {
                    "path": c.path,
                    "status": c.status,
                    "binary": c.binary,
                    "diff": c.diff,
                    "note": c.note,
                }
                for c in changes
            ],
        }
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=True) + "\n")
        return 0
    if not checkpoints:
        print(f"task {task_id} has no checkpoints (no working folder, or it never ran)")
        return 0
    print("checkpoints:")
    for c in checkpoints:
        print(f"  {c.id[:12]}  {_when(c.created_at)}  {_one(c.label)}")
    print(_limits())
    notes = dict.fromkeys(n for c in checkpoints for n in c.notes)
    if notes:
        print("not recorded (in no checkpoint; undo never deletes them):")
        for n in notes:
            print(f"  {_one(n)}")
    scope = f"turn {args.turn}" if args.turn is not None else "the task"
    if not changes:
        print(f"no changes in {scope}")
        return 0
    print(f"changes in {scope}:")
    mark = {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}
    for ch in changes:
        extra = "  (binary)" if ch.binary else f"  ({_one(ch.note)})" if ch.note else ""
        print(f"  {mark.get(ch.status, '?')} {_one(ch.path)}{extra}")
    if not args.stat:
        for ch in changes:
            if ch.diff:
                print()
                text = sanitize_block(ch.diff)
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_undo(args: argparse.Namespace) -> int:
    try:
        task_id = _full_id(args.task_id)
        result = undo(task_id, turn=args.turn, to=args.to, files=args.file, force=args.force)
    except UndoConflict as exc:
        _fail("undo", exc)
        return 4
    except TaskRunning as exc:
        _fail("undo", exc)
        return 5
    except (TaskStoreError, CheckpointError) as exc:
        _fail("undo", exc)
        return 1
    if not result.restored and not result.removed:
        print("nothing to undo: those files are already as they were")
    for p in result.restored:
        print(f"restored {_one(p)}")
    for p in result.removed:
        print(f"removed  {_one(p)}")
    for p in result.skipped:
        print(
            f"left alone {_one(p)}: it cannot be checkpointed now, "
            "so overwriting it could not be undone"
        )
    for p in result.moved_aside:
        print(
            f"moved aside {_one(p)}: it is in no checkpoint and was in the way; "
            f"it is now {_one(result.aside_dir)}/{_one(p)}"
        )
    print(
        f"the folder as it was before this undo is checkpoint {result.checkpoint_before}; "
        f"`piwork undo {task_id} --to {result.checkpoint_before}` brings it back"
    )
    return 0
