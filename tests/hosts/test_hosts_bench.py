"""``piwork bench --host``: the start-up figures and the steer latency on a remote host
(this machine through a real sshd), through the 50 ms delaying relay. Figures are
printed, never asserted as timings: the test checks that each one is there and that
the round really went through the relay without touching the person's host files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.bench import COLD, WARM
from piwork.hosts import store
from piwork.hosts.bench import LINK_OPEN, RELAYED, RPC_RTT, SSH_RTT, STEER_LATENCY, TEMPLATE
from tests.helpers.hosts import run_cli

pytestmark = pytest.mark.vm


def test_bench_host_prints_cold_warm_and_steer_figures_through_the_relay(
    box: store.Host, short_root: Path
) -> None:
    hosts_before = store.hosts_file().read_bytes()
    known_before = store.known_hosts_file().read_bytes()
    proc = run_cli("bench", "--host", box.name, "--rounds", "1", "--delay-ms", "50", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    print("\n" + proc.stdout + proc.stderr[-2000:])
    assert doc["host"] == box.name and doc["delay_ms_each_way"] == 50
    figures = doc["figures"]
    for name in (SSH_RTT, LINK_OPEN, COLD, WARM, TEMPLATE, RPC_RTT, STEER_LATENCY, RELAYED):
        assert name in figures, (name, sorted(figures), doc["notes"])
        assert figures[name]["median"] > 0
    # The pack went to the fresh remote root through the relay (hundreds of MiB).
    assert figures[RELAYED]["median"] > 100
    assert any("pack uploaded" in n for n in doc["notes"]), doc["notes"]
    # Nothing was added for the relay: the host key was checked as the box's own.
    assert store.hosts_file().read_bytes() == hosts_before
    assert store.known_hosts_file().read_bytes() == known_before
