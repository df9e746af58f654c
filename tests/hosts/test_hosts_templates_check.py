"""The remote saved VM's check, over a real sshd, against planted files: only a template
whose meta.json names exactly this key, with the recorded sizes and the state file's
SHA-256 there, is restored; everything else says why (and whether to move it aside)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import asyncssh
import orjson
import pytest

from piwork.hosts import templates
from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.vm.template import Template, TemplateUnavailable
from tests.helpers.hosts import Sshd

KEY = {"format": 4, "pack": "p1", "qemu": "QEMU emulator version 7.2|1|2", "memory_mb": 1}


def plant(d: Path, *, key: object = KEY, state: bytes = b"device state", meta: bytes | None = None,
          ram_size: int = 1 << 20) -> None:  # fmt: skip
    d.mkdir(parents=True, exist_ok=True)
    (d / "state").write_bytes(state)
    with (d / "ram").open("wb") as fh:
        fh.truncate(ram_size)
    if meta is None:
        sha = hashlib.sha256(b"device state").hexdigest()
        meta = orjson.dumps({"key": key, "state_size": 12, "state_sha256": sha})
    (d / "meta.json").write_bytes(meta)


async def reason(conn: asyncssh.SSHClientConnection, tpl: Template) -> tuple[str, bool]:
    with pytest.raises(TemplateUnavailable) as info:
        await templates.check(conn, tpl)
    return str(info.value), isinstance(info.value, templates.TemplateBroken)


async def test_only_an_intact_template_of_this_key_passes(sshd: Sshd, tmp_path: Path) -> None:
    d = tmp_path / "templates" / "abc"
    tpl = Template(d, KEY)
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    try:
        assert await reason(conn, tpl) == ("no saved VM for this pack and machine there yet", False)
        plant(d)
        assert await templates.check(conn, tpl)
        plant(d, state=b"device stat!")  # same size, other bytes
        assert await reason(conn, tpl) == ("the saved VM's state file there is corrupt", True)
        plant(d, state=b"device")
        said, broken = await reason(conn, tpl)
        assert broken and "truncated" in said
        plant(d, ram_size=4096)
        said, broken = await reason(conn, tpl)
        assert broken and "truncated" in said
        plant(d, key={**KEY, "qemu": "QEMU emulator version 9.0|1|2"})
        said, broken = await reason(conn, tpl)
        assert broken and "another pack, QEMU or machine" in said
        for meta in (b"{not json", b"[1, 2]", b"", b"x" * (templates.META_MAX_BYTES + 1)):
            plant(d, meta=meta)
            said, broken = await reason(conn, tpl)
            assert broken and "unreadable" in said, meta[:20]
        await templates.discard(conn, tpl)
        assert not d.exists() and list(d.parent.iterdir()) == []
    finally:
        conn.close()
        await conn.wait_closed()
