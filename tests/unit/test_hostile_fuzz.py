"""Property tests (hypothesis) for the framing, the protocol models and the channel:
whatever bytes the guest sends, nothing raises, nothing is lost, memory is bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from piwork.rpc.client import RpcClient
from piwork.rpc.framing import LineDecoder, OversizedLine
from piwork.rpc.models import EVENT_TYPES, UI_METHODS, parse_incoming
from piwork.tasks.transcript import compact_pi_line
from piwork.vm.channel import Endpoint, GuestChannel

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
known_types = st.sampled_from(
    [*EVENT_TYPES, "response", "extension_ui_request", "no_such_type", "", "  "]
)
protocolish = st.builds(
    lambda t, method, rid, extra: {
        **extra,
        "type": t,
        **({"method": method} if method is not None else {}),
        **({"id": rid} if rid is not None else {}),
    },
    known_types,
    st.one_of(st.none(), st.sampled_from([*UI_METHODS, "bogus"]), json_values),
    st.one_of(st.none(), st.text(max_size=10), st.integers(-1000, 1000)),
    st.dictionaries(
        st.sampled_from(
            ["message", "assistantMessageEvent", "toolCallId", "result", "partialResult",
             "success", "command", "data", "error", "options", "title", "timeout", "delayMs",
             "attempt", "maxAttempts", "willRetry", "messages", "args", "isError"]
        ),
        json_values,
        max_size=6,
    ),
)  # fmt: skip


@SETTINGS
@given(st.lists(st.binary(max_size=64).filter(lambda b: b"\n" not in b), max_size=20),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=10),
       st.integers(min_value=1, max_value=80))  # fmt: skip
def test_the_decoder_returns_each_line_whatever_the_chunking(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    decoder = LineDecoder(limit)
    out: list[bytes | OversizedLine] = []
    pos = 0
    i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        out += decoder.feed(stream[pos : pos + step])
        pos += step
        i += 1
    out += decoder.finish()
    assert len(out) == len(lines)
    for got, raw in zip(out, lines, strict=True):
        want = raw[:-1] if raw.endswith(b"\r") else raw
        if isinstance(got, OversizedLine):
            # Too long (a trailing \r may count, as documented); its head is kept.
            assert len(raw) > limit and got.head == raw[: len(got.head)]
        else:
            assert got == want and len(want) <= limit
    assert decoder.pending_bytes <= limit


@SETTINGS
@given(protocolish)
def test_any_protocol_shaped_object_parses_without_raising(obj: dict[str, Any]) -> None:
    parse_incoming(obj)
    compact_pi_line(obj)


@SETTINGS
@given(st.lists(st.one_of(protocolish, json_values.map(lambda v: v)), max_size=15),
       st.lists(st.binary(max_size=40), max_size=5))  # fmt: skip
def test_the_client_survives_any_stream_and_still_answers(
    objs: list[Any], junk: list[bytes]
) -> None:
    async def run() -> None:
        sent: list[bytes] = []

        async def send(line: bytes) -> None:
            sent.append(line)

        client = RpcClient(send, default_timeout=5)
        for obj in objs:
            client.feed_line(orjson.dumps(obj))
        for raw in junk:
            client.feed_line(raw)
        client.feed_bytes(b"".join(junk) + b"\n")
        # Still in step: a request made now gets its reply.
        asking = asyncio.create_task(client.get_state())
        await asyncio.sleep(0)
        req = orjson.loads(sent[-1])
        client.feed_line(
            orjson.dumps(
                {
                    "id": req["id"],
                    "type": "response",
                    "command": "get_state",
                    "success": True,
                    "data": {"isStreaming": False},
                }
            )
        )
        assert (await asyncio.wait_for(asking, 2)).is_streaming is False
        await client.aclose()

    asyncio.run(run())


@SETTINGS
@given(st.lists(st.binary(max_size=80), max_size=30))
@example([b"100", b"0000"])  # a line numbered 1,000,000: any fixed "next" seq is stale
def test_the_channel_reader_never_dies_on_any_bytes(chunks: list[bytes]) -> None:
    async def run() -> list[bytes]:
        pi_lines: list[bytes] = []
        events: list[dict[str, Any]] = []
        chan = GuestChannel(Endpoint(tcp_port=1), pi_lines.append, events.append)
        reader = asyncio.StreamReader(limit=256)
        reader.feed_data(b'0 !{"ev":"hello","bootId":"b"}\n')
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_data(b"\n")
        reader.feed_eof()
        await asyncio.wait_for(chan._read_loop(reader), 5)  # returns at EOF, never raises
        # The channel still works afterwards: a reconnect to the same boot delivers
        # the next line in sequence, whatever seq the garbage left it at.
        again = asyncio.StreamReader(limit=256)
        again.feed_data(b'0 !{"ev":"hello","bootId":"b"}\n')
        again.feed_data(b"%d tail\n" % (chan.last_seq + 1))
        again.feed_eof()
        await asyncio.wait_for(chan._read_loop(again), 5)
        return pi_lines

    lines = asyncio.run(run())
    assert lines and lines[-1] == b"tail"


def test_a_guest_skipping_seqs_forever_leaves_a_bounded_gap_list() -> None:
    async def run() -> GuestChannel:
        chan = GuestChannel(Endpoint(tcp_port=1), lambda _l: None, lambda _e: None)
        reader = asyncio.StreamReader()
        reader.feed_data(b'0 !{"ev":"hello","bootId":"b"}\n')
        for i in range(1, 20_000):
            reader.feed_data(b"%d {}\n" % (2 * i))  # every other seq missing
        reader.feed_eof()
        await asyncio.wait_for(chan._read_loop(reader), 30)
        return chan

    chan = asyncio.run(run())
    assert len(chan.gaps) <= 100
    assert chan.gaps[-1] == (2 * 19_999 - 1, 2 * 19_999 - 1)
