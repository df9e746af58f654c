"""``piwork bench --compare DIR``: the same figures for another piwork source tree (e.g.
one that still pins an older pi), measured in the same run, round by round.

The other tree is measured by its own code (``python -m piwork.cli.main bench`` with
that tree first on ``PYTHONPATH``, this interpreter, this machine's piwork home): its
pack is built from its own sources and its pi is started the way that piwork starts
it, so the host never has to speak an older pi. Rounds alternate (this tree, then the
other) so both meet the same machine load.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from piwork.bench import COLD, NATIVE, WARM, Round
from piwork.errors import UsageError

TIMEOUT = 3600.0


class CompareError(UsageError):
    """The other tree cannot be measured; the message says why."""


@dataclass
class Other:
    source: Path
    rounds: list[Round] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def pi(self) -> str:
        return pi_version(self.source)


def pi_version(source: Path) -> str:
    """The pi a source tree pins (runtime-pack/pi/package.json), as ``name version``."""
    try:
        deps = json.loads((source / "runtime-pack" / "pi" / "package.json").read_text())
        deps = deps["dependencies"]
        name = next(n for n in deps if n.endswith("/pi-coding-agent"))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        raise CompareError(f"{source} pins no pi in runtime-pack/pi/package.json: {exc}") from exc
    return f"pi {deps[name]}"


def _run(source: Path, *args: str, timeout: float = TIMEOUT) -> str:
    env = {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", *args],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise CompareError(
            f"`piwork {' '.join(args)}` in {source} failed (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()[-2000:]}"
        )
    return proc.stdout


def prepare(source: Path) -> Other:
    """Check the tree and build its pack (not what is measured)."""
    source = source.resolve()
    if not (source / "piwork" / "__init__.py").is_file():
        raise CompareError(f"{source} is not a piwork source tree (no piwork/__init__.py)")
    other = Other(source)
    other.pi  # noqa: B018  (fails early on a tree without a pin)
    _run(source, "pack", "build")
    return other


def one_round(other: Other, transport: str, memory: int, accel: str | None) -> None:
    args = ["bench", "--rounds", "1", "--json", "--transport", transport, "--memory", str(memory)]
    if accel is not None:
        args += ["--accel", accel]
    doc = json.loads(_run(other.source, *args).strip().splitlines()[-1])
    other.rounds.append(Round({k: float(v["median"]) for k, v in doc["figures"].items()}))
    other.notes += [str(n) for n in doc.get("notes", [])]


def _median(rounds: list[Round], key: str) -> float | None:
    vals = [r.figures[key] for r in rounds if key in r.figures]
    return statistics.median(vals) if vals else None


def table(ours: list[Round], ours_pi: str, other: Other) -> list[str]:
    """The side-by-side lines: every figure either side has, then each side's start-up
    as a multiple of its own native pi start."""
    keys = list(dict.fromkeys([k for r in ours for k in r.figures] +
                              [k for r in other.rounds for k in r.figures]))  # fmt: skip
    width = max([40, *(len(k) for k in keys)])
    head = f"{'figure (seconds unless noted), medians':<{width}} {ours_pi:>14} {other.pi:>14}"
    lines = [head]
    for k in keys:
        a, b = _median(ours, k), _median(other.rounds, k)
        fa = f"{a:>14.2f}" if a is not None else f"{'-':>14}"
        fb = f"{b:>14.2f}" if b is not None else f"{'-':>14}"
        lines.append(f"{k:<{width}} {fa} {fb}")
    for label, key in (("cold start / native pi start (x)", COLD),
                       ("warm start / native pi start (x)", WARM)):  # fmt: skip
        ratios = []
        for rounds in (ours, other.rounds):
            fig, native = _median(rounds, key), _median(rounds, NATIVE)
            ratios.append(f"{fig / native:>14.2f}" if fig and native else f"{'-':>14}")
        lines.append(f"{label:<{width}} {ratios[0]} {ratios[1]}")
    return lines
