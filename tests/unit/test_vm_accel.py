"""The accelerator is probed from host facts, never assumed from /dev/kvm alone."""

from __future__ import annotations

import pytest

from piwork.vm.accel import TCG_CPU, Accel, HostFacts, choose_accel


def linux(*, exists: bool = True, rw: bool = True, flags: str = "fpu sse2 vmx") -> HostFacts:
    return HostFacts("Linux", exists, exists and rw, frozenset(flags.split()), False)


def test_kvm_when_device_is_usable_and_cpu_has_vmx() -> None:
    choice = choose_accel(linux())
    assert choice.accel is Accel.KVM
    assert choice.qemu_args == ["-accel", "kvm", "-cpu", "host"]


def test_svm_counts_as_hardware_virtualisation() -> None:
    assert choose_accel(linux(flags="fpu svm")).accel is Accel.KVM


def test_nested_pvm_host_without_vmx_falls_back_to_tcg_and_says_why() -> None:
    # This machine: /dev/kvm answers, but the CPU flags have no vmx/svm.
    choice = choose_accel(linux(flags="fpu sse2 hypervisor"))
    assert choice.accel is Accel.TCG
    assert "no vmx/svm" in choice.reason
    # qemu64 plus SSE4: node's WebAssembly fails without them (TCG_CPU's docstring)
    assert choice.qemu_args == ["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]
    assert "+sse4.1" in TCG_CPU
    assert choice.is_emulated


def test_unwritable_kvm_device_names_the_fix() -> None:
    choice = choose_accel(linux(rw=False))
    assert choice.accel is Accel.TCG
    assert "kvm group" in choice.reason


def test_missing_kvm_device() -> None:
    choice = choose_accel(linux(exists=False))
    assert choice.accel is Accel.TCG
    assert "/dev/kvm does not exist" in choice.reason


def test_macos_uses_hvf_when_supported_else_tcg() -> None:
    mac = HostFacts("Darwin", False, False, frozenset(), True)
    assert choose_accel(mac).accel is Accel.HVF
    no_hv = HostFacts("Darwin", False, False, frozenset(), False)
    assert choose_accel(no_hv).accel is Accel.TCG


def test_override_wins_and_is_validated() -> None:
    assert choose_accel(linux(flags="fpu"), "kvm").accel is Accel.KVM
    assert choose_accel(linux(), "TCG").accel is Accel.TCG
    with pytest.raises(ValueError, match="use one of kvm, hvf, tcg"):
        choose_accel(linux(), "xen")
