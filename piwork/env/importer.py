"""``piwork env import IMAGE.tar``: an OCI or ``docker save`` archive as a task's userland.

No daemon and no registry: Debian's ``skopeo`` copies the archive into an OCI
layout, ``umoci raw unpack --rootless`` applies its layers (whiteouts
included) into a private folder, and ``mkfs.erofs`` makes that a read-only
image, cached by the archive's sha256 (``<data>/envs/images/<id>.erofs``).
A task on the folder then runs on it instead of the pack's Debian image: the
image is hot-plugged read-only after the restore, like the environment disk
(``piwork.agent``), and is the overlay's lower layer
(``runtime-pack/workbench/setup.sh image``).

Trust: the archive's paths and modes are untrusted. umoci resolves every
entry inside the root it unpacks into (no absolute paths, ``..`` or symlinked
parents leave it) and, rootless, can make no device node and owns every file
as the person running piwork. What it leaves is then checked here again:
anything but regular files, folders and symlinks is removed, set-uid/set-gid
/sticky bits are cleared, and everything is root's in the image (``--all-root``).
The image only ever reaches a VM; the host never mounts it
(``tests/unit/test_env_import.py`` attacks this).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from piwork.env.store import EnvError, EnvStore
from piwork.fsutil import atomic_write_bytes, sha256_file

TOOLS = {
    "skopeo": "apt-get install skopeo (Debian bookworm: 1.9.3), or run scripts/setup.sh",
    "umoci": "apt-get install umoci (Debian bookworm: 0.4.7), or run scripts/setup.sh",
    "mkfs.erofs": "apt-get install erofs-utils, or run scripts/setup.sh",
}
INSECURE_POLICY = {"default": [{"type": "insecureAcceptAnything"}]}
"""skopeo's signature policy for a local file the person chose: there is no signature to
check in an archive (an image pulled from a registry is never involved)."""
TOOL_TIMEOUT = 1800


@dataclass(frozen=True)
class Imported:
    id: str
    path: Path
    cached: bool
    bytes: int
    removed: tuple[str, ...] = ()
    """What the unpacked tree held that an image may not (device nodes, set-uid bits)."""


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise EnvError(f"{name} not found: {TOOLS[name]}")
    return found


def _run(args: list[str], what: str) -> None:
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvError(f"{what} took longer than {TOOL_TIMEOUT} s") from exc
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip())[-800:]
        raise EnvError(f"{what} failed: {detail}")


def archive_kind(archive: Path) -> str:
    """skopeo's transport for the archive: ``oci-archive`` or ``docker-archive``."""
    try:
        with tarfile.open(archive) as tar:
            names = {m.name.lstrip("./") for m in tar.getmembers()[:10000]}
    except (tarfile.TarError, OSError) as exc:
        raise EnvError(f"{archive}: not a tar archive ({exc})") from exc
    if "oci-layout" in names:
        return "oci-archive"
    if "manifest.json" in names:
        return "docker-archive"
    raise EnvError(
        f"{archive}: neither an OCI archive (no oci-layout) nor a docker save archive "
        "(no manifest.json); make one with `docker save IMAGE -o FILE.tar` or "
        "`skopeo copy ... oci-archive:FILE.tar`"
    )


def unpack(archive: Path, work: Path) -> Path:
    """The archive's root file system, unpacked under ``work`` (returned: ``work/rootfs``)."""
    skopeo, umoci = _tool("skopeo"), _tool("umoci")
    policy = work / "policy.json"
    policy.write_text(json.dumps(INSECURE_POLICY))
    layout = work / "oci"
    kind = archive_kind(archive)
    _run(
        [skopeo, "--policy", str(policy), "copy", "--quiet",
         f"{kind}:{archive}", f"oci:{layout}:piwork"],
        f"reading {archive.name} (skopeo copy)",
    )  # fmt: skip
    rootfs = work / "rootfs"
    _run(
        [umoci, "raw", "unpack", "--rootless", "--image", f"{layout}:piwork", str(rootfs)],
        f"unpacking {archive.name} (umoci raw unpack --rootless)",
    )
    return rootfs


def sanitize(rootfs: Path) -> list[str]:
    """Leave regular files, folders and symlinks only, with no set-uid/set-gid/sticky bit.

    Walks without following a link; returns what it removed or changed.
    """
    changed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(rootfs):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = path.relative_to(rootfs).as_posix()
            st = path.lstat()
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                path.unlink()
                changed.append(f"removed {rel} (not a file, folder or symlink)")
                if name in dirnames:
                    dirnames.remove(name)
                continue
            special = stat.S_IMODE(mode) & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
            if special and not (stat.S_ISDIR(mode) and special == stat.S_ISVTX):
                # Not a link (checked above), in a private 0700 folder: nothing swaps it.
                os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))
                changed.append(f"cleared the set-uid/set-gid bit of {rel}")
    return changed


def import_image(store: EnvStore, archive: Path) -> Imported:
    """The archive as a read-only erofs image in ``store`` (cached by its sha256)."""
    if not archive.is_file():
        raise EnvError(f"{archive}: no such file")
    _tool("mkfs.erofs")
    digest = sha256_file(archive)
    image_id = f"i-{digest[:24]}"
    path = store.image_path(image_id)
    if path.is_file():
        return Imported(image_id, path, cached=True, bytes=path.stat().st_size)
    store.images_dir.mkdir(parents=True, exist_ok=True)
    work = store.images_dir / f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    work.mkdir(mode=0o700)
    try:
        rootfs = unpack(archive, work)
        removed = sanitize(rootfs)
        if not (rootfs / "bin" / "sh").exists() and not (rootfs / "bin" / "sh").is_symlink():
            raise EnvError(
                f"{archive.name}: the image has no /bin/sh; the agent's bash tool needs a shell"
            )
        tmp = work / "image.erofs"
        _run(
            [shutil.which("mkfs.erofs") or "mkfs.erofs", "--all-root", "-T0", "-x-1", "-zlz4hc",
             str(tmp), str(rootfs)],
            "making the read-only image (mkfs.erofs)",
        )  # fmt: skip
        os.chmod(tmp, 0o400)
        meta = {
            "archive": str(archive),
            "sha256": digest,
            "created_at": time.time(),
            "removed": removed[:200],
        }
        atomic_write_bytes(store.images_dir / f"{image_id}.json", orjson.dumps(meta))
        os.replace(tmp, path)
        return Imported(image_id, path, False, path.stat().st_size, tuple(removed))
    finally:
        _rmtree(work)


def _rmtree(path: Path) -> None:
    """umoci's rootless tree may hold folders without write permission: open them first."""

    def onerror(func: object, p: str, exc: object) -> None:
        parent = os.path.dirname(p)
        try:
            os.chmod(parent, 0o700)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        except OSError:
            pass
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass

    if path.exists():
        shutil.rmtree(path, onerror=onerror)
