"""An arm64 pack's VM: the machine, devices, console and accelerator it gets (issue 32)."""

from __future__ import annotations

from pathlib import Path

from piwork import arch
from piwork.pack.manifest import Manifest
from piwork.vm.accel import Accel, HostFacts, choose_accel
from piwork.vm.command import VmSpec, build_command, kernel_cmdline
from piwork.vm.template import usable

ARM64_MANIFEST = Manifest(
    pack_id="arm",
    arch="aarch64",
    kernel="vmlinuz",
    initrd="initrd.cpio",
    rootfs="root.erofs",
    workbench="workbench.erofs",
    cmdline="console=ttyAMA0 panic=-1",
    versions={},
    files=[],
    created_at="2026-11-28T00:00:00Z",
    builder="test",
)


def _facts(system: str, machine: str, *, kvm: bool = False, hvf: bool = False) -> HostFacts:
    flags = frozenset({"vmx"}) if machine == "x86_64" else frozenset()
    return HostFacts(system, kvm, kvm, flags, hvf, machine=machine)


def spec(accel_host: HostFacts | None = None, **kw: object) -> VmSpec:
    host = accel_host or _facts("Linux", "x86_64")
    base: dict[str, object] = dict(
        pack_dir=Path("/packs/arm"),
        manifest=ARM64_MANIFEST,
        accel=choose_accel(host, guest="aarch64"),
        qmp_socket=Path("/run/q.sock"),
        console_log=Path("/logs/console.log"),
        rpc_socket=Path("/run/rpc.sock"),
        net_socket=Path("/run/net.sock"),
        qemu_binary=arch.ARM64.qemu,
        tcg_lpj=4000000,
    )
    base.update(kw)
    return VmSpec(**base)  # type: ignore[arg-type]


def option(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_an_arm64_pack_boots_on_the_virt_machine_with_pci_virtio_devices() -> None:
    argv = build_command(spec())
    assert argv[0] == "qemu-system-aarch64"
    assert option(argv, "-machine") == ["virt,gic-version=max"]
    devices = option(argv, "-device")
    for wanted in ("virtio-rng-pci", "virtio-serial-pci,id=vser0", "virtio-blk-pci,drive=pwroot"):
        assert wanted in devices
    assert any(d.startswith("virtio-scsi-pci") for d in devices)
    # QEMU has no vmgenid device for arm (it would refuse to start).
    assert not any(d.startswith("vmgenid") for d in devices)


def test_the_cmdline_has_the_packs_console_and_no_x86_only_arguments() -> None:
    line = kernel_cmdline(spec())
    assert line.startswith("console=ttyAMA0 ")
    assert "pci=noacpi" not in line  # the pc machine's interrupt routing
    assert "lpj=" not in line  # x86's TSC delay loop; arm64 delays on its timer


def test_a_warm_start_ram_file_keeps_the_machine() -> None:
    argv = build_command(spec(memory_file=Path("/t/ram")))
    assert option(argv, "-machine") == ["virt,gic-version=max,memory-backend=pwmem"]


def test_warm_start_is_refused_for_arm64_with_the_reason() -> None:
    reason = usable(spec())
    assert reason is not None and "vmgenid" in reason and "aarch64" in reason


def test_an_arm64_guest_on_an_x86_host_is_emulated_and_the_reason_says_so() -> None:
    choice = choose_accel(_facts("Linux", "x86_64", kvm=True), guest="aarch64")
    assert choice.accel is Accel.TCG
    assert "aarch64 guest on this x86_64 host" in choice.reason
    assert choice.qemu_args == ["-accel", "tcg,thread=multi", "-cpu", arch.ARM64.tcg_cpu]


def test_kvm_on_arm64_linux_needs_no_x86_cpu_flags() -> None:
    choice = choose_accel(_facts("Linux", "aarch64", kvm=True), guest="aarch64")
    assert choice.accel is Accel.KVM
    assert choice.qemu_args == ["-accel", "kvm", "-cpu", "host"]
    assert choose_accel(_facts("Linux", "aarch64"), guest="aarch64").accel is Accel.TCG


def test_hvf_on_an_apple_silicon_mac_for_arm64_only() -> None:
    mac = _facts("Darwin", "arm64", hvf=True)
    choice = choose_accel(mac, guest="aarch64")
    assert choice.accel is Accel.HVF
    assert choice.qemu_args == ["-accel", "hvf", "-cpu", "host"]
    x86_on_mac = choose_accel(mac, guest="x86_64")
    assert x86_on_mac.accel is Accel.TCG and "x86_64 guest on this arm64 host" in x86_on_mac.reason


def test_each_packs_cmdline_names_its_console_and_amd64s_is_unchanged() -> None:
    from piwork.pack.build import CMDLINE, cmdline

    assert cmdline(arch.AMD64) == CMDLINE and CMDLINE.startswith("console=ttyS0 ")
    assert cmdline(arch.ARM64) == CMDLINE.replace("console=ttyS0", "console=ttyAMA0")
