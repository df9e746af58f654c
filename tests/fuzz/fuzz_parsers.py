"""Coverage-guided fuzzing (atheris/libFuzzer) of what the guest's bytes meet first
on the host: the egress proxy's HTTP/1 and TLS parsers and the gateway's body check.

    python tests/fuzz/fuzz_parsers.py TARGET -runs=N [corpus dirs...]

TARGET is one of ``head``, ``chunked``, ``hello``, ``body``. Only the exceptions a
parser documents (``BadRequest``, ``Refused``) may come out; anything else, a hang
or a blow-up is a finding (libFuzzer stops and prints the input). Run by
``tests/unit/test_parsers_fuzz.py``, which prints the cases run.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["piwork.proxy"]):
    from piwork.proxy.allowlist import check_body, check_headers, check_query
    from piwork.proxy.http1 import (
        BadRequest,
        ChunkedBody,
        body_framing,
        client_hello_sni,
        parse_head,
    )
    from piwork.proxy.schema import Refused, loads_strict

APIS = ("anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai")


def head(data: bytes) -> None:
    try:
        parsed = parse_head(data + b"\r\n\r\n")
        body_framing(parsed)
    except BadRequest:
        return
    for name, value in parsed.headers:
        assert name.isascii() and ":" not in name
        assert not any(c in value for c in "\r\n\x00")


def chunked(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    decoder = ChunkedBody()
    out = bytearray()
    try:
        while fdp.remaining_bytes():
            out += decoder.feed(fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 64)))
    except BadRequest:
        return
    if decoder.done:  # what goes upstream is itself a well-formed chunked body
        again = ChunkedBody()
        assert again.feed(bytes(out)) == bytes(out) and again.done and again.rest == b""


def hello(data: bytes) -> None:
    try:
        got = client_hello_sni(b"\x16\x03\x01" + len(data).to_bytes(2, "big")[-2:] + data)
    except BadRequest:
        return
    if got is not None and got.sni is not None:
        assert got.sni == got.sni.lower() and got.sni.isascii()


def body(data: bytes) -> None:
    """Byte 0 picks the API, byte 1 the enabled server tools, the rest is the body."""
    if len(data) < 2:
        return
    api = APIS[data[0] % len(APIS)]
    enabled = frozenset(k for i, k in enumerate(("web_search", "mcp")) if data[1] >> i & 1)
    raw = data[2:]
    try:
        check_query(api, raw[:64].decode("latin-1"))
        check_headers(api, [("anthropic-beta", raw[:80].decode("latin-1"))], enabled=enabled)
    except Refused:
        pass
    try:
        checked = check_body(api, loads_strict(raw), enabled=enabled)
    except Refused:
        return
    assert isinstance(checked.body, dict)


TARGETS = {"head": head, "chunked": chunked, "hello": hello, "body": body}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
