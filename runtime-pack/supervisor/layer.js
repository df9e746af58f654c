// The working folder's writable layer, as the host asks for it (docs/change-sets.md).
//
// The guest never writes the person's folder: /mnt/work is an overlay whose
// lower layer is the folder's 9p share, read-only (QEMU exports it with
// readonly=on), and whose upper layer is the task's own (its layer disk, or
// RAM). What the agent changed is what the upper holds. The host opens a
// netmux stream to this service before every model call and asks for it:
//
//   host:  {"op":"scan","max":N}\n
//   guest: {"e":{...}}\n ...  {"done":{"count":n,"truncated":bool,"errors":[...]}}\n
//   host:  {"op":"read","p":"<base64 path>","max":N}\n
//   guest: {"size":n}\n<n bytes>   or   {"error":"..."}\n
//
// An entry is {"p": base64 of the path's bytes (relative to the folder),
// "k": "file"|"dir"|"link"|"gone"|"other", "m": permission bits, "s": size,
// "h": sha256 hex (files), "t": base64 link target (links)}. "gone" is a path
// the agent's view no longer has (a whiteout, or a name of the lower hidden by
// an opaque directory): found by listing the lower beside the merged view, so
// no extended attribute needs to be read. Everything here is the guest's word:
// the host validates it all (piwork/changes/wire.py) and never follows a link.
"use strict";

const fs = require("node:fs");
const crypto = require("node:crypto");
const net = require("node:net");

const FOLDER_DIR = process.env.PIWORK_FOLDER_DIR || "/run/piwork/folder";
const DEFAULTS = {
  upper: `${FOLDER_DIR}/layer/upper`,
  lower: `${FOLDER_DIR}/lower`,
  merged: process.env.PIWORK_FOLDER_MERGED || "/mnt/work",
  socket: `${FOLDER_DIR}/layer.sock`,
};
const MAX_LINE = 64 * 1024;
const BATCH_BYTES = 60 * 1024;
const SLASH = Buffer.from("/");

function join(a, b) {
  return a.length ? Buffer.concat([a, SLASH, b]) : b;
}

function under(root, rel) {
  return rel.length ? Buffer.concat([Buffer.from(root), SLASH, rel]) : Buffer.from(root);
}

// The walk uses the synchronous calls (under TCG each trip through libuv's
// thread pool costs more than the call), and yields to the event loop every
// YIELD_EVERY entries so the supervisor's other work (netmux) goes on.
const YIELD_EVERY = 256;
const nextTick = () => new Promise((resolve) => setImmediate(resolve));

function names(dir) {
  try {
    return new Set(fs.readdirSync(dir, { encoding: "buffer" }).map((n) => n.toString("latin1")));
  } catch {
    return null;
  }
}

const HASH_BUF = Buffer.allocUnsafe(1 << 20);

function sha256(file) {
  const h = crypto.createHash("sha256");
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    for (;;) {
      const n = fs.readSync(fd, HASH_BUF, 0, HASH_BUF.length, null);
      if (!n) break;
      h.update(HASH_BUF.subarray(0, n));
    }
  } finally {
    fs.closeSync(fd);
  }
  return h.digest("hex");
}

/** Walks the upper layer; remembers hashes (by inode and times) and gone-lists between scans. */
class Scanner {
  constructor(dirs = {}) {
    this.dirs = { ...DEFAULTS, ...dirs };
    this.hashes = new Map(); // path (latin1) -> {sig, h}
    this.goneCache = new Map(); // dir (latin1) -> {sig, names: Buffer[]}
  }

  /** Every entry of the upper, depth first; `emit(entry)` may return a promise. */
  async scan(max, emit) {
    const errors = [];
    let count = 0;
    let truncated = false;
    const seen = new Set();
    const stack = [Buffer.alloc(0)];
    let sinceYield = 0;
    const put = async (entry) => {
      if (count >= max) {
        truncated = true;
        return false;
      }
      count += 1;
      await emit(entry);
      if (++sinceYield >= YIELD_EVERY) {
        sinceYield = 0;
        await nextTick();
      }
      return true;
    };
    while (stack.length && !truncated) {
      const rel = stack.pop();
      let list;
      try {
        list = fs.readdirSync(under(this.dirs.upper, rel), { encoding: "buffer" });
      } catch (err) {
        errors.push(`${rel.toString("utf8")}: ${err.code || err.message}`);
        continue;
      }
      list.sort(Buffer.compare);
      const gone = new Set();
      for (const name of list) {
        const p = join(rel, name);
        const key = p.toString("latin1");
        seen.add(key);
        let st;
        try {
          st = fs.lstatSync(under(this.dirs.upper, p), { bigint: true });
        } catch (err) {
          errors.push(`${p.toString("utf8")}: ${err.code || err.message}`);
          continue;
        }
        const mode = Number(st.mode & 0o7777n);
        const e = { p: p.toString("base64") };
        if (st.isCharacterDevice() && st.rdev === 0n) {
          gone.add(name.toString("latin1"));
          continue; // reported with the lower's hidden names below
        } else if (st.isDirectory()) {
          Object.assign(e, { k: "dir", m: mode });
          stack.push(p);
        } else if (st.isFile()) {
          let h;
          const sig = `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
          const known = this.hashes.get(key);
          if (known && known.sig === sig) h = known.h;
          else {
            try {
              h = sha256(under(this.dirs.upper, p));
            } catch (err) {
              errors.push(`${p.toString("utf8")}: ${err.code || err.message}`);
              continue;
            }
            this.hashes.set(key, { sig, h });
          }
          Object.assign(e, { k: "file", m: mode, s: Number(st.size), h });
        } else if (st.isSymbolicLink()) {
          let t;
          try {
            t = fs.readlinkSync(under(this.dirs.upper, p), { encoding: "buffer" });
          } catch (err) {
            errors.push(`${p.toString("utf8")}: ${err.code || err.message}`);
            continue;
          }
          Object.assign(e, { k: "link", m: mode, t: t.toString("base64") });
        } else {
          Object.assign(e, { k: "other", m: mode });
        }
        if (!(await put(e))) break;
      }
      if (truncated) break;
      for (const name of this.hidden(rel, gone)) {
        if (!(await put({ p: join(rel, name).toString("base64"), k: "gone" }))) break;
      }
    }
    for (const key of this.hashes.keys()) if (!seen.has(key)) this.hashes.delete(key);
    return { count, truncated, errors: errors.slice(0, 20) };
  }

  /**
   * Names the agent's view of `rel` no longer has: whiteouts, and names of the
   * lower an opaque directory hides (the lower listed beside the merged view,
   * cached while neither directory changes).
   */
  hidden(rel, whiteouts) {
    const lowerDir = under(this.dirs.lower, rel);
    const mergedDir = under(this.dirs.merged, rel);
    let sig = null;
    try {
      const l = fs.statSync(lowerDir, { bigint: true });
      const u = fs.statSync(under(this.dirs.upper, rel), { bigint: true });
      if (!l.isDirectory()) sig = null;
      else sig = `${l.ino}:${l.mtimeNs}:${l.ctimeNs}:${u.mtimeNs}:${u.ctimeNs}:${whiteouts.size}`;
    } catch {
      sig = null; // no such directory below: nothing of it can be hidden but whiteouts
    }
    const key = rel.toString("latin1");
    let out = new Set(whiteouts);
    if (sig !== null) {
      const cached = this.goneCache.get(key);
      if (cached && cached.sig === sig) return cached.names;
      const lower = names(lowerDir);
      const merged = lower ? names(mergedDir) : null;
      if (lower && merged) for (const n of lower) if (!merged.has(n)) out.add(n);
      const list = [...out].sort().map((n) => Buffer.from(n, "latin1"));
      this.goneCache.set(key, { sig, names: list });
      return list;
    }
    return [...out].sort().map((n) => Buffer.from(n, "latin1"));
  }

  /** The bytes of an upper file, or an error string. */
  read(rel, max) {
    let fd;
    try {
      fd = fs.openSync(under(this.dirs.upper, rel), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
    } catch (err) {
      return { error: err.code || err.message };
    }
    try {
      const st = fs.fstatSync(fd);
      if (!st.isFile()) return { error: "not a regular file" };
      if (st.size > max) return { error: `too big (${st.size} bytes)` };
      const data = Buffer.alloc(st.size);
      let off = 0;
      while (off < data.length) {
        const n = fs.readSync(fd, data, off, data.length - off, off);
        if (!n) break;
        off += n;
      }
      return { data: data.subarray(0, off) };
    } finally {
      fs.closeSync(fd);
    }
  }
}

function write(sock, buf) {
  if (sock.destroyed) return Promise.resolve();
  if (sock.write(buf)) return Promise.resolve();
  return new Promise((resolve) => {
    sock.once("drain", resolve);
    sock.once("close", resolve);
  });
}

/** One host connection: requests are answered in order. */
function serve(sock, scanner, log = () => {}) {
  let buf = Buffer.alloc(0);
  let busy = Promise.resolve();
  sock.on("error", () => {});
  sock.on("data", (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    let nl;
    while ((nl = buf.indexOf(0x0a)) >= 0) {
      const line = buf.subarray(0, nl).toString("utf8");
      buf = buf.subarray(nl + 1);
      busy = busy.then(() => answer(sock, scanner, line)).catch((err) => {
        log(`layer: ${err.stack || err}`);
        sock.destroy();
      });
    }
    if (buf.length > MAX_LINE) sock.destroy();
  });
}

async function answer(sock, scanner, line) {
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    await write(sock, Buffer.from(`${JSON.stringify({ error: "bad request" })}\n`));
    return;
  }
  const max = Number.isSafeInteger(msg.max) && msg.max > 0 ? msg.max : 0;
  if (msg.op === "scan") {
    // Lines go out in batches: each write is a netmux frame, and a frame per
    // entry would cost a trip through the virtio-serial port each.
    let batch = [];
    let size = 0;
    const flush = async () => {
      if (!batch.length) return;
      const buf = Buffer.concat(batch);
      batch = [];
      size = 0;
      await write(sock, buf);
    };
    const done = await scanner.scan(max, async (e) => {
      const line = Buffer.from(`${JSON.stringify({ e })}\n`);
      batch.push(line);
      size += line.length;
      if (size >= BATCH_BYTES) await flush();
    });
    batch.push(Buffer.from(`${JSON.stringify({ done })}\n`));
    await flush();
  } else if (msg.op === "read" && typeof msg.p === "string") {
    const got = scanner.read(Buffer.from(msg.p, "base64"), max);
    if (got.error) {
      await write(sock, Buffer.from(`${JSON.stringify({ error: got.error })}\n`));
      return;
    }
    await write(sock, Buffer.concat([Buffer.from(`${JSON.stringify({ size: got.data.length })}\n`), got.data]));
  } else {
    await write(sock, Buffer.from(`${JSON.stringify({ error: "unknown op" })}\n`));
  }
}

/** Listen on the layer's unix socket (the supervisor's netmux connects host streams to it). */
function listen(log = () => {}, dirs = {}) {
  const scanner = new Scanner(dirs);
  const path = scanner.dirs.socket;
  try {
    fs.mkdirSync(FOLDER_DIR, { recursive: true });
    fs.rmSync(path, { force: true });
  } catch {
    /* listen reports it */
  }
  const server = net.createServer((sock) => serve(sock, scanner, log));
  server.on("error", (err) => log(`layer: cannot listen on ${path}: ${err.message}`));
  server.listen(path);
  return { server, scanner, path };
}

module.exports = { Scanner, serve, listen, DEFAULTS };
