"""Where a start goes: the guest's own timings (untrusted) and the bench's stage rows."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

import pytest

from piwork.agent import guest_timings
from piwork.bench import _stages


def test_the_guest_timings_are_taken_in_seconds() -> None:
    assert guest_timings({"ev": "started", "ms": {"prepare": 120, "go": 4}, "pid": 7}) == {
        "guest_prepare": 0.12,
        "guest_go": 0.004,
    }
    assert guest_timings({"ev": "first-output", "ms": 950}) == {"guest_first_output": 0.95}
    assert guest_timings({"ev": "preloaded", "ms": 2300, "node": 280, "codeCache": "on"}) == {
        "guest_preloaded": 2.3,
        "guest_launcher_node": 0.28,
    }
    assert guest_timings({"ev": "ready", "bootId": "b", "ms": {"node": 1700, "main": 210}}) == {
        "guest_supervisor_node": 1.7,
        "guest_supervisor_main": 0.21,
    }


@pytest.mark.parametrize(
    "msg",
    [
        {"ev": "started", "ms": {"prepare": -1, "go": True}},
        {"ev": "started", "ms": {"prepare": "12", "go": None}},
        {"ev": "started", "ms": [1, 2]},
        {"ev": "started", "ms": {"prepare": math.nan, "go": math.inf}},
        {"ev": "first-output", "ms": 10**12},
        {"ev": "first-output", "ms": {"x": 1}},
        {"ev": "preloaded"},
        {"ev": "preloaded", "ms": -5, "node": "280"},
        {"ev": "ready", "ms": {"node": -1, "main": [3]}},
        {"ev": "ready", "ms": 1700},
        {"ev": "exit", "ms": 5},
    ],
)
def test_what_a_hostile_guest_sends_as_timings_is_dropped(msg: dict[str, Any]) -> None:
    assert guest_timings(msg) == {}


def _session(agent_timings: dict[str, float], run_timings: dict[str, float]) -> Any:
    return SimpleNamespace(agent=SimpleNamespace(timings=agent_timings), timings=run_timings)


def test_the_warm_stages_add_up_and_show_the_guests_part() -> None:
    agent = {
        "qemu_started": 0.1,
        "restored": 0.3,
        "supervisor_ready": 0.42,
        "env_attached": 0.43,
        "pi_started": 0.8,
        "guest_prepare": 0.2,
        "guest_go": 0.02,
        "guest_first_output": 0.9,
    }
    run = {"start_to_pi_ready": 1.5, "boot_to_pi_ready": 1.45, "env_disk": 0.01}
    rows = _stages("warm", cast(Any, _session(agent, run)))
    top = {k: v for k, v in rows.items() if not k.startswith("warm stage:  ")}
    assert sum(top.values()) == pytest.approx(1.5)  # the top-level stages are the whole start
    assert rows["warm stage:   guest: clock and 9p mounts (s)"] == 0.2
    assert rows["warm stage:   guest: pi's main() to its first output (s)"] == pytest.approx(0.68)
    assert not any("launcher loading" in k for k in rows)  # the template's, not this start's


def test_a_start_without_guest_timings_still_has_its_stages() -> None:
    rows = _stages("cold", cast(Any, _session({"pi_started": 1.0}, {"boot_to_pi_ready": 2.0})))
    assert rows["cold stage: pi's first RPC reply (s)"] == 1.0
    assert not any("guest:" in k for k in rows)


def test_a_cold_start_shows_where_the_boot_went_from_the_console_marks() -> None:
    session = _session({"qemu_started": 0.2, "supervisor_ready": 4.0}, {"boot_to_pi_ready": 6.0})
    session.agent.vm = SimpleNamespace(stages={"init": 2.5, "rootfs": 2.8, "supervisor": 2.9})
    rows = _stages("cold", cast(Any, session))
    began = "cold stage:   boot: /init began (firmware, kernel), since QEMU's launch (s)"
    assert rows[began] == 2.5
    assert rows["cold stage:   boot: supervisor launched, since QEMU's launch (s)"] == 2.9
    warm = _stages("warm", cast(Any, session))
    assert not any("boot:" in k for k in warm)  # a restore has no boot


def test_a_primed_warm_start_shows_the_bind_switch_and_model_and_still_adds_up() -> None:
    agent = {
        "qemu_started": 0.1,
        "restored": 0.3,
        "supervisor_ready": 0.42,
        "env_attached": 0.43,
        "pi_started": 1.2,  # start_pi returns after the switch and the model check
        "pi_switch": 0.35,
        "pi_model": 0.02,
        "guest_prepare": 0.2,
        "guest_go": 0.01,
        "guest_bind": 0.05,
        "guest_first_output": 0.6,
    }
    run = {"start_to_pi_ready": 1.3, "boot_to_pi_ready": 1.25}
    rows = _stages("warm", cast(Any, _session(agent, run)))
    top = {k: v for k, v in rows.items() if not k.startswith("warm stage:  ")}
    assert sum(top.values()) == pytest.approx(1.3)
    assert rows["warm stage: pi took the task's session (switch_session) (s)"] == 0.35
    assert rows["warm stage: pi started in the guest (s)"] == pytest.approx(0.4)
    bound = "warm stage:   guest: the saved pi bound to the task (env, cwd) (s)"
    assert rows[bound] == 0.05
    switched = "warm stage:   guest: switch_session to its first output (s)"
    assert rows[switched] == pytest.approx(0.34)
    assert not any("main()" in k for k in rows)  # main() ran in the saved VM
    assert guest_timings({"ev": "started", "ms": {"prepare": 200, "go": 10, "bind": 50}}) == {
        "guest_prepare": 0.2,
        "guest_go": 0.01,
        "guest_bind": 0.05,
    }
