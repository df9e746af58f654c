"""The runtime pack on a remote host: sent once, verified there, swapped in atomically.

Remote layout, under the host's root::

    packs/<pack_id>/             a finished, verified pack (manifest.json last)
    packs/.tmp-<pack_id>-<rnd>/  an upload in progress (renamed when verified)

A pack already there is checked against *this* machine's manifest before
use, so a file changed on the remote is found and the pack sent again; a pack
that is there and intact costs 0 bytes. The full check (``sha256sum -c``, ~10 s
for 500 MB on a busy box) runs after an upload and whenever the files' stamp
changed: ``.verified`` records each file's size, inode and change time (ctime,
in nanoseconds, which no write, rename or ``touch`` leaves alone) as they were
when the hashes last matched, so an unchanged pack costs one ``stat``.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from piwork.hosts.remote import RemoteError, run
from piwork.pack.manifest import MANIFEST_NAME, Manifest

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PackUpload:
    remote_dir: str
    bytes_sent: int
    files_sent: int
    reason: str

    def describe(self) -> str:
        if not self.bytes_sent:
            return f"pack already on the remote and verified: 0 bytes uploaded ({self.remote_dir})"
        mib = self.bytes_sent / (1 << 20)
        return (
            f"pack uploaded ({self.reason}): {self.files_sent} files, {mib:.1f} MiB "
            f"({self.bytes_sent} bytes), verified there ({self.remote_dir})"
        )


def _safe_rel(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise RemoteError(f"the pack manifest lists an unsafe path {rel!r}; rebuild the pack")
    return rel


def checksums(manifest: Manifest) -> str:
    """``sha256sum -c`` input for every file the manifest lists."""
    return "".join(f"{f.sha256}  {_safe_rel(f.path)}\n" for f in manifest.files)


async def _verify(conn: asyncssh.SSHClientConnection, remote_dir: str, manifest: Manifest) -> str:
    """'' when every file matches the manifest there, else what sha256sum said."""
    cmd = f"cd -- {shlex.quote(remote_dir)} && sha256sum --quiet --strict -c -"
    result = await conn.run(cmd, input=checksums(manifest), check=False, timeout=600)
    if result.exit_status == 0:
        return ""
    said = (str(result.stdout or "") + str(result.stderr or "")).strip()
    return said.splitlines()[0] if said else f"sha256sum exit status {result.exit_status}"


STAMP = ".verified"


def _stat_cmd(manifest: Manifest) -> str:
    names = [_safe_rel(f.path) for f in manifest.files] + [MANIFEST_NAME]
    return "stat -c '%n|%s|%i|%z' -- " + " ".join(shlex.quote(n) for n in names)


async def _unchanged(conn: asyncssh.SSHClientConnection, remote_dir: str, m: Manifest) -> bool:
    """The files are exactly as when their hashes last matched (see the module doc)."""
    q = shlex.quote(remote_dir)
    cmd = f"cd -- {q} && [ -f {STAMP} ] && {_stat_cmd(m)} | cmp -s - {STAMP}"
    return (await conn.run(cmd, check=False, timeout=60)).exit_status == 0


async def _stamp(conn: asyncssh.SSHClientConnection, remote_dir: str, m: Manifest) -> None:
    q = shlex.quote(remote_dir)
    await run(conn, f"cd -- {q} && {_stat_cmd(m)} >{STAMP}.tmp && mv -f {STAMP}.tmp {STAMP}")


async def ensure_pack(
    conn: asyncssh.SSHClientConnection,
    root: str,
    pack_dir: Path,
    manifest: Manifest,
    progress: Progress | None = None,
) -> PackUpload:
    """Make ``<root>/packs/<pack_id>`` hold this pack, verified; send only what is missing."""
    packs = posixpath.join(root, "packs")
    final = posixpath.join(packs, manifest.pack_id)
    q_final = shlex.quote(final)
    present = await conn.run(f"test -f {q_final}/{MANIFEST_NAME}", check=False)
    reason = "not on the remote yet"
    if present.exit_status == 0:
        if await _unchanged(conn, final, manifest):
            return PackUpload(final, 0, 0, "present")
        problem = await _verify(conn, final, manifest)
        if not problem:
            await _stamp(conn, final, manifest)
            return PackUpload(final, 0, 0, "present")
        reason = f"the copy there did not verify: {problem}"
        if progress:
            progress(f"pack on the remote is damaged ({problem}); sending it again")
    tmp = posixpath.join(packs, f".tmp-{manifest.pack_id}-{secrets.token_hex(4)}")
    await run(conn, f"umask 077 && mkdir -p -- {shlex.quote(tmp)}")
    sent = 0
    try:
        async with conn.start_sftp_client() as sftp:
            dirs = sorted({posixpath.dirname(_safe_rel(f.path)) for f in manifest.files} - {""})
            for d in dirs:
                await sftp.makedirs(posixpath.join(tmp, d), exist_ok=True)
            for f in manifest.files:
                if progress:
                    progress(f"uploading {f.path} ({f.size} bytes)")
                await sftp.put(str(pack_dir / f.path), posixpath.join(tmp, f.path))
                sent += f.size
            await sftp.put(str(pack_dir / MANIFEST_NAME), posixpath.join(tmp, MANIFEST_NAME))
        problem = await _verify(conn, tmp, manifest)
        if problem:
            raise RemoteError(f"the uploaded pack did not verify on the remote: {problem}")
        # Swap in with one rename; a damaged old copy is replaced (a running QEMU keeps
        # its open files).
        await run(
            conn,
            f"rm -rf -- {q_final} && mv -T -- {shlex.quote(tmp)} {q_final}",
        )
        await _stamp(conn, final, manifest)
    finally:
        await conn.run(f"rm -rf -- {shlex.quote(tmp)}", check=False)
    return PackUpload(final, sent, len(manifest.files), reason)
