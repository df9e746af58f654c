"""`piwork preview TASK [PORT]`: the URL of a running task's preview (``--open``: in the browser).

A preview exists while the process running the task is alive and the person
(or a rule) let the port open; that process writes the open previews to the
task's ``previews.json``, which this reads and checks (piwork.preview.state).
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.preview import read_previews
from piwork.tasks import TaskStore
from piwork.tasks.store import TaskNotFound


def cmd_preview(args: argparse.Namespace) -> int:
    store = TaskStore(get_paths().tasks)
    try:
        task = store.get(args.task)
    except TaskNotFound as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # ambiguous prefix, unreadable task: the message says which
        print(f"piwork: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    previews = read_previews(task.dir, task.id)
    if args.port is not None:
        previews = [p for p in previews if p.port == args.port]
    if not previews:
        which = f"port {args.port} of " if args.port is not None else ""
        print(
            f"piwork: {which}task {task.id} has no open preview: the task is not running, "
            "or no server in it was opened (the run's output says why; a port opens when "
            "you allow it, or with a rule: `piwork policy allow preview PORT`)",
            file=sys.stderr,
        )
        return 1
    for p in previews:
        if args.json:
            print(orjson.dumps({"task": task.id, **p.to_json()}).decode())
        else:
            print(p.url if len(previews) == 1 else f"{p.port}\t{p.url}")
    if args.open:
        webbrowser.open(previews[0].url)
    return 0


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return int(text)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="print (or open) the URL of a running task's preview",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", help="task id (a unique prefix is enough)")
    p.add_argument("port", nargs="?", type=_port, help="the guest port (default: every preview)")
    p.add_argument("--open", action="store_true", help="open it in the browser")
    p.add_argument("--json", action="store_true", help="one JSON object per preview")
    p.set_defaults(func=cmd_preview)
