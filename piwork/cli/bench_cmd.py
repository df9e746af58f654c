"""`piwork bench`: how long start-up and a demo task take on this machine."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from piwork.bench import one_round, summarise
from piwork.pack import ensure_pack
from piwork.vm.accel import probe
from piwork.vm.command import Transport


def cmd_bench(args: argparse.Namespace) -> int:
    ensure_pack()  # building the pack is not what is measured
    accel = probe(args.accel)
    print(f"accelerator: {accel.accel.value} ({accel.reason})", file=sys.stderr)
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} …", file=sys.stderr)
        rounds.append(asyncio.run(one_round(Transport(args.transport), args.accel, args.memory)))
    rows = summarise(rounds)
    if args.json:
        out = {k: {"median": med, "min": lo, "max": hi} for k, med, lo, hi in rows}
        sys.stdout.write(orjson.dumps({"accel": accel.accel.value, "figures": out}).decode())
        sys.stdout.write("\n")
        return 0
    print(f"{'figure (seconds unless noted)':<34} {'median':>8} {'min':>8} {'max':>8}")
    for k, med, lo, hi in rows:
        print(f"{k:<34} {med:>8.2f} {lo:>8.2f} {hi:>8.2f}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure VM start-up and a demo task on this machine")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--transport", choices=[t.value for t in Transport], default="virtio")
    p.add_argument("--accel", choices=["kvm", "hvf", "tcg"])
    p.add_argument("--memory", type=int, default=1024, help="guest MiB")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
