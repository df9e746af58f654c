// piwork: pi's loaded modules as a V8 startup snapshot (a user-land snapshot:
// `node --snapshot-blob pi.blob --build-snapshot`, see piwork/pack/snapshot.py).
//
// Why: under TCG the launcher spends most of a cold start importing pi (its
// ~1,500 bundled modules run their top-level code: seconds). A snapshot holds
// the heap as it is after that import, so the guest's node deserializes it
// instead of running it again.
//
// The pack builder writes one script: this file's first part, then pi's
// bundle as one CommonJS file (runtime-pack/pack-tools/compile.mjs), then
// this file's second part. Node cannot put everything a module may touch
// at load into a snapshot, so while the bundle loads:
//
// * node:http, node:https and node:http2 are stand-ins (their native
//   bindings cannot be serialized), and so is node:worker_threads (loaded
//   into a snapshot, it makes every Worker the restored process starts abort). Each forwards every use to the real
//   module once the snapshot runs; while it loads, reading a plain-data
//   member (http.STATUS_CODES, http2.constants) gives the real value, which
//   the builder read from the same node beforehand; anything else is a
//   deferred reference that forwards later (nothing in pi calls one at load:
//   the builder fails if anything does), except the calls in REPLAYED:
//   functions called only for their effect on an object (undici marks its
//   CacheStorage uncloneable at load), which are recorded while pi loads and
//   made on the real module, with the same arguments, once it is live.
// * process.stdin/stdout/stderr are stand-ins (their handles cannot be
//   serialized); the console must not have bound them (the builder checks).
// * Intl.Segmenter and FinalizationRegistry instances made at load are
//   created for real on first use (V8 cannot serialize them).
// * The web globals (fetch, Headers, ...) are deleted, so Node's own undici is
//   not loaded into the snapshot; npm undici's install() defines them again.
// * process signal listeners added at load are added again after.
//
// The builder runs this with the guest's environment (HOME=/root, PATH, TERM,
// cwd /), as boot.sh starts the launcher: what pi reads at load is what it
// would read there. The snapshot then imports the launcher
// (runtime-pack/launcher/launch.mjs), which finds pi in
// globalThis.__piworkSnapshot instead of importing it.
var __piworkBuiltinRequire = require;
var __piworkLive = false;
var __piworkAtLoad = []; // what the bundle did with a stand-in while loading
var __piworkLazyData = /*@PIWORK_LAZY_DATA@*/ {};
var __piworkRealModules = new Map();
var __piworkProtos = [];
var __piworkReplayed = new Set(["markAsUncloneable", "markAsUntransferable"]);
var __piworkReplays = []; // [id, path, args] of the calls to make once live

function __piworkReal(id) {
  let m = __piworkRealModules.get(id);
  if (!m) {
    m = __piworkBuiltinRequire(id);
    __piworkRealModules.set(id, m);
  }
  return m;
}

function __piworkResolve(id, path) {
  let v = __piworkReal(id);
  for (const k of path) v = v[k];
  return v;
}

/** A member of a stand-in module read at load: forwards to the real one later. */
function __piworkDeferred(id, path) {
  const name = `${id}.${path.join(".")}`;
  const proto = {};
  __piworkProtos.push([proto, id, path]);
  return new Proxy(function deferred() {}, {
    get(t, k) {
      if (__piworkLive) return Reflect.get(__piworkResolve(id, path), k);
      if (k === "prototype") return proto; // `class X extends http.Agent`
      __piworkAtLoad.push(`read ${name}.${String(k)}`);
      return typeof k === "symbol" ? undefined : __piworkDeferred(id, [...path, k]);
    },
    apply(t, self, args) {
      if (__piworkLive) return Reflect.apply(__piworkResolve(id, path), self, args);
      if (path.length === 1 && __piworkReplayed.has(path[0])) {
        __piworkAtLoad.push(`replay ${name}()`);
        __piworkReplays.push([id, path, args]);
        return undefined;
      }
      throw new Error(`piwork snapshot: ${name}() called while pi loads`);
    },
    construct(t, args, newTarget) {
      if (!__piworkLive) throw new Error(`piwork snapshot: new ${name}() while pi loads`);
      const real = __piworkResolve(id, path);
      return Reflect.construct(real, args, newTarget === t ? real : newTarget);
    },
    has(t, k) {
      if (__piworkLive) return k in __piworkResolve(id, path);
      throw new Error(`piwork snapshot: "${String(k)}" in ${name} while pi loads`);
    },
    set(t, k, v) {
      if (__piworkLive) return Reflect.set(__piworkResolve(id, path), k, v);
      throw new Error(`piwork snapshot: ${name}.${String(k)} set while pi loads`);
    },
  });
}

/** A stand-in for a built-in module whose native parts cannot be serialized. */
function __piworkStandIn(id) {
  const { keys = [], data = {} } = __piworkLazyData[id] || {};
  return new Proxy(
    {},
    {
      get(t, k) {
        if (__piworkLive) return __piworkReal(id)[k];
        if (typeof k === "symbol" || k === "__esModule") return undefined;
        if (Object.hasOwn(data, k)) return data[k];
        if (!keys.includes(k)) return undefined;
        return __piworkDeferred(id, [k]);
      },
      has(t, k) {
        return __piworkLive ? k in __piworkReal(id) : keys.includes(k);
      },
      ownKeys() {
        return __piworkLive ? Reflect.ownKeys(__piworkReal(id)) : [...keys];
      },
      getOwnPropertyDescriptor(t, k) {
        if (__piworkLive) {
          const d = Reflect.getOwnPropertyDescriptor(__piworkReal(id), k);
          return d && { ...d, configurable: true };
        }
        if (!keys.includes(k)) return undefined;
        return { configurable: true, enumerable: true, writable: true, value: undefined };
      },
      set(t, k, v) {
        if (__piworkLive) return Reflect.set(__piworkReal(id), k, v);
        throw new Error(`piwork snapshot: ${id}.${String(k)} set while pi loads`);
      },
    },
  );
}

// Packages the bundle leaves to the tree (photon, with its WebAssembly) are
// required once pi runs, from the ES bundle's place in the guest.
var __piworkBundleUrl = /*@PIWORK_BUNDLE_URL@*/ "";
var __piworkTreeRequire = null;
var __piworkModule = __piworkBuiltinRequire("node:module");
var __piworkStandIns = new Map();
require = function piworkRequire(id) {
  if (!__piworkModule.isBuiltin(id)) {
    if (!__piworkLive) throw new Error(`piwork snapshot: require("${id}") while pi loads`);
    __piworkTreeRequire ??= __piworkModule.createRequire(__piworkBundleUrl);
    return __piworkTreeRequire(id);
  }
  if (!Object.hasOwn(__piworkLazyData, id)) return __piworkBuiltinRequire(id);
  let m = __piworkStandIns.get(id);
  if (!m) {
    m = __piworkStandIn(id);
    __piworkStandIns.set(id, m);
  }
  return m;
};

// Node's web globals are lazy properties: reading one, even its descriptor,
// loads Node's own undici (which cannot go into a snapshot). They are deleted
// unread, and npm undici's install() (the copy pi uses) defines them again.
var __piworkWebGlobals = [
  "fetch",
  "Headers",
  "Request",
  "Response",
  "FormData",
  "WebSocket",
  "EventSource",
  "CloseEvent",
  "MessageEvent",
  "ErrorEvent",
];
for (const k of __piworkWebGlobals) delete globalThis[k];

var __piworkEvents = __piworkBuiltinRequire("node:events");
var __piworkSignals = [];
var __piworkOn = {};
for (const m of ["on", "addListener", "prependListener", "once", "prependOnceListener"]) {
  const orig = (__piworkOn[m] = __piworkEvents.prototype[m]);
  __piworkEvents.prototype[m] = function (ev, fn) {
    if (this === process && /^SIG/.test(String(ev))) {
      __piworkSignals.push([m, ev, fn]);
      return this;
    }
    return orig.call(this, ev, fn);
  };
}

var __piworkFinalizationRegistry = globalThis.FinalizationRegistry;
globalThis.FinalizationRegistry = class FinalizationRegistry {
  #cleanup;
  #real = null;
  constructor(cleanup) {
    this.#cleanup = cleanup;
  }
  #get() {
    this.#real ??= new __piworkFinalizationRegistry(this.#cleanup);
    return this.#real;
  }
  register(...a) {
    return this.#get().register(...a);
  }
  unregister(...a) {
    return this.#real ? this.#real.unregister(...a) : false;
  }
};

var __piworkSegmenter = Intl.Segmenter;
Intl.Segmenter = class Segmenter {
  #args;
  #real = null;
  constructor(...args) {
    this.#args = args;
  }
  #get() {
    this.#real ??= new __piworkSegmenter(...this.#args);
    return this.#real;
  }
  segment(s) {
    return this.#get().segment(s);
  }
  resolvedOptions() {
    return this.#get().resolvedOptions();
  }
};

// pi reads a few of its own files at load (its package.json, by a path made
// from import.meta.url: the guest's). The builder stages the guest's tree
// under PIWORK_SNAPSHOT_ROOT: reads of /opt/piwork/... go there while pi
// loads, so pi reads the very files the guest has. Every file pi touches at
// load is reported; the builder refuses anything outside /opt/piwork.
var __piworkFs = __piworkBuiltinRequire("node:fs");
var __piworkFsOrig = {};
var __piworkStage = process.env.PIWORK_SNAPSHOT_ROOT || "";
for (const f of ["readFileSync", "existsSync", "statSync", "lstatSync", "readdirSync", "accessSync", "openSync"]) {
  const orig = (__piworkFsOrig[f] = __piworkFs[f]);
  __piworkFs[f] = function (p, ...rest) {
    const where = typeof p === "string" ? p : String(p);
    __piworkAtLoad.push(`fs.${f} ${where}`);
    const staged = __piworkStage && where.startsWith("/opt/piwork/") ? __piworkStage + where : p;
    return orig.call(this, staged, ...rest);
  };
}

// Node warns about built-in modules it has not verified in snapshots (readline,
// child_process, ...) through the console, which would bind the stand-ins
// below: the warnings go to the report instead.
var __piworkWarnings = process.listeners("warning");
var __piworkWarned = [];
process.removeAllListeners("warning");
process.on("warning", (w) => __piworkWarned.push(String(w && w.message ? w.message : w).split("\n")[0]));

// The same inputs make the same blob (the pack is checked for that): clocks
// read while pi loads say 0, and what this build's command line was is not kept.
var __piworkClocks = {
  dateNow: Date.now,
  perfNow: performance.now,
  hrtime: process.hrtime,
};
Date.now = () => 0;
performance.now = () => 0;
process.hrtime = Object.assign((prev) => (prev ? [0, 0] : [0, 0]), { bigint: () => 0n });

var __piworkStdio = {};
for (const [k, fd] of [
  ["stdin", 0],
  ["stdout", 1],
  ["stderr", 2],
]) {
  __piworkStdio[k] = Object.getOwnPropertyDescriptor(process, k);
  const standIn = {
    fd,
    isTTY: false,
    write(chunk) {
      __piworkAtLoad.push(`${k}: ${String(chunk).slice(0, 200)}`);
      return true;
    },
    on() {
      return this;
    },
    once() {
      return this;
    },
    off() {
      return this;
    },
    removeListener() {
      return this;
    },
    hasColors() {
      return false;
    },
    getColorDepth() {
      return 1;
    },
  };
  Object.defineProperty(process, k, {
    configurable: true,
    enumerable: true,
    get() {
      // The global console binds its streams once, on first use: bound to a
      // stand-in, its output would be lost (and a restored console cannot be
      // made again). The builder refuses a snapshot where that happened.
      if (/node:internal\/console\//.test(new Error().stack)) __piworkAtLoad.push(`console bound ${k}: ${new Error().stack.split("\n").slice(2, 12).join(" <- ")}`);
      return standIn;
    },
  });
}

var __piworkExports = (function () {
  var module = { exports: {} };
  var exports = module.exports;
//@PIWORK_BUNDLE@
  return module.exports;
})();

process.removeAllListeners("warning");
for (const l of __piworkWarnings) process.on("warning", l);
Date.now = __piworkClocks.dateNow;
delete performance.now; // the prototype's again
process.hrtime = __piworkClocks.hrtime;
process.argv.splice(1);
process.execArgv.splice(0);
Object.assign(__piworkEvents.prototype, __piworkOn);
Object.assign(__piworkFs, __piworkFsOrig);
for (const k of ["stdin", "stdout", "stderr"]) Object.defineProperty(process, k, __piworkStdio[k]);
globalThis.FinalizationRegistry = __piworkFinalizationRegistry;
Intl.Segmenter = __piworkSegmenter;
if (process.env.PIWORK_SNAPSHOT_REPORT) {
  __piworkBuiltinRequire("node:fs").writeFileSync(
    process.env.PIWORK_SNAPSHOT_REPORT,
    JSON.stringify({
      atLoad: __piworkAtLoad,
      warnings: __piworkWarned,
      exports: Object.keys(__piworkExports),
    }),
  );
}

__piworkBuiltinRequire("node:v8").startupSnapshot.setDeserializeMainFunction(() => {
  const t0 = performance.now();
  __piworkLive = true;
  // A node pi forks (child_process.fork takes process.execArgv) must run its own
  // script, not this snapshot again.
  const argv = process.execArgv;
  for (let i = argv.indexOf("--snapshot-blob"); i !== -1; i = argv.indexOf("--snapshot-blob")) {
    argv.splice(i, 2);
  }
  for (const [id, path, args] of __piworkReplays) Reflect.apply(__piworkResolve(id, path), __piworkReal(id), args);
  __piworkReplays.length = 0;
  for (const [proto, id, path] of __piworkProtos) {
    const real = __piworkResolve(id, path);
    if (typeof real === "function" && real.prototype) Object.setPrototypeOf(proto, real.prototype);
  }
  __piworkExports.install(); // fetch, Headers, WebSocket, ... (npm undici's)
  for (const [m, ev, fn] of __piworkSignals) process[m](ev, fn);
  globalThis.__piworkSnapshot = { ...__piworkExports, restoredMs: performance.now() - t0 };
  // The launcher is an ES module: import() from a script compiled now (the
  // snapshot's own code was compiled without an import callback).
  const vm = __piworkBuiltinRequire("node:vm");
  const emit = process.emitWarning;
  process.emitWarning = (w, ...rest) =>
    /USE_MAIN_CONTEXT_DEFAULT_LOADER/.test(String(w)) ? undefined : emit.call(process, w, ...rest);
  const load = new vm.Script("(url) => import(url)", {
    importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  }).runInThisContext();
  const launcher = process.env.PIWORK_LAUNCHER_SCRIPT || "/opt/piwork/launcher/launch.mjs";
  load(__piworkBuiltinRequire("node:url").pathToFileURL(launcher).href).then(
    () => {
      process.emitWarning = emit;
    },
    (err) => {
      process._rawDebug(`piwork-launcher (snapshot): ${err && err.stack ? err.stack : err}`);
      process.exit(70);
    },
  );
});
