"""Relay one guest TCP connection to a host TCP port (QEMU guestfwd helper).

QEMU's slirp ``guestfwd=tcp:10.0.2.100:80-cmd:CMD`` starts CMD once per guest
connection, with the connection (one end of a socketpair) as fd 0, 1 *and* 2.
This script copies bytes between that socket and ``HOST:PORT`` in both
directions until both sides have closed:

    python3 -I -S guestfwd_relay.py 127.0.0.1 PORT [LOGFILE]

- Standalone on purpose (stdlib only, no piwork imports, no ``site``): it runs
  for every connection, so it must start fast.
- No buffering: every ``recv`` is forwarded at once (``TCP_NODELAY`` on), so
  a streamed (SSE) response reaches the guest chunk by chunk.
- Half-close: EOF from one side becomes ``shutdown(SHUT_WR)`` on the other,
  while the opposite direction keeps flowing.
- fd 2 is the guest connection too, so nothing may be printed: stderr is
  pointed at LOGFILE (appended) or ``/dev/null`` before anything can fail.
- slirp splits CMD with ``g_shell_parse_argv``: quote paths with spaces.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

BUFSIZE = 65536


def _log(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"guestfwd_relay[{os.getpid()}]: {message}\n".encode())


def _redirect_stderr(logfile: str | None) -> None:
    fd = os.open(logfile or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def _nodelay(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # a unix socketpair has no Nagle to turn off
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _End:
    """One side of the relay: where to read from and where to write to.

    Sockets are used as sockets (so a half-close is a ``shutdown``); a plain
    fd such as a pipe falls back to ``os.read``/``os.write`` and ``close``.
    """

    def __init__(
        self, rsock: socket.socket | None, wsock: socket.socket | None, rfd: int, wfd: int
    ) -> None:
        self.rsock, self.wsock, self.rfd, self.wfd = rsock, wsock, rfd, wfd

    @classmethod
    def of_fds(cls, rfd: int, wfd: int) -> _End:
        return cls(_socket_or_none(rfd), _socket_or_none(wfd), rfd, wfd)

    @classmethod
    def of_socket(cls, sock: socket.socket) -> _End:
        return cls(sock, sock, sock.fileno(), sock.fileno())

    def recv(self) -> bytes:
        if self.rsock is not None:
            return self.rsock.recv(BUFSIZE)
        return os.read(self.rfd, BUFSIZE)

    def send(self, data: bytes) -> None:
        if self.wsock is not None:
            self.wsock.sendall(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]

    def shut_write(self) -> None:
        try:
            if self.wsock is not None:
                self.wsock.shutdown(socket.SHUT_WR)
            else:
                os.close(self.wfd)
        except OSError:
            pass

    def shut_both(self) -> None:
        for sock in (self.rsock, self.wsock):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _socket_or_none(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of ``fd``, or None if fd is no socket."""
    dup = os.dup(fd)
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    _nodelay(sock)
    return sock


def _pump(src: _End, dst: _End, name: str, failed: list[str]) -> None:
    """Copy src -> dst until EOF, then half-close dst."""
    try:
        while True:
            data = src.recv()
            if not data:
                break
            dst.send(data)
    except OSError as exc:
        # A reset or a peer that went away: stop both directions so the
        # other pump does not wait forever.
        failed.append(f"{name}: {exc}")
        src.shut_both()
        dst.shut_both()
        return
    dst.shut_write()


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        # Usage errors are the only output: stderr may still be a terminal.
        sys.stderr.write("usage: guestfwd_relay.py HOST PORT [LOGFILE]\n")
        return 2
    host, port = argv[1], int(argv[2])
    _redirect_stderr(argv[3] if len(argv) == 4 else None)

    guest = _End.of_fds(0, 1)
    try:
        upstream_sock = socket.create_connection((host, port), timeout=10)
    except OSError as exc:
        _log(f"cannot connect to {host}:{port}: {exc}")
        return 1
    upstream_sock.settimeout(None)
    _nodelay(upstream_sock)
    upstream = _End.of_socket(upstream_sock)

    failed: list[str] = []
    to_guest = threading.Thread(
        target=_pump, args=(upstream, guest, "upstream->guest", failed), daemon=True
    )
    to_guest.start()
    _pump(guest, upstream, "guest->upstream", failed)
    to_guest.join()
    for message in failed:
        _log(message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
