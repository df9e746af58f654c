"""Small helpers for commands on the remote: its root directory, checked commands."""

from __future__ import annotations

import shlex

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
