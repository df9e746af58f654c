"""The workbench image: a Debian userland for the agent's bash, as a read-only erofs disk.

Why: the guest that runs pi is busybox + Node; an agent asked to "fix the
failing test" needs bash, git, Python, a compiler, ripgrep... This module
turns ``vm-image/workbench.toml`` (Debian bookworm packages pinned to exact
versions) into ``workbench.erofs`` with ``mmdebstrap`` from Debian's archive:
no Docker, no registry. The guest mounts it as the lower layer of an overlay
whose upper layer is the task's own writable disk (runtime-pack/workbench/
setup.sh), and pi's bash tool enters that root (runtime-pack/workbench/bash).

Reproducible and cached: the image is keyed by the SHA-256 of the spec file
and :data:`WORKBENCH_VERSION` (``<cache>/workbench/<key>/``), so a pack
rebuilt for another reason (a supervisor edit) reuses it instead of running
mmdebstrap again; ``SOURCE_DATE_EPOCH`` is fixed, erofs timestamps and UUID
are fixed. Debian's archive only keeps the current point release, so the
*listed* packages are pinned (a moved pin fails the build, naming it) and the
full resolved set is recorded (:attr:`WorkbenchImage.packages`, the pack
manifest's ``packages``).

mmdebstrap needs root, or unprivileged user namespaces (its ``unshare``
mode, with /etc/subuid and /etc/subgid ranges for the building user) on a
laptop; ``--mode=auto`` picks whichever works and the error says what to do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from piwork import arch as arches
from piwork.fsutil import fsync_dir
from piwork.pack.cache import pack_lock
from piwork.pack.errors import PackError, PinUnavailableError

SPEC_FILE = Path("vm-image") / "workbench.toml"
IMAGE_NAME = "workbench.erofs"
PACKAGES_NAME = "workbench.packages.json"
DISK_SERIAL = "pwworkbench"
"""The guest finds the image by this virtio-blk serial (setup.sh), not by probe order."""
WORKBENCH_VERSION = 1
"""Bump when the tree this module makes changes for the same spec."""
SOURCE_DATE_EPOCH = 1700000000
FIXED_UUID = "7069776f-726b-4000-8000-000000000002"
MMDEBSTRAP_TIMEOUT = 1800.0

# Files written into the image after mmdebstrap (paths relative to its root).
# node, npm and npx: pi's Node 22 and the npm the pack carries, from
# /opt/piwork (bound into the root by setup.sh); `npm -g` installs into
# /usr/local on the writable layer (the wrapper sets NPM_CONFIG_PREFIX).
NODE_LINK = ("usr/local/bin/node", "/opt/piwork/node/bin/node")
NPM_CLI = "/opt/piwork/pi/node_modules/npm/bin"
SCRIPTS: dict[str, str] = {
    "usr/local/bin/npm": f'#!/bin/sh\nexec /usr/local/bin/node {NPM_CLI}/npm-cli.js "$@"\n',
    "usr/local/bin/npx": f'#!/bin/sh\nexec /usr/local/bin/node {NPM_CLI}/npx-cli.js "$@"\n',
}
FILES: dict[str, str] = {
    "etc/hostname": "piwork\n",
    "etc/hosts": "127.0.0.1\tlocalhost piwork\n::1\tlocalhost\n",
    # No resolver in the VM: clients reach the internet through the egress proxy
    # (HTTP(S)_PROXY), which resolves names on the host. An empty file, not the
    # build host's.
    "etc/resolv.conf": "",
    # apt honours http_proxy/https_proxy from the environment (pi's env); these
    # keep it from waiting on a missing resolver or retrying a policy refusal.
    "etc/apt/apt.conf.d/90piwork": (
        'Acquire::Retries "0";\nAcquire::http::Timeout "60";\nAcquire::https::Timeout "60";\n'
        'APT::Install-Recommends "false";\n'
    ),
}
# Mount points setup.sh binds the task's folders and /opt/piwork onto.
DIRS = ("mnt/state", "mnt/work", "mnt/outputs", "mnt/uploads", "opt/piwork", "root")

Log = Callable[[str], None]


@dataclass(frozen=True)
class WorkbenchSpec:
    suite: str
    variant: str
    mirrors: tuple[str, ...]
    packages: dict[str, str]
    path_exclude: tuple[str, ...]
    path_include: tuple[str, ...]
    digest: str
    """SHA-256 of the spec file's bytes and WORKBENCH_VERSION: the image cache key."""


@dataclass(frozen=True)
class WorkbenchImage:
    image: Path
    packages: dict[str, str]
    """Every installed package -> exact version (dpkg's view of the built tree)."""
    tree_bytes: int
    image_bytes: int
    seconds: float
    cached: bool


def load_spec(path: Path) -> WorkbenchSpec:
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode())["workbench"]
        spec = WorkbenchSpec(
            suite=str(data["suite"]),
            variant=str(data.get("variant", "minbase")),
            mirrors=tuple(str(m) for m in data["mirrors"]),
            packages={str(k): str(v) for k, v in data["packages"].items()},
            path_exclude=tuple(str(p) for p in data.get("path_exclude", ())),
            path_include=tuple(str(p) for p in data.get("path_include", ())),
            digest=hashlib.sha256(raw + f"\nversion={WORKBENCH_VERSION}".encode()).hexdigest(),
        )
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise PackError(f"cannot read the workbench spec {path}: {exc!r}") from exc
    if not spec.packages or not spec.mirrors:
        raise PackError(f"{path}: [workbench] needs mirrors and packages")
    return spec


def mmdebstrap_command(
    spec: WorkbenchSpec, dest: Path, arch: arches.Arch = arches.AMD64
) -> list[str]:
    """The mmdebstrap call: every listed package at its pinned version, for ``arch``
    (another architecture than the host's runs its maintainer scripts through
    qemu-user-static's binfmt_misc handler)."""
    include = ",".join(f"{name}={version}" for name, version in sorted(spec.packages.items()))
    cmd = [
        "mmdebstrap",
        "--quiet",
        f"--variant={spec.variant}",
        "--mode=auto",
        f"--include={include}",
        "--aptopt=Acquire::Retries=3",
    ]
    if arch is not arches.AMD64:
        cmd.append(f"--architectures={arch.debian}")
    cmd += [f"--dpkgopt=path-exclude={p}" for p in spec.path_exclude]
    cmd += [f"--dpkgopt=path-include={p}" for p in spec.path_include]
    return [*cmd, spec.suite, str(dest), *spec.mirrors]


def installed_packages(root: Path) -> dict[str, str]:
    """name -> version of every package dpkg installed in ``root`` (read from its status file)."""
    status = root / "var" / "lib" / "dpkg" / "status"
    out: dict[str, str] = {}
    try:
        text = status.read_text(errors="replace")
    except OSError as exc:
        raise PackError(f"the workbench tree has no dpkg status ({exc})") from exc
    for para in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in para.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out[fields["Package"]] = fields.get("Version", "")
    return dict(sorted(out.items()))


def _finish_tree(root: Path) -> None:
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()
        p.write_text(text)
        p.chmod(0o644)
    for rel, text in SCRIPTS.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(0o755)
    link, target = NODE_LINK
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(target)
    for rel in DIRS:
        (root / rel).mkdir(parents=True, exist_ok=True)
    # Caches that only describe the build host's run, not the image.
    for rel in ("var/cache/apt", "var/lib/apt/lists", "var/log"):
        d = root / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    if child.name != "partial":
                        shutil.rmtree(child)
                elif child.name != "lock":
                    child.unlink()


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def make_image(tree: Path, dest: Path) -> int:
    """Debian's owners and modes stay as dpkg made them (setuid sudo, root:shadow...)."""
    if shutil.which("mkfs.erofs") is None:
        raise PackError("mkfs.erofs not found (apt-get install erofs-utils, or scripts/setup.sh)")
    proc = subprocess.run(
        [
            "mkfs.erofs",
            "--quiet",
            "-zlz4hc",
            "-x-1",
            "-T0",
            f"-U{FIXED_UUID}",
            str(dest),
            str(tree),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise PackError(f"mkfs.erofs of the workbench failed:\n{proc.stderr.strip()[-2000:]}")
    return dest.stat().st_size


def _mmdebstrap_error(proc: subprocess.CompletedProcess[str], spec: WorkbenchSpec) -> PackError:
    text = (proc.stderr or proc.stdout).strip()[-3000:]
    for name, version in spec.packages.items():
        if f"'{version}' for '{name}' was not found" in text or (
            f"{name}={version}" in text
            and ("not found" in text or "has no installation candidate" in text)
        ):
            return PinUnavailableError(
                f"the workbench pin {name}={version} is not in Debian's archive any more "
                f"(vm-image/workbench.toml). See `apt-cache policy {name}` after "
                f"`apt-get update`, update the pin and rebuild.\n{text}"
            )
    hint = ""
    if "unshare" in text or ("root" in text and os.geteuid() != 0):
        hint = (
            "\nmmdebstrap needs root, or user namespaces for its unshare mode: "
            "`sysctl kernel.unprivileged_userns_clone=1` and a subuid/subgid range for "
            "this user (`usermod --add-subuids 100000-165535 --add-subgids "
            "100000-165535 $USER`)."
        )
    return PackError(f"mmdebstrap failed (exit {proc.returncode}):\n{text}{hint}")


def image_key(spec: WorkbenchSpec, arch: arches.Arch = arches.AMD64) -> str:
    """The image's cache key: amd64's is the spec's digest (as before arm64 existed),
    another architecture's has its name in it too."""
    if arch is arches.AMD64:
        return spec.digest[:16]
    return hashlib.sha256(f"{spec.digest}\narch={arch.debian}".encode()).hexdigest()[:16]


def ensure_image(
    spec_file: Path, cache: Path, log: Log, arch: arches.Arch = arches.AMD64
) -> WorkbenchImage:
    """The workbench image for ``spec_file`` and ``arch``, from the cache or built now.

    One build per spec and arch at a time: two pack builds that need the same image (two
    packs built at once, the test suite's two workers) build it once; the second
    waits and takes it from the cache."""
    spec = load_spec(spec_file)
    key = image_key(spec, arch)
    found = cached_image(cache / key)
    if found is not None:
        return found
    with pack_lock(cache, f"workbench-{key}"):
        return cached_image(cache / key) or build_image(spec, key, cache, log, arch)


def cached_image(final: Path) -> WorkbenchImage | None:
    """The image a finished build left in ``final`` (``<cache>/<key>``), or None."""
    if (final / PACKAGES_NAME).is_file() and (final / IMAGE_NAME).is_file():
        meta = orjson.loads((final / PACKAGES_NAME).read_bytes())
        return WorkbenchImage(
            image=final / IMAGE_NAME,
            packages=dict(meta["packages"]),
            tree_bytes=int(meta["tree_bytes"]),
            image_bytes=(final / IMAGE_NAME).stat().st_size,
            seconds=float(meta["seconds"]),
            cached=True,
        )
    return None


def build_image(
    spec: WorkbenchSpec, key: str, cache: Path, log: Log, arch: arches.Arch = arches.AMD64
) -> WorkbenchImage:
    """mmdebstrap the spec for ``arch`` into ``<cache>/<key>`` (the caller holds the
    spec's lock)."""
    t0 = time.monotonic()
    final = cache / key
    if shutil.which("mmdebstrap") is None:
        raise PackError(
            "mmdebstrap not found: the pack's workbench image is built with it "
            "(Debian/Ubuntu: apt-get install mmdebstrap, or run scripts/setup.sh)"
        )
    if not arches.runs_here(arch):
        raise PackError(
            f"the {arch.debian} workbench runs {arch.machine} maintainer scripts, which this "
            f"{arches.host().machine} host cannot run: install qemu-user-static and register "
            f"its binfmt_misc handler (scripts/setup.sh does both)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
    try:
        tree = tmp / "root"
        cmd = mmdebstrap_command(spec, tree, arch)
        log(f"mmdebstrap {spec.suite} {arch.debian} ({len(spec.packages)} pinned packages) ...")
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), LC_ALL="C.UTF-8")
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=env,
                timeout=MMDEBSTRAP_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PackError(f"mmdebstrap did not finish within {MMDEBSTRAP_TIMEOUT:.0f}s") from exc
        if proc.returncode != 0:
            raise _mmdebstrap_error(proc, spec)
        packages = installed_packages(tree)
        missing = [f"{n}={v}" for n, v in spec.packages.items() if packages.get(n) != v]
        if missing:
            raise PackError(f"the workbench tree lacks pinned packages: {', '.join(missing)}")
        _finish_tree(tree)
        tree_bytes = _tree_bytes(tree)
        image_bytes = make_image(tree, tmp / IMAGE_NAME)
        shutil.rmtree(tree)
        seconds = round(time.monotonic() - t0, 1)
        meta = {"packages": packages, "tree_bytes": tree_bytes, "seconds": seconds}
        (tmp / PACKAGES_NAME).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return WorkbenchImage(
        image=final / IMAGE_NAME,
        packages=packages,
        tree_bytes=tree_bytes,
        image_bytes=image_bytes,
        seconds=seconds,
        cached=False,
    )


def link_or_copy(src: Path, dest: Path) -> None:
    """Into the pack: a hard link when the cache shares the file system, else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
