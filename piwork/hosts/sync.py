"""The working folder on a remote host: sent once, brought back after each turn, three-way.

The *baseline* is what both sides last agreed on (path -> sha256). Bringing
the folder back compares three versions of each file: the baseline, the
remote (the agent's) and the local one (the person's):

- only the agent changed it: the agent's version replaces the local file;
- only the person changed it (or both made the same bytes): nothing moves;
- both changed it: the person's file stays, the agent's version lands beside
  it as ``<name>.agent-<n>`` and a :class:`Conflict` is reported;
- the agent deleted it and the person did not touch it: it is deleted here.

Links are never followed: the remote listing is ``find -type f`` (no links,
no devices), local reads and writes go through :mod:`piwork.sharefs`
(``O_NOFOLLOW`` beneath the folder), and a local link is the person's entry,
never replaced.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import posixpath
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from piwork import sharefs
from piwork.checkpoints.shadow import refused_prefix
from piwork.hosts.listing import sha256_listing
from piwork.hosts.remote import put_files, run

MAX_FILE_BYTES = 256 << 20
"""A file bigger than this on the remote is not brought back (reported as skipped)."""
LINK = "<link>"


@dataclass(frozen=True)
class Conflict:
    path: str
    agent_copy: str

    def describe(self) -> str:
        return (
            f"conflict: {self.path} changed here and in the task; your version stays, "
            f"the agent's is beside it as {self.agent_copy}"
        )


@dataclass
class SyncResult:
    fetched: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


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


async def remote_hashes(conn: asyncssh.SSHClientConnection, root: str) -> dict[str, str]:
    """rel -> sha256 of the regular files under ``root`` on the remote (links not followed).

    The listing is untrusted and streamed: names, depth, count and size are bounded
    (:mod:`piwork.hosts.listing`).
    """
    cmd = f"cd -- {shlex.quote(root)} && find . -type f -print0 | xargs -0 -r sha256sum --zero --"
    return await sha256_listing(conn, cmd, root)


class FolderSync:
    """One local folder and its copy in the remote run dir."""

    def __init__(self, local: Path, remote: str) -> None:
        self.local = local
        self.remote = remote
        self.baseline: dict[str, str] = {}
        self.turn = 0

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

    async def sync_back(
        self,
        conn: asyncssh.SSHClientConnection,
        on_conflict: Callable[[Conflict], None] | None = None,
    ) -> SyncResult:
        self.turn += 1
        res = SyncResult()
        theirs = await remote_hashes(conn, self.remote)
        async with conn.start_sftp_client() as sftp:
            for rel, rsha in sorted(theirs.items()):
                if refused_prefix(rel) is not None:
                    # Git metadata (``.git`` in any spelling git accepts): the agent may
                    # commit in the remote copy, but a config written there would run on
                    # this machine at the person's next ``git status``. It never comes back.
                    res.skipped.append(rel)
                    continue
                base = self.baseline.get(rel)
                if rsha == base:
                    continue  # the agent left it alone
                mine = await asyncio.to_thread(_local_hash, self.local, rel)
                if mine == rsha:
                    self.baseline[rel] = rsha
                    continue
                data = await self._fetch(sftp, rel, res)
                if data is None:
                    continue
                if mine != base:  # the person changed (or made) it here too
                    copy = await asyncio.to_thread(self._beside, rel, data)
                    if copy is None:
                        res.skipped.append(rel)
                        continue
                    conflict = Conflict(rel, copy)
                    res.conflicts.append(conflict)
                    if on_conflict is not None:
                        on_conflict(conflict)
                else:
                    try:
                        await asyncio.to_thread(
                            sharefs.write_atomic_beneath, self.local, rel, data, mode=0o644
                        )
                    except OSError:
                        res.skipped.append(rel)
                        continue
                    res.fetched.append(rel)
                self.baseline[rel] = rsha
            for rel in sorted(set(self.baseline) - set(theirs)):
                base = self.baseline.pop(rel)
                if refused_prefix(rel) is not None:
                    continue  # the person's git metadata is theirs: never deleted from here
                mine = await asyncio.to_thread(_local_hash, self.local, rel)
                if mine == base:
                    await asyncio.to_thread(sharefs.unlink_beneath, self.local, rel)
                    res.deleted.append(rel)
        return res

    async def _fetch(self, sftp: asyncssh.SFTPClient, rel: str, res: SyncResult) -> bytes | None:
        path = posixpath.join(self.remote, rel)
        try:
            attrs = await sftp.lstat(path)
            if attrs.type != asyncssh.FILEXFER_TYPE_REGULAR or (attrs.size or 0) > MAX_FILE_BYTES:
                res.skipped.append(rel)
                return None
            async with sftp.open(path, "rb") as fh:
                data: bytes = await fh.read(MAX_FILE_BYTES + 1)
        except (asyncssh.SFTPError, OSError):
            res.skipped.append(rel)
            return None
        if len(data) > MAX_FILE_BYTES:
            res.skipped.append(rel)
            return None
        return data

    def _beside(self, rel: str, data: bytes) -> str | None:
        for n in range(1, 100):  # the first free name: agent-1, agent-2, ...
            cand = f"{rel}.agent-{n}"
            if _local_hash(self.local, cand) is None:
                try:
                    sharefs.write_atomic_beneath(self.local, cand, data, mode=0o644)
                except OSError:
                    return None
                return cand
        return None
