"""One SSH connection to a host, with host keys checked strictly.

The keys trusted are those in the known_hosts files ssh_config names
(``UserKnownHostsFile``, default ``~/.ssh/known_hosts``; asyncssh reads
``~/.ssh/config``) plus piwork's own ``<config>/known_hosts``. A host with no
key there is *unknown*: its fingerprint is shown and the person accepts it
(at a terminal, or with the fingerprint given on the command line), and only
then is it written to piwork's file. A host whose key differs from a trusted
one is *refused*: nothing is logged in to, nothing is uploaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from piwork.fsutil import fsync_dir, fsync_fd
from piwork.hosts.store import Host, HostError, known_hosts_file

KEEPALIVE_SECONDS = 10
"""A dead link is noticed within ~3 of these (keepalive_count_max) instead of a TCP timeout."""

Confirm = Callable[["HostKeyInfo"], bool]
"""Asked on first use: True trusts the key (it is then saved), False refuses."""


class HostKeyUnknown(HostError):
    """The host has no trusted key yet and nobody accepted the one it showed."""


class HostKeyMismatch(HostError):
    """The host showed a key other than the trusted one: refused, before any login."""


@dataclass(frozen=True)
class HostKeyInfo:
    host: Host
    key: asyncssh.SSHKey
    fingerprint: str
    known_as: str
    """The known_hosts host field: ``box`` or ``[box]:port``."""

    def describe(self) -> str:
        return (
            f"The host {self.host.name} ({self.known_as}) is not known yet.\n"
            f"Its {self.key.get_algorithm()} key fingerprint is {self.fingerprint}.\n"
            "Compare it with the one the box shows (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub)."
        )


def known_as(host: Host) -> str:
    port = host.port or 22
    return host.hostname if port == 22 else f"[{host.hostname}]:{port}"


async def trusted_files(host: Host) -> list[str]:
    """The known_hosts files this connection trusts: ssh_config's, then piwork's own."""
    opts = await asyncssh.SSHClientConnectionOptions.construct(
        host=host.hostname, port=host.port or (), username=host.user or ()
    )
    named = opts.known_hosts
    files: list[str] = []
    if isinstance(named, list | tuple):
        files = [str(f) for f in named] or ["~/.ssh/known_hosts"]
    # named is None when ssh_config says "UserKnownHostsFile none": piwork's file still applies.
    files.append(str(known_hosts_file()))
    return _readable(files)


def _readable(files: list[str]) -> list[str]:
    out: list[str] = []
    for f in files:
        path = Path(os.path.expanduser(f))
        if path.is_file() and os.access(path, os.R_OK) and str(path) not in out:
            out.append(str(path))
    return out


def _trusted_keys(files: list[str], host: Host) -> int:
    """How many keys (or CAs) the files trust for this host (by name or address)."""
    if not files:
        return 0
    known = asyncssh.read_known_hosts(files)
    try:
        addr = socket.getaddrinfo(host.hostname, None)[0][4][0]
    except OSError:
        addr = host.hostname
    found = known.match(host.hostname, str(addr), host.port)
    return len(found[0]) + len(found[1])


def _client_keys(host: Host) -> list[str] | tuple[()]:
    if host.identity is None:
        return ()  # asyncssh's defaults: ~/.ssh/id_* and the agent
    path = os.path.expanduser(host.identity)
    if not os.path.isfile(path):
        raise HostError(f"the identity file {path} of host {host.name} does not exist")
    return [path]


def _remember(info: HostKeyInfo) -> None:
    """Append the accepted key durably (the person's decision: fsync, and the directory)."""
    path = known_hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{info.known_as} {info.key.export_public_key('openssh').decode().strip()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
        fsync_fd(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


SESSION_PINS: dict[str, Any] = {
    "agent_forwarding": False,
    "x11_forwarding": False,
    "send_env": [],
    "env": {},
    "command": None,
    "request_pty": False,
}
"""Connection options piwork sets whatever ssh_config says (see :func:`_strict`)."""


_routes: ContextVar[dict[str, tuple[str, int]] | None] = ContextVar(
    "piwork_ssh_routes", default=None
)


@contextlib.contextmanager
def routed(name: str, via: tuple[str, int]) -> Iterator[None]:
    """Meanwhile (in this context and the tasks it starts), connections to host ``name``
    are made through the TCP relay at ``via`` (``piwork bench --host``'s delaying proxy).

    Only the TCP path changes: the host key is still checked as ``name``'s own,
    against the same known_hosts entries, so a relay can delay bytes but never
    stand in for the host.
    """
    token = _routes.set({**(_routes.get() or {}), name: via})
    try:
        yield
    finally:
        _routes.reset(token)


async def _dial(via: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, via), 30)
    except BaseException:
        sock.close()
        raise
    return sock


async def _strict(host: Host, files: list[str]) -> asyncssh.SSHClientConnection:
    via = (_routes.get() or {}).get(host.name)
    return await asyncssh.connect(
        host.hostname,
        port=host.port or (),
        sock=await _dial(via) if via is not None else None,
        username=host.user or (),
        client_keys=_client_keys(host),
        known_hosts=files if files else b"",
        keepalive_interval=KEEPALIVE_SECONDS,
        connect_timeout=30,
        # ssh_config may say ForwardAgent / ForwardX11Trusted / SendEnv / SetEnv /
        # RemoteCommand / RequestTTY for every host (asyncssh reads them): a remote
        # piwork drives would get the person's agent or display, or local variables
        # (review 2, finding 9). Its sessions need none of these.
        **SESSION_PINS,
    )


async def connect(host: Host, confirm: Confirm | None = None) -> asyncssh.SSHClientConnection:
    """Log in to ``host``; unknown keys go through ``confirm``, wrong ones are refused.

    Raises :class:`HostKeyMismatch`, :class:`HostKeyUnknown` or :class:`HostError`
    (unreachable, login refused) with a message saying what to do.
    """
    files = await trusted_files(host)
    try:
        return await _strict(host, files)
    except asyncssh.HostKeyNotVerifiable:
        pass
    except (OSError, asyncssh.Error) as exc:
        raise HostError(f"cannot connect to {host.name} ({host.target}): {exc}") from exc
    key = await asyncssh.get_server_host_key(host.hostname, host.port or ())
    if key is None:
        raise HostError(f"{host.name} showed no host key; piwork cannot verify it")
    info = HostKeyInfo(host, key, key.get_fingerprint("sha256"), known_as(host))
    if _trusted_keys(files, host):
        raise HostKeyMismatch(
            f"REFUSED: {host.name} ({info.known_as}) showed the key {info.fingerprint}, "
            "which is NOT the one trusted for it in " + ", ".join(files) + ". Someone may be "
            "intercepting the connection, or the box was reinstalled. Nothing was sent. If the "
            f"box really changed, remove the old key (ssh-keygen -R '{info.known_as}' -f FILE) "
            "and run: piwork hosts check " + host.name
        )
    if confirm is None or not confirm(info):
        raise HostKeyUnknown(
            f"{host.name} ({info.known_as}) is not known and its key {info.fingerprint} was not "
            "accepted. At a terminal piwork asks; otherwise pass "
            f"--host-key-fingerprint {info.fingerprint} after checking it on the box."
        )
    _remember(info)
    try:
        return await _strict(host, await trusted_files(host))
    except (OSError, asyncssh.Error) as exc:
        raise HostError(f"cannot connect to {host.name} ({host.target}): {exc}") from exc


def fingerprint_matcher(expected: str | None, ask: Confirm | None) -> Confirm | None:
    """The confirm callback for the CLI: an explicit fingerprint, else a terminal prompt."""
    if expected is not None:
        want = expected if expected.startswith("SHA256:") else f"SHA256:{expected}"
        return lambda info: info.fingerprint == want
    return ask
