"""The first request head of every preview connection, checked before a byte reaches the guest.

A preview is a byte pipe into a guest port (WebSockets and long polls must
work), so piwork does not proxy HTTP; it reads only the first request head of
each connection, bounded in size and time, and lets the connection through
only when:

* the request target is origin-form (``/path``), so the ``Host`` header is the
  only authority the request names;
* there is exactly one ``Host`` header and it equals the preview's own
  ``127.a.b.c:<hostport>`` (its own loopback address, see
  :mod:`piwork.preview.server`; ``<task>-<port>.localhost:<hostport>`` where
  only 127.0.0.1 exists), case-insensitive. Browsers keep cookies per host,
  not per port, so every preview gets its own host, and a page served by the
  guest cannot read the person's other local apps' cookies (nor they its). A
  name that resolves to loopback through someone else's DNS (DNS rebinding)
  sends its own name as ``Host`` and is refused;
* an ``Origin`` header, if present, is the preview's own origin: another
  site's page cannot drive the guest's server (cross-site WebSocket, form
  posts) through the person's browser.

Anything else gets a short 421/403/400/431/408 answer and the connection is
closed; the guest never sees it. The head is passed on as read, unchanged.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

MAX_HEAD = 16 * 1024
"""Bytes of the first request head (request line plus headers) piwork will read."""
HEAD_TIMEOUT = 10.0
"""Seconds a client has to send its first request head."""

_LABEL = re.compile(r"[a-z0-9]+")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def address_host(address: str, host_port: int) -> str:
    """``127.a.b.c:<hostport>``: the one ``Host`` a preview on its own address accepts."""
    return f"{address}:{host_port}"


def preview_host(task_id: str, guest_port: int, host_port: int) -> str:
    """``<task-short-id>-<guestport>.localhost:<hostport>``: the ``Host`` accepted where no
    loopback address but 127.0.0.1 can be bound."""
    short = "".join(_LABEL.findall(task_id.lower()))[:8] or "task"
    return f"{short}-{guest_port}.localhost:{host_port}"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    status: int = 200
    reason: str = ""


def _refuse(status: int, reason: str) -> Verdict:
    return Verdict(False, status, reason)


def check_head(head: bytes, expected_host: str) -> Verdict:
    """Judge one complete request head (ending in CRLFCRLF, at most ``MAX_HEAD``)."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return _refuse(400, "the request head is not ASCII")
    lines = text.split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
        return _refuse(400, "not an HTTP/1.x request")
    method, target, _version = request_line
    if not _TOKEN.match(method.encode()):
        return _refuse(400, "bad method")
    if not target.startswith("/"):
        return _refuse(400, "only origin-form request targets (/path) are accepted")
    hosts: list[str] = []
    origins: list[str] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name.encode()):
            return _refuse(400, "malformed header line")
        key = name.lower()
        if key == "host":
            hosts.append(value.strip())
        elif key == "origin":
            origins.append(value.strip())
    if len(hosts) != 1:
        return _refuse(400, "exactly one Host header is required")
    want = expected_host.lower()
    if hosts[0].lower() != want:
        return _refuse(421, f"this preview answers only to http://{expected_host}/")
    if len(origins) > 1 or (origins and origins[0].lower() != f"http://{want}"):
        return _refuse(403, "requests from another site's page are refused")
    return Verdict(True)


def refusal(verdict: Verdict) -> bytes:
    """The short plain-text answer sent for a refused head; the connection then closes."""
    phrase = {
        400: "Bad Request",
        403: "Forbidden",
        408: "Request Timeout",
        421: "Misdirected Request",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }.get(verdict.status, "Refused")
    body = f"piwork preview: {verdict.reason}\n".encode()
    return (
        f"HTTP/1.1 {verdict.status} {phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, Verdict | None]:
    """The bytes read up to and including the first head's CRLFCRLF.

    Returns ``(head, None)`` on success; otherwise ``(b"", refusal verdict)``:
    too big (431), too slow (408) or the client went away (status 0: nothing to send).
    Bytes the client sent after the head (a body, a pipelined request) stay in
    ``reader`` and go to the guest with the rest of the stream.
    """
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
    except asyncio.LimitOverrunError:
        return b"", _refuse(431, f"the request head is larger than {MAX_HEAD} bytes")
    except TimeoutError:
        return b"", _refuse(408, f"no request head within {HEAD_TIMEOUT:.0f} s")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b"", _refuse(0, "the client closed the connection")
    if len(head) > MAX_HEAD:
        return b"", _refuse(431, f"the request head is larger than {MAX_HEAD} bytes")
    return head, None
