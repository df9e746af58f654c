// piwork guest supervisor: owns pi's stdio inside the VM.
//
// Why it exists: EOF on pi's stdin makes pi exit at once, and a host
// connection can drop at any time (app restart, socket hiccup). The
// supervisor holds pi's stdin open for pi's whole life, numbers every line
// pi writes so a reconnecting host can ask for what it missed, starts pi with
// the arguments the host sends, answers pings and powers the VM off.
// The wire format is fixed in docs/guest-protocol.md.
"use strict";

// Milliseconds from this process's start to its first line: node's own start
// (under TCG the first node process of a boot also pays for translating node).
const NODE_START_MS = performance.now();

// Four blocking port reads/writes (RPC and network ports) must not take every
// libuv worker; set before the pool starts, removed from pi's environment.
process.env.UV_THREADPOOL_SIZE = process.env.UV_THREADPOOL_SIZE || "8";

const fs = require("node:fs");
const net = require("node:net");
const path = require("node:path");
const os = require("node:os");
const { EventEmitter } = require("node:events");
const { Duplex } = require("node:stream");
const { spawn, spawnSync } = require("node:child_process");

// pi's package in the pack (piwork/pack/node.py PI_PACKAGE, checked by a test).
const PI_CLI =
  process.env.PIWORK_PI_CLI ||
  "/opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent/dist/cli.js";
const NODE = process.env.PIWORK_NODE || process.execPath;
const LAUNCHER = process.env.PIWORK_LAUNCHER || "/opt/piwork/launcher/launch.mjs";
const SNAPSHOT_BLOB = process.env.PIWORK_SNAPSHOT_BLOB || "/opt/piwork/launcher/pi.blob";
// A launcher from the snapshot that ends before saying "loaded" (a blob this
// node cannot restore) means the next ones load pi themselves: slower, not broken.
// (Declared up here: the first launcher starts before the rest of this file runs.)
let snapshotUnusable = false;
// V8 flags of pi's node; the pack's code cache is built with the same ones
// (piwork/pack/codecache.py NODE_FLAGS, checked by a test). --liftoff-only: no
// WebAssembly tier-up. Under TCG, Liftoff code asking to tier up (pi's image
// tool, photon) crashed pi: V8's Runtime_WasmTriggerTierUp walks the stack and
// dies on "Check failed: it->second.Size() > offset" (tests/vm/test_vm_image_resize.py).
const NODE_FLAGS = ["--liftoff-only"];
const EXTENSIONS_DIR = process.env.PIWORK_EXTENSIONS_DIR || "/opt/piwork/extensions";

/**
 * Say "adopted" on boot.sh's FIFO: it is about to wait there (opening it to
 * read), or has stopped waiting because the launcher died (then it writes
 * the status). Never blocks: an open with no reader fails, and is tried again
 * for up to 2 s.
 */
function tellBootSh(fifo, statusFile) {
  const nap = new Int32Array(new SharedArrayBuffer(4));
  for (let i = 0; i < 100; i++) {
    if (fs.existsSync(statusFile)) return; // the launcher has ended and boot.sh with it
    let fd = null;
    try {
      fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
      fs.writeSync(fd, "\n");
      return;
    } catch (err) {
      if (err.code !== "ENXIO") {
        log(`cannot tell boot.sh: ${err.message}`);
        return;
      }
    } finally {
      if (fd !== null) fs.closeSync(fd);
    }
    Atomics.wait(nap, 0, 0, 20);
  }
  log("boot.sh did not wait for the adoption");
}

/**
 * A launcher this process did not spawn (boot.sh's), seen as a ChildProcess
 * is: pid, stdin, stdout, stderr, stdio[3] (the control channel, one stream
 * both ways), exitCode, signalCode, kill(), and "exit" then "close" with the
 * status boot.sh read with `wait`, once stdout and stderr are closed.
 */
class AdoptedLauncher extends EventEmitter {
  constructor(pid, statusFile, { stdin, stdout, stderr, ctlIn, ctlOut }) {
    super();
    this.pid = pid;
    this.exitCode = null;
    this.signalCode = null;
    this.stdin = stdin;
    this.stdout = stdout;
    this.stderr = stderr;
    this.stdio = [stdin, stdout, stderr, Duplex.from({ readable: ctlOut, writable: ctlIn })];
    this._statusFile = statusFile;
    this._ended = false;
    for (const s of [stdin, ctlIn]) s.on("error", () => {});
    // Not our child: no SIGCHLD. Its end is seen when a stream it held closes,
    // or by looking (boot.sh reaps it at once, so a dead pid is gone).
    const check = () => this._check();
    for (const s of [stdout, stderr, ctlOut]) s.on("close", check);
    this._timer = setInterval(check, 250);
    this._timer.unref();
  }

  _check() {
    if (this._ended) return;
    try {
      process.kill(this.pid, 0);
      return; // still there
    } catch (err) {
      if (err.code === "EPERM") return;
    }
    this._ended = true;
    clearInterval(this._timer);
    // As Node does for a child that exited: drain unread output so the streams close.
    let open = 0;
    const closed = () => {
      if (--open === 0) this._readStatus(Date.now());
    };
    for (const s of [this.stdout, this.stderr]) {
      if (s.closed || s.destroyed) continue;
      open++;
      s.once("close", closed);
      if (!s.readableFlowing) s.resume();
    }
    if (open === 0) this._readStatus(Date.now());
  }

  _readStatus(since) {
    let text = null;
    try {
      text = fs.readFileSync(this._statusFile, "utf8").trim();
    } catch {
      if (Date.now() - since < 5000) {
        setTimeout(() => this._readStatus(since), 20);
        return;
      }
    }
    const status = Number(text);
    if (text === null || text === "" || !Number.isInteger(status)) {
      this.exitCode = -1; // unknown, but certainly not running
    } else if (status > 128) {
      const n = status - 128;
      this.signalCode = Object.keys(os.constants.signals).find((k) => os.constants.signals[k] === n) || `SIG${n}`;
    } else {
      this.exitCode = status;
    }
    this.stdin.destroy();
    this.stdio[3].destroy();
    this.emit("exit", this.exitCode, this.signalCode);
    this.emit("close", this.exitCode, this.signalCode);
  }

  kill(signal = "SIGTERM") {
    try {
      process.kill(this.pid, signal);
      return true;
    } catch {
      return false;
    }
  }
}

// Where /init's boot.sh left the launcher it started at boot (runtime-pack/launcher/boot.sh).
const BOOT_LAUNCHER_DIR = process.env.PIWORK_BOOT_LAUNCHER_DIR || "/run/piwork/launcher";

// The launcher's load of pi is the longest part of a cold start. /init starts
// one at boot, beside this process, and it is adopted here; without one it is
// spawned here, before the rest of this file and its modules load (~0.2 s of
// a cold boot under TCG). main() takes it over (preload). Only when run as the
// supervisor; with PIWORK_NO_PRELOAD the boot's launcher is stopped instead.
let earlyLauncher = null;
if (require.main === module) {
  const adopted = adoptBootLauncher(!process.env.PIWORK_NO_PRELOAD);
  if (!process.env.PIWORK_NO_PRELOAD) earlyLauncher = adopted || startLauncherProcess();
}

const crypto = require("node:crypto");
const netmux = require("./netmux.js");
const serial = require("./port.js");
const { PortWatcher, MIN_PORT } = require("./ports.js");

const VERSION = 1;
const PORT_NAME = "piwork.rpc";
const RING_LIMIT_BYTES = Number(process.env.PIWORK_RING_BYTES || 32 * 1024 * 1024);
const NL = 0x0a;
const BOOT_ID = crypto.randomBytes(8).toString("hex");
// 9p tags the host may give the VM, and where they are mounted (on "start").
const SHARES = { pwstate: "/mnt/state", pwwork: "/mnt/work", pwout: "/mnt/outputs", pwup: "/mnt/uploads" };
// The workbench (a Debian root for the agent's bash; runtime-pack/workbench/).
const WORKBENCH_SETUP = process.env.PIWORK_WORKBENCH_SETUP || "/opt/piwork/workbench/setup.sh";
const WORKBENCH_DIR = process.env.PIWORK_WORKBENCH_DIR || "/run/workbench";

function log(msg) {
  // The console is a slow serial line under TCG: keep this rare.
  try {
    fs.writeSync(2, `piwork-supervisor: ${msg}\n`);
  } catch {
    /* nothing to do */
  }
}

// ---------------------------------------------------------------- line splitting

/** Splits a byte stream on "\n" only; JSON may hold U+2028, so never on anything else. */
class LineSplitter {
  constructor(onLine) {
    this.onLine = onLine;
    this.parts = [];
  }
  push(chunk) {
    let start = 0;
    let idx;
    while ((idx = chunk.indexOf(NL, start)) !== -1) {
      let piece = chunk.subarray(start, idx);
      if (this.parts.length) {
        this.parts.push(piece);
        piece = Buffer.concat(this.parts);
        this.parts = [];
      }
      if (piece.length && piece[piece.length - 1] === 0x0d) piece = piece.subarray(0, -1);
      this.onLine(piece);
      start = idx + 1;
    }
    if (start < chunk.length) this.parts.push(Buffer.from(chunk.subarray(start)));
  }
  flush() {
    if (this.parts.length) {
      const rest = Buffer.concat(this.parts);
      this.parts = [];
      if (rest.length) this.onLine(rest);
    }
  }
}

// ---------------------------------------------------------------- outbound ring

/** Numbered outbound lines, bounded by bytes, replayable from any seq still held. */
class Outbox {
  constructor(limitBytes) {
    this.limit = limitBytes;
    this.lines = []; // [{seq, buf}]
    this.bytes = 0;
    this.lastSeq = 0;
    this.transient = [];
    this.sendFrom = 1; // next seq to send on the current connection
    this.wake = null;
  }
  add(payload) {
    const seq = ++this.lastSeq;
    const buf = Buffer.concat([Buffer.from(`${seq} `), payload, Buffer.from("\n")]);
    this.lines.push({ seq, buf });
    this.bytes += buf.length;
    while (this.bytes > this.limit && this.lines.length > 1) {
      this.bytes -= this.lines.shift().buf.length;
    }
    this.notify();
  }
  addTransient(obj) {
    this.transient.push(Buffer.from(`0 !${JSON.stringify(obj)}\n`));
    this.notify();
  }
  event(obj) {
    this.add(Buffer.from(`!${JSON.stringify(obj)}`));
  }
  firstHeld() {
    return this.lines.length ? this.lines[0].seq : this.lastSeq + 1;
  }
  /** Called on hello: resend everything after `after`, saying so if some is gone. */
  replayAfter(after) {
    const from = Math.max(0, Math.floor(after)) + 1;
    const first = this.firstHeld();
    if (from < first) this.addTransient({ ev: "gap", from, to: first - 1 });
    this.sendFrom = Math.max(from, first);
    this.notify();
  }
  notify() {
    if (this.wake) {
      const w = this.wake;
      this.wake = null;
      w();
    }
  }
  /** Next buffer to write, or null when there is nothing. Transient lines go first. */
  next() {
    if (this.transient.length) return this.transient.shift();
    if (this.sendFrom > this.lastSeq) return null;
    const first = this.firstHeld();
    if (this.sendFrom < first) this.sendFrom = first;
    const item = this.lines[this.sendFrom - first];
    this.sendFrom += 1;
    return item.buf;
  }
  waitForData() {
    return new Promise((resolve) => {
      this.wake = resolve;
    });
  }
}

const outbox = new Outbox(RING_LIMIT_BYTES);

// Ports something in the guest listens on, reported while pi runs (previews).
const ports = new PortWatcher((list) => outbox.event({ ev: "ports", ports: list }), {
  interval: Number(process.env.PIWORK_PORTS_INTERVAL_MS || 1000),
  exclude: process.env.PIWORK_TRANSPORT === "tcp" ? [Number(process.env.PIWORK_PORT || 7000)] : [],
});

// ---------------------------------------------------------------- pi

let pi = null; // ChildProcess
let preloaded = null; // {child, ctl, loaded, primed}: a launcher with pi loaded, waiting for "go"
let heldLines = null; // lines for pi that arrived while it was starting (mounts, bind)

function childEnv(extra) {
  const env = { ...process.env, ...(extra || {}) };
  delete env.PIWORK_TRANSPORT;
  delete env.PIWORK_PORT;
  delete env.UV_THREADPOOL_SIZE;
  delete env.PIWORK_MODULES_MARK;
  return env;
}

/** The launcher's process: it loads pi now and runs it when told (see launcher/launch.mjs); null if there is no launcher. */
function startLauncherProcess() {
  if (!fs.existsSync(LAUNCHER)) return null;
  let warm = [];
  try {
    warm = fs
      .readdirSync(EXTENSIONS_DIR)
      .filter((n) => n.endsWith(".ts"))
      .map((n) => path.join(EXTENSIONS_DIR, n));
  } catch {
    /* no extensions to warm */
  }
  // pi already loaded: the pack's V8 startup snapshot, which imports LAUNCHER once
  // restored (launcher/snapshot-shim.cjs); without it node runs LAUNCHER, which loads pi.
  const from = useSnapshot() ? ["--snapshot-blob", SNAPSHOT_BLOB] : [LAUNCHER];
  return spawn(NODE, [...NODE_FLAGS, ...from], {
    cwd: "/",
    env: childEnv({ PIWORK_WARM_EXTENSIONS: warm.join(":"), PIWORK_LAUNCHER_SCRIPT: LAUNCHER }),
    stdio: ["pipe", "pipe", "pipe", "pipe"],
    detached: true, // own process group: stop kills pi and its tools together
  });
}

/**
 * The launcher /init started at boot (boot.sh), as a child-like object the
 * rest of this file uses like a spawned one (pid, stdin, stdout, stderr,
 * stdio[3], exitCode, signalCode, kill, "close"); null if there is none, or it
 * was adopted already (a supervisor restarted after a crash starts its own).
 * Either way boot.sh is told to let go of the FIFOs; with `keep` false the
 * launcher's group is killed.
 */
function adoptBootLauncher(keep) {
  const dir = BOOT_LAUNCHER_DIR;
  const at = (name) => path.join(dir, name);
  let pid;
  try {
    // Once per boot: the rename is the claim.
    fs.renameSync(at("pid"), at("pid.adopted"));
    pid = Number(fs.readFileSync(at("pid.adopted"), "utf8").trim());
  } catch {
    return null;
  }
  const fds = [];
  let child = null;
  try {
    if (!Number.isInteger(pid) || pid <= 1) throw new Error(`bad pid ${pid}`);
    if (keep) {
      // Non-blocking: boot.sh holds every FIFO both ways until told, but if the
      // launcher died it has let go, and a blocking open would wait forever
      // (O_NONBLOCK: an open for writing with no reader fails, ENXIO).
      // Every end is opened before any becomes a stream, so a failure leaves
      // only plain descriptors to close.
      const { O_RDONLY, O_WRONLY, O_NONBLOCK } = fs.constants;
      const ends = { in: O_WRONLY, out: O_RDONLY, err: O_RDONLY, "ctl-in": O_WRONLY, "ctl-out": O_RDONLY };
      const fd = {};
      for (const [name, flags] of Object.entries(ends)) {
        fd[name] = fs.openSync(at(name), flags | O_NONBLOCK);
        fds.push(fd[name]);
      }
      const stream = (name) =>
        new net.Socket({ fd: fd[name], readable: ends[name] === O_RDONLY, writable: ends[name] === O_WRONLY });
      fds.length = 0; // the streams own them now
      child = new AdoptedLauncher(pid, at("status"), {
        stdin: stream("in"),
        stdout: stream("out"),
        stderr: stream("err"),
        ctlIn: stream("ctl-in"),
        ctlOut: stream("ctl-out"),
      });
    }
  } catch (err) {
    for (const fd of fds) {
      try {
        fs.closeSync(fd);
      } catch {
        /* nothing to do */
      }
    }
    log(`cannot adopt the boot's launcher: ${err.message}`);
    child = null;
  }
  if (!child && Number.isInteger(pid) && pid > 1) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      /* gone already */
    }
  }
  tellBootSh(at("adopted"), at("status"));
  return child;
}

function useSnapshot() {
  return !snapshotUnusable && !process.env.PIWORK_NO_SNAPSHOT && fs.existsSync(SNAPSHOT_BLOB);
}

/** A launcher entry for `child` (a new launcher's process unless given one); null if there is no launcher. */
function spawnLauncher(child = startLauncherProcess()) {
  if (!child) return null;
  const entry = {
    child,
    ctl: child.stdio[3],
    loaded: false,
    primed: false,
    onBound: null,
    onSettled: null,
  };
  const fromSnapshot = useSnapshot();
  child.on("close", (code, signal) => {
    if (!entry.loaded && fromSnapshot && !snapshotUnusable) {
      snapshotUnusable = true;
      log(`the launcher from ${SNAPSHOT_BLOB} ended before pi was loaded (${code ?? signal}); later ones load pi themselves`);
    }
  });
  const split = new LineSplitter((line) => {
    let msg;
    try {
      msg = JSON.parse(line.toString("utf8"));
    } catch {
      return;
    }
    if (msg.ev === "loaded") {
      entry.loaded = true;
      outbox.event({
        ev: "preloaded",
        ms: msg.ms ?? null,
        node: msg.node ?? null,
        codeCache: msg.codeCache ?? null,
        snapshot: msg.snapshot ?? null,
      });
    } else if (msg.ev === "bound" && entry.onBound) {
      entry.onBound();
    } else if (msg.ev === "settled" && entry.onSettled) {
      entry.onSettled();
    }
  });
  entry.ctl.on("data", (c) => split.push(c));
  entry.ctl.on("error", () => {});
  return entry;
}

function preload() {
  // The launcher started before this file's modules loaded serves the first preload.
  const early = earlyLauncher;
  earlyLauncher = null;
  if (early && (preloaded || pi)) killGroup(early);
  else if (!preloaded && !pi) {
    try {
      preloaded = spawnLauncher(early || undefined);
    } catch (err) {
      log(`cannot preload pi: ${err.message}`);
      return;
    }
    if (!preloaded) return; // no launcher in this pack
    const mine = preloaded;
    mine.child.on("close", (code, signal) => {
      if (preloaded === mine) {
        preloaded = null;
        log(`preloaded pi exited before start (${code ?? signal})`);
      }
    });
    mine.child.on("error", () => {
      if (preloaded === mine) preloaded = null;
    });
  }
}

// ---------------------------------------------------------------- prime

const PRIME_PROBE_ID = "piwork-prime";
const PRIME_TIMEOUT_MS = Number(process.env.PIWORK_PRIME_TIMEOUT_MS || 600000);

function killGroup(child) {
  try {
    process.kill(-child.pid, "SIGKILL");
  } catch {
    /* already gone */
  }
}

/**
 * "prime" (the host is making a saved VM): the preloaded launcher runs pi's
 * main() with the prime's argv, env and cwd (no task in any of them; see
 * launcher/launch.mjs), and pi is asked for its state on its own stdin. Its
 * answer means pi's RPC loop runs: "primed" goes to the host, which saves
 * the VM. A restored VM's "start" with bind then skips main().
 */
function primePi(msg) {
  const entry = preloaded;
  const why = !entry ? "pi is not preloaded" : !entry.loaded ? "pi is still loading" : entry.primed ? "pi is already primed" : pi ? "pi is running" : null;
  if (why) {
    outbox.event({ ev: "primed", ok: false, error: why });
    return;
  }
  const t0 = performance.now();
  const { child } = entry;
  let stderr = "";
  let done = false;
  const out = new LineSplitter((line) => {
    let reply;
    try {
      reply = JSON.parse(line.toString("utf8"));
    } catch {
      return;
    }
    if (reply && reply.id === PRIME_PROBE_ID && reply.type === "response") {
      finish(reply.success === true, reply.success === true ? null : String(reply.error));
    }
  });
  const onOut = (c) => out.push(c);
  const onErr = (c) => {
    if (stderr.length < 4000) stderr += c.toString("utf8");
  };
  const onClose = (code, signal) => finish(false, `pi exited while priming (${code ?? signal})`);
  const timer = setTimeout(() => finish(false, `pi did not answer within ${PRIME_TIMEOUT_MS} ms`), PRIME_TIMEOUT_MS);
  function finish(ok, error) {
    if (done) return;
    done = true;
    clearTimeout(timer);
    child.stdout.removeListener("data", onOut);
    child.stderr.removeListener("data", onErr);
    child.removeListener("close", onClose);
    child.stdout.pause(); // what pi writes next waits for the task's start
    child.stderr.pause();
    if (ok) {
      // A full collection before the save (see the launcher's settle()); then "primed".
      const said = () => {
        entry.onSettled = null;
        clearTimeout(settleTimer);
        entry.primed = true;
        outbox.event({ ev: "primed", ok: true, ms: Math.round(performance.now() - t0) });
      };
      const settleTimer = setTimeout(said, 60000); // primed anyway, just not settled
      entry.onSettled = said;
      entry.ctl.write(`${JSON.stringify({ op: "settle" })}\n`);
      return;
    }
    const tail = stderr.trim().split("\n").slice(-10).join("\n");
    outbox.event({ ev: "primed", ok: false, error: tail ? `${error}: ${tail}` : error });
    if (preloaded === entry) preloaded = null;
    killGroup(child);
    preload(); // this VM can still run a task the ordinary way
  }
  child.stdout.on("data", onOut);
  child.stderr.on("data", onErr);
  child.on("close", onClose);
  const { argv, env, cwd, files } = msg;
  entry.ctl.write(`${JSON.stringify({ op: "prime", argv, env: childEnv(env), cwd, files })}\n`);
  child.stdin.write(`${JSON.stringify({ id: PRIME_PROBE_ID, type: "get_state" })}\n`);
}

function mountedDirs() {
  try {
    return new Set(
      fs.readFileSync("/proc/mounts", "utf8").split("\n").map((l) => l.split(" ")[1]),
    );
  } catch {
    return new Set();
  }
}

/**
 * The shell commands that mount the 9p shares the VM has (after a restore they
 * are this task's folders). Tags come from sysfs and only known ones are used.
 */
function shareMounts() {
  const base = "/sys/bus/virtio/drivers/9pnet_virtio";
  let names = [];
  try {
    names = fs.readdirSync(base).filter((n) => n.startsWith("virtio"));
  } catch {
    return [];
  }
  const mounted = mountedDirs();
  const cmds = [];
  for (const n of names) {
    let tag;
    try {
      tag = fs.readFileSync(path.join(base, n, "mount_tag"), "utf8").replace(/\0/g, "").trim();
    } catch {
      continue;
    }
    const dir = Object.hasOwn(SHARES, tag) ? SHARES[tag] : null;
    if (!dir || mounted.has(dir)) continue;
    fs.mkdirSync(dir, { recursive: true });
    let opts = "trans=virtio,version=9p2000.L,msize=512000,cache=none";
    if (tag === "pwup") opts += ",ro";
    cmds.push(`{ mount -t 9p -o ${opts} ${tag} ${dir} || echo "mount ${tag} failed" >&2; } &`);
  }
  return cmds;
}

/** Wall-clock time is stale after a restore: the command that takes the host's. */
function clockCommand(epochSeconds) {
  const t = Number(epochSeconds);
  if (!Number.isFinite(t) || t <= 0) return null;
  const d = new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
  return `{ date -u -s '${d}' > /dev/null || echo "date -s failed" >&2; } &`;
}

// A shell started with the supervisor, so it is already there in a saved VM:
// a task's clock and mounts run in it. Starting a process from here is a fork
// of this Node process, which under TCG costs tens of milliseconds on the
// warm start's path; the shell's own children (mount, date) are small.
const PREPARED = "__piwork_prepared__";
let helperShell = null; // {child, waiting, text}

function startHelperShell() {
  let child;
  try {
    child = spawn("/bin/busybox", ["sh"], { cwd: "/", stdio: ["pipe", "pipe", "ignore"] });
  } catch (err) {
    log(`no helper shell: ${err.message}`);
    return;
  }
  const shell = { child, waiting: null, text: [] };
  const answer = (text) => {
    const w = shell.waiting;
    shell.waiting = null;
    if (w) w(text);
  };
  const split = new LineSplitter((line) => {
    const text = line.toString("utf8");
    if (text === PREPARED) {
      answer(shell.text.join("\n"));
      shell.text = [];
    } else if (shell.text.length < 50) {
      shell.text.push(text.slice(0, 300));
    }
  });
  child.stdout.on("data", (c) => split.push(c));
  child.stdin.on("error", () => {});
  child.on("error", () => {});
  child.on("close", () => {
    if (helperShell === shell) helperShell = null;
    answer(null);
  });
  helperShell = shell;
}

/**
 * Set the clock and mount the shares in one shell, all at once (each 9p mount
 * waits on a round trip to QEMU's 9p server), then call `done`. In the helper
 * shell if it is there and idle, else in a new one (waited for).
 */
function prepareTask(msg, done) {
  const cmds = [];
  const clock = msg.clock ? clockCommand(msg.clock) : null;
  if (clock) cmds.push(clock);
  if (msg.mount === true) cmds.push(...shareMounts());
  if (!cmds.length) return done();
  cmds.push("wait");
  const said = (err) => {
    if (err) log(`preparing the task: ${err.slice(0, 500)}`);
  };
  const shell = helperShell;
  if (shell && !shell.waiting) {
    const timer = setTimeout(() => {
      log("the helper shell did not finish preparing the task within 30 s");
      shell.child.kill("SIGKILL"); // its close answers null: prepared again below
    }, 30000);
    shell.waiting = (text) => {
      clearTimeout(timer);
      if (text === null) return prepareInNewShell(cmds, said, done);
      said(text.trim());
      done();
    };
    shell.child.stdin.write(`{\n${cmds.join("\n")}\n} 2>&1\necho ${PREPARED}\n`);
    return;
  }
  prepareInNewShell(cmds, said, done);
}

function prepareInNewShell(cmds, said, done) {
  const r = spawnSync("/bin/busybox", ["sh", "-c", cmds.join("\n")], { stdio: ["ignore", "ignore", "pipe"] });
  said(r.error ? r.error.message : (r.stderr || "").toString().trim());
  done();
}

/**
 * Build the workbench root in the background while pi starts: pi needs it only
 * at its first bash call, and the bash wrapper waits for setup's "ready" mark.
 * `mode` is "disk" (the host hot-plugged the task's environment disk), "image"
 * (that disk and an imported image to use instead of the pack's Debian one) or
 * "tmpfs" (no disk: installs last until power-off). A pack without the
 * workbench image has no setup script: nothing to do.
 */
function startWorkbench(mode) {
  if (!fs.existsSync(WORKBENCH_SETUP)) return;
  const t0 = Date.now();
  try {
    fs.mkdirSync(WORKBENCH_DIR, { recursive: true });
    fs.writeFileSync(path.join(WORKBENCH_DIR, "started"), "");
  } catch (err) {
    outbox.event({ ev: "workbench", ok: false, error: `cannot start: ${err.message}` });
    return;
  }
  setImmediate(() => spawnWorkbench(mode, t0));
}

function spawnWorkbench(mode, t0) {
  let child;
  try {
    const arg = mode === "disk" || mode === "image" ? mode : "tmpfs";
    child = spawn("/bin/busybox", ["sh", WORKBENCH_SETUP, arg], {
      cwd: "/",
      stdio: ["ignore", "ignore", "pipe"],
    });
    // Niced (its children inherit it): pi's own start, the task's first reply,
    // comes first on the guest's CPUs.
    try {
      os.setPriority(child.pid, 10);
    } catch {
      /* runs at normal priority */
    }
  } catch (err) {
    outbox.event({ ev: "workbench", ok: false, error: `cannot start: ${err.message}` });
    return;
  }
  let stderr = "";
  child.stderr.on("data", (c) => {
    if (stderr.length < 4000) stderr += c.toString("utf8");
  });
  child.on("error", (err) => outbox.event({ ev: "workbench", ok: false, error: err.message }));
  child.on("close", (code) => {
    let error = null;
    if (code !== 0) {
      try {
        error = fs.readFileSync(path.join(WORKBENCH_DIR, "error"), "utf8").trim();
      } catch {
        error = stderr.trim().slice(-500) || `setup exited with ${code}`;
      }
    }
    outbox.event({ ev: "workbench", ok: code === 0, mode, ms: Date.now() - t0, error });
  });
}

/** pi's arguments from a start op. */
function taskArgv(msg) {
  return Array.isArray(msg.argv) ? msg.argv.map(String) : [];
}

/** Whether a preloaded launcher's process is still there (not exited, not killed). */
function launcherAlive(entry) {
  return entry.child.exitCode === null && entry.child.signalCode === null;
}

function startPi(msg) {
  if (pi || heldLines) {
    outbox.event({ ev: "error", message: pi ? `pi is already running (pid ${pi.pid})` : "pi is starting" });
    return;
  }
  heldLines = []; // lines for pi wait until it has the task's env and cwd
  // performance.now(), not Date.now(): prepareTask sets the wall clock.
  const t0 = performance.now();
  // A primed pi takes the task's env now, while the folders are mounted (its cwd
  // after: a directory entered before its mount would stay the one beneath).
  if (preloaded && preloaded.primed && msg.bind === true && launcherAlive(preloaded)) {
    preloaded.ctl.write(`${JSON.stringify({ op: "bind", argv: taskArgv(msg), env: childEnv(msg.env) })}\n`);
  }
  prepareTask(msg, () => launchPi(msg, t0));
}

/** startPi, once the task's clock and mounts are in place. */
function launchPi(msg, t0) {
  const tPrepared = performance.now();
  const cannot = (message) => {
    heldLines = null;
    outbox.event({ ev: "error", message });
  };
  const argv = taskArgv(msg);
  const env = childEnv(msg.env);
  const cwd = typeof msg.cwd === "string" && msg.cwd ? msg.cwd : "/root";
  try {
    fs.mkdirSync(cwd, { recursive: true });
  } catch {
    /* spawn reports the real problem */
  }
  let entry = preloaded;
  preloaded = null;
  if (entry && entry.primed && msg.bind !== true) {
    // A primed pi has run main() with the prime's arguments; this start wants its own.
    killGroup(entry.child);
    entry = null;
  }
  if (!entry || !launcherAlive(entry)) {
    try {
      entry = spawnLauncher();
    } catch (err) {
      cannot(`cannot start pi: ${err.message}`);
      return;
    }
  }
  let child;
  let bindTimer = null;
  const primed = Boolean(entry && entry.primed);
  if (primed) {
    child = entry.child;
    bindTimer = setTimeout(() => {
      log("the primed pi did not bind within 30 s");
      killGroup(child);
    }, 30000);
    entry.onBound = () => {
      clearTimeout(bindTimer);
      begin(true);
    };
    // Still primed and alive here means startPi sent it the task's "bind" (env).
    entry.ctl.write(`${JSON.stringify({ op: "cwd", cwd })}\n`);
  } else if (entry) {
    child = entry.child;
    entry.ctl.write(`${JSON.stringify({ op: "go", argv, env, cwd })}\n`);
  } else {
    try {
      child = spawn(NODE, [...NODE_FLAGS, PI_CLI, ...argv], {
        cwd,
        env,
        stdio: ["pipe", "pipe", "pipe"],
        detached: true, // own process group: stop kills pi and its tools together
      });
    } catch (err) {
      cannot(`cannot start pi: ${err.message}`);
      return;
    }
  }
  pi = child;
  const tGo = performance.now();
  let reported = false;
  // Where a start's time goes, for `piwork bench`: the first line pi writes
  // (its reply to the host's first request) is timed from the "start" op.
  let firstLine = true;
  const out = new LineSplitter((line) => {
    if (firstLine) {
      firstLine = false;
      outbox.event({ ev: "first-output", ms: Math.round(performance.now() - t0) });
    }
    outbox.add(line);
  });
  const errSplit = new LineSplitter((line) => {
    const text = line.toString("utf8");
    outbox.event({ ev: "stderr", text });
    log(`pi: ${text.slice(0, 500)}`);
  });
  child.on("error", (err) => {
    if (!reported) {
      reported = true;
      outbox.event({ ev: "error", message: `pi failed: ${err.message}` });
      if (pi === child) {
        pi = null;
        heldLines = null;
        ports.stop();
      }
    }
  });
  child.on("close", (code, signal) => {
    clearTimeout(bindTimer);
    out.flush();
    errSplit.flush();
    if (pi === child) {
      pi = null;
      heldLines = null;
      ports.stop();
    }
    if (!reported) {
      reported = true;
      outbox.event({ ev: "exit", code, signal });
    }
  });
  // An EPIPE on pi's stdin after pi died must not kill the supervisor.
  child.stdin.on("error", (err) => log(`pi stdin: ${err.message}`));

  /** pi runs for this task: its output flows to the host, and the host hears "started". */
  function begin(isPrimed) {
    // After "go": pi's start is not delayed by spawning the setup. The bash
    // wrapper's "started" mark is written in this tick, before pi can run a
    // command; the spawn (a fork of this process) waits until "started" is out.
    // "image": an imported image (piwork env import) was hot-plugged too, as the lower layer.
    if (["disk", "image", "tmpfs"].includes(msg.workbench)) startWorkbench(msg.workbench);
    child.stdout.on("data", (c) => out.push(c));
    child.stderr.on("data", (c) => errSplit.push(c));
    child.stdout.resume(); // a primed pi's streams were paused after the prime
    child.stderr.resume();
    const ms = {
      prepare: Math.round(tPrepared - t0),
      go: Math.round(tGo - tPrepared),
      ...(isPrimed ? { bind: Math.round(performance.now() - tGo) } : {}),
    };
    if (entry) outbox.event({ ev: "started", pid: child.pid, preloaded: entry.loaded, primed: isPrimed, ms });
    else child.on("spawn", () => outbox.event({ ev: "started", pid: child.pid, ms }));
    ports.start();
    const held = heldLines || [];
    heldLines = null;
    for (const line of held) child.stdin.write(Buffer.concat([line, Buffer.from("\n")]));
  }
  if (!primed) begin(false);
}

function signalPi(sig) {
  if (!pi) return false;
  const name = typeof sig === "string" && sig ? `SIG${sig.replace(/^SIG/, "")}` : "SIGTERM";
  try {
    process.kill(-pi.pid, name); // the whole group: pi and the tools it spawned
  } catch {
    try {
      pi.kill(name);
    } catch {
      return false;
    }
  }
  return true;
}

function waitPiExit(ms) {
  return new Promise((resolve) => {
    if (!pi) return resolve(true);
    const child = pi;
    const timer = setTimeout(() => resolve(false), ms);
    child.once("close", () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

async function powerOff() {
  outbox.event({ ev: "poweroff" });
  if (pi) {
    signalPi("TERM");
    if (!(await waitPiExit(3000))) signalPi("KILL");
  }
  await new Promise((r) => setTimeout(r, 200)); // let the event reach the host
  spawnSync("/bin/sync");
  if (process.env.PIWORK_NO_POWEROFF) process.exit(0); // host-side tests
  // busybox links poweroff in /sbin, not /bin; calling it through busybox
  // works whatever the links. If this fails the host waits ~15 s, then quits QEMU.
  const off = spawnSync("/bin/busybox", ["poweroff", "-f"]);
  if (off.error || off.status !== 0) process.stderr.write(`piwork-supervisor: poweroff failed: ${off.error ?? off.status}\n`);
}

function readUptime() {
  try {
    return Number(fs.readFileSync("/proc/uptime", "utf8").split(" ")[0]);
  } catch {
    return null;
  }
}

function readMemAvailableKb() {
  try {
    const m = /MemAvailable:\s+(\d+)/.exec(fs.readFileSync("/proc/meminfo", "utf8"));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- inbound

// /init loads the kernel modules while this process starts, and touches this
// mark when done (vm-image/init). Mounting the 9p shares needs 9pnet_virtio:
// a "start" that arrives before the mark waits for it (a cold boot only; a
// saved VM has long had its modules). Unset (host-side tests): no wait.
const MODULES_MARK = process.env.PIWORK_MODULES_MARK || "";
const MODULES_WAIT_MS = 60000;
let waitingForModules = null; // {starts, lines}: what arrived while a start waited

function whenModulesLoaded(fn) {
  if (waitingForModules) {
    waitingForModules.starts.push(fn); // runs after the first (and hears "already running")
    return;
  }
  if (!MODULES_MARK || fs.existsSync(MODULES_MARK)) {
    fn();
    return;
  }
  const waiting = { starts: [fn], lines: [] };
  waitingForModules = waiting;
  const t0 = Date.now();
  const poll = () => {
    const loaded = fs.existsSync(MODULES_MARK);
    if (!loaded && Date.now() - t0 < MODULES_WAIT_MS) {
      setTimeout(poll, 20);
      return;
    }
    if (!loaded) log(`no ${MODULES_MARK} after ${MODULES_WAIT_MS} ms; starting pi anyway`);
    waitingForModules = null;
    for (const f of waiting.starts) f();
    for (const line of waiting.lines) handleInboundLine(line);
  };
  poll();
}

function handleControl(text) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch (err) {
    outbox.event({ ev: "error", message: `bad supervisor command: ${err.message}` });
    return;
  }
  switch (msg.op) {
    case "hello":
      outbox.addTransient({
        ev: "hello",
        bootId: BOOT_ID,
        lastSeq: outbox.lastSeq,
        pi: { running: Boolean(pi), pid: pi ? pi.pid : null },
        preloaded: Boolean(preloaded && preloaded.loaded),
        primed: Boolean(preloaded && preloaded.primed),
        version: VERSION,
      });
      outbox.replayAfter(Number(msg.after) || 0);
      break;
    case "start":
      whenModulesLoaded(() => startPi(msg));
      break;
    case "prime":
      primePi(msg);
      break;
    case "stop":
      if (!signalPi(msg.signal)) outbox.event({ ev: "error", message: "pi is not running" });
      break;
    case "ping":
      outbox.addTransient({
        ev: "pong",
        id: msg.id ?? null,
        uptime: readUptime(),
        memAvailableKb: readMemAvailableKb(),
      });
      break;
    case "poweroff":
      powerOff();
      break;
    default:
      outbox.event({ ev: "error", message: `unknown supervisor op: ${msg.op}` });
  }
}

function handleInboundLine(line) {
  if (line.length === 0) return;
  if (line[0] === 0x21 /* ! */) {
    handleControl(line.subarray(1).toString("utf8"));
    return;
  }
  if (waitingForModules) {
    // A start waits for /init's modules: what follows it is for that pi.
    waitingForModules.lines.push(Buffer.from(line));
    return;
  }
  if (heldLines) {
    heldLines.push(Buffer.from(line)); // pi gets them once it has the task's env and cwd
    return;
  }
  if (!pi) {
    outbox.event({ ev: "error", message: "pi is not running; a line for pi was dropped" });
    return;
  }
  pi.stdin.write(Buffer.concat([line, Buffer.from("\n")]));
}

// ---------------------------------------------------------------- transports

async function runVirtio() {
  const dev = await serial.waitForPort(PORT_NAME);
  if (!dev) throw new Error(`no virtio-serial port named ${PORT_NAME}`);
  // The port can be open only once: one read-write descriptor for both ways.
  const fd = fs.openSync(dev, "r+");
  const splitter = new LineSplitter(handleInboundLine);

  // A read of 0 means "no host connected": keep pi running and wait for one.
  const reader = () =>
    serial.readLoop(
      fd,
      "port",
      log,
      (chunk) => splitter.push(chunk),
      async () => {
        splitter.flush();
        await serial.sleep(50);
      },
    );

  const writer = async () => {
    for (;;) {
      const chunk = outbox.next();
      if (!chunk) {
        await outbox.waitForData();
        continue;
      }
      // Blocks in the kernel while no host is connected; that is fine,
      // lines keep accumulating in the ring and are replayed on hello.
      await serial.writeAll(fd, chunk, "port", log);
    }
  };
  log(`channel virtio ${dev}`);
  await Promise.all([reader(), writer()]);
}

// TCP transport: the first line of every connection must be "auth <secret>",
// the per-run secret the host put in fw_cfg (a 0600 file on the host; never on
// a command line). Anything else is closed without being read further, and an
// unauthenticated connection never displaces the host's. The secret is read
// when a connection needs it until it has been read once: /init loads
// qemu_fw_cfg (which makes the file) while the supervisor starts, and a
// supervisor that looked once, too early, would refuse the host for good.
const SECRET_FILE =
  process.env.PIWORK_SECRET_FILE || "/sys/firmware/qemu_fw_cfg/by_name/opt/piwork/secret/raw";
const AUTH_MAX_BYTES = 256;
const AUTH_TIMEOUT_MS = 10000;
const AUTH_MAX_PENDING = 8;

function readSecret() {
  try {
    const s = fs.readFileSync(SECRET_FILE, "utf8").trim();
    return s.length >= 16 ? Buffer.from(`auth ${s}`) : null;
  } catch {
    return null;
  }
}

function secretMatches(expected, line) {
  return (
    expected !== null && line.length === expected.length && crypto.timingSafeEqual(line, expected)
  );
}

async function runTcp(port, host) {
  let expected = readSecret();
  let said = false;
  const secret = () => {
    if (!expected) expected = readSecret();
    if (!expected && !said) {
      said = true;
      log(`tcp transport: no secret in ${SECRET_FILE} yet; connections are refused until it is there`);
    }
    return expected;
  };
  let current = null;
  let pending = 0;
  const adopt = (sock, rest) => {
    if (current) current.destroy();
    current = sock;
    outbox.notify();
    const splitter = new LineSplitter(handleInboundLine);
    sock.on("data", (c) => splitter.push(c));
    sock.on("close", () => {
      if (current === sock) current = null;
      outbox.notify();
    });
    if (rest.length) splitter.push(rest);
  };
  const server = net.createServer((sock) => {
    sock.on("error", () => {});
    if (pending >= AUTH_MAX_PENDING) {
      sock.destroy();
      return;
    }
    pending += 1;
    sock.setNoDelay(true);
    let head = Buffer.alloc(0);
    let done = false;
    const finish = (ok, rest) => {
      if (done) return;
      done = true;
      pending -= 1;
      clearTimeout(timer);
      sock.removeListener("data", onData);
      if (ok) adopt(sock, rest);
      else sock.destroy();
    };
    const timer = setTimeout(() => finish(false), AUTH_TIMEOUT_MS);
    const onData = (c) => {
      head = Buffer.concat([head, c]);
      const nl = head.indexOf(NL);
      if (nl < 0) {
        if (head.length > AUTH_MAX_BYTES) finish(false);
        return;
      }
      finish(secretMatches(secret(), head.subarray(0, nl)), head.subarray(nl + 1));
    };
    sock.on("data", onData);
    sock.on("close", () => finish(false));
  });
  await new Promise((res) => server.listen(port, host, res));
  log(`channel tcp ${host}:${port}`);
  for (;;) {
    if (!current) {
      await outbox.waitForData();
      continue;
    }
    const chunk = outbox.next();
    if (!chunk) {
      await outbox.waitForData();
      continue;
    }
    const sock = current;
    if (!sock.write(chunk)) await new Promise((r) => sock.once("drain", r).once("close", r));
  }
}

async function main() {
  process.on("SIGPIPE", () => {});
  process.on("uncaughtException", (err) => log(`uncaught: ${err.stack || err}`));
  // For `piwork bench`: node's start, and the supervisor's own up to here.
  const ms = { node: Math.round(NODE_START_MS), main: Math.round(performance.now() - NODE_START_MS) };
  outbox.event({ ev: "ready", bootId: BOOT_ID, ms });
  startHelperShell();
  if (!process.env.PIWORK_NO_PRELOAD) preload();
  if (!process.env.PIWORK_NO_NETMUX) {
    // A host-opened stream (a preview) connects to the guest's loopback, never to
    // a port below 1024 (the supervisor's own listeners, system services).
    const resolve = (port) => (port >= MIN_PORT ? { host: ports.hostFor(port), port } : null);
    netmux.run(log, { resolve }).catch((err) => log(`netmux: ${err.stack || err}`));
  }
  const transport = process.env.PIWORK_TRANSPORT || "virtio";
  if (transport === "tcp") {
    await runTcp(Number(process.env.PIWORK_PORT || 7000), process.env.PIWORK_LISTEN || "0.0.0.0");
  } else {
    await runVirtio();
  }
}

if (require.main === module) {
  main().catch((err) => {
    log(`fatal: ${err.stack || err}`);
    process.exit(1);
  });
}

module.exports = { LineSplitter, Outbox };
