"""Small helpers for commands on the remote: its root directory, checked commands."""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from pathlib import Path

import asyncssh

from piwork.hosts.store import Host, HostError


class RemoteError(HostError):
    """A command on the remote failed; the message carries its stderr."""


async def run(conn: asyncssh.SSHClientConnection, cmd: str, *, timeout: float = 120) -> str:
    """Run ``cmd`` (a POSIX sh command line) there; its stdout, or RemoteError."""
    result = await conn.run(cmd, check=False, timeout=timeout)
    if result.exit_status != 0:
        err = str(result.stderr or "").strip()
        raise RemoteError(f"on the remote, `{cmd}` failed ({result.exit_status}): {err}")
    return str(result.stdout or "")


async def remote_root(conn: asyncssh.SSHClientConnection, host: Host, *, create: bool) -> str:
    """The absolute path of the host's piwork root (made 0700 if ``create``).

    A relative root is under the remote user's home (where a session starts).
    Without ``create`` a missing root is reported as the path it would have.
    """
    q = shlex.quote(host.root)
    if create:
        cmd = f"umask 077 && mkdir -p -- {q} && cd -- {q} && pwd -P"
    else:
        cmd = (
            f"if [ -d {q} ]; then cd -- {q} && pwd -P; "
            f'else case {q} in /*) echo {q};; *) echo "$HOME"/{q};; esac; fi'
        )
    return (await run(conn, cmd)).strip()


PARALLEL_PUTS = 16


async def put_files(conn: asyncssh.SSHClientConnection, files: list[tuple[Path, str]]) -> None:
    """Send ``(local file, remote path)`` pairs: the directories in one ``mkdir -p`` (0700),
    the files over one SFTP session, many requests in flight.

    Why not ``sftp.makedirs`` + ``put`` per file: makedirs costs a round trip per
    path component and the puts one file at a time, which over a distant link made a
    folder of a few files take seconds.
    """
    dirs = sorted({posixpath.dirname(r) for _l, r in files} - {""})
    for i in range(0, len(dirs), 200):
        await run(conn, "umask 077 && mkdir -p -- " + shlex.join(dirs[i : i + 200]))
    if not files:
        return
    gate = asyncio.Semaphore(PARALLEL_PUTS)
    async with conn.start_sftp_client() as sftp:

        async def one(local: Path, remote: str) -> None:
            async with gate:
                await sftp.put(str(local), remote)

        await asyncio.gather(*(one(local, remote) for local, remote in files))
