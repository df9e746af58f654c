"""`piwork bench`: how long start-up and a demo task take on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from piwork.bench import REPO, BenchContext, Round, all_measurements, one_round, summarise
from piwork.pack import ensure_pack
from piwork.run.environment import probe  # the accelerator, as a run picks it
from piwork.run.request import Transport


def cmd_bench(args: argparse.Namespace) -> int:
    ensure_pack()  # building the pack is not what is measured
    if args.host is not None:
        return _bench_host(args)
    accel = probe(args.accel)
    print(f"accelerator: {accel.accel.value} ({accel.reason})", file=sys.stderr)
    ctx = BenchContext(Transport(args.transport), args.accel, args.memory)
    measurements = all_measurements()
    other = None
    if args.compare is not None:
        from piwork.cli import bench_compare

        print(f"building the pack of {args.compare} …", file=sys.stderr)
        other = bench_compare.prepare(args.compare)
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} …", file=sys.stderr)
        rounds.append(one_round(ctx, measurements))
        if other is not None:
            print(f"round {i + 1}/{args.rounds} of {args.compare} ({other.pi}) …", file=sys.stderr)
            bench_compare.one_round(other, args.transport, args.memory, args.accel)
    rows = summarise(rounds)
    load = os.getloadavg()
    notes = list(dict.fromkeys(ctx.notes))
    if other is not None:
        from piwork.cli import bench_compare

        for note in dict.fromkeys(other.notes):
            print(f"note ({other.pi}): {note}", file=sys.stderr)
        print(f"accelerator: {accel.accel.value}; load average {load[0]:.2f} {load[1]:.2f}; "
              f"{args.rounds} rounds each, alternating")  # fmt: skip
        ours = bench_compare.pi_version(REPO)
        for line in bench_compare.table(rounds, ours, other):
            print(line)
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        out = {k: {"median": med, "min": lo, "max": hi} for k, med, lo, hi in rows}
        doc = {
            "accel": accel.accel.value,
            "accel_reason": accel.reason,
            "rounds": args.rounds,
            "loadavg": [round(x, 2) for x in load],
            "notes": notes,
            "figures": out,
        }
        sys.stdout.write(orjson.dumps(doc).decode())
        sys.stdout.write("\n")
        return 0
    print(f"accelerator: {accel.accel.value}; load average {load[0]:.2f} {load[1]:.2f}")
    print(f"{'figure (seconds unless noted)':<40} {'median':>10} {'min':>10} {'max':>10}")
    for k, med, lo, hi in rows:
        print(f"{k:<40} {med:>10.2f} {lo:>10.2f} {hi:>10.2f}")
    return 0


def _bench_host(args: argparse.Namespace) -> int:
    """The start-up figures on a remote host, through a delaying relay (piwork.hosts.bench)."""
    from piwork.hosts import store
    from piwork.hosts.bench import run_rounds

    try:
        host = store.get(args.host)
    except store.HostError as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    delay = args.delay_ms / 1000
    print(f"host {host.name} ({host.target}) through a relay adding {args.delay_ms:g} ms "
          "each way", file=sys.stderr)  # fmt: skip
    rounds = []
    notes: list[str] = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} …", file=sys.stderr)
        figures, said = run_rounds(host, delay, 1)
        rounds.append(Round(figures[0]))
        notes += said
    rows = summarise(rounds)
    for note in dict.fromkeys(notes):
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        doc = {
            "host": host.name,
            "delay_ms_each_way": args.delay_ms,
            "rounds": args.rounds,
            "notes": list(dict.fromkeys(notes)),
            "figures": {k: {"median": med, "min": lo, "max": hi} for k, med, lo, hi in rows},
        }
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return 0
    print(f"host {host.name}; {args.delay_ms:g} ms added each way")
    print(f"{'figure (seconds unless noted)':<40} {'median':>10} {'min':>10} {'max':>10}")
    for k, med, lo, hi in rows:
        print(f"{k:<40} {med:>10.2f} {lo:>10.2f} {hi:>10.2f}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure VM start-up and a demo task on this machine")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--transport", choices=[t.value for t in Transport], default="virtio")
    p.add_argument("--accel", choices=["kvm", "hvf", "tcg"])
    p.add_argument("--memory", type=int, default=1024, help="guest MiB")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--compare",
        type=Path,
        metavar="DIR",
        help="also measure another piwork source tree (e.g. one pinning an older pi), "
        "round by round in the same run, and print both side by side",
    )
    p.add_argument(
        "--host",
        metavar="NAME",
        help="measure on a host added with `piwork hosts add` (cold, warm, steer latency)",
    )
    p.add_argument(
        "--delay-ms",
        type=float,
        default=50.0,
        help="with --host: delay a loopback relay adds to every chunk, each way (default 50)",
    )
    p.set_defaults(func=cmd_bench)
