"""Fuzzing what the guest's bytes meet first on the host: the egress proxy's HTTP/1
and TLS parsers (``piwork.proxy.http1``) and the gateway's strict JSON and body
allowlist (``piwork.proxy.schema``, ``piwork.proxy.allowlist``).

Two kinds, each printing the cases it ran:

* coverage-guided (atheris/libFuzzer, ``tests/fuzz/fuzz_parsers.py``), started from
  seeds (a proxy request head, a chunked body, a real OpenSSL ClientHello, pi 1.6's
  request bodies), with a fixed seed so a run is reproducible;
* properties (hypothesis): what is accepted round-trips, what is refused is refused
  with the parser's own exception, and a live proxy fed generated request streams
  sends the origin at most one request per connection, for the vetted host only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piwork.config import repo_root
from piwork.proxy.allowlist import check_body
from piwork.proxy.egress import EgressProxy
from piwork.proxy.http1 import BadRequest, ChunkedBody, body_framing, client_hello_sni, parse_head
from piwork.proxy.schema import Refused, loads_strict
from tests.helpers.egress import client_hello
from tests.helpers.figures import report

FUZZ = repo_root() / "tests/fuzz/fuzz_parsers.py"
RUNS = {"head": 200_000, "chunked": 30_000, "hello": 60_000, "body": 40_000}


@pytest.mark.parametrize("target", list(RUNS))
def test_coverage_guided_fuzzing_finds_nothing(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    proc = subprocess.run(
        [sys.executable, str(FUZZ), target, f"-runs={RUNS[target]}", "-seed=1",
         "-max_total_time=300", str(corpus), str(FUZZ.parent / "seeds" / target)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    done = re.search(r"Done (\d+) runs in (\d+) second", proc.stderr)
    final = re.search(r"DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)", proc.stderr)
    assert proc.returncode == 0 and done is not None and final is not None, proc.stderr[-4000:]
    report(
        f"fuzz {target}: {done.group(1)} cases in {done.group(2)} s, "
        f"coverage {final.group(1)} edges / {final.group(2)} features, corpus {final.group(3)}"
    )
    assert int(done.group(1)) == RUNS[target]


# --- properties ---------------------------------------------------------------------------

_TOKEN = st.text("abcXYZ-_0189!#", min_size=1, max_size=12)
_ODD = st.sampled_from(["\x00", "\r", "\n", " ", "\t", "\x7f", "\x80", ":", "é", "\x0b"])


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """Request heads near the valid ones: right shapes with odd bytes spliced in."""
    method = draw(st.sampled_from(["GET", "POST", "CONNECT", "get", "G ET"]))
    target = draw(st.sampled_from(["http://example.com/x", "example.com:443", "/p", ""]))
    lines = [f"{method} {target} {draw(st.sampled_from(['HTTP/1.1', 'HTTP/1.0', 'HTTP/2']))}"]
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.one_of(_TOKEN, st.sampled_from(["Content-Length", "Transfer-Encoding"])))
        value = draw(st.one_of(st.text(max_size=10), st.sampled_from(["5", "chunked", "0,0"])))
        if draw(st.booleans()):
            where = draw(st.integers(0, len(name)))
            name = name[:where] + draw(_ODD) + name[where:]
        lines.append(f"{name}: {value}" if draw(st.booleans()) else f"{name}:{value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass")


def test_a_head_is_parsed_one_way_or_refused() -> None:
    cases = 0

    @settings(max_examples=1500, deadline=None)
    @given(heads())
    def prop(head: bytes) -> None:
        nonlocal cases
        cases += 1
        try:
            parsed = parse_head(head)
            framing = body_framing(parsed)
        except BadRequest:
            return
        for name, value in parsed.headers:
            assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name), name
            assert not set(value) & {"\r", "\n", "\x00"}
        again = (
            f"{parsed.method} {parsed.target} {parsed.version}\r\n"
            + "".join(f"{n}: {v}\r\n" for n, v in parsed.headers)
            + "\r\n"
        ).encode("latin-1")
        assert parse_head(again) == parsed and body_framing(parse_head(again)) == framing

    prop()
    report(f"property request heads: {cases} cases")


def test_a_chunked_body_comes_out_whole_however_it_is_cut() -> None:
    cases = 0

    @settings(max_examples=500, deadline=None)
    @given(
        st.lists(st.binary(min_size=1, max_size=40), max_size=6),
        st.lists(st.sampled_from(["", ";a=b", ";x", ' ;y="z"']), min_size=7, max_size=7),
        st.binary(max_size=30),
        st.data(),
    )
    def prop(chunks: list[bytes], exts: list[str], after: bytes, data: st.DataObject) -> None:
        nonlocal cases
        cases += 1
        wire = b"".join(
            b"%x%s\r\n%s\r\n" % (len(c), exts[i].encode(), c) for i, c in enumerate(chunks)
        )
        wire += b"0\r\nTrailer: t\r\n\r\n" + after
        decoder, out, pos = ChunkedBody(), bytearray(), 0
        while pos < len(wire):
            step = data.draw(st.integers(1, 16))
            out += decoder.feed(wire[pos : pos + step])
            pos += step
        assert decoder.done and decoder.rest == after
        payload, check = bytearray(), ChunkedBody()
        assert check.feed(bytes(out)) == bytes(out) and check.done
        rest = bytes(out)
        while not rest.startswith(b"0\r\n"):
            size, _, rest = rest.partition(b"\r\n")
            payload += rest[: int(size, 16)]
            rest = rest[int(size, 16) + 2 :]
        assert bytes(payload) == b"".join(chunks)

    prop()
    report(f"property chunked bodies: {cases} cases")


def test_the_name_in_a_real_client_hello_is_read_and_mangled_ones_refused() -> None:
    cases = 0

    @settings(max_examples=100, deadline=None)
    @given(
        st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True),
        st.data(),
    )
    def prop(name: str, data: st.DataObject) -> None:
        nonlocal cases
        cases += 1
        hello = client_hello(name)
        got = client_hello_sni(hello)
        assert got is not None and got.sni == name and not got.ech
        cut = data.draw(st.integers(0, len(hello) - 1))
        with contextlib.suppress(BadRequest):
            assert client_hello_sni(hello[:cut]) is None  # a prefix: more bytes needed
        flip = data.draw(st.integers(0, len(hello) - 1))
        mangled = (
            hello[:flip] + bytes([hello[flip] ^ data.draw(st.integers(1, 255))]) + hello[flip + 1 :]
        )
        with contextlib.suppress(BadRequest):
            client_hello_sni(mangled)

    prop()
    report(f"property client hello names: {cases} cases")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["model", "messages", "tools", "type", "role", "content", "url", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


def test_a_body_is_checked_one_way_or_refused() -> None:
    cases = 0

    @settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        _JSON,
        st.sampled_from(
            ["anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai"]
        ),
    )
    def prop(value: object, api: str) -> None:
        nonlocal cases
        cases += 1
        try:
            raw = orjson.dumps(value)
        except TypeError:  # out-of-range ints, NaN: orjson will not write them, nor will pi
            return
        try:
            checked = check_body(api, loads_strict(raw))  # type: ignore[arg-type]
        except Refused:
            return
        again = orjson.loads(orjson.dumps(checked.body))
        assert check_body(api, again).body == again  # type: ignore[arg-type]

    prop()
    report(f"property gateway bodies: {cases} cases")


@st.composite
def streams(draw: st.DrawFn, port: int) -> bytes:
    """What a guest might write to the proxy on one connection."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["get", "post", "chunked", "fronted", "junk", "connect"]))
        if kind == "get":
            parts.append(f"GET http://localhost:{port}/a HTTP/1.1\r\n\r\n".encode())
        elif kind == "post":
            n = draw(st.integers(0, 8))
            parts.append(
                f"POST http://localhost:{port}/b HTTP/1.1\r\nContent-Length: {n}\r\n\r\n".encode()
                + b"x" * draw(st.integers(0, n + 4))
            )
        elif kind == "chunked":
            parts.append(
                f"POST http://localhost:{port}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                "3\r\nabc\r\n0\r\n\r\n".encode()
            )
        elif kind == "fronted":
            parts.append(b"GET /f HTTP/1.1\r\nHost: exfil.attacker.example\r\n\r\n")
        elif kind == "connect":
            parts.append(b"CONNECT exfil.attacker.example:443 HTTP/1.1\r\n\r\n")
        else:
            parts.append(draw(st.binary(max_size=20)))
    return b"".join(parts)


def test_a_live_proxy_sends_one_vetted_request_per_connection() -> None:
    """Generated request streams against a real proxy and origin: whatever is
    pipelined, only the first request goes, only to the host the policy allowed."""
    from aiohttp import web

    seen: list[tuple[str, str]] = []
    asked: list[str] = []

    async def policy(host: str, port: int) -> bool:
        asked.append(host)
        return host == "localhost"

    async def origin(request: web.Request) -> web.Response:
        seen.append((request.host, request.path))
        await request.read()
        return web.Response(text="ok")

    async def run(examples: list[bytes], port_box: list[int]) -> list[list[tuple[str, str]]]:
        per_connection = []
        async with EgressProxy(policy, allow_private_networks=True, header_timeout=1) as proxy:
            for data in examples:
                before = len(seen)
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                writer.write(data)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                    writer.write_eof()
                with contextlib.suppress(ConnectionError, TimeoutError):
                    # (a body shorter than its Content-Length keeps the origin waiting)
                    await asyncio.wait_for(reader.read(), 2)
                writer.close()
                await asyncio.sleep(0)
                per_connection.append(seen[before:])
        return per_connection

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", origin)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        examples: list[bytes] = []

        @settings(max_examples=60, deadline=None, database=None)
        @given(streams(port))
        def collect(data: bytes) -> None:
            examples.append(data)

        collect()
        try:
            results = await run(examples, [port])
        finally:
            await runner.cleanup()
        for data, got in zip(examples, results, strict=True):
            assert len(got) <= 1, (data, got)
            assert all(host == f"localhost:{port}" for host, _ in got), (data, got)
        report(f"property live proxy: {len(examples)} streams, {len(seen)} requests went through")

    asyncio.run(main())
