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

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
"""Largest line accepted. pi's ``message_update`` repeats the whole partial
message on every delta, so lines of several MiB are normal; 64 MiB is far
beyond that while still bounding memory."""

HEAD_BYTES: Final = 200
"""How much of a bad line a report keeps, for logs."""

SHAPE_CHECK_BYTES: Final = 1024 * 1024
"""Lines at least this long have their JSON shape costed before they are parsed."""
PARSE_BUDGET_FACTOR: Final = 4
PARSE_BUDGET_BASE: Final = 32 * 1024 * 1024
"""A line may cost at most ``PARSE_BUDGET_FACTOR * len + PARSE_BUDGET_BASE`` bytes parsed.

The byte cap alone does not bound memory: parsed, ``{},{},...`` costs ~30x its
size (a 64 MiB line, ~1.9 GB; SECURITY-REVIEW.md finding 16), because every
3-byte ``{}`` becomes a Python dict. pi's big lines are big because of strings
(the partial message, a file's content), which cost about their size."""
CONTAINER_COST: Final = 64
"""Upper bound of a parsed empty dict/list, in bytes (CPython 3.11: 64 / 56)."""
ELEMENT_COST: Final = 56
"""Upper bound of one more value plus its slot (a short str is ~50 bytes, plus 8)."""
_JSON_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[{,:]')
"""A whole JSON string (its inside is text), or one structure character that costs."""


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


def parse_cost(line: bytes, stop_above: int | None = None) -> int:
    """About how many bytes parsing ``line`` allocates (an upper bound), without parsing it.

    Every ``{``/``[`` outside a string costs a container, every ``,``/``:`` one
    more value. First the same counts over the whole line, in C: when those
    (which also count characters inside strings) fit ``stop_above``, that is
    the answer. Otherwise the line is walked token by token, strings skipped
    whole, and the walk stops as soon as the cost passes ``stop_above``: memory
    stays O(1) and only a line that really is that dense is walked for long.
    """
    rough = (
        len(line)
        + CONTAINER_COST * (line.count(b"{") + line.count(b"["))
        + ELEMENT_COST * (line.count(b",") + line.count(b":"))
    )
    if stop_above is not None and rough <= stop_above:
        return rough
    cost = len(line)
    for m in _JSON_TOKEN.finditer(line):
        first = line[m.start()]
        if first == 0x22:  # '"': a string, whatever is inside it
            continue
        cost += CONTAINER_COST if first in (0x7B, 0x5B) else ELEMENT_COST
        if stop_above is not None and cost > stop_above:
            break
    return cost


def parse_budget(size: int) -> int:
    return PARSE_BUDGET_FACTOR * size + PARSE_BUDGET_BASE


def decode_line(line: bytes) -> dict[str, Any] | MalformedLine:
    """Parse one line; never raises. Non-objects are malformed for this protocol.

    A long line whose shape would cost more than :func:`parse_budget` to parse
    is refused unparsed (a :class:`MalformedLine` saying so): no pi message has
    that shape, and parsing it is how a guest would make the host's memory grow.
    """
    if len(line) >= SHAPE_CHECK_BYTES:
        budget = parse_budget(len(line))
        cost = parse_cost(line, stop_above=budget)
        if cost > budget:
            return _malformed(
                line,
                f"refused unparsed: its JSON shape would take more than {budget >> 20} MiB "
                f"to parse (a {len(line) >> 20} MiB line; pi's big lines are text)",
            )
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
