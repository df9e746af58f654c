"""The QEMU command line: what the guest gets, and what it must never get."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from piwork.pack.manifest import Manifest
from piwork.vm.accel import Accel, AccelChoice
from piwork.vm.command import (
    Share,
    Transport,
    VmSpec,
    build_command,
    host_lpj,
    kernel_cmdline,
)

MANIFEST = Manifest(
    pack_id="abc",
    kernel="vmlinuz",
    initrd="initrd.cpio",
    cmdline="console=ttyS0 panic=-1",
    versions={},
    files=[],
    created_at="2026-11-22T00:00:00Z",
    builder="test",
)
TCG = AccelChoice(Accel.TCG, "test", ["-accel", "tcg,thread=multi"])


def spec(**kw: object) -> VmSpec:
    base: dict[str, object] = dict(
        pack_dir=Path("/packs/abc"),
        manifest=MANIFEST,
        accel=TCG,
        qmp_socket=Path("/run/q.sock"),
        console_log=Path("/logs/console.log"),
        rpc_socket=Path("/run/rpc.sock"),
    )
    base.update(kw)
    return VmSpec(**base)  # type: ignore[arg-type]


def option(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_boots_pack_kernel_and_initrd_with_transport_on_cmdline() -> None:
    argv = build_command(spec())
    assert option(argv, "-kernel") == ["/packs/abc/vmlinuz"]
    assert option(argv, "-initrd") == ["/packs/abc/initrd.cpio"]
    assert option(argv, "-append") == ["console=ttyS0 panic=-1 pci=noacpi piwork.transport=virtio"]
    assert "-no-reboot" in argv
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi"


def test_virtio_transport_names_the_port_and_uses_a_server_socket() -> None:
    argv = build_command(spec())
    chardevs = option(argv, "-chardev")
    assert "socket,id=rpc,path=/run/rpc.sock,server=on,wait=off" in chardevs
    assert "virtserialport,bus=vser0.0,chardev=rpc,name=piwork.rpc" in option(argv, "-device")
    assert "socket,id=qmp,path=/run/q.sock,server=on,wait=off" in chardevs


def test_tcp_transport_forwards_only_loopback_and_its_secret_is_a_file() -> None:
    secret = Path("/run/secret,x")
    argv = build_command(
        spec(
            transport=Transport.TCP,
            rpc_socket=None,
            host_tcp_port=4567,
            tcp_secret_file=secret,
            net_socket=Path("/run/net.sock"),
        )
    )
    (netdev,) = option(argv, "-netdev")
    assert netdev == "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4567-:7000"
    assert option(argv, "-fw_cfg") == ["name=opt/piwork/secret,file=/run/secret,,x"]
    assert "piwork.port=7000" in kernel_cmdline(spec(transport=Transport.TCP, host_tcp_port=1))
    ports = [d for d in option(argv, "-device") if "virtserialport" in d]
    assert ports == ["virtserialport,bus=vser0.0,chardev=pwnet,name=piwork.net"]
    with pytest.raises(ValueError, match="tcp_secret_file"):
        build_command(spec(transport=Transport.TCP, rpc_socket=None, host_tcp_port=4567))


def test_virtio_transport_has_no_network_card_only_the_netmux_port() -> None:
    argv = build_command(spec(net_socket=Path("/run/net,1.sock")))
    assert "-netdev" not in argv and "-nic" not in argv and "-net" not in argv
    assert not any("virtio-net" in d or "guestfwd" in d for d in argv)
    assert "socket,id=pwnet,path=/run/net,,1.sock,server=on,wait=off" in option(argv, "-chardev")
    ports = [d for d in option(argv, "-device") if "virtserialport" in d]
    assert ports == [
        "virtserialport,bus=vser0.0,chardev=rpc,name=piwork.rpc",
        "virtserialport,bus=vser0.0,chardev=pwnet,name=piwork.net",
    ]
    assert option(argv, "-device").count("virtio-serial-pci,id=vser0") == 1
    assert "-fw_cfg" not in argv


def test_shares_become_9p_devices_readonly_where_asked() -> None:
    shares = [Share("pwstate", Path("/t/state")), Share("pwup", Path("/t/up,x"), readonly=True)]
    argv = build_command(spec(shares=shares))
    fsdevs = option(argv, "-fsdev")
    model = "security_model=mapped-xattr,fmode=0644,dmode=0755,multidevs=remap"
    assert fsdevs[0] == f"local,id=fs0,path=/t/state,{model}"
    assert fsdevs[1].endswith(f"path=/t/up,,x,{model},readonly=on")
    assert "virtio-9p-pci,fsdev=fs1,mount_tag=pwup" in option(argv, "-device")


def test_incoherent_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="rpc_socket"):
        build_command(spec(rpc_socket=None))
    with pytest.raises(ValueError, match="host_tcp_port"):
        build_command(spec(transport=Transport.TCP, tcp_secret_file=Path("/s")))
    with pytest.raises(ValueError, match="duplicate"):
        build_command(spec(shares=[Share("a", Path("/x")), Share("a", Path("/y"))]))


def test_no_secret_shaped_values_leak_into_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-should-never-appear")
    argv = build_command(spec())
    assert not any("sk-live" in a for a in argv)


def test_cold_boot_has_private_ram_and_a_generation_id() -> None:
    argv = build_command(spec())
    assert option(argv, "-machine") == ["pc"]
    assert "-incoming" not in argv and "-object" not in argv
    assert "vmgenid,guid=auto" in option(argv, "-device")


def test_template_ram_is_a_shared_file_and_a_clone_maps_it_privately() -> None:
    tpl = build_command(spec(memory_file=Path("/t/ram,x"), memory_shared=True, memory_mb=512))
    assert option(tpl, "-machine") == ["pc,memory-backend=pwmem"]
    assert option(tpl, "-object") == [
        "memory-backend-file,id=pwmem,size=512M,mem-path=/t/ram,,x,share=on"
    ]
    assert "-incoming" not in tpl
    clone = build_command(spec(memory_file=Path("/t/ram"), incoming=True, memory_mb=512))
    assert option(clone, "-object") == [
        "memory-backend-file,id=pwmem,size=512M,mem-path=/t/ram,share=off"
    ]
    assert option(clone, "-incoming") == ["defer"]
    # Same devices in the same order: only the RAM sharing and -incoming differ.
    strip = {"-incoming", "defer"}
    assert [a.replace("share=on", "share=off").replace(",,x", "") for a in tpl] == [
        a for a in clone if a not in strip
    ]


def test_the_console_goes_to_a_host_socket_not_a_file_qemu_grows() -> None:
    argv = build_command(spec())
    assert "socket,id=console,path=/run/cq.sock" in option(argv, "-chardev")
    assert not any(c.startswith("file,") for c in option(argv, "-chardev"))
    assert option(argv, "-serial") == ["chardev:console"]


def test_the_packs_read_only_disk_is_attached_read_only_when_the_pack_has_one() -> None:
    assert "-drive" not in build_command(spec())  # a pack without one: no disk
    with_disk = spec()
    with_disk.manifest = with_disk.manifest.model_copy(update={"rootfs": "root.erofs"})
    argv = build_command(with_disk)
    assert option(argv, "-drive") == [
        "file=/packs/abc/root.erofs,if=none,id=pwroot,format=raw,readonly=on"
    ]
    assert "virtio-blk-pci,drive=pwroot" in option(argv, "-device")
    # A restored clone is launched from the same spec: it attaches the same disk.
    clone = build_command(replace(with_disk, incoming=True, memory_file=Path("/t/ram")))
    assert option(clone, "-drive") == option(argv, "-drive")


def test_the_workbench_image_is_read_only_and_the_env_disk_is_never_on_the_command_line() -> None:
    """The task's writable disk is hot-plugged after start (piwork.agent): a template made
    from this command line holds no writable disk, so no clone sees a disk that disagrees
    with the page cache saved in the template's RAM."""
    assert "virtio-scsi-pci,id=pwscsi" not in option(build_command(spec()), "-device")
    wb = spec()
    wb.manifest = wb.manifest.model_copy(update={"workbench": "workbench.erofs"})
    argv = build_command(wb)
    assert option(argv, "-drive") == [
        "file=/packs/abc/workbench.erofs,if=none,id=pwwb,format=raw,readonly=on"
    ]
    assert "virtio-blk-pci,drive=pwwb,serial=pwworkbench" in option(argv, "-device")
    assert "virtio-scsi-pci,id=pwscsi" in option(argv, "-device")
    assert not any("qcow2" in a or "scsi-hd" in a for a in argv)
    clone = build_command(replace(wb, incoming=True, memory_file=Path("/t/ram")))
    assert option(clone, "-device") == option(argv, "-device")


CPUINFO = """processor\t: 0
model name\t: AMD EPYC
bogomips\t: 5192.27
flags\t\t: fpu tsc

processor\t: 1
bogomips\t: 5192.27
"""


def test_lpj_is_the_hosts_tsc_cycles_per_guest_jiffy() -> None:
    # bogomips = TSC kHz / 500; the guest (HZ=250) computed 10384544 for its first CPU.
    assert host_lpj(CPUINFO) == 10_384_540
    assert host_lpj("processor\t: 0\nflags\t: fpu\n") is None  # no figure: calibrate
    assert host_lpj("bogomips\t: 0.00\n") is None


def test_lpj_goes_on_the_command_line_under_tcg_only() -> None:
    assert kernel_cmdline(spec(tcg_lpj=10_384_540)).endswith(" lpj=10384540")
    assert "lpj=" not in kernel_cmdline(spec())
    kvm = AccelChoice(Accel.KVM, "test", ["-accel", "kvm"])
    assert "lpj=" not in kernel_cmdline(spec(accel=kvm, tcg_lpj=10_384_540))
