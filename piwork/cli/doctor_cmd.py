"""`piwork doctor`: what is present, what is missing, and how to fix it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.doctor import run_checks


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = run_checks(get_paths())
    if args.json:
        sys.stdout.write(orjson.dumps([c.to_dict() for c in checks]).decode() + "\n")
    else:
        for c in checks:
            mark = "✓" if c.ok and not c.warning else ("!" if c.ok else "✗")
            print(f"{mark} {c.name:<18} {c.detail}")
            if c.fix and (not c.ok or c.warning):
                print(f"  {'':<18} fix: {c.fix}")
    return 0 if all(c.ok for c in checks) else 1


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check QEMU, the accelerator, the pack and disk space")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
