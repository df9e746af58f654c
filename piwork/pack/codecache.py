"""V8 code cache for the guest's JavaScript, made at pack build (cold start under TCG).

Under TCG the guest spends seconds parsing and compiling pi's bundle. Node 22's
compile cache (``module.enableCompileCache``) stores V8's code cache per
module; the builder fills it once, on the build host, with the pack's own node
binary, and ships it read-only in ``root.erofs`` at ``/opt/piwork/node-cache``:

* the run happens inside the guest tree (``unshare --user --map-root-user
  --root=<tree>``, no real root needed) because Node keys each entry on the
  module's absolute path, which must be the guest's; uid 0 as in the guest;
* it imports what the launcher imports and every lazy chunk of pi's bundle
  (``runtime-pack/pack-tools/code-cache.mjs``). Node serializes an entry right
  after V8 compiles the module, so running pi would add nothing to it;
* the bytes are the same on every build from the same inputs (``BUILD_FLAGS``).
  ``--random-seed=1`` fixes the seed V8 hashes strings with. ``--predictable``
  keeps V8's garbage collector on the main thread: V8 copies a few bytes it
  never initializes into an entry (the 4-byte header padding of every
  BytecodeArray); on fresh heap pages they are zero, after a full GC they are
  whatever the reused memory held, and with concurrent sweeper threads which
  memory that is changed from run to run (pi 1.6's chunks, run one after the
  other, need a full GC before the last ones are compiled: 4 to 10 of 73 entries
  differed between two builds). V8 leaves both flags, and what
  ``--predictable`` implies, out of the flag hash it checks (V8's
  ``ComputeFlagListHash``, "to allow predictable code caching"), so the
  guest's node, started without them, accepts the entries;
* Node names its cache directory after V8's version, flags *and CPU features*
  (``CachedDataVersionTag``), which differ between the host and a TCG guest, so
  the entries are stored flat in ``node-cache/`` and the launcher links the
  directory name its own node asks for to that folder (launcher/launch.mjs).
  V8's own check of an entry (version, flags, source length, read-only snapshot
  checksum) has no CPU features in it; Node checks each file's size and CRC.

Anything that does not match (another node, other flags, a damaged file) is a
cache miss: V8 compiles from source as before. Nothing a VM does can reach the
cache: it is on the read-only disk, covered by the manifest's hashes, and the
guest's writes at exit fail (EROFS) or land in the VM's own tmpfs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from piwork.pack.errors import PackError

CACHE_DIR = "node-cache"  # under /opt/piwork
SCRIPT = Path("runtime-pack") / "pack-tools" / "code-cache.mjs"
NODE_FLAGS = ("--liftoff-only",)
"""The V8 flags pi's node runs with (``NODE_FLAGS`` in runtime-pack/supervisor/supervisor.js).
V8 puts flags in the code cache's tag, so the cache is built with the same ones.
``--liftoff-only``: no WebAssembly tier-up; under TCG, Liftoff code asking to tier
up (photon, pi's image resizing) crashed pi in V8's ``Runtime_WasmTriggerTierUp``
stack walk (``Check failed: it->second.Size() > offset``)."""
BUILD_FLAGS = ("--random-seed=1", "--predictable", *NODE_FLAGS)
"""The build's flags: the guest's, and two that make the bytes reproducible and that V8
leaves out of the flag hash (see above)."""
TIMEOUT = 180.0
SCRATCH = "tmp/piwork-code-cache"  # inside the tree; removed afterwards


@dataclass(frozen=True)
class CodeCacheResult:
    files: int
    bytes: int


def unavailable_reason() -> str | None:
    """Why this host cannot build the cache (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not found"
    try:
        proc = subprocess.run(
            ["unshare", "--user", "--map-root-user", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare failed: {exc}"
    if proc.returncode != 0:
        return f"no user namespaces here ({proc.stderr.strip()[:200]})"
    return None


def build(
    source: Path,
    tree: Path,
    *,
    guest_root: str,
    guest_node: str,
    bundle_dir: str,
    extensions_dir: str,
    emu: dict[str, str] | None = None,
) -> CodeCacheResult:
    """Fill ``<tree>/<guest_root>/node-cache`` by running the guest's node in ``tree``.

    Guest paths are given without the leading '/'; ``tree`` is the whole guest
    root (it has /lib with the C libraries the node binary needs); ``emu``: what
    another architecture's node needs in its environment here (build._emulation_env).
    """
    script = (source / SCRIPT).read_text()
    out = tree / guest_root / CACHE_DIR
    shutil.rmtree(out, ignore_errors=True)
    scratch = tree / SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    home = f"/{SCRATCH}"
    # pi does not run, but its modules' top level may look at these.
    env = {
        "HOME": home,
        "PATH": "/bin:/usr/bin",
        "PI_CODING_AGENT_DIR": f"{home}/agent",
        "PI_OFFLINE": "1",
        "PI_TELEMETRY": "0",
        **(emu or {}),
    }
    cmd = [
        "unshare",
        "--user",
        "--map-root-user",
        f"--root={tree}",
        f"--wd={home}",
        f"/{guest_node}",
        *BUILD_FLAGS,
        "--input-type=module",
        "-e",
        script,
        f"/{guest_root}/{CACHE_DIR}",
        f"/{bundle_dir}",
        f"/{extensions_dir}",
    ]
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError(f"filling the V8 code cache did not finish within {TIMEOUT:.0f}s") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        raise PackError(
            f"filling the V8 code cache failed ({SCRIPT}, exit {proc.returncode}):\n"
            f"stdout: {proc.stdout.strip()[-800:]}\nstderr: {proc.stderr.strip()[-2000:]}"
        )
    try:
        tagged = Path(json.loads(lines[-1])["dir"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PackError(f"{SCRIPT} did not say where the cache went: {lines[-1:]!r}") from exc
    # <cache>/<node version>-<arch>-<V8 tag>-<uid>/<entry> -> <cache>/<entry>
    inner = tree / tagged.relative_to("/")
    if inner.parent != out or not inner.is_dir():
        raise PackError(f"the code cache is not where it should be: {tagged}")
    entries = sorted(p for p in inner.iterdir() if p.is_file())
    for p in entries:
        os.rename(p, out / p.name)
    shutil.rmtree(inner)
    if not entries:
        raise PackError("filling the V8 code cache wrote no entries")
    return CodeCacheResult(
        files=len(entries), bytes=sum((out / p.name).stat().st_size for p in entries)
    )
