"""The host's process table, read from /proc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        # ProcessLookupError: reaped between the open and the read (seen once in CI).
        return False
    return state not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def parents(pid: int) -> list[str]:
    """Process names from ``pid`` up to init."""
    names = []
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        names.append(stat[stat.index("(") + 1 : stat.rindex(")")])
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return names


def wait_gone(pid: int, limit: float) -> float:
    """Seconds until ``pid`` is gone (or ``limit``): run in a thread."""
    t0 = time.monotonic()
    while alive(pid) and time.monotonic() - t0 < limit:
        time.sleep(0.2)
    return time.monotonic() - t0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [g for k in kids for g in descendants(k)]


def qemu_children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid and comm.startswith("qemu-system"):
            found.append(int(entry.name))
    return found
