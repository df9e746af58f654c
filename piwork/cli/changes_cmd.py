"""``piwork changes``, ``piwork undo`` and ``piwork apply``: review, roll back, and answer.

``changes`` lists what piwork applied to the folder for the task (or one
turn), with diffs, and what waits for the person (:mod:`piwork.changes.api`);
``--json`` prints ``{"task", "turn", "limits": {"maxFileBytes"}, "checkpoints",
"changes": [{"path", "status", "binary", "diff", "note"}], "waiting": [{"path",
"root", "kind", "why", "status", "binary", "diff", "note"}]}`` (``note``: why a
file has no diff). ``undo`` restores the folder (or some files) and prints how
to undo the undo. ``apply`` applies waiting changes (or keeps them out) as
the person's answer.

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

from piwork.changes.api import WaitingChange, apply_waiting, keep_out, waiting_changes
from piwork.checkpoints import (
    CheckpointError,
    TaskRunning,
    UndoConflict,
    list_checkpoints,
    task_changes,
    undo,
)
from piwork.policy import Choice
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

    p = subparsers.add_parser(
        "apply",
        help="apply what waits for you: the agent's deletes, moves and host-runnable files",
    )
    p.add_argument("task_id", metavar="TASK")
    p.add_argument(
        "path", nargs="*", metavar="PATH", help="only these (a path, or a folder it waits under)"
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--keep-out", action="store_true", help="no: your folder keeps its version")
    how.add_argument(
        "--folder", action="store_true", help="yes, and always for these in this folder"
    )
    how.add_argument("--everywhere", action="store_true", help="yes, and always, everywhere")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--list", action="store_true", help="only list what waits, with diffs")
    p.set_defaults(func=cmd_apply)


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
    """What a checkpoint keeps, shown with every review."""
    cap = _max_file_bytes()
    size = f"{cap / 1048576:.1f} MiB" if cap is not None else "tasks.checkpointMaxFileBytes"
    return (
        "each checkpoint keeps the previous version of every path piwork changed "
        f"(a file of yours over {size} is not replaced without asking)"
    )


def _waiting_json(w: WaitingChange) -> dict[str, Any]:
    return {"path": w.path, "root": w.root, "kind": w.kind, "why": w.why, "status": w.status,
            "binary": w.binary, "diff": w.diff, "note": w.note}  # fmt: skip


def _print_waiting(task_id: str, waiting: list[WaitingChange], *, diffs: bool) -> None:
    if not waiting:
        return
    print("waiting for you (in the agent's copy, not in your folder):")
    for w in waiting:
        extra = f" (under {_one(w.root)})" if w.root != w.path else ""
        print(f"  {MARK.get(w.status, '?')} {_one(w.path)}{extra}: {_one(w.why)}")
    print(f"  `piwork apply {task_id}` applies them (or `--keep-out`); `--list` shows the diffs")
    if diffs:
        for w in waiting:
            if w.diff:
                print()
                text = sanitize_block(w.diff)
                sys.stdout.write(text if text.endswith("\n") else text + "\n")


MARK = {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}


def cmd_changes(args: argparse.Namespace) -> int:
    try:
        task_id = _full_id(args.task_id)
        checkpoints = list_checkpoints(task_id)
        changes = task_changes(task_id, turn=args.turn) if checkpoints else []
        waiting = waiting_changes(task_id, diffs=not args.stat) if args.turn is None else []
    except (TaskStoreError, CheckpointError) as exc:
        _fail("changes", exc)
        return 1
    if args.json:
        out: dict[str, Any] = {
            "task": task_id,
            "turn": args.turn,
            "limits": {"maxFileBytes": _max_file_bytes()},
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
            "waiting": [_waiting_json(w) for w in waiting],
        }
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=True) + "\n")
        return 0
    if not checkpoints and not waiting:
        print(f"task {task_id} has no checkpoints (no working folder, or it never ran)")
        return 0
    print("checkpoints:")
    for c in checkpoints:
        print(f"  {c.id[:12]}  {_when(c.created_at)}  {_one(c.label)}")
    print(_limits())
    notes = dict.fromkeys(n for c in checkpoints for n in c.notes)
    if notes:
        print("notes:")
        for n in notes:
            print(f"  {_one(n)}")
    scope = f"turn {args.turn}" if args.turn is not None else "the task"
    if not changes:
        print(f"no changes applied in {scope}")
        _print_waiting(task_id, waiting, diffs=not args.stat)
        return 0
    print(f"changes applied in {scope}:")
    for ch in changes:
        extra = "  (binary)" if ch.binary else f"  ({_one(ch.note)})" if ch.note else ""
        print(f"  {MARK.get(ch.status, '?')} {_one(ch.path)}{extra}")
    if not args.stat:
        for ch in changes:
            if ch.diff:
                print()
                text = sanitize_block(ch.diff)
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
    _print_waiting(task_id, waiting, diffs=not args.stat)
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


def cmd_apply(args: argparse.Namespace) -> int:
    try:
        task_id = _full_id(args.task_id)
        waiting = waiting_changes(task_id, diffs=True)
    except (TaskStoreError, CheckpointError) as exc:
        _fail("apply", exc)
        return 1
    wanted = [p.strip("/") for p in args.path]
    chosen = [w for w in waiting if not wanted or any(
        w.path == p or w.path.startswith(p + "/") or w.root == p for p in wanted)]  # fmt: skip
    if not chosen:
        print(f"nothing of task {task_id} waits for you" + (" there" if wanted else ""))
        return 0
    _print_waiting(task_id, chosen, diffs=args.list)
    if args.list:
        return 0
    roots = sorted({w.root for w in chosen})
    if not args.yes:
        verb = "keep these out of your folder" if args.keep_out else "apply these to your folder"
        if not sys.stdin.isatty():
            print(f"piwork apply: no terminal to confirm; add --yes to {verb}", file=sys.stderr)
            return 2
        answer = input(f"{verb}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing changed")
            return 0
    try:
        if args.keep_out:
            n = keep_out(task_id, roots)
            print(f"kept out of your folder: {n} path(s); the agent's copy keeps them")
            return 0
        choice = (
            Choice.ALWAYS_FOLDER if args.folder
            else Choice.ALWAYS_EVERYWHERE if args.everywhere
            else Choice.ALLOW_ONCE
        )  # fmt: skip
        result = apply_waiting(task_id, roots, choice=choice)
    except TaskRunning as exc:
        _fail("apply", exc)
        return 5
    except (TaskStoreError, CheckpointError, OSError) as exc:
        _fail("apply", exc)
        return 1
    for path, status in result.applied:
        print(f"{MARK.get(status, '?')} {_one(path)}")
    for path, beside in result.conflicts:
        where = f"; the agent's version is {_one(beside)}" if beside else ""
        print(f"conflict: you changed {_one(path)} since; your version stays{where}")
    for rule in result.rules:
        print(f"rule saved: {_one(rule)}")
    if result.checkpoint:
        print(
            f"recorded as a checkpoint: `piwork changes {task_id}` shows it, "
            "`piwork undo` reverts it"
        )
    return 0
