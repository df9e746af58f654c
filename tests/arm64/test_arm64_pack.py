"""The arm64 pack as built: every binary in it is arm64, and its manifest says how to boot it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from piwork import arch
from piwork.config import repo_root
from piwork.pack import build_pack
from piwork.pack.cpio import read_newc
from piwork.pack.ingredients import load_pins, pins_path
from piwork.pack.inputs import compute_pack_id
from piwork.pack.manifest import Manifest

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]
EM_AARCH64 = 183
ELF_MEMBERS = (
    "bin/busybox",
    "lib/aarch64-linux-gnu/libc.so.6",
    "lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
    "usr/lib/aarch64-linux-gnu/libstdc++.so.6",
)


def _elf_machine(data: bytes) -> int | None:
    if data[:4] != b"\x7fELF":
        return None
    return int(struct.unpack_from("<H", data, 18)[0])


def test_the_arm64_pack_holds_arm64_binaries_and_boots_on_the_virt_console(
    arm64_pack: tuple[Path, Manifest],
) -> None:
    pack_dir, m = arm64_pack
    assert m.arch == "aarch64"
    assert m.pack_id == compute_pack_id(repo_root(), arch.ARM64) == pack_dir.name
    assert m.pack_id != compute_pack_id(repo_root(), arch.AMD64)
    assert m.cmdline.startswith("console=ttyAMA0 ")
    pins = load_pins(pins_path(repo_root(), arch.ARM64))
    assert m.versions["kernel"] == pins.kernel_release
    assert pins.node is not None and m.versions["node"] == pins.node.version
    # The kernel: Debian's arm64 Image, as shipped (its header's magic at 0x38).
    assert m.kernel == "vmlinuz"
    assert (pack_dir / m.kernel).read_bytes()[0x38:0x3C] == b"ARM\x64"
    machines: dict[str, int | None] = {}
    names: set[str] = set()
    with (pack_dir / m.initrd).open("rb") as fh:
        for member in read_newc(fh):
            names.add(member.name)
            if member.name in ELF_MEMBERS or member.name.endswith("/9p.ko"):
                machines[member.name] = _elf_machine(member.data)
    assert set(machines.values()) == {EM_AARCH64}, machines
    assert set(ELF_MEMBERS) <= set(machines)
    assert "lib/ld-linux-aarch64.so.1" in names  # the PT_INTERP path (a link, as in Debian)
    assert any(name.endswith("/9p.ko") for name in machines)
    # The workbench: the same pinned Debian packages, built for arm64.
    assert m.workbench and m.packages["bash"] == "5.2.15-2+b13"
    print(f"arm64 pack {m.pack_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(m.stats.items())))


def test_a_second_build_is_the_same_pack_found_in_the_cache(
    arm64_pack: tuple[Path, Manifest],
) -> None:
    again = build_pack(arch="aarch64")
    assert not again.built and again.pack_dir == arm64_pack[0]
