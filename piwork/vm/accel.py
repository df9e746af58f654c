"""Choosing the QEMU accelerator: probed, never assumed.

``/dev/kvm`` existing is not enough: on nested-PVM hosts it answers ioctls but
ordinary guests hang (see FACTS.md). KVM is used only when the device is
read-writable *and* the CPU advertises hardware virtualisation; HVF on macOS
when the hypervisor framework says it is supported; TCG otherwise, with the
reason said out loud. The user can always override.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from piwork import arch as arches


class Accel(StrEnum):
    KVM = "kvm"
    HVF = "hvf"
    TCG = "tcg"


@dataclass(frozen=True)
class AccelChoice:
    accel: Accel
    reason: str
    qemu_args: list[str] = field(default_factory=list)

    @property
    def is_emulated(self) -> bool:
        return self.accel is Accel.TCG


@dataclass(frozen=True)
class HostFacts:
    """What the probe looks at; injectable so the rules are testable anywhere."""

    system: str
    dev_kvm_exists: bool
    dev_kvm_rw: bool
    cpu_flags: frozenset[str]
    hvf_supported: bool
    machine: str = "x86_64"
    """The host's CPU architecture (``uname -m``): KVM and HVF run guests of that one only."""


TCG_CPU = arches.AMD64.tcg_cpu
"""The emulated CPU: QEMU's default qemu64 plus the SSE4 generation (which TCG
has implemented for years; no AVX, whose TCG support is new in QEMU 7.2).

Why: on bare qemu64 (no SSE4.1) V8's WebAssembly compilers take their rarely
used fallbacks, and they are broken: pi's image tool (photon, wasm) crashed
node with SIGILL/SIGSEGV or failed in ~1 of 5 resizes, and every one of 5 with
``--liftoff-only`` (SIGTRAP). With these features: 15 of 15 passed (measured in
the guest; see tests/vm/test_vm_image_resize.py). Every real x86-64 CPU since
2008 has them, so the guest sees what node is normally run on. An arm64 guest's:
:attr:`piwork.arch.Arch.tcg_cpu`."""


def _qemu_args(
    accel: Accel, smp_threads: bool = True, guest: arches.Arch = arches.AMD64
) -> list[str]:
    if accel is Accel.KVM:
        return ["-accel", "kvm", "-cpu", "host"]
    if accel is Accel.HVF:
        return ["-accel", "hvf", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi" if smp_threads else "tcg", "-cpu", guest.tcg_cpu]


def read_host_facts(
    dev_kvm: Path = Path("/dev/kvm"), cpuinfo: Path = Path("/proc/cpuinfo")
) -> HostFacts:
    system = platform.system()
    flags: set[str] = set()
    if cpuinfo.exists():
        try:
            for line in cpuinfo.read_text(errors="replace").splitlines():
                if line.startswith("flags"):
                    flags.update(line.partition(":")[2].split())
                    break
        except OSError:
            pass
    hvf = False
    if system == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "kern.hv_support"], capture_output=True, text=True, timeout=5
            )
            hvf = out.stdout.strip() == "1"
        except (OSError, subprocess.SubprocessError):
            hvf = False
    exists = dev_kvm.exists()
    return HostFacts(
        system=system,
        dev_kvm_exists=exists,
        dev_kvm_rw=exists and os.access(dev_kvm, os.R_OK | os.W_OK),
        cpu_flags=frozenset(flags),
        hvf_supported=hvf,
        machine=platform.machine(),
    )


def choose_accel(
    facts: HostFacts, override: str | None = None, guest: str | None = None
) -> AccelChoice:
    """Pick the accelerator for these host facts and a ``guest`` of that architecture
    (a pack manifest's ``arch``; default :func:`piwork.arch.selected`), or honour the
    user's choice."""
    target = arches.get(guest) if guest else arches.selected()
    try:
        native = arches.get(facts.machine) is target
    except ValueError:
        native = False
    if override:
        try:
            wanted = Accel(override.lower())
        except ValueError:
            raise ValueError(
                f"unknown accelerator {override!r}: use one of " + ", ".join(a.value for a in Accel)
            ) from None
        return AccelChoice(
            wanted, f"{wanted.value} chosen with --accel", _qemu_args(wanted, guest=target)
        )

    if not native:
        return AccelChoice(
            Accel.TCG,
            f"an {target.machine} guest on this {facts.machine} host: KVM and HVF run only "
            "guests of the host's own architecture; emulating with TCG (slow)",
            _qemu_args(Accel.TCG, guest=target),
        )
    if facts.system == "Darwin":
        if facts.hvf_supported:
            return AccelChoice(
                Accel.HVF, "macOS Hypervisor.framework is available", _qemu_args(Accel.HVF)
            )
        return AccelChoice(
            Accel.TCG,
            "macOS reports no hypervisor support (kern.hv_support != 1); emulating with TCG (slow)",
            _qemu_args(Accel.TCG, guest=target),
        )

    if not facts.dev_kvm_exists:
        why = "/dev/kvm does not exist"
    elif not facts.dev_kvm_rw:
        why = "/dev/kvm is not read-writable by this user (add yourself to the kvm group)"
    elif target is arches.AMD64 and not facts.cpu_flags & {"vmx", "svm"}:
        why = (
            "/dev/kvm exists but the CPU advertises no vmx/svm (nested or paravirtual "
            "KVM, where ordinary guests hang)"
        )
    else:
        return AccelChoice(
            Accel.KVM,
            "/dev/kvm is usable and the CPU has hardware virtualisation"
            if target is arches.AMD64
            else f"/dev/kvm is usable on this {facts.machine} host",
            _qemu_args(Accel.KVM),
        )
    return AccelChoice(
        Accel.TCG, f"{why}; emulating with TCG (slow)", _qemu_args(Accel.TCG, guest=target)
    )


def probe(override: str | None = None, guest: str | None = None) -> AccelChoice:
    """The accelerator for a ``guest`` (a manifest's ``arch``) on this machine."""
    return choose_accel(read_host_facts(), override, guest)
