"""PNG images built and read back without an imaging library."""

from __future__ import annotations

import base64
import struct
import zlib


def png(width: int, height: int) -> bytes:
    """An RGB PNG with a gradient (so it is not trivially small), written here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    row = bytes(v for x in range(width) for v in (x % 256, (x * 7) % 256, 128))
    rows = b"".join(b"\0" + row for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR (raises if it is not a PNG)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError(f"not a PNG: {data[:16]!r}")
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def images_sent(body: object) -> list[bytes]:
    """Every ``data:`` image URL in a chat request's messages, decoded."""
    found: list[bytes] = []
    messages = body.get("messages", []) if isinstance(body, dict) else []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else []:
            url = (part.get("image_url") or {}).get("url", "") if isinstance(part, dict) else ""
            if isinstance(url, str) and url.startswith("data:"):
                found.append(base64.b64decode(url.partition(",")[2]))
    return found
