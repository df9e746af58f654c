"""What a remote host lists is untrusted input: names, depth, counts and bytes are bounded.

A remote host may be malicious (or run a malicious guest with access to the run
dir). Its listings - the ``sha256sum`` listing of the working folder's copy
(:mod:`piwork.hosts.sync`) and the SFTP directories of the task's own folders
(:func:`piwork.hosts.vm.download_tree`) - could name a file with a NUL (a
``Path`` built from it raises ``ValueError``), ``..``, a component longer than
any file system takes, a tree a million levels deep, a billion entries, or a
file that never ends. Review 2, finding 13: the listing was held whole in
memory, ``_get_dir`` had no bound, and a NUL in a name aborted ``stop()`` before
the environment disk came back.

Here every name is checked before it becomes a path, and one :class:`Budget` per
listing bounds entries, depth and bytes; past a bound the listing stops with
:class:`ListingTooLarge` (a :class:`~piwork.hosts.remote.RemoteError`: callers
report it like any failure of the remote).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import asyncssh

from piwork.hosts.remote import RemoteError

MAX_ENTRIES = 200_000
"""Entries in one listing (files and folders): far more than a working folder has."""
MAX_DEPTH = 64
"""Folder levels below the listed root."""
MAX_NAME_BYTES = 255
"""One name (NAME_MAX on Linux)."""
MAX_PATH_BYTES = 4096
"""A whole relative path (PATH_MAX on Linux)."""
MAX_FILE_BYTES = 256 << 20
"""One file brought back; a bigger one is skipped (and said)."""
MAX_TOTAL_BYTES = 4 << 30
"""All files of one download together."""
MAX_ERR_BYTES = 4096
LISTING_TIMEOUT = 600.0


class ListingTooLarge(RemoteError):
    """A remote listing went past one of the bounds above."""


def name_ok(name: str) -> bool:
    """One directory entry's name as a remote sent it: usable as one path component."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return False
    return len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME_BYTES


def rel_ok(rel: str) -> bool:
    """A relative path from a remote listing: components that are names, bounded."""
    if rel.startswith("/") or len(rel.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        return False
    parts = rel.split("/")
    return len(parts) <= MAX_DEPTH + 1 and all(name_ok(p) for p in parts)


@dataclass
class Budget:
    """What one listing may still take."""

    entries: int = field(default_factory=lambda: MAX_ENTRIES)
    bytes: int = field(default_factory=lambda: MAX_TOTAL_BYTES)

    def entry(self, where: str) -> None:
        self.entries -= 1
        if self.entries < 0:
            raise ListingTooLarge(f"{where}: the remote lists more than {MAX_ENTRIES} entries")

    def take(self, n: int, where: str) -> None:
        self.bytes -= n
        if self.bytes < 0:
            raise ListingTooLarge(
                f"{where}: the remote's files add up to more than {MAX_TOTAL_BYTES >> 20} MiB"
            )


def _record(rec: bytes) -> tuple[str, str] | None:
    """``<sha256 hex>  ./<rel>`` (``sha256sum --zero``), or None if it is not one."""
    digest, sep, name = rec.partition(b"  ")
    if not sep or len(digest) != 64 or digest.strip(b"0123456789abcdef"):
        return None
    rel = name.decode("utf-8", errors="surrogateescape").removeprefix("./")
    return (rel, digest.decode()) if rel_ok(rel) else None


async def sha256_listing(
    conn: asyncssh.SSHClientConnection, cmd: str, where: str
) -> dict[str, str]:
    """rel -> sha256 from ``cmd``'s ``sha256sum --zero`` output, read as it streams.

    Never more than one record (plus a read) is held beyond the result, which has at
    most ``MAX_ENTRIES`` entries; a record longer than any valid one, or more of them,
    ends the listing with :class:`ListingTooLarge`. Records that are not one (a bad
    digest, a name with ``..``, too deep or too long) are left out.
    """
    out: dict[str, str] = {}
    longest = 64 + 2 + 2 + MAX_PATH_BYTES
    async with asyncio.timeout(LISTING_TIMEOUT):
        async with conn.create_process(cmd, encoding=None) as proc:
            pending = b""
            while chunk := await proc.stdout.read(1 << 16):
                *records, pending = (pending + chunk).split(b"\0")
                for rec in records:
                    parsed = _record(rec) if rec else None
                    if parsed is not None:
                        out[parsed[0]] = parsed[1]
                        if len(out) > MAX_ENTRIES:
                            raise ListingTooLarge(
                                f"{where}: the remote lists more than {MAX_ENTRIES} files"
                            )
                if len(pending) > longest:
                    raise ListingTooLarge(f"{where}: a remote listing record is too long")
            err = b""
            with contextlib.suppress(asyncssh.Error, OSError):
                err = await proc.stderr.read(MAX_ERR_BYTES)
            result = await proc.wait()
    if result.exit_status != 0:
        text = err.decode(errors="replace").strip()
        raise RemoteError(f"cannot list {where} on the remote: {text}")
    return out


__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_TOTAL_BYTES",
    "Budget",
    "ListingTooLarge",
    "name_ok",
    "rel_ok",
    "sha256_listing",
]
