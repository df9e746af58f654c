"""The pack's V8 code cache, used by the real launcher with the pack's real node.

The guest tree is rebuilt from the real pack (initramfs + read-only disk) and
the launcher runs in it exactly as in a VM (same paths, uid 0, through
``unshare --root``), only natively. Node's compile-cache debug output says
whether V8 accepted each entry. A damaged, truncated or mismatching cache must
only cost speed: the launcher still loads pi and pi still answers.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from piwork.config import repo_root
from piwork.pack import codecache, ensure_pack, load_manifest, node
from tests.helpers.pack import EXTENSIONS, launch

BUNDLE_URL = (
    "file:///opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent/"
    "dist/core/piwork-bundle/entry.js"
)


@dataclass
class LauncherRun:
    loaded: dict[str, object]
    reply: dict[str, object]
    debug: str  # Node's compile-cache debug lines (stderr)


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


def test_the_build_flags_leave_the_cache_tag_the_guest_node_checks() -> None:
    """V8 checks its flag hash on every entry: what the build adds to the guest's flags
    (for reproducible bytes) must be left out of it, or the guest refuses every entry."""
    pinned = repo_root() / node.PI_SOURCE / "node_modules" / node.NODE_PACKAGE / "bin" / "node"

    def tag(*flags: str) -> str:
        js = "require('v8').cachedDataVersionTag()"
        proc = subprocess.run(
            [str(pinned), *flags, "-p", js], capture_output=True, text=True, timeout=60, check=True
        )
        return proc.stdout.strip()

    assert set(codecache.BUILD_FLAGS) > set(codecache.NODE_FLAGS)
    assert tag(*codecache.BUILD_FLAGS) == tag(*codecache.NODE_FLAGS)
    assert tag(*codecache.NODE_FLAGS, "--stack-size=900") != tag(*codecache.NODE_FLAGS)


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
