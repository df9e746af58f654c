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

The image's own config (``Env``, ``WorkingDir``) applies as a build's ``ENV``
and ``WORKDIR`` do: written into ``/etc/piwork/env.sh`` in the image (tasks'
bash reads it through ``BASH_ENV``) and kept in the image's record, so a build
``FROM`` the image starts from them. The config is the archive's, so it is
read as untrusted input: every file of the layout bounded, digests checked for
form before they name a file, each variable's name an identifier, values
without newlines or NULs and bounded in size and number, ``WorkingDir``
absolute; anything else is left out and said. piwork's own variables (the
egress proxy, ``BASH_ENV``, ``PIWORK_*``) are never taken from an image. The
file is written beneath the unpacked root without following a link the image
planted (``piwork.sharefs``).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from piwork import sharefs
from piwork.env.dockerfile import ENV_NAME, env_script
from piwork.env.store import BUILD_ENV_FILE, EnvError, EnvStore, write_record
from piwork.errors import UsageError
from piwork.fsutil import fsync_dir, fsync_file, sha256_file
from piwork.textsafe import has_unsafe

TOOLS = {
    "skopeo": "apt-get install skopeo (Debian bookworm: 1.9.3), or run scripts/setup.sh",
    "umoci": "apt-get install umoci (Debian bookworm: 0.4.7), or run scripts/setup.sh",
    "mkfs.erofs": "apt-get install erofs-utils, or run scripts/setup.sh",
}
INSECURE_POLICY = {"default": [{"type": "insecureAcceptAnything"}]}
"""skopeo's signature policy for a local file the person chose: there is no signature to
check in an archive (an image pulled from a registry is never involved)."""
TOOL_TIMEOUT = 1800
MAX_LAYOUT_JSON = 1 << 20
"""index.json and the manifest: a few hundred bytes in practice."""
MAX_CONFIG_JSON = 8 << 20
"""The image config (its history can be long)."""
MAX_ENV_ENTRIES = 256
MAX_ENV_VALUE = 16 << 10
MAX_ENV_TOTAL = 256 << 10
MAX_WORKDIR = 4096
PIWORK_ENV = frozenset(
    {"BASH_ENV", "ENV"}
    | {f"{name}_proxy" for name in ("http", "https", "no", "all")}
    | {f"{name}_PROXY" for name in ("HTTP", "HTTPS", "NO", "ALL")}
)
"""Variables piwork sets for the agent (the egress proxy with its per-run token, bash's
start file): an image's own values would cut the agent off or replace what it reads."""
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Imported:
    id: str
    path: Path
    cached: bool
    bytes: int
    removed: tuple[str, ...] = ()
    """What the unpacked tree held that an image may not (device nodes, set-uid bits)."""
    env: tuple[tuple[str, str], ...] = ()
    """The image's Env that tasks get (``/etc/piwork/env.sh``)."""
    workdir: str | None = None
    """The image's WorkingDir (``$PIWORK_WORKDIR``), if it names one."""


@dataclass(frozen=True)
class ImageSettings:
    """What the image's config asks of a task's shell, checked (see the module doc)."""

    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    notes: tuple[str, ...] = ()
    """What was left out of the config, and why (for the person)."""


class ArchiveError(UsageError, EnvError):
    """The path given is not an image archive piwork can read: a usage error (exit 2)."""


MAKE_ONE = (
    "give the path of an image archive: `docker save IMAGE -o FILE.tar`, "
    "`podman save IMAGE -o FILE.tar` or `skopeo copy ... oci-archive:FILE.tar` makes one"
)


def check_archive(archive: Path) -> None:
    """A missing, unreadable or non-file path is refused before anything starts."""
    try:
        st = archive.stat()
    except FileNotFoundError as exc:
        raise ArchiveError(f"{archive}: no such file; {MAKE_ONE}") from exc
    except OSError as exc:
        raise ArchiveError(f"{archive}: cannot be read ({exc.strerror}); {MAKE_ONE}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ArchiveError(f"{archive}: not a file; {MAKE_ONE}")
    try:
        with archive.open("rb"):
            pass
    except OSError as exc:
        raise ArchiveError(
            f"{archive}: cannot be read ({exc.strerror}); check its permissions, or {MAKE_ONE}"
        ) from exc


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
        raise ArchiveError(f"{archive}: not a tar archive ({exc}); {MAKE_ONE}") from exc
    if "oci-layout" in names:
        return "oci-archive"
    if "manifest.json" in names:
        return "docker-archive"
    raise ArchiveError(
        f"{archive}: neither an OCI archive (no oci-layout) nor a docker save archive "
        "(no manifest.json); make one with `docker save IMAGE -o FILE.tar` or "
        "`skopeo copy ... oci-archive:FILE.tar`"
    )


def unpack(archive: Path, work: Path, kind: str | None = None) -> Path:
    """The archive's root file system, unpacked under ``work`` (returned: ``work/rootfs``)."""
    skopeo, umoci = _tool("skopeo"), _tool("umoci")
    policy = work / "policy.json"
    policy.write_text(json.dumps(INSECURE_POLICY))
    layout = work / "oci"
    kind = kind or archive_kind(archive)
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


def _shown(text: str, limit: int = 40) -> str:
    """Archive text for a message: escaped (no control character reaches a terminal), short."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _layout_json(layout: Path, rel: str, limit: int) -> object:
    try:
        data = sharefs.read_beneath(layout, rel, max_bytes=limit + 1)
    except OSError as exc:
        raise EnvError(f"the image's {rel} cannot be read ({exc.strerror or exc})") from exc
    if len(data) > limit:
        raise EnvError(f"the image's {rel} is larger than {limit} bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise EnvError(f"the image's {rel} is not JSON") from exc


def _blob(layout: Path, descriptor: object, limit: int) -> object:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise EnvError(f"the image names a blob by {_shown(str(digest))}, not a sha256 digest")
    return _layout_json(layout, f"blobs/sha256/{match.group(1)}", limit)


def read_config(layout: Path, ref: str = "piwork") -> dict[str, object]:
    """The ``config`` object of the image ``ref`` in the OCI layout skopeo wrote ({} if none)."""
    index = _layout_json(layout, "index.json", MAX_LAYOUT_JSON)
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise EnvError("the image's index.json lists no manifest")
    for desc in manifests:
        if not isinstance(desc, dict):
            continue
        names = desc.get("annotations")
        if isinstance(names, dict) and names.get("org.opencontainers.image.ref.name") == ref:
            manifest = _blob(layout, desc, MAX_LAYOUT_JSON)
            if not isinstance(manifest, dict):
                raise EnvError("the image's manifest is not a JSON object")
            config = _blob(layout, manifest.get("config"), MAX_CONFIG_JSON)
            inner = config.get("config") if isinstance(config, dict) else None
            return inner if isinstance(inner, dict) else {}
    raise EnvError(f"the image's index.json has no image named {ref}")


def image_settings(config: dict[str, object]) -> ImageSettings:
    """``Env`` and ``WorkingDir`` of an image config, checked as untrusted input."""
    notes: list[str] = []
    env: dict[str, str] = {}
    raw = config.get("Env") or []
    if not isinstance(raw, list):
        notes.append("left out the image's Env: not a list")
        raw = []
    if len(raw) > MAX_ENV_ENTRIES:
        notes.append(f"left out the image's Env past its first {MAX_ENV_ENTRIES} entries")
        raw = raw[:MAX_ENV_ENTRIES]
    total = 0
    for n, item in enumerate(raw, 1):
        if not isinstance(item, str) or "=" not in item:
            notes.append(f"left out Env entry {n}: not NAME=VALUE")
            continue
        name, _, value = item.partition("=")
        why = None
        if not ENV_NAME.fullmatch(name):
            why = f"{_shown(name)} is not a variable name (letters, digits, _)"
        elif name in PIWORK_ENV or name.startswith("PIWORK_"):
            why = f"{name} is piwork's own (the agent's network and shell need piwork's value)"
        elif any(c in value for c in "\n\r\x00"):
            why = f"the value of {name} holds a newline or NUL"
        elif len(value) > MAX_ENV_VALUE:
            why = f"the value of {name} is longer than {MAX_ENV_VALUE} characters"
        elif total + len(name) + len(value) > MAX_ENV_TOTAL:
            why = f"{name}: the image's Env is over {MAX_ENV_TOTAL} characters in all"
        if why is not None:
            notes.append(f"left out Env entry {n}: {why}")
            continue
        total += len(name) + len(value)
        env.pop(name, None)  # the last one wins, as in Docker
        env[name] = value
    workdir = config.get("WorkingDir") or None
    if workdir is not None:
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            notes.append(f"left out the WorkingDir {_shown(str(workdir))}: not an absolute path")
            workdir = None
        elif len(workdir) > MAX_WORKDIR or has_unsafe(workdir):
            # Control (C0, C1, ESC, newline, NUL) and format (bidi, zero-width) characters:
            # a folder name never needs one, and a terminal would act on them.
            notes.append(
                "left out the WorkingDir: too long, or holds a control or format character"
            )
            workdir = None
        else:
            workdir = posixpath.normpath(workdir)
            workdir = "/" + workdir.lstrip("/")  # normpath keeps a leading "//"
    return ImageSettings(tuple(env.items()), workdir, tuple(notes))


def write_settings(rootfs: Path, settings: ImageSettings) -> list[str]:
    """``/etc/piwork/env.sh`` in the unpacked root for the image's Env/WorkingDir.

    Written beneath ``rootfs`` one component at a time without following a link: an
    image whose ``/etc`` is a link (to anywhere) keeps it, and gets no file (said).
    """
    if not settings.env and settings.workdir is None:
        return []
    script = env_script(settings.env, settings.workdir or "/", source="the image's config")
    rel = BUILD_ENV_FILE.lstrip("/")
    try:
        sharefs.write_atomic_beneath(rootfs, rel, script.encode(), mode=0o644)
    except OSError as exc:
        return [
            f"the image's Env and WorkingDir are not applied: {BUILD_ENV_FILE} cannot be "
            f"written there ({exc.strerror or exc})"
        ]
    return []


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
    check_archive(archive)
    kind = archive_kind(archive)  # not an image archive: said before anything is made
    _tool("mkfs.erofs")
    digest = sha256_file(archive)
    image_id = f"i-{digest[:24]}"
    path = store.image_path(image_id)
    if path.is_file():
        env, workdir = store.image_settings(image_id)
        return Imported(
            image_id,
            path,
            cached=True,
            bytes=path.stat().st_size,
            env=tuple(env.items()),
            workdir=workdir if workdir != "/" else None,
        )
    store.images_dir.mkdir(parents=True, exist_ok=True)
    work = store.images_dir / f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    work.mkdir(mode=0o700)
    try:
        rootfs = unpack(archive, work, kind)
        settings = image_settings(read_config(work / "oci"))
        removed = sanitize(rootfs)
        if not (rootfs / "bin" / "sh").exists() and not (rootfs / "bin" / "sh").is_symlink():
            raise EnvError(
                f"{archive.name}: the image has no /bin/sh; the agent's bash tool needs a shell"
            )
        removed += [*settings.notes, *write_settings(rootfs, settings)]
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
            # What a build FROM the image starts from (EnvStore.image_settings).
            "env": [list(pair) for pair in settings.env],
            "workdir": settings.workdir,
        }
        write_record(store.images_dir / f"{image_id}.json", meta)
        fsync_file(tmp)  # durable before it is named: a cached image is used as found
        os.replace(tmp, path)
        fsync_dir(store.images_dir)
        return Imported(
            image_id,
            path,
            False,
            path.stat().st_size,
            tuple(removed),
            settings.env,
            settings.workdir,
        )
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
