"""The pack's V8 code cache, used by the real launcher with the pack's real node.

The guest tree is rebuilt from the real pack (initramfs + read-only disk) and
the launcher runs in it exactly as in a VM (same paths, uid 0, through
``unshare --root``), only natively. Node's compile-cache debug output says
whether V8 accepted each entry. A damaged, truncated or mismatching cache must
only cost speed: the launcher still loads pi and pi still answers.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from piwork.config import repo_root
from piwork.pack import codecache, ensure_pack, load_manifest
from piwork.pack.cpio import read_newc

BUNDLE_URL = (
    "file:///opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent/"
    "dist/core/piwork-bundle/entry.js"
)
NODE = "/opt/piwork/node/bin/node"
LAUNCHER = "/opt/piwork/launcher/launch.mjs"
EXTENSIONS = ("permission-gate", "ask-user")


@pytest.fixture(scope="module")
def guest_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guest's file tree: the pack's initramfs with its disk at /opt/piwork."""
    pack_dir = ensure_pack()
    manifest = load_manifest(pack_dir)
    assert manifest.rootfs is not None
    root = tmp_path_factory.mktemp("guest")
    with (pack_dir / manifest.initrd).open("rb") as fh:
        for m in read_newc(fh):
            dest = root / m.name
            kind = stat.S_IFMT(m.mode)
            if kind == stat.S_IFDIR:
                dest.mkdir(parents=True, exist_ok=True)
            elif kind == stat.S_IFLNK:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(m.data.decode())
            elif kind == stat.S_IFREG:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(m.data)
                dest.chmod(stat.S_IMODE(m.mode))
            # device nodes: not needed to run node
    subprocess.run(
        ["fsck.erofs", f"--extract={root / 'opt' / 'piwork'}", str(pack_dir / manifest.rootfs)],
        check=True,
        capture_output=True,
    )
    return root


@dataclass
class LauncherRun:
    loaded: dict[str, object]
    reply: dict[str, object]
    debug: str  # Node's compile-cache debug lines (stderr)


def _lines(sock: socket.socket, deadline: float) -> Iterator[str]:
    buf = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


def launch(
    root: Path,
    go: dict[str, object],
    stdin: bytes,
    *node_flags: str,
    timeout: float = 120,
    script: str | None = LAUNCHER,
) -> tuple[dict[str, object], str, str]:
    """The real launcher in the guest tree, started as the supervisor starts it, then
    told ``go``: its "loaded" message, pi's stdout and stderr. ``script=None``: node runs
    what ``node_flags`` say (``--snapshot-blob``), not launch.mjs itself."""
    ours, theirs = socket.socketpair()
    env = {
        "PATH": "/bin",
        "HOME": "/root",
        "NODE_DEBUG_NATIVE": "COMPILE_CACHE",
        # As the supervisor starts it: the extensions to load before "go".
        "PIWORK_WARM_EXTENSIONS": ":".join(f"/opt/piwork/extensions/{e}.ts" for e in EXTENSIONS),
    }
    cmd = ["unshare", "--user", "--map-root-user", f"--root={root}", "--wd=/tmp"]
    cmd += [NODE, *node_flags, *([script] if script else [])]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        # The control socket is the launcher's fd 3, as the supervisor gives it.
        # dup2 clears close-on-exec; every other descriptor of ours has it set.
        close_fds=False,
        preexec_fn=lambda: os.dup2(theirs.fileno(), 3),
    )
    theirs.close()
    try:
        first = next(_lines(ours, time.monotonic() + 120), None)
        if first is None:
            proc.kill()
            _out, err = proc.communicate(timeout=30)
            raise AssertionError(f"the launcher said nothing on fd 3: {err.decode()[-2000:]}")
        ours.sendall(json.dumps(go).encode() + b"\n")
        out, err = proc.communicate(stdin, timeout=timeout)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return json.loads(first), out.decode(), err.decode()


def run_launcher(root: Path, *node_flags: str) -> LauncherRun:
    """The real launcher in the guest tree: "loaded", then "go", then pi's get_state reply.
    ``node_flags`` come after the V8 flags the supervisor gives pi's node."""
    home = "/tmp/pi-home"
    go: dict[str, object] = {
        "op": "go",
        "argv": ["--mode", "rpc", "--offline", "--no-session", "--no-extensions"],
        "env": {"HOME": home, "PI_CODING_AGENT_DIR": f"{home}/agent", "PI_OFFLINE": "1"},
        "cwd": "/tmp",
    }
    stdin = b'{"type":"get_state","id":"cc"}\n'
    loaded, out, err = launch(root, go, stdin, *codecache.NODE_FLAGS, *node_flags)
    replies = [json.loads(ln) for ln in out.splitlines() if '"id":"cc"' in ln]
    assert replies, f"pi did not answer get_state; stderr: {err[-2000:]}"
    debug = "\n".join(ln for ln in err.splitlines() if "[compile cache]" in ln)
    return LauncherRun(loaded, replies[0], debug)


def entry_cache_file(root: Path, debug: str) -> Path:
    """The cache file Node read for pi's bundle (named by Node's key for its path)."""
    m = re.search(r"reading cache from \S+/([0-9a-f]{8}) for ESM " + re.escape(BUNDLE_URL), debug)
    assert m, debug[-2000:]
    return root / "opt" / "piwork" / codecache.CACHE_DIR / m.group(1)


def accepted(debug: str, url: str) -> bool:
    return f"{url} was accepted" in debug


def test_the_supervisor_starts_pi_with_the_flags_the_cache_was_built_with() -> None:
    """V8 flags are in the cache's tag: pi's node (supervisor.js) and the build must agree."""
    source = (repo_root() / "runtime-pack" / "supervisor" / "supervisor.js").read_text()
    m = re.search(r"^const NODE_FLAGS = (\[.*\]);$", source, re.MULTILINE)
    assert m, "supervisor.js has no NODE_FLAGS line"
    assert tuple(json.loads(m.group(1))) == codecache.NODE_FLAGS
    assert source.count("...NODE_FLAGS") == 2  # the launcher and the plain pi start
    assert set(codecache.NODE_FLAGS) <= set(codecache.BUILD_FLAGS)
    # and the launcher /init starts at boot (a shell script: the flags are spelled out)
    boot = (repo_root() / "runtime-pack" / "launcher" / "boot.sh").read_text()
    m = re.search(r'setsid "\$NODE" (.*?) "\$@"', boot)
    assert m, "boot.sh starts no launcher"
    assert tuple(m.group(1).split()) == codecache.NODE_FLAGS


def test_pack_holds_the_code_cache_and_the_guest_node_accepts_it(guest_tree: Path) -> None:
    manifest = load_manifest(ensure_pack())
    cache = guest_tree / "opt" / "piwork" / codecache.CACHE_DIR
    files = sorted(p for p in cache.iterdir() if p.is_file())
    assert len(files) == manifest.stats["code_cache_files"] > 0
    run = run_launcher(guest_tree)
    assert run.loaded["ev"] == "loaded" and run.loaded["codeCache"] == "on"
    assert run.reply["success"] is True
    assert accepted(run.debug, BUNDLE_URL), run.debug[-3000:]
    for ext in EXTENSIONS:
        assert accepted(run.debug, f"file:///opt/piwork/extensions/{ext}.mjs"), ext
    assert "rejected" not in run.debug
    # The bundle's entry is among the pack's files (not written by this run).
    assert entry_cache_file(guest_tree, run.debug) in files


def test_damaged_or_mismatching_cache_only_costs_speed(guest_tree: Path) -> None:
    intact = run_launcher(guest_tree)
    entry = entry_cache_file(guest_tree, intact.debug)
    cache = entry.parent
    originals = {p: p.read_bytes() for p in cache.iterdir() if p.is_file()}
    try:
        # Other flags than the build's: V8's own check refuses every entry.
        flags = run_launcher(guest_tree, "--stack-size=900")
        assert flags.reply["success"] is True and flags.loaded["codeCache"] == "on"
        assert f"{BUNDLE_URL} was rejected" in flags.debug, flags.debug[-3000:]
        assert not accepted(flags.debug, BUNDLE_URL)

        # Damaged bytes in every entry, and the bundle's entry truncated.
        for p, data in originals.items():
            bad = bytearray(data)
            for i in range(64, len(bad), 997):
                bad[i] ^= 0x5A
            p.write_bytes(bytes(bad))
        entry.write_bytes(originals[entry][: len(originals[entry]) // 2])
        damaged = run_launcher(guest_tree)
        assert damaged.reply["success"] is True and damaged.loaded["codeCache"] == "on"
        assert "was accepted" not in damaged.debug, damaged.debug[-3000:]

        # No cache at all (a pack built where user namespaces are off).
        for p in originals:
            p.unlink()
        cache.rmdir()
        none = run_launcher(guest_tree)
        assert none.reply["success"] is True and none.loaded["codeCache"] == "none"
    finally:
        cache.mkdir(exist_ok=True)
        for p, data in originals.items():
            p.write_bytes(data)
