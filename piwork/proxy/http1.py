"""The least of HTTP/1.1 and TLS the egress proxy must read, read strictly.

The guest writes every byte the proxy reads, so each parser here takes bytes
and returns a value or raises :class:`BadRequest`; none of them does I/O, so
they are fuzzed directly (``tests/unit/test_http1_fuzz.py``, atheris and
hypothesis). What is ambiguous to some HTTP implementation is refused rather
than guessed: bare CR or LF, obs-fold, control bytes or spaces in names, a
body framed twice (``Content-Length`` with ``Transfer-Encoding``, or two
different lengths), any transfer coding but ``chunked``.

* :func:`parse_head`: a request line and its headers;
* :func:`body_framing`: how long the body after that head is;
* :class:`ChunkedBody`: a chunked body, re-framed chunk by chunk, and where it ends;
* :func:`client_hello_sni`: the server name a TLS ClientHello asks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from piwork.errors import ProtocolError

MAX_HEADERS = 128
MAX_CHUNK_LINE = 1024
MAX_CLIENT_HELLO = 64 * 1024


class BadRequest(ProtocolError):
    """Bytes the proxy will not act on; ``str()`` says why (shown to the guest)."""


_METHOD = re.compile(rb"[A-Z]{1,20}")
_TARGET = re.compile(rb"[\x21-\x7e]{1,8192}")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]{0,16384}")


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    """Names as sent, values with surrounding blanks removed; latin-1 text."""

    def get_all(self, name: str) -> list[str]:
        lname = name.lower()
        return [v for n, v in self.headers if n.lower() == lname]


def parse_head(head: bytes) -> RequestHead:
    """A request head ending in CRLF CRLF, as the guest sent it."""
    if not head.endswith(b"\r\n\r\n"):
        raise BadRequest("the request head does not end with an empty line")
    body = head[:-4]
    if b"\n" in body.replace(b"\r\n", b"") or b"\r" in body.replace(b"\r\n", b""):
        raise BadRequest("bare CR or LF in the request head")
    request_line, *lines = body.split(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise BadRequest("the request line must be METHOD TARGET HTTP/1.x")
    method, target, version = parts
    if not _METHOD.fullmatch(method):
        raise BadRequest("a method is uppercase letters")
    if not _TARGET.fullmatch(target):
        raise BadRequest("the request target holds control bytes, spaces or nothing")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest("HTTP/1.0 and HTTP/1.1 only")
    if len(lines) > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} header lines")
    headers = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise BadRequest("folded header lines (obs-fold) are refused")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise BadRequest("a header name is a token (no spaces, controls or NUL)")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise BadRequest(f"the value of {name.decode('latin-1')} holds control bytes")
        headers.append((name.decode("latin-1"), value.decode("latin-1")))
    return RequestHead(
        method.decode("ascii"), target.decode("ascii"), version.decode("ascii"), tuple(headers)
    )


Framing = tuple[Literal["none", "length", "chunked"], int]


def body_framing(head: RequestHead) -> Framing:
    """``("none", 0)``, ``("length", n)`` or ``("chunked", 0)`` for the body after ``head``."""
    codings = [c.strip().lower() for v in head.get_all("transfer-encoding") for c in v.split(",")]
    lengths = head.get_all("content-length")
    if codings:
        if lengths:
            raise BadRequest("Content-Length and Transfer-Encoding together are refused")
        if codings != ["chunked"] or head.version != "HTTP/1.1":
            raise BadRequest("the only transfer coding is chunked (HTTP/1.1)")
        return ("chunked", 0)
    if not lengths:
        return ("none", 0)
    values = {v.strip() for item in lengths for v in item.split(",")}
    if len(values) != 1:
        raise BadRequest("two different Content-Length values")
    (value,) = values
    if not value.isdigit() or not value.isascii() or len(value) > 18:
        raise BadRequest("Content-Length is a decimal number")
    return ("length", int(value))


class ChunkedBody:
    """A chunked body read incrementally: :meth:`feed` returns the bytes to forward
    (each chunk framed again without extensions; no trailers), ``done`` once the
    last chunk and the empty line after it were read; ``rest`` is what came after."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state: Literal["size", "data", "data-end", "trailer", "done"] = "size"
        self._left = 0
        self.rest = b""

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.rest += data
            return b""
        self._buf += data
        out = bytearray()
        while not self.done:
            if self._state == "size":
                line = self._line()
                if line is None:
                    break
                size = line.split(b";", 1)[0].strip(b" \t")
                if not size or len(size) > 16 or not re.fullmatch(rb"[0-9A-Fa-f]+", size):
                    raise BadRequest("a chunk size is hexadecimal")
                self._left = int(size, 16)
                if self._left == 0:
                    self._state = "trailer"
                    out += b"0\r\n\r\n"
                else:
                    self._state = "data"
                    out += b"%x\r\n" % self._left
            elif self._state == "data":
                if not self._buf:
                    break
                take = bytes(self._buf[: self._left])
                del self._buf[: len(take)]
                self._left -= len(take)
                out += take
                if self._left == 0:
                    self._state = "data-end"
            elif self._state == "data-end":
                if len(self._buf) < 2:
                    break
                if self._buf[:2] != b"\r\n":
                    raise BadRequest("a chunk does not end with CRLF")
                del self._buf[:2]
                out += b"\r\n"
                self._state = "size"
            else:  # trailer lines, dropped, until the empty one
                line = self._line()
                if line is None:
                    break
                if not line:
                    self._state = "done"
                    self.rest = bytes(self._buf)
                    self._buf.clear()
        return bytes(out)

    def _line(self) -> bytes | None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > MAX_CHUNK_LINE or b"\n" in self._buf or b"\r" in self._buf[:-1]:
                raise BadRequest("a chunk line is too long or not ended by CRLF")
            return None
        line = bytes(self._buf[:end])
        if end > MAX_CHUNK_LINE or b"\n" in line or b"\r" in line:
            raise BadRequest("a chunk line is too long or not ended by CRLF")
        del self._buf[: end + 2]
        return line


@dataclass(frozen=True)
class ClientHello:
    sni: str | None
    """The server name asked for (lowercase, no trailing dot), if any."""
    ech: bool
    """It carries an encrypted ClientHello: the real name is hidden."""


_SNI = 0x0000
_ECH = (0xFE0D, 0xFE08, 0xFE09, 0xFE0A)


def client_hello_sni(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of a TLS stream; ``None``: more bytes are needed.

    Handshake records are reassembled (a ClientHello may span records); anything
    that is not a well-formed ClientHello raises :class:`BadRequest`.
    """
    handshake = bytearray()
    pos = 0
    while True:
        if len(data) - pos < 5:
            return None
        ctype, major, length = data[pos], data[pos + 1], int.from_bytes(data[pos + 3 : pos + 5])
        if ctype != 0x16 or major != 3 or not 0 < length <= 16384 + 256:
            raise BadRequest("not a TLS handshake")
        if len(data) - pos - 5 < length:
            return None
        handshake += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if len(handshake) >= 4:
            if handshake[0] != 0x01:
                raise BadRequest("the first TLS message is not a ClientHello")
            need = int.from_bytes(handshake[1:4])
            if need > MAX_CLIENT_HELLO:
                raise BadRequest("the ClientHello is too large")
            if len(handshake) >= 4 + need:
                return _parse_client_hello(bytes(handshake[4 : 4 + need]))
        if pos > MAX_CLIENT_HELLO:
            raise BadRequest("the ClientHello is too large")


def _parse_client_hello(body: bytes) -> ClientHello:
    r = _Reader(body)
    r.take(2 + 32)  # legacy version, random
    r.take(r.num(1))  # session id
    r.take(r.num(2))  # cipher suites
    r.take(r.num(1))  # compression methods
    if r.left() == 0:
        return ClientHello(None, False)
    ext = _Reader(r.take(r.num(2)))
    if r.left():
        raise BadRequest("bytes after the ClientHello's extensions")
    sni: str | None = None
    ech = False
    seen: set[int] = set()
    while ext.left():
        kind, data = ext.num(2), ext.take(ext.num(2))
        if kind in seen:
            raise BadRequest("a TLS extension appears twice")
        seen.add(kind)
        ech = ech or kind in _ECH
        if kind == _SNI:
            sni = _server_name(data)
    return ClientHello(sni, ech)


def _server_name(data: bytes) -> str:
    r = _Reader(data)
    names = _Reader(r.take(r.num(2)))
    if r.left():
        raise BadRequest("bytes after the server name list")
    found = []
    while names.left():
        kind, name = names.num(1), names.take(names.num(2))
        if kind == 0:
            found.append(name)
    if len(found) != 1:
        raise BadRequest("a ClientHello names one host name")
    try:
        text = found[0].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("a server name is ASCII") from None
    if not text or not re.fullmatch(r"[A-Za-z0-9._-]{1,253}\.?", text):
        raise BadRequest("a server name is a host name")
    return text.lower().rstrip(".")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def left(self) -> int:
        return len(self._data) - self._pos

    def take(self, n: int) -> bytes:
        if n > self.left():
            raise BadRequest("a truncated ClientHello")
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def num(self, width: int) -> int:
        return int.from_bytes(self.take(width))


__all__ = [
    "BadRequest",
    "ChunkedBody",
    "ClientHello",
    "RequestHead",
    "body_framing",
    "client_hello_sni",
    "parse_head",
]
