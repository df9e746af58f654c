"""Host resources for VMs: per-VM caps from settings, and a check before each launch.

``settings.json`` may hold a ``vm`` section (other sections belong to others)::

    {"vm": {"maxMemoryMb": 4096, "maxCpus": 4, "hostReserveMb": 512}}

A VM asking for more than a cap is refused with a message naming the cap. A
VM is also refused, before QEMU starts, when the host's available memory minus
what VMs started by this process already hold cannot fit it plus the reserve:
a clear refusal instead of a hang or the OOM killer mid-task.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from piwork.errors import UsageError
from piwork.settings import read_section, settings_path

MEMINFO = Path("/proc/meminfo")
SECTION = "vm"


class ResourceError(RuntimeError, UsageError):
    """The VM cannot be started as asked; ``str()`` says what to do."""


@dataclass(frozen=True)
class VmCaps:
    max_memory_mb: int = 8192
    max_cpus: int = max(1, os.cpu_count() or 1)
    host_reserve_mb: int = 512


def load_caps(path: Path | None = None) -> VmCaps:
    path = settings_path(path)
    section = read_section(SECTION, path)  # a SettingsError names the file and the fault
    base = VmCaps()
    values: dict[str, int] = {}
    for key, attr in (
        ("maxMemoryMb", "max_memory_mb"),
        ("maxCpus", "max_cpus"),
        ("hostReserveMb", "host_reserve_mb"),
    ):
        value = section.get(key, getattr(base, attr))
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ResourceError(f"settings file {path}: '{SECTION}.{key}' must be a whole number")
        values[attr] = value
    return VmCaps(**values)


def available_memory_mb(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in MiB, or None where the kernel does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_held_lock = threading.Lock()
_held_mb = 0
"""Guest memory of VMs this process started and has not stopped (QEMU allocates
lazily, so MemAvailable alone would let several simultaneous starts all pass)."""


@contextmanager
def vm_budget(
    memory_mb: int, cpus: int, *, caps: VmCaps | None = None, meminfo: Path = MEMINFO
) -> Iterator[None]:
    """Hold ``memory_mb`` for one VM while the block runs, or raise ResourceError."""
    global _held_mb
    caps = caps if caps is not None else load_caps()
    if memory_mb > caps.max_memory_mb:
        raise ResourceError(
            f"a VM with {memory_mb} MiB is over the cap of {caps.max_memory_mb} MiB "
            f"(settings.json: vm.maxMemoryMb); ask for less with --memory"
        )
    if cpus > caps.max_cpus:
        raise ResourceError(
            f"a VM with {cpus} CPUs is over the cap of {caps.max_cpus} "
            f"(settings.json: vm.maxCpus); ask for fewer with --cpus"
        )
    with _held_lock:
        available = available_memory_mb(meminfo)
        if available is not None:
            free = available - _held_mb - caps.host_reserve_mb
            if memory_mb > free:
                held = f", {_held_mb} MiB held by this piwork's running VMs" if _held_mb else ""
                raise ResourceError(
                    f"not enough memory to start a VM with {memory_mb} MiB: the host has "
                    f"{available} MiB available{held}, and keeps {caps.host_reserve_mb} MiB "
                    "for itself. Stop another task, or use --memory with less"
                )
        _held_mb += memory_mb
    try:
        yield
    finally:
        with _held_lock:
            _held_mb -= memory_mb
