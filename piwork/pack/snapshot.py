"""The launcher's V8 startup snapshot: pi's modules as they are once loaded.

Under TCG the guest's launcher spends most of a cold start importing pi: its
bundle's ~1,500 modules run their top-level code, seconds of emulated CPU. The
builder runs that import once on the build host, with the guest's own node and
environment, and saves the heap (``node --build-snapshot``): the guest's node
then restores it (``--snapshot-blob /opt/piwork/launcher/pi.blob``) instead.

The script is ``runtime-pack/launcher/snapshot-shim.cjs`` around pi's bundle as
one CommonJS file (``runtime-pack/pack-tools/compile.mjs``); the shim says what
cannot go into a snapshot and how it is put back. The build checks the shim's
report: pi must not have used a stand-in module or touched a file outside
``/opt/piwork`` while loading (what it read would not be the guest's). Then the
blob is started on the host exactly as boot.sh starts it, driven through the
launcher's control channel ("go"), and must answer ``get_state``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from piwork.pack import stage
from piwork.pack.bundle import BUNDLE_EXPORTS
from piwork.pack.codecache import NODE_FLAGS
from piwork.pack.errors import PackError

SHIM = Path("runtime-pack") / "launcher" / "snapshot-shim.cjs"
BUNDLE_MARK = "//@PIWORK_BUNDLE@"
DATA_MARK = "/*@PIWORK_LAZY_DATA@*/ {}"
URL_MARK = '/*@PIWORK_BUNDLE_URL@*/ ""'
GUEST_ROOT = stage.GUEST_ROOT
BLOB_NAME = "pi.blob"
"""In the guest: /opt/piwork/launcher/pi.blob (boot.sh, supervisor.js)."""
STAND_INS = tuple(
    f"{prefix}{name}"
    for name in ("http", "https", "http2", "worker_threads")
    for prefix in ("", "node:")
)
"""Built-in modules that must not be loaded into the snapshot: http, https and http2 hold
native bindings V8 cannot serialize (HTTPParser, nghttp2); worker_threads, once loaded
there, makes every Worker the restored process starts abort at its start (Node 22 and 24:
``Assertion failed: shutdown_wrap_template_.IsEmpty()``), which took pi's image resizing
and codemode with it."""
GUEST_ENV = {"PATH": "/bin:/sbin:/usr/bin:/usr/sbin", "HOME": "/root", "TERM": "linux"}
"""The launcher's environment in the guest (vm-image/init, boot.sh), where it matters to
what pi reads at load: its agent dir (HOME), PATH, TERM."""
TIMEOUT = 300.0

# The stand-ins' own property names, and the members that are plain data
# (http.STATUS_CODES, http2.constants): the shim gives those out while pi loads.
LAZY_DATA_SCRIPT = """
const plain = (v, d = 0) => v === null || ["string", "number", "boolean"].includes(typeof v) ||
  (d < 2 && typeof v === "object" && (Array.isArray(v) ||
    [Object.prototype, null].includes(Object.getPrototypeOf(v))) &&
    Object.values(v).every((x) => plain(x, d + 1)));
const out = {};
for (const id of process.argv.slice(1)) {
  const m = require(id);
  const keys = Object.getOwnPropertyNames(m);
  const data = {};
  for (const k of keys) { const v = m[k]; if (plain(v)) data[k] = v; }
  out[id] = { keys, data };
}
process.stdout.write(JSON.stringify(out));
"""


@dataclass(frozen=True)
class SnapshotResult:
    blob: Path
    bytes: int
    seconds: float
    stdio_at_load: int
    """Lines pi wrote to stdout/stderr while loading (they went nowhere)."""


def _run(cmd: list[str], *, env: dict[str, str], cwd: Path, what: str) -> str:
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError(f"{what} did not finish within {TIMEOUT:.0f}s") from exc
    if proc.returncode != 0:
        raise PackError(
            f"{what} failed (exit {proc.returncode}; {' '.join(cmd[:4])} ...):\n"
            f"{proc.stderr.strip()[-3000:]}"
        )
    return proc.stdout


def lazy_data(node_binary: Path, cwd: Path, emu: dict[str, str] | None = None) -> dict[str, object]:
    out = _run(
        [str(node_binary), "-e", LAZY_DATA_SCRIPT, *STAND_INS],
        env={**GUEST_ENV, **(emu or {})},
        cwd=cwd,
        what="reading the stand-in modules' members",
    )
    data: dict[str, object] = json.loads(out)
    return data


def compose(shim_text: str, bundle_text: str, data: dict[str, object], bundle_url: str) -> str:
    """The snapshot's script: the shim's two parts around the bundle; ``bundle_url`` is the
    ES bundle's entry.js in the guest (what the bundle's own requires resolve from)."""
    if any(shim_text.count(m) != 1 for m in (BUNDLE_MARK, DATA_MARK, URL_MARK)):
        raise PackError(f"{SHIM} lacks one of its marks ({BUNDLE_MARK}, {DATA_MARK}, {URL_MARK})")
    head, tail = shim_text.split(BUNDLE_MARK)
    head = head.replace(DATA_MARK, json.dumps(data, separators=(",", ":")))
    head = head.replace(URL_MARK, json.dumps(bundle_url))
    return f"{head}{bundle_text}\n{tail}"


def check_report(report: dict[str, list[str]]) -> int:
    """What pi did with the stand-ins while loading: only stdout/stderr writes, reads of
    its own files and calls the shim replays once live are fine. Returns the number of
    stdout/stderr lines."""
    at_load = [str(x) for x in report.get("atLoad", [])]
    bad = [
        x
        for x in at_load
        if not x.startswith(("stdout: ", "stderr: ", "replay "))
        and not (x.startswith("fs.") and x.split(" ", 1)[1].startswith("/opt/piwork/"))
    ]
    if bad:
        raise PackError(
            "pi's load cannot go into a snapshot as it is: while loading it used "
            + "; ".join(bad[:10])
            + f". Add the module to STAND_INS or a shim to {SHIM} (its header says how)."
        )
    exports = report.get("exports", [])
    for name in BUNDLE_EXPORTS:
        if name not in exports:
            raise PackError(f"the snapshot's bundle does not export {name}")
    return sum(1 for x in at_load if x.startswith(("stdout: ", "stderr: ")))


BUILD_DIR = Path("/opt/piwork-snapshot")
"""Where the build's script and blob are, in the build's own mount namespace."""


def build(
    node_binary: Path,
    shim: Path,
    bundle_cjs: Path,
    bundle_url: str,
    stage_root: Path,
    out_blob: Path,
    work: Path,
    emu: dict[str, str] | None = None,
) -> SnapshotResult:
    """Snapshot pi loaded from ``bundle_cjs`` into ``out_blob``; ``stage_root`` holds the
    guest's tree (its ``opt/piwork``); ``bundle_url``: see :func:`compose`; ``emu``: the
    environment another architecture's node needs on this host (build._emulation_env).

    Where it may (``unshare``), the build runs in its own mount and PID namespaces with
    the stage at /opt/piwork and its files at :data:`BUILD_DIR`: the paths and the pid
    in the heap are then the same on every build, and the blob differs only in node's own
    start-up timings (3 bytes and a checksum). Elsewhere pi's reads of /opt/piwork/...
    go to the stage (the shim) and the build's paths end up in the blob too."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "snapshot-entry.cjs"
    script.write_text(
        compose(
            shim.read_text(), bundle_cjs.read_text(), lazy_data(node_binary, work, emu), bundle_url
        )
    )
    blob = work / BLOB_NAME
    blob.unlink(missing_ok=True)
    prefix = stage.private_opt(stage_root, {BUILD_DIR: work}, pid=True)
    if prefix is not None:
        # Outside /opt the host's files are where they are (a test's node, say).
        where, node, redirect = BUILD_DIR, stage.inside(node_binary, stage_root), {}
    else:
        prefix, where, node = [], work, node_binary
        redirect = {"PIWORK_SNAPSHOT_ROOT": str(stage_root)}
    env = {
        **GUEST_ENV,
        **(emu or {}),
        **redirect,
        "PIWORK_SNAPSHOT_REPORT": str(where / "snapshot-report.json"),
    }
    t0 = time.monotonic()
    _run(
        [
            *prefix,
            str(node),
            *NODE_FLAGS,
            "--predictable",
            "--random-seed=1",
            "--hash-seed=1",
            "--snapshot-blob",
            str(where / BLOB_NAME),
            "--build-snapshot",
            str(where / script.name),
        ],
        env=env,
        cwd=Path("/"),
        what="building pi's V8 startup snapshot (node --build-snapshot)",
    )
    seconds = time.monotonic() - t0
    if not blob.is_file():
        raise PackError(f"node --build-snapshot wrote no {blob}")
    stdio = check_report(json.loads((work / "snapshot-report.json").read_text()))
    out_blob.parent.mkdir(parents=True, exist_ok=True)
    blob.replace(out_blob)
    return SnapshotResult(out_blob, out_blob.stat().st_size, seconds, stdio)


def smoke_test(
    node_binary: Path, blob: Path, stage_root: Path, env: dict[str, str], cwd: Path
) -> dict[str, object]:
    """Start the blob as boot.sh does, tell the launcher "go" (pi in RPC mode, offline),
    and ask ``get_state``; returns the launcher's "loaded" line.

    pi in the snapshot knows its files by their guest paths, so this runs in a private
    mount namespace (``unshare``) where ``stage_root``'s opt/piwork is /opt/piwork. Where
    that is not allowed, only the restore and the launcher's start are checked."""
    staged = stage_root / GUEST_ROOT
    namespace = stage.private_opt(stage_root, {}, pid=False)
    if namespace is not None:
        prefix = [*namespace[:-1], namespace[-1].replace('"$@"', '"$@" 3<&{fd} {fd}<&-')]
        node_path, blob_path = stage.inside(node_binary, stage_root), stage.inside(blob, stage_root)
        extra_env: dict[str, str] = {}
    else:
        prefix = ["bash", "-c", 'exec "$0" "$@" 3<&{fd} {fd}<&-']
        node_path, blob_path = node_binary, blob
        extra_env = {"PIWORK_LAUNCHER_SCRIPT": str(staged / "launcher" / "launch.mjs")}
    ours, theirs = socket.socketpair()
    fd = theirs.fileno()
    # The control channel on fd 3, as the supervisor gives it (a socket, both ways);
    # bash, as dash cannot name a descriptor above 9.
    cmd = [
        *prefix[:-1],
        prefix[-1].format(fd=fd),
        str(node_path),
        *NODE_FLAGS,
        "--snapshot-blob",
        str(blob_path),
    ]
    with ours:
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**env, **extra_env},
                cwd=cwd,
                pass_fds=(fd,),
            )
        finally:
            theirs.close()
        try:
            ours.settimeout(TIMEOUT)
            loaded: dict[str, object] = json.loads(_read_line(ours))
            if loaded.get("ev") != "loaded" or loaded.get("snapshot") is None:
                raise PackError(f"the snapshot's launcher said {loaded!r}, not loaded (snapshot)")
            if namespace is None:
                proc.kill()
                proc.communicate()
                loaded["smoke"] = "restored only (unshare not allowed here)"
                return loaded
            go = {
                "op": "go",
                "argv": ["--mode", "rpc", "--offline", "--no-session"],
                "env": env,
                "cwd": str(cwd),
            }
            ours.sendall((json.dumps(go) + "\n").encode())
            out, err = proc.communicate(b'{"type":"get_state","id":"smoke"}\n', TIMEOUT)
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            proc.kill()
            out, err = proc.communicate()
            raise PackError(
                f"pi from the snapshot did not start ({exc}):\n{err.decode()[-2000:]}"
            ) from exc
    if b'"id":"smoke"' not in out.replace(b" ", b""):
        raise PackError(
            f"pi from the snapshot did not answer get_state (exit {proc.returncode}):\n"
            f"stdout: {out.decode()[-1000:]}\nstderr: {err.decode()[-2000:]}"
        )
    loaded["smoke"] = "get_state answered"
    return loaded


def _read_line(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ValueError(f"the launcher closed its control channel after {buf!r}")
        buf += chunk
    return buf.decode().splitlines()[0]
