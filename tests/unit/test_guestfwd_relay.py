"""The guestfwd relay, run the way QEMU's slirp runs it: a child process whose
fd 0, 1 and 2 are one end of a socketpair (slirp uses a loopback TCP pair),
relaying to a host TCP port."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from piwork.models.scripted import Delay, ScriptedModelServer, Text

RELAY = Path(__file__).resolve().parents[2] / "piwork" / "proxy" / "guestfwd_relay.py"


def tcp_socketpair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair, as libslirp's fork_exec builds it."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def pair(kind: str) -> tuple[socket.socket, socket.socket]:
    return tcp_socketpair() if kind == "tcp" else socket.socketpair()


@contextmanager
def relay_to(
    port: int, kind: str = "tcp", extra: list[str] | None = None
) -> Iterator[tuple[socket.socket, subprocess.Popen[bytes]]]:
    """Spawn the relay for one 'guest connection'; yield the guest's end."""
    guest, child = pair(kind)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(RELAY), "127.0.0.1", str(port), *(extra or [])],
        stdin=child.fileno(),
        stdout=child.fileno(),
        stderr=child.fileno(),  # like slirp: anything on stderr would reach the guest
        close_fds=True,
    )
    child.close()
    guest.settimeout(20)
    try:
        yield guest, proc
    finally:
        guest.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise


def serve_once(handler: Callable[[socket.socket], None]) -> tuple[int, threading.Thread]:
    """A one-connection TCP server running ``handler`` in a thread."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                handler(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


def recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def echo_until_eof(conn: socket.socket) -> None:
    """Echo as data arrives; close (write side) only after the client's EOF."""
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_echo_round_trip_with_half_close_from_the_guest(kind: str) -> None:
    port, server = serve_once(echo_until_eof)
    message = b"hello through the relay\n" * 100
    with relay_to(port, kind) as (guest, proc):
        guest.sendall(message)
        guest.shutdown(socket.SHUT_WR)  # the guest is done sending, still reading
        # The echo server closes only after it saw EOF, so getting EOF here
        # proves the half-close crossed the relay in both directions.
        assert recv_all(guest) == message
        assert proc.wait(5) == 0
    server.join(5)


def test_upstream_half_close_leaves_the_guest_to_upstream_direction_open() -> None:
    received: list[int] = []

    def greet_then_listen(conn: socket.socket) -> None:
        conn.sendall(b"greeting")
        conn.shutdown(socket.SHUT_WR)
        received.append(len(recv_all(conn)))

    port, server = serve_once(greet_then_listen)
    payload = os.urandom(1024 * 1024)
    with relay_to(port) as (guest, proc):
        assert recv_all(guest) == b"greeting"  # EOF from upstream reached the guest
        guest.sendall(payload)  # ...and the guest can still send
        guest.shutdown(socket.SHUT_WR)
        server.join(10)
        assert received == [len(payload)]
        assert proc.wait(5) == 0


def test_large_transfer_in_both_directions_at_once() -> None:
    port, server = serve_once(echo_until_eof)
    payload = os.urandom(16 * 1024 * 1024)
    with relay_to(port) as (guest, proc):
        # Send and receive concurrently: a relay that blocked one direction
        # while the other is full would deadlock here.
        def send() -> None:
            guest.sendall(payload)
            guest.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        echoed = recv_all(guest)
        sender.join(10)
        assert proc.wait(5) == 0
    server.join(5)
    assert len(echoed) == len(payload)
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()


def test_streamed_sse_passes_chunk_by_chunk() -> None:
    script = [Delay(0.6, Text("arrived after the pause"))]
    with ScriptedModelServer(script) as model, relay_to(model.port) as (guest, _):
        body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
        start = time.monotonic()
        guest.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 10.0.2.100\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        seen = b""
        while b'"role":"assistant"' not in seen:
            seen += guest.recv(65536)
        first_chunk_at = time.monotonic() - start
        rest = recv_all(guest)
        done_at = time.monotonic() - start
    assert seen.startswith(b"HTTP/1.1 200")
    assert b"text/event-stream" in seen
    # The role chunk must not sit in a buffer until the delayed rest arrives.
    assert first_chunk_at < 0.45, first_chunk_at
    assert done_at >= 0.6
    assert b"after" in rest and b"data: [DONE]" in rest


def test_refused_upstream_closes_the_guest_connection_without_writing_to_it(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = int(placeholder.getsockname()[1])  # closed again: nothing listens
    log = tmp_path / "relay.log"
    with relay_to(port, extra=[str(log)]) as (guest, proc):
        assert recv_all(guest) == b"", "errors must not be written into the guest stream"
        assert proc.wait(5) == 1
    assert "cannot connect" in log.read_text()


def test_usage_error_without_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(RELAY)], capture_output=True, timeout=10
    )
    assert result.returncode == 2
    assert b"usage" in result.stderr
