// piwork pack build step: fill Node's compile cache (V8 code cache) for the
// guest's JavaScript. Runs on the build host, never in a VM, with the pack's
// own node binary, inside the guest tree (unshare --root): Node keys each
// entry on the module's absolute path, so it must see the guest's paths.
// piwork/pack/codecache.py passes this file's text to `node -e`; it is not
// itself part of the pack.
//
//   node --random-seed=1 --predictable --input-type=module -e <this> <cacheDir> <bundleDir> <extensionsDir>
//
// It enables the cache at <cacheDir>, imports what the launcher imports (the
// precompiled extensions, the bundle, resolve.mjs) and every lazy chunk of the
// bundle, writes the cache and exits. Node serializes a module's entry right
// after V8 compiles it, so an entry holds what compiling the module makes;
// running pi afterwards would add nothing to it (and did not, when this
// script ran pi's main()). The flags make the bytes the same on every build
// (piwork/pack/codecache.py says why); V8 leaves both out of the flag hash it
// checks, so a guest node started without them accepts the entries.
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

for (const p of sorted(extensionsDir, (n) => n.endsWith(".mjs"))) await load(p);
await load(path.join(bundleDir, "entry.js"));
// What the launcher imports beside the bundle when pi comes from the snapshot.
if (fs.existsSync(path.join(bundleDir, "resolve.mjs"))) await load(path.join(bundleDir, "resolve.mjs"));
for (const p of sorted(bundleDir, (n) => n.startsWith("chunk-") && n.endsWith(".js"))) {
  try {
    await load(p); // pi's lazy imports (provider SDKs): compiled now, cached for the first prompt
  } catch {
    /* a chunk that does not load by itself (a dropped SDK) is simply not cached */
  }
}
module.flushCompileCache();
process.stdout.write(`${JSON.stringify({ dir: module.getCompileCacheDir() })}\n`);
process.exit(0); // the chunks' own timers or handles must not keep the build waiting
