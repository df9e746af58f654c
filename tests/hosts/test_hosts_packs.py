"""The pack on a remote host over a real sshd: sent once, verified there, resent if damaged."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import asyncssh
import pytest

from piwork.hosts.connect import HostKeyMismatch, connect, fingerprint_matcher
from piwork.hosts.packs import ensure_pack
from piwork.hosts.remote import remote_root
from piwork.hosts.store import known_hosts_file
from piwork.pack.manifest import MANIFEST_NAME, Manifest, PackFile
from tests.helpers.hosts import Sshd


def make_pack(base: Path, pack_id: str = "abc123") -> tuple[Path, Manifest]:
    """A small pack laid out as the builder lays one out (the upload reads no more)."""
    d = base / pack_id
    (d / "boot").mkdir(parents=True)
    files = {"boot/vmlinuz": os.urandom(300_000), "initrd.cpio": os.urandom(70_000)}
    listed = []
    for rel, data in files.items():
        (d / rel).write_bytes(data)
        listed.append(PackFile(path=rel, sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
    manifest = Manifest(
        pack_id=pack_id,
        kernel="boot/vmlinuz",
        initrd="initrd.cpio",
        cmdline="console=ttyS0",
        versions={},
        files=listed,
        created_at="2026-11-24T00:00:00Z",
        builder="test",
    )
    (d / MANIFEST_NAME).write_text(manifest.model_dump_json())
    return d, manifest


async def _conn(sshd: Sshd) -> asyncssh.SSHClientConnection:
    return await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))


async def test_second_upload_sends_nothing_and_damage_is_resent(sshd: Sshd, tmp_path: Path) -> None:
    pack_dir, manifest = make_pack(tmp_path / "local")
    conn = await _conn(sshd)
    try:
        root = await remote_root(conn, sshd.host(), create=True)
        first = await ensure_pack(conn, root, pack_dir, manifest)
        assert first.bytes_sent == 370_000 and first.files_sent == 2
        remote = Path(first.remote_dir)
        assert remote == Path(root) / "packs" / "abc123"
        assert (remote / "boot/vmlinuz").read_bytes() == (pack_dir / "boot/vmlinuz").read_bytes()
        assert [p.name for p in remote.parent.iterdir()] == ["abc123"]  # no tmp left
        second = await ensure_pack(conn, root, pack_dir, manifest)
        assert second.bytes_sent == 0
        assert "0 bytes uploaded" in second.describe()
        assert (remote / ".verified").is_file()  # the stamp of the verified files
        # A file changed on the remote (its mtime put back, as `touch -d` would): its
        # ctime still moved, so the stamp differs, the hashes are checked, it is sent again.
        damaged = remote / "initrd.cpio"
        before = damaged.stat()
        with damaged.open("r+b") as fh:
            fh.write(b"X")
        os.utime(damaged, ns=(before.st_atime_ns, before.st_mtime_ns))
        third = await ensure_pack(conn, root, pack_dir, manifest)
        assert third.bytes_sent == 370_000 and "did not verify" in third.reason
        assert (remote / "initrd.cpio").read_bytes() == (pack_dir / "initrd.cpio").read_bytes()
    finally:
        conn.close()
        await conn.wait_closed()


async def test_unsafe_manifest_path_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    pack_dir, manifest = make_pack(tmp_path / "local")
    evil = manifest.model_copy(
        update={"files": [*manifest.files, PackFile(path="../escape", sha256="0" * 64, size=1)]}
    )
    conn = await _conn(sshd)
    try:
        root = await remote_root(conn, sshd.host(), create=True)
        with pytest.raises(Exception, match="unsafe path"):
            await ensure_pack(conn, root, pack_dir, evil)
        assert not (Path(root).parent / "escape").exists()
    finally:
        conn.close()
        await conn.wait_closed()


async def test_wrong_host_key_uploads_nothing(sshd: Sshd, tmp_path: Path) -> None:
    """The upload path starts with connect(): a planted other key stops it before login."""
    pack_dir, manifest = make_pack(tmp_path / "local")
    other = sshd.host_key_pub.replace(
        sshd.host_key_pub.split()[1], "AAAAC3NzaC1lZDI1NTE5AAAAI" + "B" * 43
    )
    known = known_hosts_file()
    known.parent.mkdir(parents=True)
    known.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(other.split()[:2]) + "\n")

    async def upload() -> None:
        conn = await connect(sshd.host(), lambda _i: True)
        root = await remote_root(conn, sshd.host(), create=True)
        await ensure_pack(conn, root, pack_dir, manifest)

    with pytest.raises(HostKeyMismatch):
        await upload()
    assert not await asyncio.to_thread(Path(sshd.host().root).exists)
    assert "Accepted publickey" not in sshd.log.read_text()
