// piwork pack build step: fill Node's compile cache (V8 code cache) for the
// guest's JavaScript. Runs on the build host, never in a VM, with the pack's
// own node binary, inside the guest tree (unshare --root): Node keys each
// entry on the module's absolute path, so it must see the guest's paths.
// piwork/pack/codecache.py passes this file's text to `node -e`; it is not
// itself part of the pack.
//
//   node --random-seed=1 --input-type=module -e <this> <cacheDir> <bundleDir> <extensionsDir>
//
// It enables the cache at <cacheDir>, imports what the launcher imports (the
// bundle, the precompiled extensions) and the bundle's lazy chunks, runs pi's
// main() until it answers the get_state on stdin (so the functions pi's start
// compiles are in the cache too), and lets Node write the cache at exit.
// --random-seed fixes V8's string hash seed (same bytes on every build); V8
// leaves that flag out of the flag hash it checks, so a guest node started
// without it accepts the cache.
import fs from "node:fs";
import module from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [cacheDir, bundleDir, extensionsDir] = process.argv.slice(1);
const r = module.enableCompileCache(cacheDir);
if (r.status !== module.constants.compileCacheStatus.ENABLED) {
  process.stderr.write(`piwork code cache: cannot enable the compile cache: ${r.message}\n`);
  process.exit(2);
}
const sorted = (dir, test) =>
  fs.existsSync(dir) ? fs.readdirSync(dir).filter(test).sort().map((n) => path.join(dir, n)) : [];
const load = (p) => import(pathToFileURL(p).href);

const factories = [];
for (const p of sorted(extensionsDir, (n) => n.endsWith(".mjs"))) {
  factories.push((await load(p)).default);
}
const entry = await load(path.join(bundleDir, "entry.js"));
// What the launcher imports beside the bundle when pi comes from the snapshot.
if (fs.existsSync(path.join(bundleDir, "resolve.mjs"))) await load(path.join(bundleDir, "resolve.mjs"));
for (const p of sorted(bundleDir, (n) => n.startsWith("chunk-") && n.endsWith(".js"))) {
  try {
    await load(p); // pi's lazy imports (provider SDKs): compiled now, cached for the first prompt
  } catch {
    /* a chunk that does not load by itself (a dropped SDK) is simply not cached */
  }
}
process.stdout.write(`${JSON.stringify({ dir: module.getCompileCacheDir() })}\n`);
await entry.main(["--mode", "rpc", "--offline", "--no-session", "--no-extensions"], {
  extensionFactories: factories,
});
