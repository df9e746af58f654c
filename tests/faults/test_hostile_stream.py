"""A hostile guest against the real host stack (benchmarks/hostile.py, run in a child
process so its peak memory is its own): nothing the guest wrote is lost by the
parser, memory stays bounded, the host stays responsive, and stopping is quick.

Short runs here; the soak variants (PIWORK_SOAK=1) last a minute each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEAK_RSS_MIB = 400  # the reader's 64 MiB line limit (x2 while skipping) plus the stack


def hostile(scenario: str, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.hostile", scenario, str(seconds)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    print(result)
    return result


def check(result: dict[str, Any]) -> None:
    # Every line reaches the RPC layer as an item (an oversized one as its report).
    assert result["host_items"] == result["guest_lines"], "the host lost or invented lines"
    assert result["stop_s"] < 2, "stopping took too long"
    assert result["peak_rss_mib"] < PEAK_RSS_MIB, "memory not bounded"
    assert result["transcript_bytes"] < 5 * 32 * 1024 * 1024 + (1 << 20), "transcript unbounded"


def test_a_flood_of_events_is_digested_in_order_with_bounded_memory() -> None:
    result = hostile("flood", 2)
    check(result)
    assert result["guest_lines"] > 10_000


def test_garbage_bad_json_unknown_types_foreign_replies_and_absurd_dialogs() -> None:
    check(hostile("garbage", 2))


def test_a_100_mb_line_is_skipped_and_reported_and_traffic_goes_on() -> None:
    result = hostile("bigline", 1)
    check(result)
    assert result["oversized_reports"] == 1


@pytest.mark.soak
@pytest.mark.parametrize("scenario", ["flood", "garbage"])
def test_soak_a_minute_of_hostile_traffic(scenario: str) -> None:
    check(hostile(scenario, 60))
