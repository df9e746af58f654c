"""The running task's open previews, on disk for other processes (``piwork preview``, the app).

``<task dir>/previews.json``, written atomically (0600) by the process that
runs the task whenever a preview opens, removed when the task stops. A
reader trusts nothing in it: the writer must still be alive (same pid, same
start time), every field is checked, and the URL is rebuilt from the task id,
the two ports and the preview's loopback address rather than taken from the
file, so ``piwork preview --open`` can only ever open a
``http://127.a.b.c:<port>/`` (or ``http://<task>-<port>.localhost:<port>/``)
address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from piwork.fsutil import atomic_write_bytes
from piwork.preview.gate import address_host, preview_host

FILE_NAME = "previews.json"
FORMAT = 1
MAX_FILE_BYTES = 64 * 1024
MAX_ENTRIES = 64


@dataclass(frozen=True)
class PreviewInfo:
    """One open preview: the guest port, the loopback port piwork listens on, the URL."""

    port: int
    host_port: int
    url: str
    address: str | None = None
    """The preview's own loopback address (None: the ``.localhost`` fallback)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "hostPort": self.host_port,
            "url": self.url,
            "address": self.address,
        }


def url_for(task_id: str, port: int, host_port: int, address: str | None = None) -> str:
    host = (
        address_host(address, host_port)
        if address is not None
        else preview_host(task_id, port, host_port)
    )
    return f"http://{host}/"


LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


def loopback_address(value: Any) -> str | None:
    """A loopback IPv4 address written as piwork writes one, else None."""
    if not isinstance(value, str) or len(value) > 15:
        return None
    try:
        addr = ipaddress.IPv4Address(value)
    except ValueError:
        return None
    return str(addr) if addr in LOOPBACK and str(addr) == value else None


def write(task_dir: Path, task_id: str, previews: list[PreviewInfo]) -> None:
    """Replace the file with ``previews`` (removing it when there are none)."""
    path = task_dir / FILE_NAME
    if not previews:
        remove(task_dir)
        return
    doc = {
        "v": FORMAT,
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
        "task": task_id,
        "previews": [p.to_json() for p in previews[:MAX_ENTRIES]],
    }
    atomic_write_bytes(path, orjson.dumps(doc))


def remove(task_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (task_dir / FILE_NAME).unlink()


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if there is no such process.

    With the pid it names one process for good: a pid reused after the writer
    died has another start time, so its stale file is not taken for a live one.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b") ", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _port(value: Any) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
        else None
    )


def read(task_dir: Path, task_id: str) -> list[PreviewInfo]:
    """The open previews of the task, or [] when none (or the file is stale or invalid)."""
    path = task_dir / FILE_NAME
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if len(raw) > MAX_FILE_BYTES:
        return []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(doc, dict) or doc.get("v") != FORMAT or doc.get("task") != task_id:
        return []
    pid, started = doc.get("pid"), doc.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return []
    if not isinstance(started, int) or _start_time(pid) != started:
        return []  # the process that ran the task is gone: its previews are closed
    items = doc.get("previews")
    if not isinstance(items, list):
        return []
    out: list[PreviewInfo] = []
    for item in items[:MAX_ENTRIES]:
        if not isinstance(item, dict):
            continue
        port, host_port = _port(item.get("port")), _port(item.get("hostPort"))
        if port is None or host_port is None:
            continue
        address = loopback_address(item.get("address"))
        if item.get("address") is not None and address is None:
            continue  # not one piwork writes: never turned into a URL
        out.append(
            PreviewInfo(port, host_port, url_for(task_id, port, host_port, address), address)
        )
    return out
