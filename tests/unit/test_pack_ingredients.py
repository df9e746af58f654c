"""Debian ingredients: pins, downloads, module closure, ELF dependencies."""

from __future__ import annotations

import lzma
import struct
import subprocess
from pathlib import Path

import pytest

from piwork.config import repo_root
from piwork.pack.errors import PackError, PinUnavailableError
from piwork.pack.ingredients import (
    MODULE_SIG_MARKER,
    Pins,
    _copy_module,
    download_debs,
    elf_deps,
    extract_pvh_vmlinux,
    has_pvh_entry,
    load_pins,
    module_closure,
    module_name,
    parse_modules_dep,
    strip_module_signature,
)

MODULES_DEP = """\
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/fs/9p/9p.ko.xz: kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko kernel/net/9p/9pnet.ko
kernel/drivers/net/net-failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
"""


def test_real_pins_parse_and_name_the_kernel_package() -> None:
    pins = load_pins(repo_root() / "vm-image" / "pins.toml")
    assert pins.kernel_package == f"linux-image-{pins.kernel_release}"
    assert "9p" in pins.modules and "busybox-static" in pins.packages


def test_module_names_drop_suffixes_and_treat_dash_as_underscore() -> None:
    assert module_name("kernel/fs/9p/9p.ko.xz") == "9p"
    assert module_name("kernel/drivers/net/net-failover.ko") == "net_failover"


def test_module_closure_puts_dependencies_first_and_skips_builtins() -> None:
    deps = parse_modules_dep(MODULES_DEP)
    got = module_closure(["9p", "net_failover", "virtio"], deps, builtin={"virtio_ring"})
    assert got == [
        "kernel/fs/netfs/netfs.ko",
        "kernel/fs/fscache/fscache.ko",
        "kernel/net/9p/9pnet.ko",
        "kernel/fs/9p/9p.ko.xz",
        "kernel/net/core/failover.ko",
        "kernel/drivers/net/net-failover.ko",
        "kernel/drivers/virtio/virtio.ko",
    ]


def test_unknown_module_is_an_error_naming_it() -> None:
    with pytest.raises(PackError, match="no_such_mod"):
        module_closure(["9p", "no_such_mod"], parse_modules_dep(MODULES_DEP), builtin=set())


def test_elf_deps_agree_with_readelf() -> None:
    binary = Path("/bin/ls")
    deps = elf_deps(binary)
    out = subprocess.run(
        ["readelf", "-d", "-l", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    expected = [
        line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line
    ]
    assert list(deps.needed) == expected and "libc.so.6" in expected
    assert deps.interpreter is not None and deps.interpreter in out


def test_an_unavailable_pin_says_which_and_how_to_fix(tmp_path: Path) -> None:
    pins = Pins(
        suite="bookworm",
        arch="amd64",
        packages={"busybox-static": "0.0.0-nope"},
        kernel_release="x",
        modules=(),
        path=Path("vm-image/pins.toml"),
    )
    with pytest.raises(PinUnavailableError) as info:
        download_debs(pins, tmp_path / "debs")
    msg = str(info.value)
    assert "busybox-static=0.0.0-nope" in msg and "apt-cache madison busybox-static" in msg
    assert "vm-image/pins.toml" in msg
    assert list((tmp_path / "debs").iterdir()) == []  # no partial download left


def test_a_cached_deb_matching_the_pin_is_reused_without_apt(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: piwork-fake\nVersion: 1:2.0-1\nArchitecture: all\n"
        "Maintainer: t <t@example.com>\nDescription: test\n"
    )
    debs = tmp_path / "debs"
    debs.mkdir()
    deb = debs / "piwork-fake_1%3a2.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    pins = Pins(
        suite="bookworm",
        arch="amd64",
        packages={"piwork-fake": "1:2.0-1"},
        kernel_release="x",
        modules=(),
        path=Path("pins.toml"),
    )
    # apt-get would fail: no such package exists in any archive.
    assert download_debs(pins, debs) == {"piwork-fake": deb}


def _elf_with_notes(notes: list[tuple[bytes, int]]) -> bytes:
    """A minimal 64-bit ELF whose one PT_NOTE segment holds ``notes`` (name, type)."""
    body = b""
    for name, ntype in notes:
        n = name + b"\0"
        desc = b"\0" * 4
        body += struct.pack("<III", len(n), len(desc), ntype)
        body += n + b"\0" * (-len(n) % 4) + desc
    ehdr = bytearray(64)
    ehdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", ehdr, 32, 64)  # e_phoff
    struct.pack_into("<HH", ehdr, 54, 56, 1)  # e_phentsize, e_phnum
    phdr = struct.pack("<IIQQQQQQ", 4, 0, 64 + 56, 0, 0, len(body), len(body), 4)
    return bytes(ehdr) + phdr + body


def test_pvh_entry_is_found_only_in_a_xen_phys32_entry_note() -> None:
    assert has_pvh_entry(_elf_with_notes([(b"Xen", 6), (b"Xen", 18)]))
    assert not has_pvh_entry(_elf_with_notes([(b"Xen", 6), (b"GNU", 18)]))
    assert not has_pvh_entry(b"MZ" + b"\0" * 100)


def test_a_vmlinux_comes_out_of_an_xz_bzimage_only_with_a_pvh_entry(tmp_path: Path) -> None:
    pvh = _elf_with_notes([(b"Xen", 18)])
    bz = tmp_path / "vmlinuz"
    bz.write_bytes(b"setup code" + lzma.compress(pvh, format=lzma.FORMAT_XZ) + b"trailer")
    assert extract_pvh_vmlinux(bz) == pvh
    bz.write_bytes(b"setup code" + lzma.compress(_elf_with_notes([]), format=lzma.FORMAT_XZ))
    assert extract_pvh_vmlinux(bz) is None
    bz.write_bytes(b"no xz here")
    assert extract_pvh_vmlinux(bz) is None


def _signed(body: bytes, sig: bytes) -> bytes:
    """A module as Debian ships it: body, PKCS#7 signature, struct module_signature, marker."""
    info = struct.pack(">BBBBB3xI", 0, 0, 2, 0, 0, len(sig))  # id_type 2: PKCS#7
    return body + sig + info + MODULE_SIG_MARKER


def test_a_signed_module_loses_exactly_its_signature() -> None:
    body = b"\x7fELF" + bytes(range(256)) * 10
    assert strip_module_signature(_signed(body, b"S" * 547)) == body


def test_an_unsigned_module_is_left_as_it_is() -> None:
    body = b"\x7fELF" + b"x" * 100
    assert strip_module_signature(body) == body


@pytest.mark.parametrize(
    "data",
    [
        MODULE_SIG_MARKER,  # no header
        b"\x7fELF" + struct.pack(">BBBBB3xI", 0, 0, 2, 0, 0, 10_000) + MODULE_SIG_MARKER,
        _signed(b"not an elf file", b"S" * 8),
    ],
)
def test_a_malformed_signature_trailer_fails_the_build_naming_the_module(data: bytes) -> None:
    with pytest.raises(PackError, match=r"virtio\.ko"):
        strip_module_signature(data, "virtio.ko")


def test_copied_modules_are_decompressed_and_unsigned(tmp_path: Path) -> None:
    body = b"\x7fELF" + b"module code" * 50
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.ko.xz").write_bytes(lzma.compress(_signed(body, b"S" * 300)))
    (src / "b.ko").write_bytes(_signed(body, b"T" * 300))
    dest = tmp_path / "dest"
    assert _copy_module(src / "a.ko.xz", dest, "kernel/a.ko.xz") == "kernel/a.ko"
    assert _copy_module(src / "b.ko", dest, "kernel/b.ko") == "kernel/b.ko"
    assert (dest / "kernel/a.ko").read_bytes() == body
    assert (dest / "kernel/b.ko").read_bytes() == body
