"""One entry of a change set, as the host accepts it from the guest: validated, bounded.

Everything in a change set is the guest's word (it runs as root in the VM and
may be hostile). An entry reaches the rest of piwork only through
:func:`parse_entry`, which refuses any path that could leave the folder (absolute,
``..``, empty or NUL components, over-long names), any kind it does not know,
sizes and modes out of range, and link targets that are not plain text of a
bounded length. Paths are kept as text decoded with ``surrogateescape``
(:func:`os.fsdecode`), so a name that is not UTF-8 keeps its exact bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from piwork.errors import ProtocolError

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_LINK_BYTES = 4096
MAX_FILE_BYTES = 1 << 30
"""No single file the guest reports may claim more than this (the store has its own cap)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


class EntryError(ValueError, ProtocolError):
    """An entry the host refuses (the message says why; it names no guest text raw)."""


class Kind(StrEnum):
    FILE = "file"
    DIR = "dir"
    LINK = "link"
    GONE = "gone"
    """The agent's view no longer has this path (deleted, or hidden by a new folder)."""
    OTHER = "other"
    """A FIFO, socket or device node: never brought to the folder."""


@dataclass(frozen=True)
class Change:
    """What the agent's layer holds at ``path`` (relative to the folder, ``/``-separated)."""

    path: str
    kind: Kind
    mode: int = 0
    size: int = 0
    sha256: str | None = None
    target: str | None = None
    """A link's text (never followed by the host)."""

    @property
    def executable(self) -> bool:
        return self.kind is Kind.FILE and bool(self.mode & 0o111)

    def same_as(self, other: Change) -> bool:
        """Same content as far as the folder is concerned (kind, bytes, exec bit, link text)."""
        if self.kind is not other.kind:
            return False
        if self.kind is Kind.FILE:
            return self.sha256 == other.sha256 and self.executable == other.executable
        if self.kind is Kind.LINK:
            return self.target == other.target
        return True


def check_path(raw: bytes) -> str:
    """A guest path as bytes -> the validated relative path (``surrogateescape`` text)."""
    if not raw or len(raw) > MAX_PATH_BYTES:
        raise EntryError(f"a path of {len(raw)} bytes")
    if b"\0" in raw:
        raise EntryError("a path with a NUL byte")
    if raw.startswith(b"/"):
        raise EntryError("an absolute path")
    parts = raw.split(b"/")
    for part in parts:
        if part in (b"", b".", b".."):
            raise EntryError("a path with an empty, '.' or '..' component")
        if len(part) > MAX_NAME_BYTES:
            raise EntryError(f"a name of {len(part)} bytes")
    return os.fsdecode(raw)


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > 2 * MAX_PATH_BYTES:
        raise EntryError(f"{what} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EntryError(f"{what} is not base64") from exc


def _int(value: Any, what: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise EntryError(f"{what} out of range")
    return value


def parse_entry(data: Any) -> Change:
    """One ``{"p", "k", "m", "s", "h", "t"}`` object from the guest -> a :class:`Change`."""
    if not isinstance(data, dict):
        raise EntryError("an entry that is not an object")
    path = check_path(_b64(data.get("p"), "the path"))
    try:
        kind = Kind(str(data.get("k")))
    except ValueError:
        raise EntryError("an entry of an unknown kind") from None
    if kind is Kind.GONE:
        return Change(path, kind)
    mode = _int(data.get("m", 0), "the mode", 0o7777)
    if kind is Kind.FILE:
        size = _int(data.get("s"), "the size", MAX_FILE_BYTES)
        sha = data.get("h")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise EntryError("a file without a sha256")
        return Change(path, kind, mode, size, sha)
    if kind is Kind.LINK:
        target = _b64(data.get("t"), "the link target")
        if not target or len(target) > MAX_LINK_BYTES or b"\0" in target:
            raise EntryError("a link target of the wrong shape")
        return Change(path, kind, mode, target=os.fsdecode(target))
    return Change(path, kind, mode)


def parents(path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def display(path: str) -> str:
    """A path for JSON and people: bytes that are not UTF-8 shown as ``\\xNN``."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
