"""The QEMU command line, built from a pack manifest and a VM spec.

A pure function: no files are touched and nothing is started, so the whole
command line is unit-testable and can be shown verbatim in errors. Nothing
secret is ever put here (keys stay in the host's model gateway).
"""

from __future__ import annotations

import functools
import platform
import re
import shutil
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from piwork import arch as arches
from piwork.pack.manifest import Manifest
from piwork.vm.accel import AccelChoice

RPC_PORT_NAME = "piwork.rpc"
NET_PORT_NAME = "piwork.net"
"""The guest's TCP connections to the gateway/egress, multiplexed (piwork.vm.netmux)."""
SECRET_FW_CFG = "opt/piwork/secret"
"""TCP transport: the per-run secret, as a fw_cfg file (never on a command line)."""
GUEST_TCP_PORT = 7000
GATEWAY_GUEST_ADDR = ("10.0.2.100", 80)
EGRESS_GUEST_ADDR = ("10.0.2.101", 3128)


class Transport(StrEnum):
    VIRTIO = "virtio"
    TCP = "tcp"


@dataclass(frozen=True)
class Share:
    """A host directory shared into the guest over 9p under a fixed tag."""

    tag: str
    host_path: Path
    readonly: bool = False
    guard_git: bool = True
    """Git metadata in it is read-only to QEMU, new ones moved aside (piwork.vm.gitguard).
    False only for piwork's private state, where nobody runs host git."""


@dataclass
class VmSpec:
    pack_dir: Path
    manifest: Manifest
    accel: AccelChoice
    qmp_socket: Path
    console_log: Path
    transport: Transport = Transport.VIRTIO
    rpc_socket: Path | None = None  # virtio transport
    host_tcp_port: int | None = None  # tcp transport
    tcp_secret_file: Path | None = None  # tcp transport: 0600 file, read by QEMU at start
    net_socket: Path | None = None  # the netmux port's chardev socket (no NIC needed)
    memory_mb: int = 1024
    cpus: int = 2
    shares: list[Share] = field(default_factory=list)
    name: str = "piwork"
    qemu_binary: str = "qemu-system-x86_64"
    extra_kernel_args: list[str] = field(default_factory=list)
    # Warm start (piwork.vm.template): guest RAM in a file, shared while a
    # template is made, a private copy-on-write mapping in a restored clone.
    memory_file: Path | None = None
    memory_shared: bool = False
    incoming: bool = False  # wait for migrate-incoming (a restore) instead of booting
    tcg_lpj: int | None = None
    """Under TCG only: the guest kernel's loops-per-jiffy (``lpj=``), from :func:`host_lpj`."""


def console_socket(spec: VmSpec) -> Path:
    """Where the host listens for QEMU's serial console (next to the QMP socket).

    The console goes through a socket, not a ``file`` chardev, so the host
    writes ``console.log`` itself and can bound it (piwork.vm.machine).
    """
    return spec.qmp_socket.with_name(f"c{spec.qmp_socket.name}")


def qemu_opt(value: str) -> str:
    """Escape a value for QEMU's comma-separated option syntax."""
    return value.replace(",", ",,")


# For the `pc` machine (SeaBIOS provides a $PIR table): route PCI interrupts
# without ACPI. With ACPI the kernel evaluates each interrupt link's AML as
# the virtio drivers bind, ~1.3 s of a cold boot under TCG for 8 devices.
MACHINE_KERNEL_ARGS: tuple[str, ...] = ("pci=noacpi",)


GUEST_HZ = 250
"""The pinned Debian kernel's CONFIG_HZ (jiffies per second)."""
_BOGOMIPS_RE = re.compile(r"^bogomips\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.MULTILINE)


@functools.cache
def _this_hosts_lpj() -> int | None:
    """:func:`host_lpj` of this machine, read once (its TSC does not change)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return host_lpj(fh.read())
    except OSError:
        return None


def host_lpj(cpuinfo: str | None = None) -> int | None:
    """The guest's loops-per-jiffy under TCG on this x86-64 Linux host, or None.

    Why: with no ``lpj=`` the guest kernel calibrates its delay loop on the
    second vCPU by counting jiffies (the emulated CPU lacks ``constant_tsc``,
    so the first CPU's figure is not reused), and under TCG that calibration
    fails its direct method and falls back to the slow one: 0.15-0.25 s of
    every cold boot, measured from the console's "Bringing up secondary CPUs"
    to "Brought up" (0.02-0.06 s with ``lpj=``). Under TCG the guest's TSC is
    the host's, and x86 Linux delays count TSC cycles, so the right figure is
    the host TSC's cycles per guest jiffy: the host kernel's ``bogomips`` is
    TSC kHz / 500, hence lpj = bogomips * 500000 / GUEST_HZ (2 596 MHz -> the
    10384544 the guest computes for its first CPU). Only on an x86-64 Linux
    host, whose /proc/cpuinfo says it; elsewhere the guest calibrates as before.
    """
    if cpuinfo is None:
        return _this_hosts_lpj()
    m = _BOGOMIPS_RE.search(cpuinfo)
    if m is None:
        return None
    lpj = round(float(m.group(1)) * 500_000 / GUEST_HZ)
    return lpj if lpj > 0 else None


def guest_arch(spec: VmSpec) -> arches.Arch:
    """The pack's architecture (its manifest's ``arch``): which QEMU machine boots it."""
    return arches.of_manifest(spec.manifest.arch)


def kernel_cmdline(spec: VmSpec) -> str:
    x86 = guest_arch(spec) is arches.AMD64
    parts = [
        spec.manifest.cmdline,
        *(MACHINE_KERNEL_ARGS if x86 else ()),
        f"piwork.transport={spec.transport.value}",
    ]
    # lpj: an x86 guest's delay loop; arm64 kernels delay on the architected timer.
    if spec.tcg_lpj and spec.accel.is_emulated and x86:
        parts.append(f"lpj={spec.tcg_lpj}")
    if spec.transport is Transport.TCP:
        parts.append(f"piwork.port={GUEST_TCP_PORT}")
    parts.extend(spec.extra_kernel_args)
    return " ".join(p for p in parts if p)


def rootfs_args(spec: VmSpec) -> list[str]:
    """The pack's read-only disk (node + pi), the first virtio-blk device (/dev/vda).

    ``readonly=on``: QEMU opens the image read-only with a shared lock, so every
    VM (and every clone of a template) attaches the same file; the guest reads
    it through the host's page cache.
    """
    if not spec.manifest.rootfs:
        return []
    path = qemu_opt(str(spec.pack_dir / spec.manifest.rootfs))
    return [
        "-drive",
        f"file={path},if=none,id=pwroot,format=raw,readonly=on",
        "-device",
        "virtio-blk-pci,drive=pwroot",
    ]


ENV_SCSI_BUS = "pwscsi"
"""The virtio-scsi controller the task's environment disk is hot-plugged on (piwork.env)."""
WORKBENCH_SERIAL = "pwworkbench"
"""The guest finds the workbench image by this serial (runtime-pack/workbench/setup.sh)."""


def workbench_args(spec: VmSpec) -> list[str]:
    """The pack's workbench image (read-only, like the pack's disk) and an empty SCSI bus.

    The task's writable environment disk is *not* here: it is hot-plugged over
    QMP after the VM is up (``piwork.agent``), so a saved template holds no
    writable disk and a restored clone can never see a disk whose contents
    disagree with the page cache in the template's RAM. virtio-scsi, not a
    virtio-blk PCI device: a SCSI disk joins an existing controller without PCI
    hotplug (which ``pci=noacpi`` would leave without a slot to announce it).
    """
    if not spec.manifest.workbench:
        return []
    path = qemu_opt(str(spec.pack_dir / spec.manifest.workbench))
    return [
        "-drive",
        f"file={path},if=none,id=pwwb,format=raw,readonly=on",
        "-device",
        f"virtio-blk-pci,drive=pwwb,serial={WORKBENCH_SERIAL}",
        "-device",
        f"virtio-scsi-pci,id={ENV_SCSI_BUS}",
    ]


def build_command(spec: VmSpec) -> list[str]:
    """Return the argv that boots ``spec``; raises ValueError on an incoherent spec."""
    if spec.transport is Transport.VIRTIO and spec.rpc_socket is None:
        raise ValueError("the virtio transport needs rpc_socket")
    if spec.transport is Transport.TCP and not spec.host_tcp_port:
        raise ValueError("the tcp transport needs host_tcp_port")
    if spec.transport is Transport.TCP and spec.tcp_secret_file is None:
        raise ValueError("the tcp transport needs tcp_secret_file (its per-run secret)")
    tags = [s.tag for s in spec.shares]
    if len(tags) != len(set(tags)):
        raise ValueError(f"duplicate 9p tags: {tags}")

    arch = guest_arch(spec)
    machine = arch.qemu_machine
    memory: list[str] = []
    if spec.memory_file is not None:
        shared = "on" if spec.memory_shared else "off"
        memory = [
            "-object",
            f"memory-backend-file,id=pwmem,size={spec.memory_mb}M,"
            f"mem-path={qemu_opt(str(spec.memory_file))},share={shared}",
        ]
        machine = f"{machine},memory-backend=pwmem"
    argv: list[str] = [
        spec.qemu_binary,
        "-name",
        qemu_opt(spec.name),
        "-machine",
        machine,
        *memory,
        *spec.accel.qemu_args,
        "-m",
        str(spec.memory_mb),
        "-smp",
        str(spec.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-vga",
        "none",
        # A guest panic or poweroff becomes a QEMU exit the host can see.
        "-no-reboot",
        "-kernel",
        str(spec.pack_dir / spec.manifest.kernel),
        "-initrd",
        str(spec.pack_dir / spec.manifest.initrd),
        "-append",
        kernel_cmdline(spec),
        *rootfs_args(spec),
        *workbench_args(spec),
        "-chardev",
        f"socket,id=console,path={qemu_opt(str(console_socket(spec)))}",
        "-serial",
        "chardev:console",
        "-chardev",
        f"socket,id=qmp,path={qemu_opt(str(spec.qmp_socket))},server=on,wait=off",
        "-mon",
        "chardev=qmp,mode=control",
        "-device",
        "virtio-rng-pci",
    ]
    if arch is arches.AMD64:
        # A restored clone gets a new generation id: the guest kernel reseeds its RNG.
        # (QEMU has vmgenid on x86 only: see piwork.vm.template for arm64.)
        argv += ["-device", "vmgenid,guid=auto"]
    if spec.incoming:
        argv += ["-incoming", "defer"]

    if spec.rpc_socket is not None or spec.net_socket is not None:
        argv += ["-device", "virtio-serial-pci,id=vser0"]
    if spec.transport is Transport.VIRTIO:
        assert spec.rpc_socket is not None
        argv += [
            "-chardev",
            f"socket,id=rpc,path={qemu_opt(str(spec.rpc_socket))},server=on,wait=off",
            "-device",
            f"virtserialport,bus=vser0.0,chardev=rpc,name={RPC_PORT_NAME}",
        ]
    if spec.net_socket is not None:
        argv += [
            "-chardev",
            f"socket,id=pwnet,path={qemu_opt(str(spec.net_socket))},server=on,wait=off",
            "-device",
            f"virtserialport,bus=vser0.0,chardev=pwnet,name={NET_PORT_NAME}",
        ]

    for i, share in enumerate(spec.shares):
        opts = [
            "local",
            f"id=fs{i}",
            f"path={qemu_opt(str(share.host_path))}",
            # Guest ownership and mode bits live in user.virtfs.* xattrs, never on
            # the host file: guest root cannot make setuid/setgid files or device
            # nodes on the host (docs/security.md). Host-side modes are fixed.
            "security_model=mapped-xattr",
            "fmode=0644",
            "dmode=0755",
            "multidevs=remap",
        ]
        if share.readonly:
            opts.append("readonly=on")
        argv += [
            "-fsdev",
            ",".join(opts),
            "-device",
            f"virtio-9p-pci,fsdev=fs{i},mount_tag={share.tag}",
        ]

    # No network card at all on the virtio transport: the guest's connections to
    # the gateway and egress proxy go through the netmux port. Only the TCP
    # transport needs slirp, for its hostfwd; restrict=on, and no guestfwd.
    if spec.transport is Transport.TCP:
        assert spec.tcp_secret_file is not None
        argv += [
            "-fw_cfg",
            f"name={SECRET_FW_CFG},file={qemu_opt(str(spec.tcp_secret_file))}",
            "-netdev",
            f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{spec.host_tcp_port}-:{GUEST_TCP_PORT}",
            "-device",
            "virtio-net-pci,netdev=net0",
        ]
    return argv


def find_qemu(binary: str = "qemu-system-x86_64") -> str | None:
    return shutil.which(binary)
