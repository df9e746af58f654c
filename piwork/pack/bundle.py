"""Pre-link pi and precompile the extensions at pack build (cold start under TCG).

Under TCG the guest spends most of a cold start in Node: resolving and reading
~1,400 module files of pi's tree (~12 s) and transpiling the TypeScript
extensions through jiti (~7 s). The builder therefore runs esbuild (pinned in
``runtime-pack/pack-tools/package-lock.json``, installed with ``npm ci`` into
the build's scratch dir, never into the guest) through
``runtime-pack/pack-tools/compile.mjs``:

* pi + undici -> ``<pi>/dist/core/piwork-bundle/entry.js`` (+ lazy chunks);
  the launcher imports it when present, else pi's own ``dist/main.js``. Bundled
  modules that read ``import.meta.url`` get their own guest URL (pi finds the
  files beside its modules, e.g. the codemode worker, where they are);
* ``/opt/piwork/extensions/X.ts`` -> ``X.mjs`` beside it, one self-contained
  module each; the launcher hands them to pi as extension factories.

Both are then started once on the build host (when it can run the guest's
binaries, in a mount namespace where the staged tree is ``/opt/piwork``:
``piwork.pack.stage``), so a bundle that does not work fails the build, not a boot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from piwork.pack import stage
from piwork.pack.errors import PackError

TOOLS_DIR = Path("runtime-pack") / "pack-tools"
COMPILE_SCRIPT = "compile.mjs"
BUNDLE_REL = Path("dist") / "core" / "piwork-bundle"
BUNDLE_ENTRY = "entry.js"
NPM_CI_TOOLS = ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
TIMEOUT = 600.0


@dataclass(frozen=True)
class CompileResult:
    bundle_files: int
    bundle_bytes: int
    bundle_inputs: int
    extensions: list[Path]


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise PackError("node not found on PATH: the pack build runs esbuild with it (Node >= 20)")
    return node


def install_tools(source: Path, scratch: Path) -> Path:
    """``npm ci`` the pinned build tools into ``scratch``; return the dir holding compile.mjs."""
    src = source / TOOLS_DIR
    for name in ("package.json", "package-lock.json", COMPILE_SCRIPT):
        if not (src / name).is_file():
            raise PackError(f"{src / name} is missing: the pack build needs its pinned tools")
        scratch.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, scratch / name)
    env = dict(os.environ, npm_config_update_notifier="false")
    # Optional dependencies stay in: esbuild's binary is @esbuild/<platform>.
    proc = subprocess.run(
        NPM_CI_TOOLS, cwd=scratch, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise PackError(
            f"npm ci of the pack build tools ({src}) failed (exit {proc.returncode}):\n"
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return scratch


KEPT_EXTERNAL: frozenset[str] = frozenset({"@silvia-odwyer/photon-node"})
"""Packages the bundle must import from the pack's tree at run time, not inline.

photon-node (pi's image resizing, WebAssembly): its loader reads
``photon_rs_bg.wasm`` next to its ``__dirname``, which an ES module bundle does
not have, so inlined it failed at import and pi silently sent images
unresized. Left a run-time import, Node resolves it from the bundle's
directory in the pack's tree, where the package and its .wasm are
(tests/unit/test_pack_photon.py; tests/vm/test_vm_image_resize.py in a VM).

An earlier attempt was switched off after 3 failed runs of a VM test reading a
2400x100 PNG (a hang to 600 s, a failure after 122 s, and once V8's
``Check failed: it->second.Size() > offset``). The hang was that test's script:
it restarted at every user message, and pi hands a tool result's picture to an
``openai-completions`` model as a user message ("Attached image(s) from tool
result:"), so it asked for the picture again, forever (re-run: 50 resizes in
one pi, no failure, until the timeout). The V8 check is real: reading
4000x3000 pictures crashed pi with it (SIGILL), in V8's
``Runtime_WasmTriggerTierUp`` stack walk, i.e. Liftoff code asking to tier up
to TurboFan (at the second of ten such reads in one pi; twelve mixed reads in
another run did not crash). pi's node therefore runs
with ``--liftoff-only`` (``codecache.NODE_FLAGS``). Its cost under TCG: pi's
resize is synchronous, and while reading a 4000x3000 picture pi did not answer
the host's ``get_state`` within 60 s, which fails the run (so with
``--no-wasm-dynamic-tiering`` and ``--liftoff-only --wasm-lazy-compilation``;
busy or stuck was not told apart); a 2400x100 one takes seconds. Without
SSE4.1 (bare qemu64) photon itself failed; see ``piwork.vm.accel.TCG_CPU``."""


def external_patterns(dropped: frozenset[str]) -> list[str]:
    """Packages the pruned tree lacks stay run-time imports (they fail there, as before),
    and so do :data:`KEPT_EXTERNAL` (they are in the tree and load from it)."""
    return sorted(p for name in dropped | KEPT_EXTERNAL for p in (name, f"{name}/*"))


def compile_guest(
    tools: Path,
    pi_dir: Path,
    extensions_dir: Path,
    dropped: frozenset[str],
    stage_root: Path,
    snapshot_bundle: tuple[Path, str] | None = None,
) -> CompileResult:
    """Bundle pi under ``pi_dir`` and compile every ``extensions_dir/*.ts`` beside itself;
    ``stage_root`` is the build's copy of the guest's ``/`` (``pi_dir`` is under it).

    ``snapshot_bundle`` (output file, the guest's file URL of the bundle's entry.js): also
    the same bundle as one CommonJS file, for the launcher's snapshot
    (:mod:`piwork.pack.snapshot`)."""
    exts = sorted(extensions_dir.glob("*.ts")) if extensions_dir.is_dir() else []
    job: dict[str, object] = {
        "piDir": str(pi_dir),
        "bundleDir": str(pi_dir / BUNDLE_REL),
        "stageRoot": str(stage_root),
        "external": external_patterns(dropped),
        "extensions": [{"src": str(p), "out": str(p.with_suffix(".mjs"))} for p in exts],
    }
    if snapshot_bundle is not None:
        job["snapshotBundle"] = str(snapshot_bundle[0])
        job["snapshotImportMetaUrl"] = snapshot_bundle[1]
    job_file = tools / "job.json"
    job_file.write_text(json.dumps(job))
    try:
        proc = subprocess.run(
            [_node(), str(tools / COMPILE_SCRIPT), str(job_file)],
            cwd=tools,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError(f"esbuild did not finish within {TIMEOUT:.0f}s") from exc
    if proc.returncode != 0:
        raise PackError(
            "bundling pi / compiling the extensions with esbuild failed "
            f"(runtime-pack/pack-tools/{COMPILE_SCRIPT}):\n{proc.stderr.strip()[-3000:]}"
        )
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        bundle = out["bundle"]
        return CompileResult(
            bundle_files=int(bundle["files"]),
            bundle_bytes=int(bundle["bytes"]),
            bundle_inputs=int(bundle["inputs"]),
            extensions=[Path(e["out"]) for e in out["extensions"]],
        )
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PackError(f"{COMPILE_SCRIPT} printed no result: {proc.stdout[-500:]!r}") from exc


BUNDLE_EXPORTS = ("main", "configureHttpDispatcher", "install")
"""What the bundle's entry exports (compile.mjs): the launcher and the snapshot use them."""

SMOKE_SCRIPT = (
    f"const BUNDLE_EXPORTS = {list(BUNDLE_EXPORTS)!r};\n"
    + """
import { pathToFileURL } from "node:url";
const [entry, tsExt, ...exts] = process.argv.slice(1);
for (const e of exts) {
  const m = await import(pathToFileURL(e).href);
  if (typeof m.default !== "function") throw new Error(`${e}: no default export function`);
}
const m = await import(pathToFileURL(entry).href);
for (const k of BUNDLE_EXPORTS) {
  if (typeof m[k] !== "function") throw new Error(`bundle lacks ${k}`);
}
const ext = exts.map((e) => import(pathToFileURL(e).href).then((x) => x.default));
await m.main(["--mode", "rpc", "--offline", "--no-session", "--no-extensions", "-e", tsExt],
  { extensionFactories: await Promise.all(ext) });
"""
)
# A TypeScript extension that is not precompiled still loads through jiti
# (which the bundle loads lazily): it leaves a mark.
SMOKE_TS_EXTENSION = """import fs from "node:fs";
export default function smoke(pi: { on: unknown }): void {
  fs.writeFileSync(process.env.PIWORK_SMOKE_MARK as string, typeof pi.on);
}
"""


# Each package the bundle leaves to the tree, imported as the bundle's own code
# imports it: resolved from the bundle's directory, then evaluated (photon
# compiles and instantiates its WebAssembly at import).
EXTERNALS_SCRIPT = """
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
const [entry, ...names] = process.argv.slice(1);
const req = createRequire(entry);
for (const name of names) {
  const m = await import(pathToFileURL(req.resolve(name)).href);
  if (Object.keys(m).length === 0) throw new Error(`${name}: nothing exported`);
}
process.stdout.write("externals ok\\n");
"""


def check_externals(node_binary: Path, pi_dir: Path, env: dict[str, str], cwd: Path) -> None:
    """Import every :data:`KEPT_EXTERNAL` package from the bundle's directory with the
    guest's node: a package the tree lacks, or whose loader fails, fails the build
    instead of failing silently in a VM (pi swallows photon's import error)."""
    names = sorted(KEPT_EXTERNAL)
    if not names:
        return
    entry = pi_dir / BUNDLE_REL / BUNDLE_ENTRY
    cmd = [str(node_binary), "--input-type=module", "-e", EXTERNALS_SCRIPT, str(entry), *names]
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError(f"importing {', '.join(names)} did not finish within 120s") from exc
    if proc.returncode != 0 or "externals ok" not in proc.stdout:
        raise PackError(
            f"the bundle's run-time imports ({', '.join(names)}) do not load from the pack's "
            f"tree (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}"
        )


def smoke_test(
    node_binary: Path,
    pi_dir: Path,
    extensions: list[Path],
    env: dict[str, str],
    cwd: Path,
    stage_root: Path,
) -> str:
    """Run the bundle with the guest's node: ``get_state`` with every extension loaded;
    returns what was checked (for the build's log).

    Also loads a small TypeScript extension by path, the way pi loads any
    extension that was not precompiled (through jiti, which the bundle loads
    lazily from node_modules), and every package the bundle leaves to the tree.
    The bundle knows its modules by their guest paths, so pi runs where the staged
    tree is ``/opt/piwork`` (:mod:`piwork.pack.stage`); where that cannot be made,
    only the externals are checked.
    """
    check_externals(node_binary, pi_dir, env, cwd)
    prefix = stage.private_opt(stage_root, {}, pid=False)
    if prefix is None:
        return "externals load; pi itself not started (unshare not allowed here)"
    ts_ext = cwd / "smoke-extension.ts"
    ts_ext.write_text(SMOKE_TS_EXTENSION)
    mark = cwd / "smoke-extension.mark"
    env = {**env, "PIWORK_SMOKE_MARK": str(mark)}
    cmd = [
        *prefix,
        str(stage.inside(node_binary, stage_root)),
        "--input-type=module",
        "-e",
        SMOKE_SCRIPT,
        str(stage.inside(pi_dir / BUNDLE_REL / BUNDLE_ENTRY, stage_root)),
        str(ts_ext),
        *(str(stage.inside(e, stage_root)) for e in extensions),
    ]
    try:
        proc = subprocess.run(
            cmd,
            input='{"type":"get_state","id":"smoke"}\n',
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PackError("the bundled pi did not answer get_state within 120s") from exc
    if '"id":"smoke"' not in proc.stdout.replace(" ", "") or "Failed to load" in proc.stderr:
        raise PackError(
            f"the bundled pi failed its smoke test (exit {proc.returncode}):\n"
            f"stdout: {proc.stdout.strip()[-1000:]}\nstderr: {proc.stderr.strip()[-2000:]}"
        )
    if not mark.is_file() or mark.read_text() != "function":
        raise PackError(
            "the bundled pi did not load a TypeScript extension by path (jiti): "
            f"stderr: {proc.stderr.strip()[-2000:]}"
        )
    return "bundled pi answered get_state with the extensions loaded"
