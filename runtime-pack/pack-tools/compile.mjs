// piwork pack build step (runs on the build host, never in the guest):
// turn pi and the TypeScript extensions into a few pre-linked JavaScript files,
// so the guest spends its (emulated, slow) start-up running code instead of
// resolving ~1,500 module files and transpiling TypeScript through jiti.
//
//   node compile.mjs <job.json>
//
// job.json: {
//   "piDir":      ".../node_modules/@earendil-works/pi-coding-agent",  (pruned tree)
//   "bundleDir":  "<piDir>/dist/core/piwork-bundle",  (output: entry.js + chunks)
//   "stageRoot":  the build's copy of the guest's "/" (piDir is under it),
//   "external":   ["@aws-sdk/client-bedrock-runtime", ...],  (left as run-time imports)
//   "extensions": [{"src": ".../permission-gate.ts", "out": ".../permission-gate.mjs"}, ...]
// }
//
// The bundle entry exports pi's `main`, pi's `configureHttpDispatcher` (the
// launcher applies a bound task's proxy with it) and undici's `install` (the
// snapshot's web globals), one copy of undici for all. It lives two levels
// below pi's package root, like pi's own dist/core/extensions/loader.js.
// Every bundled module whose code reads `import.meta.url` gets its own file's
// URL in the guest instead (a literal): pi finds files next to its modules
// that way (the extension loader's aliases for jiti, the codemode and image
// resize workers, the QuickJS WebAssembly), and they are where they were, in
// the pack's tree. pi's extension loader imports "jiti" lazily, the first time
// an extension is loaded from a .ts path; in the bundle that import is a small
// module with the same createJiti that loads jiti from node_modules then
// (babel only on the first transform), exactly as jiti does unbundled.
// Likewise highlight.js, which pi's interactive theme imports: its index
// registers ~190 languages at import, and RPC mode never highlights. In the
// bundle it is a module with the same functions, each loading the real
// highlight.js (the one pi resolves, from node_modules) on first call.
// Each extension becomes one self-contained ES module (its gate/*.js helpers
// and typebox inlined) whose default export is the extension factory, which
// the launcher hands to pi's main() (options.extensionFactories).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const esbuild = require("esbuild");

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));

// CommonJS code inside an ES module bundle calls require() for Node built-ins.
const BANNER =
  'import { createRequire as __piworkCreateRequire } from "node:module";\n' +
  "const require = __piworkCreateRequire(import.meta.url);";

const common = {
  bundle: true,
  format: "esm",
  platform: "node",
  target: "node22",
  logLevel: "silent",
  charset: "utf8",
  legalComments: "none",
  banner: { js: BANNER },
};

const LAZY_JITI = `import { createRequire } from "node:module";
export function createJiti(id, opts) {
  return createRequire(import.meta.url)("jiti").createJiti(id, opts);
}
`;

const lazyJiti = {
  name: "piwork-lazy-jiti",
  setup(build) {
    build.onResolve({ filter: /^jiti(\/static)?$/ }, () => ({ path: "jiti-lazy", namespace: "piwork" }));
    build.onLoad({ filter: /.*/, namespace: "piwork" }, () => ({ contents: LAZY_JITI, loader: "js" }));
  },
};

// Packages evaluated at import but only used on demand: bare specifier -> loaded lazily.
const LAZY_PACKAGES = ["highlight.js"];

const lazyPackages = {
  name: "piwork-lazy-packages",
  setup(build) {
    const filter = new RegExp(`^(${LAZY_PACKAGES.map((p) => p.replace(/[.]/g, "\\.")).join("|")})$`);
    build.onResolve({ filter }, (args) => {
      const real = require.resolve(args.path, { paths: [args.resolveDir] });
      // The bare name as the module's path: no build-host path in the bundle.
      return { path: args.path, namespace: "piwork-lazy", pluginData: { real } };
    });
    build.onLoad({ filter: /.*/, namespace: "piwork-lazy" }, (args) => {
      const { real } = args.pluginData;
      const mod = require(real);
      const names = Object.keys(mod).filter((k) => typeof mod[k] === "function" && /^[A-Za-z_$][\w$]*$/.test(k));
      // Relative to the bundle's directory, where every chunk of it lives.
      const rel = path.relative(job.bundleDir, real).split(path.sep).join("/");
      const lines = [
        'import { createRequire } from "node:module";',
        "let real;",
        `const load = () => (real ??= createRequire(import.meta.url)(${JSON.stringify(`./${rel}`)}));`,
        ...names.map((k) => `export function ${k}(...a) { return load().${k}(...a); }`),
      ];
      return { contents: lines.join("\n"), loader: "js" };
    });
  },
};

// A module's own URL in the guest, for the modules that ask (see the header).
const guestUrl = (file) => `file:///${path.relative(job.stageRoot, file).split(path.sep).join("/")}`;
const guestImportMeta = {
  name: "piwork-guest-import-meta",
  setup(build) {
    build.onLoad({ filter: /\.[cm]?js$/ }, (args) => {
      if (path.relative(job.stageRoot, args.path).startsWith("..")) return undefined;
      const text = fs.readFileSync(args.path, "utf8");
      if (!text.includes("import.meta.url")) return undefined;
      return {
        contents: text.replaceAll("import.meta.url", JSON.stringify(guestUrl(args.path))),
        loader: "js",
        resolveDir: path.dirname(args.path),
      };
    });
  },
};

// import.meta.resolve() in the CommonJS file (the snapshot's), which has no
// import.meta: the launcher sets the function once pi runs, from a module in
// the bundle's directory (RESOLVE_MODULE), so bare names resolve from there as
// in the ES bundle. pi calls it only when it loads an extension from a path.
const RESOLVE_MODULE = "resolve.mjs";
const RESOLVE_SOURCE = "export default (specifier) => import.meta.resolve(specifier);\n";

function report(err) {
  const msgs = (err.errors || []).slice(0, 10).map((e) => {
    const loc = e.location ? `${e.location.file}:${e.location.line}: ` : "";
    return `${loc}${e.text}`;
  });
  return msgs.length ? msgs.join("\n") : String(err && err.stack ? err.stack : err);
}

// The same entry as one CommonJS file, for the launcher's V8 startup snapshot
// (runtime-pack/launcher/snapshot-shim.cjs, piwork/pack/snapshot.py). A
// snapshot's script cannot import(): pi's lazy imports become lazy require()s
// of modules inlined here (esbuild's "dynamic-import" lowering), still run only
// on first use. import.meta.url is the ES bundle's entry, so pi's path
// arithmetic (package.json lookup, the lazy packages' ./paths) finds the same files.
//   job.snapshotBundle: output file; job.snapshotImportMetaUrl: file URL of the
//   ES bundle's entry.js as the guest sees it.
async function snapshotBundle(entry) {
  const r = await esbuild.build({
    ...common,
    banner: undefined,
    format: "cjs",
    stdin: { contents: entry, resolveDir: job.piDir, sourcefile: "piwork-entry.mjs", loader: "js" },
    outfile: job.snapshotBundle,
    supported: { "dynamic-import": false },
    // Where the ES bundle's entry is in the guest (the build host stages it elsewhere).
    define: {
      "import.meta.url": JSON.stringify(job.snapshotImportMetaUrl),
      "import.meta.resolve": "globalThis.__piworkImportMetaResolve",
    },
    external: job.external,
    plugins: [lazyJiti, lazyPackages, guestImportMeta],
    metafile: true,
  });
  return { bytes: fs.statSync(job.snapshotBundle).size, inputs: Object.keys(r.metafile.inputs).length };
}

async function main() {
  const out = { bundle: null, extensions: [] };
  fs.rmSync(job.bundleDir, { recursive: true, force: true });
  const entry = [
    `export { main } from ${JSON.stringify(path.join(job.piDir, "dist", "main.js"))};`,
    `export { configureHttpDispatcher } from ${JSON.stringify(path.join(job.piDir, "dist", "core", "http-dispatcher.js"))};`,
    'export { install } from "undici";',
  ].join("\n");
  const r = await esbuild.build({
    ...common,
    stdin: { contents: entry, resolveDir: job.piDir, sourcefile: "piwork-entry.mjs", loader: "js" },
    splitting: true, // pi's lazy imports (provider SDKs) stay lazy: separate chunks
    outdir: job.bundleDir,
    entryNames: "entry",
    chunkNames: "chunk-[hash]",
    external: job.external,
    plugins: [lazyJiti, lazyPackages, guestImportMeta],
    metafile: true,
  });
  fs.writeFileSync(path.join(job.bundleDir, RESOLVE_MODULE), RESOLVE_SOURCE);
  const outputs = Object.entries(r.metafile.outputs);
  out.bundle = {
    files: outputs.length,
    bytes: outputs.reduce((n, [, o]) => n + o.bytes, 0),
    inputs: Object.keys(r.metafile.inputs).length,
  };
  if (job.snapshotBundle) out.snapshotBundle = await snapshotBundle(entry);
  for (const ext of job.extensions) {
    await esbuild.build({
      ...common,
      entryPoints: [ext.src],
      outfile: ext.out,
      // Resolve what the extension imports (typebox) from pi's tree, as pi's loader does.
      nodePaths: [path.join(job.piDir, "node_modules"), path.resolve(job.piDir, "..", "..")],
    });
    out.extensions.push({ src: ext.src, out: ext.out, bytes: fs.statSync(ext.out).size });
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch((err) => {
  process.stderr.write(`${report(err)}\n`);
  process.exit(1);
});
