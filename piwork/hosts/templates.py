"""The warm-start template (piwork.vm.template) kept on a remote host.

Same idea, same key, same checks as this machine's: one saved VM per (pack,
QEMU build, accelerator, machine shape), made the first time a task runs there
with that key, restored by every later task. Only the QEMU identity in the key
is the remote's (its version line, size and mtime, from ``hosts check``'s
probe), and the files live under the host's root::

    templates/<digest>/            ram, state, meta.json (read-only files)
    templates/<digest>.tmp-<rnd>/  a build in progress
    templates/.<digest>.lock       flock(1)'d by the one builder

Before every restore the remote's ``meta.json`` must name exactly this key, the
files must have the recorded sizes and the state file the recorded SHA-256
(``sha256sum`` there): a truncated, corrupt or foreign template is moved aside
and made again, never restored. The guest RAM image holds no key and nothing of
a task: the template VM boots with empty shares and no netmux connection before
any task exists, exactly as locally (pi gets the task's arguments and tokens
only after the restore).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import posixpath
import secrets
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import orjson

from piwork.hosts.remote import RemoteError, run
from piwork.vm.command import VmSpec
from piwork.vm.template import (
    META,
    RAM,
    STATE,
    UNKNOWN_QEMU,
    Template,
    TemplateUnavailable,
    key_digest,
    template_key,
)

META_MAX_BYTES = 64 << 10
"""meta.json is a few hundred bytes; more than this is not read (it is not ours)."""

CHECK = r"""
d=$1
[ -e "$d" ] || { echo present=0; exit 0; }
echo present=1
echo "state_size=$(stat -c %s "$d/state" 2>/dev/null)"
echo "ram_size=$(stat -c %s "$d/ram" 2>/dev/null)"
echo "state_sha256=$(sha256sum <"$d/state" 2>/dev/null | cut -d' ' -f1)"
echo "meta=$(head -c 65537 "$d/meta.json" 2>/dev/null | base64 | tr -d '\n')"
"""
"""Reads only. One round trip for everything :func:`check` compares."""


def remote_template(spec: VmSpec, root: str, qemu_identity: str) -> Template:
    """The template a VM with ``spec`` restores on a host whose QEMU is ``qemu_identity``.

    ``Template.dir`` is a path on the remote (only its name and joins are used here).
    """
    if qemu_identity.startswith(f"{UNKNOWN_QEMU}|"):
        raise TemplateUnavailable(
            "cannot tell which QEMU the remote has (its --version failed in the check)"
        )
    key = {**template_key(spec), "qemu": qemu_identity}
    return Template(Path(posixpath.join(root, "templates", key_digest(key))), key)


def _values(out: str) -> dict[str, str]:
    values = {}
    for line in out.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            values[k] = v.strip()
    return values


async def check(conn: asyncssh.SSHClientConnection, tpl: Template) -> bool:
    """Raise TemplateUnavailable unless the remote template is complete and ours.

    Returns True (usable). :class:`TemplateBroken` when something stands there
    (to move aside), plain TemplateUnavailable when nothing does.
    """
    result = await conn.run("sh -s -- " + shlex.quote(str(tpl.dir)), input=CHECK,
                            check=False, timeout=600)  # fmt: skip
    if result.exit_status != 0:
        raise RemoteError(f"checking the saved VM there failed: {str(result.stderr).strip()}")
    values = _values(str(result.stdout or ""))
    if values.get("present") != "1":
        raise _unavailable("no saved VM for this pack and machine there yet", present=False)
    try:
        raw = base64.b64decode(values.get("meta", ""), validate=True)
        if not raw or len(raw) > META_MAX_BYTES:
            raise ValueError("missing or oversized")
        meta = orjson.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except (ValueError, binascii.Error, orjson.JSONDecodeError) as exc:
        raise _unavailable(f"the saved VM's meta.json there is unreadable ({exc})") from None
    if meta.get("key") != tpl.key:
        raise _unavailable("the saved VM there belongs to another pack, QEMU or machine")
    sizes = (values.get("state_size", ""), values.get("ram_size", ""))
    if not all(s.isdigit() for s in sizes):
        raise _unavailable("the saved VM there is incomplete")
    if int(sizes[0]) != meta.get("state_size") or int(sizes[1]) != tpl.key["memory_mb"] << 20:
        raise _unavailable("the saved VM's state file there is truncated or changed")
    if values.get("state_sha256") != meta.get("state_sha256"):
        raise _unavailable("the saved VM's state file there is corrupt")
    return True


class TemplateBroken(TemplateUnavailable):
    """Something stands there but is not a usable template of ours: move it aside."""


def _unavailable(reason: str, *, present: bool = True) -> TemplateUnavailable:
    return TemplateBroken(reason) if present else TemplateUnavailable(reason)


@contextlib.asynccontextmanager
async def build_lock(conn: asyncssh.SSHClientConnection, tpl: Template) -> AsyncIterator[None]:
    """One builder per template on the remote, across every piwork that uses it.

    ``flock`` there holds the lock for as long as its ``cat`` reads our stdin:
    closing the session (or losing the connection, or a kill -9 here) releases it.
    """
    lock = posixpath.join(posixpath.dirname(str(tpl.dir)), f".{tpl.dir.name}.lock")
    await run(conn, f"umask 077 && mkdir -p -- {shlex.quote(posixpath.dirname(lock))}")
    inner = "echo locked; exec cat >/dev/null"
    proc = await conn.create_process(
        f"exec flock -x {shlex.quote(lock)} -c {shlex.quote(inner)}", stderr=asyncssh.STDOUT
    )
    try:
        line = await proc.stdout.readline()
        if line.strip() != "locked":
            rest = line + str(await proc.stdout.read())
            raise RemoteError(f"could not lock the saved VM there: {rest.strip()}")
        yield
    finally:
        with contextlib.suppress(asyncssh.Error, OSError):
            proc.stdin.write_eof()
        proc.close()


async def sweep_unfinished(conn: asyncssh.SSHClientConnection, tpl: Template) -> None:
    """Remove builds and discards dead builders left (up to a guest's RAM each).

    Call with :func:`build_lock` held: no other builder runs, so all are stale."""
    d = shlex.quote(str(tpl.dir))
    await run(conn, f"rm -rf -- {d}.tmp-* {d}.bad-*")


async def discard(conn: asyncssh.SSHClientConnection, tpl: Template) -> None:
    """Move a broken template aside and delete it (a running clone keeps its mapping)."""
    d = shlex.quote(str(tpl.dir))
    aside = shlex.quote(f"{tpl.dir}.bad-{secrets.token_hex(4)}")
    await conn.run(f"mv -T -- {d} {aside} 2>/dev/null; rm -rf -- {aside}", check=False)


def build_dir(tpl: Template) -> str:
    return f"{tpl.dir}.tmp-{secrets.token_hex(4)}"


COMMIT = r"""
set -e
tmp=$1 final=$2
cd "$tmp"
sync ram state
chmod 0400 ram state
echo "state_size=$(stat -c %s state)"
echo "state_sha256=$(sha256sum <state | cut -d' ' -f1)"
"""


async def commit(
    conn: asyncssh.SSHClientConnection, tmp: str, tpl: Template, extra: dict[str, Any]
) -> None:
    """Seal a build there: files synced and read-only, meta.json last, one rename."""
    result = await conn.run("sh -s -- " + shlex.join([tmp, str(tpl.dir)]), input=COMMIT,
                            check=False, timeout=600)  # fmt: skip
    values = _values(str(result.stdout or ""))
    if result.exit_status != 0 or not values.get("state_size", "").isdigit():
        raise TemplateUnavailable(f"could not seal the saved VM there: {result.stderr!s}".strip())
    meta = {
        "key": tpl.key,
        "state_size": int(values["state_size"]),
        "state_sha256": values["state_sha256"],
        **extra,
    }
    staged = posixpath.join(tmp, f".{META}.tmp")
    async with conn.start_sftp_client() as sftp, sftp.open(staged, "wb") as fh:
        await fh.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    q_meta = shlex.quote(posixpath.join(tmp, META))
    q_tmp, q_final = shlex.quote(tmp), shlex.quote(str(tpl.dir))
    await run(
        conn,
        f"sync {shlex.quote(staged)} && mv -f -- {shlex.quote(staged)} {q_meta} && "
        f"rm -rf -- {q_final} && mv -T -- {q_tmp} {q_final} && "
        f"sync {shlex.quote(posixpath.dirname(str(tpl.dir)))}",
    )


__all__ = [
    "RAM",
    "STATE",
    "TemplateBroken",
    "build_dir",
    "build_lock",
    "check",
    "commit",
    "discard",
    "remote_template",
    "sweep_unfinished",
]
