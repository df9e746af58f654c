// piwork pi launcher: load pi before the task is known, start it when it is.
//
// The supervisor spawns this process as soon as the guest is up, with pi's
// stdin/stdout/stderr as usual and a control socket on fd 3. It imports pi's
// modules (the slow part of pi's start under TCG: ~10 s), warms jiti's cache
// for the extensions the host asks for, says {"ev":"loaded"} on fd 3, and
// waits. The host can save the VM in that state (a template) and restore it
// for any task: nothing task-specific is loaded yet. On {"op":"go", argv,
// env, cwd} it applies the task's environment and working directory and runs
// pi's own `main(argv)` exactly as pi's cli.js (its setupCli) does.
//
// Fast path (made by the pack builder, runtime-pack/pack-tools/compile.mjs):
// pi and its dependencies pre-linked into one bundle
// (dist/core/piwork-bundle/entry.js), and each TypeScript extension
// precompiled next to its source (X.ts -> X.mjs). A precompiled extension is
// imported here and handed to pi as an extension factory (pi's
// main(argv, {extensionFactories})) in place of its `-e X.ts` argument, so
// pi never starts jiti. Anything not precompiled takes the old path.
//
// Primed (a saved VM): the host may instead send {"op":"prime"} while making
// the saved VM: pi's main() then runs with no task (see prime() below), and a
// restored VM is bound to its task with {"op":"bind", argv, env}, then {"op":"cwd"}, plus RPC
// switch_session: a restored VM skips main(), which TCG would otherwise
// translate again on every restore.
//
// V8 startup snapshot (made by the pack builder, piwork/pack/snapshot.py): when
// /init or the supervisor starts node with --snapshot-blob pi.blob, the heap
// is restored with pi's modules already loaded (runtime-pack/launcher/
// snapshot-shim.cjs), which then imports this file: pi is taken from there.
//
// V8 code cache (made by the pack builder, piwork/pack/codecache.py): Node's
// compile cache entries for the bundle and the extensions, on the read-only
// disk at /opt/piwork/node-cache. Node looks for them in a directory named
// after V8's version, flags and this CPU's features, which the builder could
// not know: so the cache is enabled on a fresh directory in /tmp and the
// directory Node asks for is made a link to the pack's entries. An entry that
// does not match (other node, other flags, damaged) is a miss: V8 compiles
// from source. Node's writes at exit fail on the read-only disk.
import fs from "node:fs";
import module from "node:module";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import v8 from "node:v8";
import vm from "node:vm";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import * as agentStats from "./agent-stats.mjs";

// pi's package in the pack (piwork/pack/node.py PI_PACKAGE, checked by a test).
const PI_DIR =
  process.env.PIWORK_PI_DIR || "/opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent";
const t0 = performance.now();

// The control channel: fd 3 both ways (a socket pair, when the supervisor
// spawns this process), or fd 3 in and fd 4 out (two FIFOs, when /init started
// it at boot: runtime-pack/launcher/boot.sh).
const CTL_FIFOS = process.env.PIWORK_LAUNCHER_CTL === "fifo";
delete process.env.PIWORK_LAUNCHER_CTL;
delete process.env.PIWORK_LAUNCHER_SCRIPT; // snapshot-shim.cjs's: where this file is
const ctl = new net.Socket({ fd: 3, readable: true, writable: !CTL_FIFOS });
const ctlOut = CTL_FIFOS ? new net.Socket({ fd: 4, readable: false, writable: true }) : ctl;
const say = (obj) => ctlOut.write(`${JSON.stringify(obj)}\n`);

const CODE_CACHE = process.env.PIWORK_CODE_CACHE || "/opt/piwork/node-cache";

/** Point Node's compile cache at the pack's entries; returns what happened (for the log). */
function useCodeCache() {
  if (typeof module.enableCompileCache !== "function") return "unsupported";
  if (!fs.existsSync(CODE_CACHE)) return "none";
  try {
    const base = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-code-cache-"));
    const r = module.enableCompileCache(base);
    if (r.status !== module.constants.compileCacheStatus.ENABLED) return `off: ${r.message || r.status}`;
    const dir = module.getCompileCacheDir(); // <base>/<node>-<arch>-<V8 tag>-<uid>, just made, empty
    fs.rmdirSync(dir);
    fs.symlinkSync(CODE_CACHE, dir);
    return "on";
  } catch (err) {
    return `off: ${err.message}`; // at worst every module misses the cache
  }
}
const codeCache = useCodeCache();

const BUNDLE_DIR = `${PI_DIR}/dist/core/piwork-bundle`;
const BUNDLE = `${BUNDLE_DIR}/entry.js`;
// Started from the pack's V8 startup snapshot (snapshot-shim.cjs), pi is loaded already.
const SNAPSHOT = globalThis.__piworkSnapshot;
delete globalThis.__piworkSnapshot;
const [{ main }, { configureHttpDispatcher }] = SNAPSHOT
  ? [SNAPSHOT, SNAPSHOT]
  : fs.existsSync(BUNDLE)
  ? await import(pathToFileURL(BUNDLE).href).then((m) => [m, m])
  : await Promise.all([
      import(pathToFileURL(`${PI_DIR}/dist/main.js`).href),
      import(pathToFileURL(`${PI_DIR}/dist/core/http-dispatcher.js`).href),
    ]);
if (SNAPSHOT) {
  // The snapshot's CommonJS copy of the bundle has no import.meta.resolve: pi's
  // (extension loader's) calls go to one from the ES bundle's directory (compile.mjs).
  const resolver = `${BUNDLE_DIR}/resolve.mjs`;
  if (fs.existsSync(resolver)) {
    globalThis.__piworkImportMetaResolve = (await import(pathToFileURL(resolver).href)).default;
  }
}

/** X.ts -> X.mjs beside it, if the pack builder made one. */
function compiledPath(p) {
  return p.endsWith(".ts") ? `${p.slice(0, -3)}.mjs` : null;
}

// Extension source path -> factory, for the extensions precompiled by the pack.
const factories = new Map();
async function loadCompiled(paths) {
  const rest = [];
  for (const p of paths) {
    const js = compiledPath(p);
    if (!js || !fs.existsSync(js)) {
      rest.push(p);
      continue;
    }
    try {
      const mod = await import(pathToFileURL(js).href);
      if (typeof mod.default !== "function") throw new Error("no default export function");
      factories.set(p, mod.default);
    } catch (err) {
      process.stderr.write(`piwork-launcher: ${js}: ${err.message}; pi loads ${p} itself\n`);
      rest.push(p);
    }
  }
  return rest;
}

/**
 * argv without the `-e`/`--extension` pairs we hold factories for, [path,
 * factory] for those, and the `-e` paths left in argv (no factory: pi's own loader).
 */
function takeExtensions(argv, have) {
  const out = [];
  const picked = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if ((a === "-e" || a === "--extension") && i + 1 < argv.length && have.has(argv[i + 1])) {
      picked.push([argv[i + 1], have.get(argv[i + 1])]);
      i++;
      continue;
    }
    out.push(a);
  }
  const loose = out.filter((a, i) => i > 0 && (out[i - 1] === "-e" || out[i - 1] === "--extension"));
  return { argv: out, picked, loose };
}

// Extensions are loaded by pi through jiti ("jiti/static", file cache in
// /tmp). Importing them once here loads jiti and babel and fills that cache,
// so pi's own load after "go" is a cache hit. Their imports of pi's packages
// need pi's aliases and may fail here: the cache entry is written before that.
async function warmExtensions(paths) {
  if (!paths.length) return;
  let createJiti;
  try {
    ({ createJiti } = await import(pathToFileURL(`${PI_DIR}/../../jiti/lib/jiti-static.mjs`).href));
  } catch {
    return; /* pi loads the extensions itself, just slower */
  }
  // The aliases pi's loader gives jiti for what extensions may import at run
  // time (see getAliases in pi's dist/core/extensions/loader.js), resolved the
  // same way, so the files jiti compiles here are the ones pi compiles later.
  const loader = `${PI_DIR}/dist/core/extensions/loader.js`;
  const alias = { "@earendil-works/pi-coding-agent": `${PI_DIR}/dist/index.js` };
  alias["@mariozechner/pi-coding-agent"] = alias["@earendil-works/pi-coding-agent"];
  try {
    const r = createRequire(loader);
    for (const [name, spec] of [
      ["typebox", "typebox"],
      ["typebox/compile", "typebox/compile"],
      ["typebox/value", "typebox/value"],
    ]) {
      alias[name] = r.resolve(spec);
      alias[`@sinclair/${name}`] = alias[name];
    }
  } catch {
    /* without them only the extension files themselves are cached */
  }
  const jiti = createJiti(pathToFileURL(loader).href, { moduleCache: false, alias });
  for (const p of paths) {
    try {
      await jiti.import(p, { default: true });
    } catch {
      /* see above */
    }
  }
}
const warm = (process.env.PIWORK_WARM_EXTENSIONS || "").split(":").filter(Boolean);
await warmExtensions(await loadCompiled(warm));
// ms: loading pi; node: node's own start before this module ran
say({
  ev: "loaded",
  ms: Math.round(performance.now() - t0),
  node: Math.round(t0),
  codeCache,
  snapshot: SNAPSHOT ? Math.round(SNAPSHOT.restoredMs) : null,
});

function applyEnv(env) {
  // In place: native code (os.homedir, child processes) reads the real environ.
  for (const k of Object.keys(process.env)) if (!(k in env)) delete process.env[k];
  for (const [k, v] of Object.entries(env)) process.env[k] = String(v);
}

/**
 * PIWORK_CPU_PROFILE=FILE in the environment a task brings (go or bind): a V8 CPU
 * profile of pi's next PIWORK_CPU_PROFILE_MS milliseconds (default 30000) is written to
 * FILE, for finding what a cold start's main() or a warm start's session switch spends
 * in the guest. Nothing happens without it.
 */
function maybeProfile() {
  const out = process.env.PIWORK_CPU_PROFILE;
  if (!out) return;
  const ms = Number(process.env.PIWORK_CPU_PROFILE_MS) || 30000;
  const session = new (process.getBuiltinModule("node:inspector").Session)();
  session.connect();
  session.post("Profiler.enable");
  session.post("Profiler.setSamplingInterval", { interval: 1000 });
  session.post("Profiler.start");
  setTimeout(() => {
    session.post("Profiler.stop", (err, res) => {
      if (!err) fs.writeFileSync(out, JSON.stringify(res.profile));
      session.disconnect();
    });
  }, ms).unref();
}

/** Apply a task's (or the prime's) environment and working directory, then run pi's main. */
function runMain(msg, factoryFor = (_p, f) => f) {
  applyEnv(msg.env || {});
  if (msg.cwd) {
    fs.mkdirSync(msg.cwd, { recursive: true });
    process.chdir(msg.cwd);
  }
  // "go" comes once the task's folders are mounted (the prime's agent dir is the
  // VM's own): pi's polled agent-dir files are stat()ed once per change (agent-stats.mjs).
  agentStats.arm(process.env.PI_CODING_AGENT_DIR);
  // What pi's cli.js does before main() (its setupCli); main() configures its
  // HTTP dispatcher (the proxy the environment names) itself.
  process.title = "pi";
  process.env.PI_CODING_AGENT = "true";
  process.env.AI_AGENT = "pi";
  process.emitWarning = () => {};
  maybeProfile();
  const { argv, picked } = takeExtensions((msg.argv || []).map(String), factories);
  const extensionFactories = picked.map(([p, f]) => factoryFor(p, f));
  main(argv, extensionFactories.length ? { extensionFactories } : undefined);
}

// A primed pi's extensions: pi calls each factory again whenever it builds a
// session (switch_session), and a slot calls its extension only if the bound
// task asked for it (-e), so one saved VM serves tasks with any subset.
const active = new Set();

/**
 * "prime" (a saved VM being made): run pi's main() now, with no task in it,
 * so a restored VM skips it. Its agent dir (PI_CODING_AGENT_DIR, the path the
 * task's own will be mounted on) gets the files the host sent: a models.json
 * naming one model nobody serves, so pi starts. Plain names only. Every
 * extension must be precompiled (a slot): pi would load any other for every
 * task, asked for or not.
 */
function prime(msg) {
  const { picked, loose } = takeExtensions((msg.argv || []).map(String), factories);
  if (loose.length) throw new Error(`extensions not precompiled: ${loose.join(", ")}`);
  const dir = msg.env && msg.env.PI_CODING_AGENT_DIR;
  if (dir) {
    fs.mkdirSync(dir, { recursive: true });
    for (const [name, text] of Object.entries(msg.files || {})) {
      if (!/^[A-Za-z0-9._-]+$/.test(name) || name.startsWith(".")) throw new Error(`bad file name ${name}`);
      fs.writeFileSync(path.join(dir, name), String(text));
    }
  }
  for (const [p] of picked) active.add(p); // their code runs once here, for the saved VM
  runMain(msg, (p, f) => (api) => (active.has(p) ? f(api) : undefined));
}

/**
 * "bind" (a restored VM, while the task's folders are mounted): the task's
 * environment replaces the prime's; its working directory follows ("cwd"). The host then
 * switches pi to the task's session (RPC switch_session), which makes pi
 * build its session, settings, models, resources and extensions again from
 * the task's agent dir, cwd and environment; and sets the task's model. The
 * bind's argv says which extensions the task has (a subset of the prime's).
 */
function bind(msg) {
  const { picked, loose } = takeExtensions((msg.argv || []).map(String), factories);
  if (loose.length) throw new Error(`extensions the saved VM was not primed with: ${loose.join(", ")}`);
  active.clear();
  for (const [p] of picked) active.add(p);
  // What was kept of the prime's agent dir is not the task's, which is mounted over it next.
  agentStats.disarm();
  applyEnv(msg.env || {});
  process.env.PI_CODING_AGENT = "true";
  process.env.AI_AGENT = "pi";
  // pi's HTTP goes through the proxy the task's environment names, as main() set it up.
  configureHttpDispatcher();
  maybeProfile();
}

/**
 * "cwd" (after "bind": the supervisor sends the env while it mounts the task's
 * folders, then this): the working directory, which must be entered only once
 * its folder is mounted.
 */
function enter(msg) {
  process.chdir(String(msg.cwd));
  agentStats.arm(process.env.PI_CODING_AGENT_DIR); // mounted now, before the session switch
}

/**
 * "settle" (a primed pi, just before the VM is saved): a full garbage
 * collection, so the saved heap is compact and its young generation empty.
 * A restored VM's first collection is costly (every page it touches comes
 * from the saved RAM file, under TCG), and the task's switch_session
 * allocates a few MB: from an empty young generation it seldom needs one.
 */
function settle() {
  v8.setFlagsFromString("--expose-gc");
  vm.runInNewContext("gc")();
  say({ ev: "settled" });
}

// One control line at a time: "go" (run pi for a task now), or "prime" then,
// in the restored VM, "bind" and "cwd". After "go" or "cwd" the socket is closed.
let buf = "";
let state = "loaded"; // -> "running" (go) | "primed" (prime) -> "binding" (bind) -> "running" (cwd)
const ops = {
  loaded: { go: runMain, prime },
  primed: { bind, settle },
  binding: { cwd: enter },
};
ctl.on("data", (chunk) => {
  buf += chunk.toString("utf8");
  let nl;
  while ((nl = buf.indexOf("\n")) !== -1 && state !== "running") {
    const msg = JSON.parse(buf.slice(0, nl));
    buf = buf.slice(nl + 1);
    const op = ops[state][msg.op];
    if (!op) {
      process.stderr.write(`piwork-launcher: unexpected ${JSON.stringify(msg.op)} when ${state}\n`);
      process.exit(70);
    }
    try {
      op(msg);
    } catch (err) {
      process.stderr.write(`piwork-launcher: ${msg.op} failed: ${err.message}\n`);
      process.exit(72);
    }
    if (msg.op === "prime") {
      state = "primed"; // the supervisor asks pi itself (get_state) when it is ready
    } else if (msg.op === "settle") {
      /* still primed */
    } else if (msg.op === "bind") {
      state = "binding"; // its cwd comes once the folders are mounted
    } else {
      if (msg.op === "cwd") say({ ev: "bound" });
      state = "running";
      ctl.removeAllListeners("data");
      // Closed once what was said is out; never what keeps pi's process alive
      // (pi in print mode ends when nothing else is left to do).
      ctl.unref();
      ctlOut.unref();
      ctlOut.end(() => {
        ctlOut.destroy();
        ctl.destroy();
      });
    }
  }
});
ctl.on("error", () => process.exit(71));
if (ctlOut !== ctl) ctlOut.on("error", () => process.exit(71));
ctl.on("end", () => {
  if (state !== "running") process.exit(0); // the supervisor went away first
});
