"""The task's workbench environment (piwork.env) on a remote host.

Locally a task's disk is ``<task>/env.qcow2``, a qcow2 overlay on a chain of
frozen, read-only layers (``<data>/envs/layers/<id>.qcow2``). For a VM on a
remote host:

- each layer of the chain is sent to ``<root>/envs/layers/<id>.qcow2`` only
  when no copy with the same SHA-256 is there (``sha256sum`` checks it there
  before every use, as for the pack); a layer never changes once frozen, so
  a second task on the folder sends 0 bytes of it;
- the task's own disk is sent into the run directory, attached there with its
  backing chain given explicitly to QEMU (``blockdev-add`` with ``backing`` set
  node by node), so the header's paths (this machine's) are never opened there;
- when the VM has stopped it is brought back into ``<task>/env.qcow2`` (the
  task's ``env.lock`` held from before the upload until then), so ``piwork
  resume`` and the folder's next task see what was installed. A run whose
  piwork is killed, or whose host is lost, before then leaves its disk there:
  the next connect's sweep keeps it, and the task's next ``--host`` start on
  that host brings it back (:mod:`piwork.hosts.orphans`).

Trust: the disk that comes back was written by a QEMU on another machine. Its
contents are the guest's and are never read here; its qcow2 header could name
any file of this machine as a backing file or external data file, which the
next local QEMU would open. So it is accepted only as a plain qcow2 without an
external data file, and its backing file is rewritten to the one it had here
(``qemu-img rebase -u``: the header only, nothing opened) before it replaces
the task's disk. Anything else keeps the disk as it was and says so.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import orjson

from piwork.env import TaskEnv
from piwork.fsutil import fsync_dir, sha256_file
from piwork.hosts.remote import RemoteError, run

Progress = Callable[[str], None]


class EnvDiskError(RemoteError):
    """The environment disk could not be sent or brought back; the message says why."""


@dataclass(frozen=True)
class LocalLayer:
    id: str
    path: Path
    sha256: str
    size: int


def _qemu_img_info(path: Path, *, chain: bool) -> Any:
    args = ["qemu-img", "info", "-U", "--output=json"]
    if chain:
        args.append("--backing-chain")
    try:
        proc = subprocess.run(
            [*args, str(path)], capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError as exc:
        raise EnvDiskError("qemu-img not found (apt-get install qemu-utils)") from exc
    if proc.returncode != 0:
        raise EnvDiskError(f"qemu-img info {path} failed: {proc.stderr.strip()[-300:]}")
    return orjson.loads(proc.stdout)


def local_chain(env: TaskEnv) -> tuple[list[LocalLayer], str | None]:
    """The layers under the task's disk (oldest first) and the disk's own backing path.

    Read from this machine's own headers (``qemu-img info --backing-chain``): the
    layers are files piwork froze here, the disk one it made or checked on return.
    """
    infos = _qemu_img_info(env.disk, chain=True)
    if not isinstance(infos, list) or not infos:
        raise EnvDiskError(f"qemu-img said nothing about {env.disk}")
    backing = infos[0].get("full-backing-filename") or infos[0].get("backing-filename")
    layers = []
    for info in reversed(infos[1:]):
        path = Path(str(info["filename"]))
        if info.get("format") != "qcow2":
            raise EnvDiskError(f"the environment layer {path} is not qcow2")
        layers.append(LocalLayer(path.stem, path, sha256_file(path), path.stat().st_size))
    return layers, str(backing) if backing else None


async def ensure_layers(
    conn: asyncssh.SSHClientConnection,
    root: str,
    layers: list[LocalLayer],
    progress: Progress | None = None,
) -> tuple[list[str], int]:
    """Each layer present and verified under ``<root>/envs/layers``; (their paths, bytes sent)."""
    top = posixpath.join(root, "envs", "layers")
    await run(conn, f"umask 077 && mkdir -p -- {shlex.quote(top)}")
    paths, sent = [], 0
    for layer in layers:
        final = posixpath.join(top, f"{layer.id}.qcow2")
        if not await _verified(conn, final, layer.sha256):
            tmp = f"{final}.tmp-{secrets.token_hex(4)}"
            if progress:
                progress(f"environment layer {layer.id}: sending {layer.size} bytes")
            try:
                async with conn.start_sftp_client() as sftp:
                    await sftp.put(str(layer.path), tmp)
                if not await _verified(conn, tmp, layer.sha256):
                    raise EnvDiskError(f"the environment layer {layer.id} did not verify there")
                await run(
                    conn, f"chmod 0400 {shlex.quote(tmp)} && mv -f -- {shlex.quote(tmp)} "
                    f"{shlex.quote(final)}",
                )  # fmt: skip
            finally:
                await conn.run(f"rm -f -- {shlex.quote(tmp)}", check=False)
            sent += layer.size
        paths.append(final)
    return paths, sent


async def _verified(conn: asyncssh.SSHClientConnection, path: str, sha: str) -> bool:
    cmd = "sha256sum --quiet --strict -c - 2>/dev/null"
    result = await conn.run(cmd, input=f"{sha}  {path}\n", check=False, timeout=600)
    return result.exit_status == 0


async def send_disk(conn: asyncssh.SSHClientConnection, env: TaskEnv, remote: str) -> int:
    async with conn.start_sftp_client() as sftp:
        await sftp.put(str(env.disk), remote)
    return env.disk.stat().st_size


def blockdev_chain(layers: list[str], disk: str) -> list[dict[str, Any]]:
    """QMP ``blockdev-add`` arguments, oldest layer first, the task's disk last.

    Every node names its backing node (or ``None``: none), so QEMU there never
    follows the backing path written in a header (a path on this machine).
    """
    nodes: list[dict[str, Any]] = []
    below: str | None = None
    for i, path in enumerate(layers):
        name = f"pwlayer{i}"
        nodes.append({
            "driver": "qcow2", "node-name": name, "read-only": True,
            "file": {"driver": "file", "filename": path, "read-only": True},
            "backing": below,
        })  # fmt: skip
        below = name
    nodes.append({
        "driver": "qcow2", "node-name": "pwenv", "discard": "unmap",
        "file": {"driver": "file", "filename": disk}, "backing": below,
    })  # fmt: skip
    return nodes


def accept_returned(tmp: Path, backing: str | None, *, strict: bool = False) -> None:
    """Check the disk that came back and give it this machine's backing path (see module).

    ``strict``: its header must already name ``backing`` (the file it was sent on top
    of, which QEMU there never rewrites), else it is refused rather than mended: for a
    disk kept on the host after its run was interrupted (piwork.hosts.orphans).
    """
    info = _qemu_img_info(tmp, chain=False)
    if not isinstance(info, dict) or info.get("format") != "qcow2":
        raise EnvDiskError("the environment disk that came back is not a qcow2 image")
    specific = (info.get("format-specific") or {}).get("data") or {}
    if specific.get("data-file") or specific.get("data-file-raw"):
        raise EnvDiskError("the environment disk that came back names an external data file")
    named = info.get("full-backing-filename") or info.get("backing-filename")
    if strict and (named or None) != backing:
        raise EnvDiskError(
            f"the environment disk that came back names the backing file {named!r}, "
            f"not the one it was sent on top of ({backing!r})"
        )
    args = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-b", backing or ""]
    if backing:
        args += ["-F", "qcow2"]
    proc = subprocess.run(
        [*args, str(tmp)], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise EnvDiskError(f"qemu-img rebase failed: {proc.stderr.strip()[-300:]}")


async def bring_back(
    conn: asyncssh.SSHClientConnection,
    remote: str,
    env: TaskEnv,
    backing: str | None,
    *,
    strict: bool = False,
) -> int:
    """Replace ``env.disk`` with the remote copy, checked; the bytes brought back."""
    tmp = env.disk.with_name(f".{env.disk.name}.remote-{secrets.token_hex(4)}")
    try:
        async with conn.start_sftp_client() as sftp:
            await sftp.get(remote, str(tmp), follow_symlinks=False)
        await asyncio.to_thread(accept_returned, tmp, backing, strict=strict)
        os.chmod(tmp, 0o600)
        size = tmp.stat().st_size
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, env.disk)
        fsync_dir(env.disk.parent)
        return size
    finally:
        tmp.unlink(missing_ok=True)
