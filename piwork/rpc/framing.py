"""Strict JSONL framing for pi's RPC stream.

pi writes one JSON object per line and splits its own input on ``\\n`` only
(``dist/modes/rpc/jsonl.js``). JSON strings may legally contain U+2028/U+2029
and other separators that ``str.splitlines()`` treats as line ends, so this
module works on bytes and splits on ``\\n`` alone.

Nothing here raises on bad input: a line that is too big or not JSON becomes a
report object that the caller can show or log, because a single bad line from
the guest must never take down the host's reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
"""Largest line accepted. pi's ``message_update`` repeats the whole partial
message on every delta, so lines of several MiB are normal; 64 MiB is far
beyond that while still bounding memory."""

HEAD_BYTES: Final = 200
"""How much of a bad line a report keeps, for logs."""


@dataclass(frozen=True, slots=True)
class OversizedLine:
    """A line longer than the decoder's limit; its bytes were discarded."""

    size: int
    """Length of the line in bytes, without the ``\\n`` (a ``\\r`` before it may count)."""
    head: bytes
    """The first :data:`HEAD_BYTES` bytes of the line."""

    def describe(self) -> str:
        return f"discarded a {self.size}-byte line starting {self.head[:80]!r}"


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A complete line that is not a JSON object."""

    error: str
    head: str
    """A truncated, lossily decoded copy of the line."""
    size: int

    def describe(self) -> str:
        return f"malformed line ({self.error}): {self.head[:80]!r}"


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


class LineDecoder:
    """Turns arbitrary byte chunks into complete lines.

    Feed chunks with :meth:`feed`; each call returns the lines completed by
    that chunk, in order, as ``bytes`` (without ``\\n`` and one trailing
    ``\\r``) or :class:`OversizedLine` reports. Memory stays bounded by
    ``max_line_bytes`` plus one chunk: once a partial line passes the limit,
    its bytes are dropped until its newline arrives.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        # While discarding an oversized line: its size so far and its head.
        self._discarding = False
        self._discarded = 0
        self._head = b""

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the current incomplete line."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[bytes | OversizedLine]:
        out: list[bytes | OversizedLine] = []
        pos = 0
        end = len(chunk)
        while pos < end:
            nl = chunk.find(b"\n", pos)
            if nl == -1:
                self._absorb_partial(chunk, pos, end)
                break
            self._complete(chunk, pos, nl, out)
            pos = nl + 1
        return out

    def finish(self) -> list[bytes | OversizedLine]:
        """End of stream: a final line without ``\\n`` still counts (as pi does)."""
        out: list[bytes | OversizedLine] = []
        if self._discarding:
            out.append(OversizedLine(self._discarded, self._head))
        elif self._buf:
            line = _strip_cr(bytes(self._buf))
            out.append(self._checked(line))
        self._reset()
        return out

    def _reset(self) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._discarded = 0
        self._head = b""

    def _absorb_partial(self, chunk: bytes, start: int, end: int) -> None:
        if self._discarding:
            self._discarded += end - start
            return
        self._buf += chunk[start:end]
        if len(self._buf) > self.max_line_bytes:
            self._discarding = True
            self._discarded = len(self._buf)
            self._head = bytes(self._buf[:HEAD_BYTES])
            self._buf = bytearray()

    def _complete(
        self, chunk: bytes, start: int, nl: int, out: list[bytes | OversizedLine]
    ) -> None:
        if self._discarding:
            out.append(OversizedLine(self._discarded + (nl - start), self._head))
            self._reset()
            return
        if self._buf:
            self._buf += chunk[start:nl]
            line = bytes(self._buf)
            self._buf = bytearray()
        else:
            line = chunk[start:nl]
        out.append(self._checked(_strip_cr(line)))

    def _checked(self, line: bytes) -> bytes | OversizedLine:
        if len(line) > self.max_line_bytes:
            return OversizedLine(len(line), line[:HEAD_BYTES])
        return line


def encode_line(obj: Any) -> bytes:
    """One compact JSON object followed by ``\\n``.

    orjson never emits a raw newline (control characters in strings are
    escaped), so the result is always exactly one line.
    """
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def decode_line(line: bytes) -> dict[str, Any] | MalformedLine:
    """Parse one line; never raises. Non-objects are malformed for this protocol."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return _malformed(line, str(exc))
    if not isinstance(value, dict):
        return _malformed(line, f"expected a JSON object, got {type(value).__name__}")
    return value


def _malformed(line: bytes, error: str) -> MalformedLine:
    head = line[:HEAD_BYTES].decode("utf-8", errors="replace")
    return MalformedLine(error=error, head=head, size=len(line))
