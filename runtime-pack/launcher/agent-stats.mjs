// pi's agent dir, stat()ed once per change instead of once per credential lookup.
//
// pi 1.x checks the "revision" of its agent dir's auth.json and models-store.json
// (statSync: dev, ino, size, mtime, ctime; pi's utils/paths.js getFileRevision)
// every time it reads a credential or a stored model entry, to notice another
// process's writes: ~800 stats each time it builds a session (its start, and a warm
// start's switch_session), for ~30 built-in providers. In the VM the agent dir is on
// 9p without a cache (/mnt/state/agent), where every stat is a round trip to QEMU:
// under TCG that was 80 % of a warm start's switch (5 s of its 5.1 s) and most of a
// cold start's main().
//
// While armed on a directory, statSync of those two files in it (when they exist) is
// kept until anything in that directory changes. Every process in the VM
// writes through the guest's own kernel, which tells inotify (fs.watch) of each
// change, and any event at all drops everything kept, so pi still sees other
// processes' writes (as soon as the event loop takes the event). The host writes the
// agent dir only before pi starts (piwork/run/environment.py), which is why the
// launcher arms it only once the task's folders are mounted. If the directory cannot
// be watched, or is moved or replaced, nothing is kept.
import fs from "node:fs";
import module from "node:module";
import path from "node:path";

/** The files pi polls (pi's core/auth-storage.js and core/models-store.js). */
export const POLLED = new Set(["auth.json", "models-store.json"]);
const realStatSync = fs.statSync;
let dir = null; // the armed directory (resolved), or null
let watcher = null;
let watched = ""; // the directory's dev:ino when armed
const kept = new Map(); // key -> Stats

const identity = (p) => {
  const s = realStatSync(p, { throwIfNoEntry: false });
  return s ? `${s.dev}:${s.ino}` : "";
};

let moved = false; // an event came: is the directory at the path still the watched one?

/** Something in the directory changed: forget what was kept. */
function drop() {
  kept.clear();
  moved = true;
}

/** After events: if the directory itself was moved or replaced, the watch no longer
 * sees the one at its path: stop keeping anything. Once per burst of events. */
function stillWatched() {
  if (moved) {
    moved = false;
    if (identity(dir) !== watched) disarm();
  }
  return dir !== null;
}

function cachedStatSync(p, options) {
  // pi stats many other files: they pass with a look at the name's tail (TCG makes
  // every instruction here count).
  const slash = typeof p === "string" ? p.lastIndexOf("/") : -1;
  if (dir === null || slash === -1 || !POLLED.has(p.slice(slash + 1))) return realStatSync(p, options);
  // pi's path is absolute and normal (join(agentDir, name)): compared as it is.
  const file = p.slice(0, slash) === dir ? p : path.resolve(p);
  if (path.dirname(file) !== dir || !stillWatched()) return realStatSync(p, options);
  const key = `${file}\0${options?.bigint === true}\0${options?.throwIfNoEntry !== false}`;
  let stats = kept.get(key);
  if (stats === undefined) {
    // A missing file (or any error) is asked again: pi makes both files at its start,
    // and must see them at once, not when inotify's event has come through.
    stats = realStatSync(p, options);
    // (undefined: throwIfNoEntry false and no file; a watcher error may have disarmed us)
    if (stats !== undefined && dir !== null) kept.set(key, stats);
  }
  return stats;
}

/** Stop keeping stats (and watching). */
export function disarm() {
  dir = null;
  kept.clear();
  moved = false;
  if (watcher !== null) {
    watcher.close();
    watcher = null;
  }
}

/**
 * Keep stats of the files directly in `agentDir` (absolute) until it changes; returns
 * what happened, for the launcher's log: "on", or why not.
 */
export function arm(agentDir) {
  disarm();
  if (typeof agentDir !== "string" || !path.isAbsolute(agentDir)) return "off: no absolute agent dir";
  try {
    // persistent: false: the watch never keeps pi's process alive.
    watcher = fs.watch(agentDir, { persistent: false }, drop);
  } catch (err) {
    return `off: ${err.code || err.message}`;
  }
  watcher.on("error", disarm);
  dir = path.resolve(agentDir);
  watched = identity(dir);
  if (fs.statSync !== cachedStatSync) {
    fs.statSync = cachedStatSync;
    module.syncBuiltinESMExports(); // ES modules' `import { statSync } from "node:fs"` too
  }
  return "on";
}
