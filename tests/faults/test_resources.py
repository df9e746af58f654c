"""Per-VM caps from settings, and a clean refusal when the host cannot fit another VM."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from piwork.config import get_paths
from piwork.resources import ResourceError, VmCaps, load_caps, vm_budget
from piwork.runner import RunError, RunRequest, TaskSession


def meminfo(tmp_path: Path, available_mb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_mb * 1024} kB\n")
    return path


def start(memory_mb: int, cpus: int, caps: VmCaps, info: Path) -> None:
    with vm_budget(memory_mb, cpus, caps=caps, meminfo=info):
        pass


def test_a_vm_that_does_not_fit_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ResourceError, match=r"not enough memory.*900 MiB available.*--memory"):
        start(1024, 1, VmCaps(host_reserve_mb=0), meminfo(tmp_path, 900))


def test_vms_started_together_cannot_all_pass_the_same_check(tmp_path: Path) -> None:
    info = meminfo(tmp_path, 3000)
    caps = VmCaps(host_reserve_mb=512)
    with (
        vm_budget(1024, 1, caps=caps, meminfo=info),
        vm_budget(1024, 1, caps=caps, meminfo=info),
        pytest.raises(ResourceError, match="2048 MiB held by this piwork's running VMs"),
    ):
        start(1024, 1, caps, info)
    start(1024, 1, caps, info)  # released: fits again


def test_caps_come_from_settings(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    settings.write_bytes(orjson.dumps({"vm": {"maxMemoryMb": 512, "maxCpus": 1}}))
    caps = load_caps(settings)
    with pytest.raises(ResourceError, match=r"over the cap of 512 MiB.*vm\.maxMemoryMb"):
        start(1024, 1, caps, meminfo(tmp_path, 99999))
    with pytest.raises(ResourceError, match=r"over the cap of 1 .*vm\.maxCpus"):
        start(256, 2, caps, meminfo(tmp_path, 99999))
    settings.write_bytes(b'{"vm": {"maxCpus": "lots"}}')
    with pytest.raises(ResourceError, match=r"vm\.maxCpus' must be a whole number"):
        load_caps(settings)


async def test_a_task_over_the_cap_is_refused_before_any_vm_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    settings = get_paths().settings_file
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_bytes(orjson.dumps({"vm": {"maxMemoryMb": 256}}))
    started = time.monotonic()
    with pytest.raises(RunError, match="over the cap of 256 MiB"):
        async with TaskSession(RunRequest(prompt="x", memory_mb=1024)):
            raise AssertionError("the session must not start")
    assert time.monotonic() - started < 10
