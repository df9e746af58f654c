"""`piwork policy ...`: list, add, remove and reset permission rules; read the audit log."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

import orjson

from piwork.jsonstore import NothingToRestore
from piwork.policy.audit import AuditLog
from piwork.policy.rules import DEFAULT_RULES, Action, Rule, Scope, Verdict
from piwork.policy.store import PolicyError, PolicyStore
from piwork.textsafe import sanitize

ACTIONS = [a.value for a in Action]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = subparsers.add_parser(
        "policy", help="permission rules the agent's tool calls are judged by"
    )
    sub = policy.add_subparsers(dest="policy_command", metavar="ACTION")

    p = sub.add_parser("list", help="list rules (yours, then the built-in defaults)")
    p.add_argument("--json", action="store_true", help="print the rules as JSON")
    p.set_defaults(func=cmd_list)
    policy.set_defaults(func=cmd_list, json=False)

    for verdict, text in (
        (Verdict.ALLOW, "run without asking"),
        (Verdict.DENY, "refuse without asking"),
        (Verdict.ASK, "always ask"),
    ):
        p = sub.add_parser(verdict.value, help=f"add a rule: {text}")
        p.add_argument("action", choices=ACTIONS, metavar="ACTION", help=", ".join(ACTIONS))
        p.add_argument(
            "pattern",
            nargs="?",
            help="path glob (read/write/delete/move/outside-scope), domain (network), "
            "command prefix (shell) or tool name (connector); omit for all",
        )
        where = p.add_mutually_exclusive_group()
        where.add_argument("--folder", metavar="DIR", help="only for tasks on this folder")
        where.add_argument("--task", metavar="ID", help="only for this task")
        p.add_argument("--note", help="why (shown by list)")
        p.add_argument("--json", action="store_true", help="print the new rule as JSON")
        p.set_defaults(func=cmd_add, verdict=verdict.value)

    p = sub.add_parser("rm", help="remove a rule by id (or unique id prefix)")
    p.add_argument("rule_id", metavar="ID")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser(
        "restore",
        help="put back the last good copy of a damaged policy file (the damaged one is kept)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("reset", help="remove all your rules (the defaults remain)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reset)

    p = sub.add_parser("log", help="show the audit log of decisions")
    p.add_argument("--task", metavar="ID", help="only this task (id or prefix)")
    p.add_argument("-n", "--limit", type=int, default=50, help="last N entries (0: all)")
    p.add_argument("--json", action="store_true", help="print entries as JSON lines")
    p.set_defaults(func=cmd_log)


def _error(msg: str) -> int:
    print(f"piwork: {msg}", file=sys.stderr)  # one prefix for every error (piwork.cli.main)
    return 1


def _print_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _table(rows: Iterable[list[str]], header: list[str]) -> str:
    # Patterns and logged targets come from guest requests: one line each, escaped.
    all_rows = [header, *([sanitize(c, one_line=True) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in all_rows
    )


def _rule_row(r: Rule) -> list[str]:
    return [
        r.id,
        r.verdict.value,
        r.action.value,
        r.pattern or "*",
        r.scope.describe(),
        r.note or "",
    ]


def cmd_list(args: argparse.Namespace) -> int:
    store = PolicyStore()
    try:
        rules = store.load()
    except PolicyError as exc:  # a damaged file: say what happened, and fail
        return _error(str(exc))
    if args.json:
        _print_json(
            {
                "file": str(store.path),
                "rules": [r.to_json() for r in rules],
                "defaults": [r.to_json() for r in DEFAULT_RULES],
            }
        )
        return 0
    header = ["ID", "VERDICT", "ACTION", "PATTERN", "SCOPE", "NOTE"]
    if rules:
        print(f"Your rules ({store.path}):")
        print(_table((_rule_row(r) for r in rules), header))
    else:
        print(f"No rules of your own yet ({store.path}).")
    print()
    print("Built-in defaults (any rule of yours overrides them):")
    print(_table((_rule_row(r) for r in DEFAULT_RULES), header))
    print()
    print("Precedence: task > folder > global > defaults; at one level deny wins, then")
    print("rules with a pattern, then ask over allow.")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    if args.folder:
        scope = Scope.folder(args.folder)
    elif args.task:
        scope = Scope.task(args.task)
    else:
        scope = Scope.global_()
    rule = Rule(
        action=Action(args.action),
        verdict=Verdict(args.verdict),
        scope=scope,
        pattern=args.pattern or None,
        note=args.note,
    )
    store = PolicyStore()
    try:
        store.add(rule)
    except (PolicyError, OSError) as exc:
        return _error(f"cannot save the rule: {exc}")
    if args.json:
        _print_json(rule.to_json())
    else:
        print(f"added {rule.id}: {rule.describe()}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    store = PolicyStore()
    try:
        removed = store.remove(args.rule_id)
    except (PolicyError, OSError) as exc:
        return _error(str(exc))
    if removed is None:
        if args.rule_id.startswith("default-"):
            return _error(
                f"{args.rule_id} is a built-in default; override it with allow/deny/ask instead"
            )
        return _error(f"no rule with id {args.rule_id!r} (or the prefix is ambiguous)")
    if args.json:
        _print_json(removed.to_json())
    else:
        print(f"removed {removed.id}: {removed.describe()}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    store = PolicyStore()
    damage = store.check()
    if damage is not None:
        # Starting over is the person's choice; make sure they see what they replace.
        print(f"piwork: {damage}", file=sys.stderr)
    if not args.yes:
        if not sys.stdin.isatty():
            return _error("reset removes all your rules; pass --yes to confirm")
        answer = input(f"Remove all rules in {store.path}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing changed")
            return 1
    try:
        count = store.reset()
    except (PolicyError, OSError) as exc:
        return _error(str(exc))
    if args.json:
        _print_json({"removed": count})
    else:
        print(f"removed {count} rule(s); the built-in defaults apply")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    store = PolicyStore()
    try:
        restored = store.restore()
        rules = store.load()
    except (PolicyError, NothingToRestore, OSError) as exc:
        return _error(str(exc))
    if args.json:
        _print_json(
            {
                "file": str(restored.path),
                "from": str(restored.source),
                "damagedCopy": str(restored.kept) if restored.kept else None,
                "rules": [r.to_json() for r in rules],
            }
        )
        return 0
    print(f"restored {restored.path} from {restored.source}: {len(rules)} rule(s) of yours")
    if restored.kept is not None:
        print(f"the damaged file is kept at {restored.kept}")
    print("see them with `piwork policy list`")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    audit = AuditLog()
    entries = [
        e for e in audit.read() if not args.task or str(e.get("task") or "").startswith(args.task)
    ]
    if args.limit > 0:
        entries = entries[-args.limit :]
    if args.json:
        for e in entries:
            sys.stdout.write(orjson.dumps(e).decode() + "\n")
        return 0
    if not entries:
        print(f"No decisions logged yet ({audit.path}).")
        return 0
    rows = []
    for e in entries:
        who = str(e.get("decidedBy") or "")
        if e.get("rule"):
            who += f" ({e['rule']})"
        rows.append(
            [
                str(e.get("time") or "")[:19].replace("T", " "),
                str(e.get("task") or "-")[:12],
                str(e.get("action") or ""),
                str(e.get("decision") or ""),
                who,
                _clip(str(e.get("command") or e.get("target") or ""), 60),
            ]
        )
    print(_table(rows, ["TIME (UTC)", "TASK", "ACTION", "DECISION", "BY", "TARGET"]))
    return 0


def _clip(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"
