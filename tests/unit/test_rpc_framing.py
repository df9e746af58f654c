"""JSONL framing: what a line is, and what happens to lines that are not fit to keep."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest

from piwork.rpc.framing import (
    HEAD_BYTES,
    LineDecoder,
    MalformedLine,
    OversizedLine,
    decode_line,
    encode_line,
    parse_cost,
)

LS = "\u2028"
PS = "\u2029"


def feed_all(decoder: LineDecoder, *chunks: bytes) -> list[bytes | OversizedLine]:
    out: list[bytes | OversizedLine] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def test_unicode_line_and_paragraph_separators_stay_inside_a_line() -> None:
    obj = {"type": "message_update", "text": f"one{LS}two{PS}three\u0085four\x0bfive"}
    raw = orjson.dumps(obj) + b"\n"
    # orjson writes U+2028/U+2029 raw, which str.splitlines() would split on.
    assert len(raw.decode().splitlines()) > 1

    lines = LineDecoder().feed(raw)

    assert lines == [raw[:-1]]
    assert decode_line(raw[:-1]) == obj


def test_crlf_loses_exactly_one_carriage_return() -> None:
    lines = LineDecoder().feed(b'{"a":1}\r\n{"b":"x\\r"}\r\r\n')

    assert lines == [b'{"a":1}', b'{"b":"x\\r"}\r']


def test_several_lines_in_one_chunk_come_out_in_order() -> None:
    assert LineDecoder().feed(b"a\nb\n\nc\n") == [b"a", b"b", b"", b"c"]


def test_a_partial_line_waits_for_its_newline() -> None:
    decoder = LineDecoder()

    assert decoder.feed(b'{"type":"agent') == []
    assert decoder.pending_bytes == len(b'{"type":"agent')
    assert decoder.feed(b'_start"}\n{"x"') == [b'{"type":"agent_start"}']
    assert decoder.pending_bytes == 4


STREAM = (
    orjson.dumps({"type": "a", "s": f"é{LS}ü\r"})
    + b"\r\n"
    + orjson.dumps({"type": "b", "s": "🙂" * 3})
    + b"\n"
    + b"\n"
    + orjson.dumps({"type": "c"})
    + b"\r\n"
)


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_splitting_the_stream_at_any_byte_boundary_gives_the_same_lines(cut: int) -> None:
    whole = LineDecoder().feed(STREAM)

    split = feed_all(LineDecoder(), STREAM[:cut], STREAM[cut:])

    assert split == whole
    assert len(whole) == 4


def test_byte_by_byte_feeding_gives_the_same_lines() -> None:
    decoder = LineDecoder()
    out = feed_all(decoder, *(STREAM[i : i + 1] for i in range(len(STREAM))))

    assert out == LineDecoder().feed(STREAM)


def test_a_ten_megabyte_line_arrives_whole() -> None:
    payload = "x" * (10 * 1024 * 1024)
    raw = encode_line({"type": "message_update", "p": payload})
    chunks = [raw[i : i + 65536] for i in range(0, len(raw), 65536)]

    lines = feed_all(LineDecoder(), *chunks)

    assert len(lines) == 1
    line = lines[0]
    assert isinstance(line, bytes)
    parsed = decode_line(line)
    assert isinstance(parsed, dict)
    assert parsed["p"] == payload


def test_an_oversized_line_is_reported_and_the_next_line_survives() -> None:
    decoder = LineDecoder(max_line_bytes=1000)
    big = b'{"type":"agent_end","messages":"' + b"y" * 5000 + b'"}'

    out = feed_all(decoder, big[:700], big[700:3000], big[3000:] + b'\n{"type":"ok"}\n')

    assert len(out) == 2
    report, after = out
    assert isinstance(report, OversizedLine)
    assert report.size == len(big)
    assert report.head == big[:HEAD_BYTES]
    assert after == b'{"type":"ok"}'


def test_memory_stays_bounded_while_discarding_an_oversized_line() -> None:
    decoder = LineDecoder(max_line_bytes=1000)
    for _ in range(100):
        decoder.feed(b"z" * 999)
        assert decoder.pending_bytes <= 1000 + 999


def test_an_oversized_line_inside_one_chunk_is_also_reported() -> None:
    out = LineDecoder(max_line_bytes=10).feed(b"0123456789A\nshort\n")

    assert out == [OversizedLine(11, b"0123456789A"), b"short"]


def test_a_line_of_exactly_the_limit_is_kept() -> None:
    assert LineDecoder(max_line_bytes=10).feed(b"0123456789\n") == [b"0123456789"]


def test_finish_returns_a_last_line_without_newline_like_pi_does() -> None:
    decoder = LineDecoder()
    decoder.feed(b'{"a":1}\n{"b":2}')

    assert decoder.finish() == [b'{"b":2}']
    assert decoder.finish() == []


def test_encode_line_is_one_compact_line() -> None:
    raw = encode_line({"type": "prompt", "message": "a\nb\r\n" + LS, "n": None})

    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == 1
    assert b": " not in raw and b", " not in raw
    assert orjson.loads(raw) == {"type": "prompt", "message": "a\nb\r\n" + LS, "n": None}


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b'{"a":1', b"\xff\xfe", b'"just a string"', b"[1,2]", b"null"],
)
def test_decode_line_reports_malformed_input_instead_of_raising(raw: bytes) -> None:
    result = decode_line(raw)

    assert isinstance(result, MalformedLine)
    assert result.error
    assert result.size == len(raw)


def test_malformed_report_keeps_only_a_head_of_a_long_line() -> None:
    raw = b"{" + b"q" * 100_000

    result = decode_line(raw)

    assert isinstance(result, MalformedLine)
    assert len(result.head) <= HEAD_BYTES
    assert result.head.startswith("{qqq")
    assert result.size == len(raw)


def test_decode_line_accepts_a_trailing_carriage_return_or_newline() -> None:
    assert decode_line(b'{"a":1}\r') == {"a": 1}
    assert decode_line(b'{"a":1}\n') == {"a": 1}


# --- parse amplification (SECURITY-REVIEW.md finding 16) ----------------------------

_RSS_PROBE = """
import resource, sys
import orjson
from piwork.rpc.framing import decode_line, MalformedLine
size, shape = int(sys.argv[1]), sys.argv[2]
if shape == "empty-objects":
    line = b'{"type":"message_update","x":[' + b"{}," * (size // 3) + b"{}]}"
elif shape == "short-strings":
    line = b'{"type":"tool_execution_update","x":[' + b'"ab",' * (size // 5) + b'"ab"]}'
else:  # what pi really sends: the partial message, big because of its text
    text = "print('hello, world: {x}')\\n" * (size // 27)
    content = [{"type": "text", "text": text}]
    line = orjson.dumps({"type": "message_update", "message": {"content": content}})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = decode_line(line)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(len(line), grew * 1024, isinstance(result, MalformedLine))
"""


def _rss_growth(size: int, shape: str) -> tuple[int, int, bool]:
    """Peak RSS growth of one ``decode_line`` in a fresh interpreter (not this test's heap)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(size), shape],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    n, grew, refused = proc.stdout.split()
    return int(n), int(grew), refused == "True"


@pytest.mark.parametrize("shape", ["empty-objects", "short-strings"])
def test_a_line_shaped_to_blow_up_when_parsed_is_refused_unparsed(shape: str) -> None:
    n, grew, refused = _rss_growth(32 << 20, shape)
    print(f"\n{shape}: {n >> 20} MiB line, RSS grew {grew >> 20} MiB")
    assert refused
    assert grew < 3 * n  # parsed, it was ~30x (empty objects) / ~12x (short strings)


def test_a_big_line_of_text_still_parses_at_about_its_size() -> None:
    n, grew, refused = _rss_growth(32 << 20, "text")
    print(f"\ntext: {n >> 20} MiB line, RSS grew {grew >> 20} MiB")
    assert not refused
    assert grew < 3 * n


def test_a_big_line_of_code_with_braces_in_its_strings_still_parses() -> None:
    code = "function f(a, b) { return {x: [a, b], y: {z: a}}; }\n" * 40_000  # ~2 MiB
    line = orjson.dumps({"type": "message_update", "message": {"content": [code] * 8}})
    assert isinstance(decode_line(line), dict)


def test_parse_cost_ignores_structure_inside_strings() -> None:
    code = json.dumps({"type": "message_update", "text": '{"a": [1, 2], "b": {}}' * 1000})
    assert parse_cost(code.encode()) < len(code) + 10 * 64
    assert parse_cost(b"[{},{},{}]") == 10 + 4 * 64 + 2 * 56
    tricky = rb'["a\"{,:", "\\", {}]'  # an escaped quote, then an escaped backslash
    assert parse_cost(tricky) == len(tricky) + 2 * 64 + 2 * 56
