"""Debian ingredients of a pack: kernel, modules, busybox, and Node's shared libraries.

Everything comes from exact Debian package versions listed in
``vm-image/pins.toml``. Packages are fetched with ``apt-get download`` into the
download cache (kept across builds: a .deb whose name and control fields match
the pin is reused), unpacked with ``dpkg-deb -x``, and only the few files the
guest needs are copied into the initramfs tree.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import struct
import subprocess
import tempfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from piwork import arch as arches
from piwork.pack.errors import PackError, PinUnavailableError

PINS_FILE = Path("vm-image") / "pins.toml"
"""amd64's pins; another architecture's are ``vm-image/pins-<arch>.toml``
(:func:`pins_path`)."""
LOAD_ORDER_FILE = "piwork.load"  # in lib/modules/<release>/ of the initramfs

# Where glibc's loader looks without an ld.so.cache on Debian (multiarch first).
LIB_DIRS: tuple[str, ...] = arches.AMD64.lib_dirs

# Applets /init relies on; used only if the busybox binary cannot be run on the
# build host to list its applets itself.
FALLBACK_APPLETS: tuple[str, ...] = (
    "bin/sh",
    "bin/ash",
    "bin/cat",
    "bin/chmod",
    "bin/cp",
    "bin/date",
    "bin/dmesg",
    "bin/echo",
    "bin/grep",
    "bin/hostname",
    "bin/kill",
    "bin/ln",
    "bin/ls",
    "bin/mkdir",
    "bin/mknod",
    "bin/mount",
    "bin/mv",
    "bin/ps",
    "bin/rm",
    "bin/sed",
    "bin/sleep",
    "bin/sync",
    "bin/true",
    "bin/false",
    "bin/umount",
    "bin/uname",
    "bin/printf",
    "sbin/ifconfig",
    "sbin/insmod",
    "sbin/ip",
    "sbin/modprobe",
    "sbin/lsmod",
    "sbin/poweroff",
    "sbin/reboot",
    "sbin/route",
    "sbin/switch_root",
    "usr/bin/env",
    "usr/bin/head",
    "usr/bin/tail",
    "usr/bin/tr",
    "usr/bin/wc",
    "usr/bin/test",
    "usr/bin/[",
    "usr/bin/find",
    "usr/bin/xargs",
    "usr/bin/awk",
    "usr/bin/id",
    "usr/bin/nc",
    "usr/bin/wget",
    "usr/bin/timeout",
)


@dataclass(frozen=True)
class NodePin:
    """``[node]`` of a pin file: an npm package of the official Node binary, by integrity."""

    package: str
    version: str
    integrity: str


def pins_path(source: Path, arch: arches.Arch) -> Path:
    """``arch``'s pin file in the source tree."""
    return source / (
        PINS_FILE if arch is arches.AMD64 else PINS_FILE.with_name(f"pins-{arch.debian}.toml")
    )


@dataclass(frozen=True)
class Pins:
    """The parsed ``vm-image/pins.toml``."""

    suite: str
    arch: str
    packages: dict[str, str]
    kernel_release: str
    modules: tuple[str, ...]
    path: Path
    mirrors: tuple[str, ...] = ()
    """apt sources for a host of another architecture (``[debian] mirrors``)."""
    node: NodePin | None = None
    """The Node binary from npm, where the lock file does not pin it (``[node]``)."""

    @property
    def target(self) -> arches.Arch:
        return arches.get(self.arch)

    @property
    def kernel_package(self) -> str:
        name = f"linux-image-{self.kernel_release}"
        if name not in self.packages:
            raise PackError(
                f"{self.path}: [kernel] release {self.kernel_release!r} has no "
                f"pinned package {name!r} in [debian.packages]"
            )
        return name


def load_pins(path: Path) -> Pins:
    try:
        data = tomllib.loads(path.read_text())
        debian = data["debian"]
        kernel = data["kernel"]
        node = data.get("node")
        pins = Pins(
            suite=str(debian["suite"]),
            arch=str(debian["arch"]),
            packages={str(k): str(v) for k, v in debian["packages"].items()},
            kernel_release=str(kernel["release"]),
            modules=tuple(str(m) for m in kernel["modules"]),
            path=path,
            mirrors=tuple(str(m) for m in debian.get("mirrors", ())),
            node=None
            if node is None
            else NodePin(str(node["package"]), str(node["version"]), str(node["integrity"])),
        )
        arches.get(pins.arch)  # an unknown one fails here, naming the file
        return pins
    except (
        OSError,
        tomllib.TOMLDecodeError,
        KeyError,
        TypeError,
        AttributeError,
        ValueError,
    ) as exc:
        raise PackError(f"cannot read pins from {path}: {exc!r}") from exc


def run(cmd: list[str], *, cwd: Path | None = None, what: str = "") -> str:
    """Run a tool, raising :class:`PackError` with its output if it fails."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise PackError(
            f"{cmd[0]} not found: building a pack needs it on PATH "
            f"(Debian/Ubuntu: apt-get install apt dpkg kmod binutils npm)"
        ) from exc
    if proc.returncode != 0:
        out = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise PackError(
            f"{what or cmd[0]} failed ({' '.join(cmd)}), exit {proc.returncode}:\n{out}"
        )
    return proc.stdout


# --- download -------------------------------------------------------------------------


def _deb_matches(deb: Path, name: str, version: str, arch: str | None = None) -> bool:
    try:
        fields = run(["dpkg-deb", "-f", str(deb), "Package", "Version", "Architecture"])
    except PackError:
        return False
    got = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
    return (
        got.get("Package") == name
        and got.get("Version") == version
        and (arch is None or got.get("Architecture") in (arch, "all"))
    )


def _cached_deb(debs: Path, name: str, version: str, arch: str) -> Path | None:
    # apt-get names files <name>_<version with ':' as %3a>_<arch>.deb
    stem = f"{name}_{quote(version, safe='+~.-')}".replace("%3A", "%3a")
    for cand in sorted(debs.glob(f"{stem}_*.deb")):
        if _deb_matches(cand, name, version, arch):
            return cand
    return None


def host_dpkg_arch() -> str | None:
    """This host's Debian architecture, or None without dpkg."""
    try:
        return run(["dpkg", "--print-architecture"]).strip() or None
    except PackError:
        return None


APT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def foreign_apt(pins: Pins, state: Path) -> list[str]:
    """``apt-get`` options for ``pins.arch`` on a host of another architecture: a private
    apt state in ``state`` (its own sources from ``[debian] mirrors``, lists, cache and an
    empty dpkg status), so the host's apt configuration is neither needed nor changed.
    Its lists are brought up to date first (``apt-get update``: ~10 MB the first time)."""
    if not pins.mirrors:
        raise PackError(
            f"{pins.path}: [debian] mirrors is needed to fetch {pins.arch} packages on "
            f"this {host_dpkg_arch()} host"
        )
    if not APT_KEYRING.is_file():
        raise PackError(
            f"{APT_KEYRING} not found: fetching {pins.arch} packages checks Debian's "
            "signatures with it (apt-get install debian-archive-keyring)"
        )
    lists = state / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    wanted = "".join(
        m.replace("deb ", f"deb [arch={pins.arch} signed-by={APT_KEYRING}] ", 1) + "\n"
        for m in pins.mirrors
    )
    sources.write_text(wanted)
    (state / "status").touch()
    opts = [
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::State::Lists={lists}",
        f"-oDir::Cache={state / 'cache'}",
        f"-oDir::State::status={state / 'status'}",
        f"-oAPT::Architecture={pins.arch}",
        f"-oAPT::Architectures::={pins.arch}",
    ]
    # Every time (only a build missing a .deb gets here): apt fetches only what changed,
    # and lists of an archive that has moved on would not have the pinned versions.
    run(["apt-get", *opts, "update"], what=f"apt-get update ({pins.arch} lists)")
    return opts


def download_debs(pins: Pins, debs: Path) -> dict[str, Path]:
    """Make sure every pinned .deb is in ``debs``; return package name -> file.

    Pins for another architecture than the host's come through :func:`foreign_apt`
    (its state beside ``debs``)."""
    debs.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    apt_opts: list[str] | None = None
    for name, version in sorted(pins.packages.items()):
        cached = _cached_deb(debs, name, version, pins.arch)
        if cached is None:
            if apt_opts is None:
                native = host_dpkg_arch() in (None, pins.arch)
                apt_opts = [] if native else foreign_apt(pins, debs.parent / f"apt-{pins.arch}")
            # Download into a private dir, then move: a partial download is never
            # mistaken for a cached one.
            with tempfile.TemporaryDirectory(dir=debs, prefix=".dl-") as tmp:
                try:
                    proc = subprocess.run(
                        ["apt-get", *apt_opts, "download", f"{name}={version}"],
                        cwd=tmp,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                except FileNotFoundError as exc:
                    raise PackError(
                        "apt-get not found: building a pack downloads the pinned Debian "
                        f"packages with it (needed: {name}={version}); build on Debian/Ubuntu "
                        "or copy the .deb files into "
                        f"{debs}"
                    ) from exc
                got = sorted(Path(tmp).glob("*.deb"))
                if proc.returncode != 0 or len(got) != 1:
                    raise PinUnavailableError(
                        f"cannot download pinned Debian package {name}={version} "
                        f"(from {pins.path}):\n{(proc.stderr or proc.stdout).strip()[-1500:]}\n"
                        f"If the archive no longer has this version, see which ones it has "
                        f"with `apt-cache madison {name}` (after `apt-get update`), put the "
                        f"new version under [debian.packages] in {pins.path}"
                        + (
                            " and update [kernel] release and the package name to match"
                            if name.startswith("linux-image-")
                            else ""
                        )
                        + ", and rebuild (a new pin gives a new pack id)."
                    )
                os.replace(got[0], debs / got[0].name)
            cached = debs / got[0].name
            if not _deb_matches(cached, name, version, pins.arch):
                raise PackError(f"downloaded {cached.name} is not {name}={version} ({pins.arch})")
        found[name] = cached
    return found


def extract_deb(deb: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(deb), str(dest)], what=f"unpacking {deb.name}")


# --- kernel and modules ---------------------------------------------------------------


def module_name(path: str) -> str:
    """``kernel/fs/9p/9p.ko.xz`` -> ``9p`` (kernel module names treat '-' as '_')."""
    base = path.rsplit("/", 1)[-1]
    for suffix in (".ko.xz", ".ko.gz", ".ko.zst", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """modules.dep -> {name: (path, [dependency paths])}."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, rest = line.split(":", 1)
        deps[module_name(path)] = (path.strip(), rest.split())
    return deps


def module_closure(
    wanted: Iterable[str], deps: dict[str, tuple[str, list[str]]], builtin: set[str]
) -> list[str]:
    """Paths (relative to lib/modules/<release>) of ``wanted`` and everything they need."""
    paths: dict[str, None] = {}
    missing: list[str] = []

    def visit(name: str) -> None:
        key = name.replace("-", "_")
        if key in builtin:
            return
        if key not in deps:
            missing.append(name)
            return
        path, needs = deps[key]
        if path in paths:
            return
        for dep in needs:
            visit(module_name(dep))
        paths[path] = None

    for name in wanted:
        visit(name)
    if missing:
        raise PackError(
            f"kernel modules not found in the kernel package: {', '.join(missing)} "
            f"(check [kernel] modules in vm-image/pins.toml)"
        )
    return list(paths)


MODULE_SIG_MARKER = b"~Module signature appended~\n"
# struct module_signature (include/linux/module_signature.h); the last field is sig_len.
_MODULE_SIG_INFO = struct.Struct(">BBBBB3xI")


def strip_module_signature(data: bytes, name: str = "module") -> bytes:
    """``data`` without the signature Debian appends to each module (unchanged if unsigned).

    Why: the guest kernel checks every signed module it loads (SHA-512 of the
    whole file and an RSA verification), which under TCG made loading the
    pack's ~37 modules cost seconds of guest CPU on every cold boot, while the
    guest's two node processes were starting. The check protects nothing here:
    the modules come from the pinned, apt-verified kernel package, the kernel
    does not enforce signatures (no ``module.sig_enforce``, no lockdown), and
    root in the guest (the threat model's attacker) could load an unsigned
    module anyway. An unsigned module only taints the kernel (a notice below
    ``loglevel=3``).

    Layout: ``module | signature | struct module_signature | marker``, the
    struct's last field the signature's length (big-endian).
    """
    if not data.endswith(MODULE_SIG_MARKER):
        return data
    end = len(data) - len(MODULE_SIG_MARKER)
    info_at = end - _MODULE_SIG_INFO.size
    if info_at < 0:
        raise PackError(f"{name}: a module signature marker without its header")
    *_, sig_len = _MODULE_SIG_INFO.unpack_from(data, info_at)
    body_end = info_at - sig_len
    if body_end <= 0 or not data.startswith(b"\x7fELF"):
        raise PackError(f"{name}: malformed module signature (length {sig_len})")
    return data[:body_end]


def _copy_module(src: Path, dest_dir: Path, rel: str) -> str:
    """Copy one module, decompressed (busybox insmod cannot read .ko.xz) and unsigned."""
    new_rel = rel
    opener = None
    for suffix, how in ((".ko.xz", lzma.open), (".ko.gz", gzip.open)):
        if rel.endswith(suffix):
            new_rel, opener = rel[: -len(suffix)] + ".ko", how
    if rel.endswith(".ko.zst"):
        raise PackError(f"{rel}: zstd-compressed modules are not supported yet")
    if opener is not None:
        with opener(src, "rb") as fin:
            data = fin.read()
    else:
        data = src.read_bytes()
    dest = dest_dir / new_rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(strip_module_signature(data, rel))
    return new_rel


def install_kernel(kernel_root: Path, pins: Pins, initrd: Path, vmlinuz_dest: Path) -> list[str]:
    """Copy vmlinuz and the pinned modules (with dependencies); run depmod on the result.

    Returns the module paths installed (relative to ``lib/modules/<release>``).
    """
    release = pins.kernel_release
    vmlinuz = kernel_root / "boot" / f"vmlinuz-{release}"
    if not vmlinuz.is_file():
        raise PackError(
            f"{vmlinuz.name} not in {pins.kernel_package}: does [kernel] release "
            f"match the package in {pins.path}?"
        )
    shutil.copyfile(vmlinuz, vmlinuz_dest)

    src_mods = kernel_root / "lib" / "modules" / release
    if not (src_mods / "modules.dep").is_file():
        run(["depmod", "-b", str(kernel_root), release], what="depmod (kernel package)")
    deps = parse_modules_dep((src_mods / "modules.dep").read_text())
    builtin_file = src_mods / "modules.builtin"
    builtin = (
        {module_name(line.strip()) for line in builtin_file.read_text().splitlines()}
        if builtin_file.is_file()
        else set()
    )
    wanted = module_closure(pins.modules, deps, builtin)

    dest_mods = initrd / "lib" / "modules" / release
    dest_mods.mkdir(parents=True, exist_ok=True)
    installed = [_copy_module(src_mods / rel, dest_mods, rel) for rel in wanted]
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (src_mods / name).is_file():
            shutil.copyfile(src_mods / name, dest_mods / name)
    run(["depmod", "-b", str(initrd), release], what="depmod (initramfs)")
    # /init loads them in this order (dependencies first, then the pins' order):
    # soft dependencies such as libcrc32c's on a crc32c implementation are not
    # in modules.dep, so the order is written down rather than left to modprobe.
    (dest_mods / LOAD_ORDER_FILE).write_text("".join(f"{module_name(r)}\n" for r in installed))
    return installed


# --- busybox --------------------------------------------------------------------------


def install_busybox(busybox_root: Path, initrd: Path) -> int:
    """Install ``/bin/busybox`` and a symlink for each of its applets.

    Symlinks are made at build time (not ``busybox --install`` at boot): it costs
    nothing in the archive and saves work in every boot under TCG. Returns the
    number of applet links.
    """
    src = busybox_root / "bin" / "busybox"
    if not src.is_file():
        raise PackError("bin/busybox not found in the busybox-static package")
    dest = initrd / "bin" / "busybox"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(0o755)
    try:
        listed = subprocess.run(
            [str(dest), "--list-full"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = list(FALLBACK_APPLETS)  # e.g. building on a non-x86_64 host
    count = 0
    for rel in sorted(set(listed)):
        link = initrd / rel
        if rel == "bin/busybox" or link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
        count += 1
    return count


# --- shared libraries -----------------------------------------------------------------

_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


@dataclass(frozen=True)
class ElfDeps:
    interpreter: str | None
    needed: tuple[str, ...]


def elf_deps(path: Path) -> ElfDeps:
    """Read PT_INTERP and DT_NEEDED from a 64-bit little-endian ELF file.

    A few lines of ``struct`` instead of ``ldd``: ldd runs the binary's loader
    on the host, which is both a security smell and wrong when the host's libc
    differs from the pinned one.
    """
    data = path.read_bytes() if path.stat().st_size < (1 << 20) else None
    with path.open("rb") as fh:

        def read_at(off: int, n: int) -> bytes:
            if data is not None:
                return data[off : off + n]
            fh.seek(off)
            return fh.read(n)

        ident = read_at(0, 16)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise PackError(f"{path}: not a 64-bit little-endian ELF file")
        (e_phoff,) = struct.unpack_from("<Q", read_at(32, 8))
        e_phentsize, e_phnum = struct.unpack_from("<HH", read_at(54, 4))
        loads: list[tuple[int, int, int]] = []  # vaddr, offset, filesz
        dynamic: tuple[int, int] | None = None
        interp: str | None = None
        for i in range(e_phnum):
            ph = read_at(e_phoff + i * e_phentsize, 56)
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", ph)
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
            elif p_type == _PT_INTERP:
                interp = read_at(p_offset, p_filesz).rstrip(b"\0").decode()
        if dynamic is None:
            return ElfDeps(interp, ())
        raw = read_at(dynamic[0], dynamic[1])
        needed_offs: list[int] = []
        strtab_vaddr = 0
        for j in range(0, len(raw) - 15, 16):
            tag, val = struct.unpack_from("<qQ", raw, j)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                needed_offs.append(val)
            elif tag == _DT_STRTAB:
                strtab_vaddr = val
        strtab_off = next(
            (off + strtab_vaddr - va for va, off, sz in loads if va <= strtab_vaddr < va + sz), None
        )
        if strtab_off is None:
            raise PackError(f"{path}: cannot locate the dynamic string table")
        names = []
        for off in needed_offs:
            chunk = read_at(strtab_off + off, 256)
            names.append(chunk.split(b"\0", 1)[0].decode())
        return ElfDeps(interp, tuple(names))


def _resolve_in(root: Path, rel: str) -> Path:
    """Follow symlinks inside ``root`` (absolute targets are relative to ``root``)."""
    path = root / rel.lstrip("/")
    for _ in range(40):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = root / target.lstrip("/") if target.startswith("/") else path.parent / target
    raise PackError(f"symlink loop at {rel} in {root}")


def install_shared_libs(
    binary: Path, libs_root: Path, initrd: Path, lib_dirs: tuple[str, ...] = LIB_DIRS
) -> list[str]:
    """Install the loader and every library ``binary`` needs (transitively).

    Each library goes to the first of ``lib_dirs`` (the pack's architecture's
    :attr:`piwork.arch.Arch.lib_dirs`) that holds it in the
    unpacked packages, i.e. its usual path; the loader goes where the binary's
    PT_INTERP says (``/lib64/ld-linux-x86-64.so.2``, kept as the symlink
    Debian ships). Returns the guest paths installed.
    """
    installed: list[str] = []
    top = elf_deps(binary)
    if top.interpreter:
        interp_rel = top.interpreter.lstrip("/")
        src = libs_root / interp_rel
        if src.is_symlink():
            target = os.readlink(src)
            (initrd / interp_rel).parent.mkdir(parents=True, exist_ok=True)
            (initrd / interp_rel).symlink_to(target)
            installed.append(interp_rel)
            real_rel = _resolve_in(libs_root, interp_rel).relative_to(libs_root).as_posix()
        else:
            real_rel = interp_rel
        _install_file(_resolve_in(libs_root, interp_rel), initrd / real_rel)
        installed.append(real_rel)

    queue = list(top.needed)
    seen: set[str] = set()
    while queue:
        soname = queue.pop(0)
        if soname in seen:
            continue
        seen.add(soname)
        for d in lib_dirs:
            cand = libs_root / d / soname
            if cand.exists() or cand.is_symlink():
                real = _resolve_in(libs_root, f"{d}/{soname}")
                if not real.is_file():
                    continue
                rel = f"{d}/{soname}"
                if not (initrd / rel).exists():
                    _install_file(real, initrd / rel)
                    installed.append(rel)
                queue.extend(elf_deps(real).needed)
                break
        else:
            raise PackError(
                f"{binary.name} needs {soname}, which none of the pinned Debian "
                f"packages provide (add its package to {PINS_FILE} or pins-<arch>.toml)"
            )
    return installed


def _install_file(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(0o755)


# --- PVH kernel -----------------------------------------------------------------------

_XZ_MAGIC = b"\xfd7zXZ\x00"
_PT_NOTE = 4
_XEN_ELFNOTE_PHYS32_ENTRY = 18


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit ELF kernel carries the Xen PVH entry note QEMU boots through."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    (e_phoff,) = struct.unpack_from("<Q", elf, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", elf, 54)
    for i in range(e_phnum):
        p_type, _f, p_offset, _v, _p, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, e_phoff + i * e_phentsize
        )
        if p_type != _PT_NOTE:
            continue
        off, end = p_offset, p_offset + p_filesz
        while off + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, off)
            name = elf[off + 12 : off + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            off += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_pvh_vmlinux(bzimage: Path) -> bytes | None:
    """The uncompressed ELF kernel inside an XZ bzImage, if it can boot through PVH.

    QEMU (>= 4.0) loads such an ELF with ``-kernel`` and enters it through its
    PVH note: no firmware real-mode boot path and no in-guest XZ decompression
    (~4 s under TCG). None if the image is not XZ or has no PVH entry.
    """
    data = bzimage.read_bytes()
    at = data.find(_XZ_MAGIC)
    if at < 0:
        return None
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[at:])
    except lzma.LZMAError:
        return None
    return elf if has_pvh_entry(elf) else None
