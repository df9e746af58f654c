"""The working folder on a remote host: a copy sent once, the agent's changes brought back.

The remote VM sees the copy read-only under a writable layer of its own, as a
local VM sees the folder; its changes come back as change sets through the same
engine as a local run (:mod:`piwork.changes`: validated, held or asked, checkpointed,
applied). What this module adds is the copy: :class:`FolderSync` sends the
folder's regular files (links stay here) and keeps what it sent as the
*baseline* (path -> sha256), which makes the three-way decision exact: a file
the person changed here since it was sent keeps the person's version, and the
agent's lands beside it.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import posixpath
import shlex
import stat
from pathlib import Path

import asyncssh

from piwork import sharefs
from piwork.hosts.remote import put_files, run

LINK = "<link>"


def local_hashes(root: Path) -> dict[str, str]:
    """rel -> sha256 of every regular file beneath ``root``; links count as ``LINK``."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        base = Path(dirpath)
        for d in list(dirs):
            if (base / d).is_symlink():
                dirs.remove(d)
                out[(base / d).relative_to(root).as_posix()] = LINK
        for f in files:
            rel = (base / f).relative_to(root).as_posix()
            out[rel] = _local_hash(root, rel) or LINK
    return out


def _local_hash(root: Path, rel: str) -> str | None:
    """sha256 of ``root/rel``; ``LINK`` for a link or a special file; None if absent."""
    try:
        fd = sharefs.open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link on the way or at the name (ELOOP/ENOTDIR): the person's
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) or isinstance(exc, sharefs.UnsafePathError):
            return LINK
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return LINK
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


class FolderSync:
    """One local folder and its copy in the remote run dir."""

    def __init__(self, local: Path, remote: str) -> None:
        self.local = local
        self.remote = remote
        self.baseline: dict[str, str] = {}
        """What was sent: path -> sha256 (the agent's copy started from exactly this)."""

    async def upload(self, conn: asyncssh.SSHClientConnection) -> int:
        """Send every regular file (links stay here); the baseline is what was sent."""
        hashes = await asyncio.to_thread(local_hashes, self.local)
        files = {rel: d for rel, d in sorted(hashes.items()) if d != LINK}
        await run(conn, f"umask 077 && mkdir -p -- {shlex.quote(self.remote)}")
        await put_files(
            conn, [(self.local / rel, posixpath.join(self.remote, rel)) for rel in files]
        )
        self.baseline.update(files)
        return len(files)
