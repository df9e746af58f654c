// The guest supervisor, run on the host with its TCP transport and a stand-in
// for pi. What must hold: lines are numbered and replayable after a
// reconnect, a host disconnect never closes pi's stdin, control ops work.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import crypto from "node:crypto";
import { PI_DIR } from "./fixtures/pi.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const SUPERVISOR = path.join(here, "..", "supervisor", "supervisor.js");
const FAKE_PI = path.join(here, "fixtures", "fake-pi.js");
// The real launcher, pi and extensions, for the tests that load pi.
const LAUNCHER = path.join(here, "..", "launcher", "launch.mjs");
const EXTENSIONS = path.join(here, "..", "extensions");
// pi in RPC mode with nothing of its own to load.
const BARE_RPC = ["--mode", "rpc", "--offline", "--no-session", "--no-extensions"];
const require = createRequire(import.meta.url);
const { LineSplitter, Outbox } = require(SUPERVISOR);

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// The TCP transport's per-run secret, as the host hands it over (fw_cfg in the VM).
const SECRET = crypto.randomBytes(24).toString("hex");
const SECRET_DIR = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-secret-"));
const SECRET_FILE = path.join(SECRET_DIR, "secret");
fs.writeFileSync(SECRET_FILE, SECRET, { mode: 0o600 });
process.on("exit", () => fs.rmSync(SECRET_DIR, { recursive: true, force: true }));

test("a snapshot blob node cannot restore costs only speed: pi starts from its cli", async (t) => {
  const os = await import("node:os");
  const fs = await import("node:fs");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-blob-"));
  const blob = path.join(tmp, "pi.blob");
  fs.writeFileSync(blob, Buffer.alloc(4096, 0x5a)); // damaged: not a snapshot at all
  const { proc, port } = await startSupervisor({
    PIWORK_LAUNCHER: LAUNCHER,
    PIWORK_PI_DIR: PI_DIR,
    PIWORK_EXTENSIONS_DIR: EXTENSIONS,
    PIWORK_SNAPSHOT_BLOB: blob,
  });
  t.after(() => {
    proc.kill("SIGKILL");
    fs.rmSync(tmp, { recursive: true, force: true });
  });
  const c = await connect(port);
  c.send('!{"op":"hello","after":0}');
  await c.waitFor(ev("ready"));
  await new Promise((r) => setTimeout(r, 1000)); // the launcher's node has failed by now
  const argv = JSON.stringify(BARE_RPC);
  c.send(`!{"op":"start","argv":${argv},"env":{"HOME":"${tmp}"},"cwd":"${tmp}"}`);
  const started = JSON.parse((await c.waitFor(ev("started"), 30000)).payload.slice(1));
  assert.equal(started.preloaded, false);
  c.send('{"type":"get_state","id":"1"}');
  // The start's launcher loaded the real pi itself (the blob's had died first).
  const reply = await c.waitFor(piLine((o) => o.type === "response" && o.id === "1"), 60000);
  assert.equal(JSON.parse(reply.payload).success, true);
  const loaded = c.lines.filter(ev("preloaded")).map((l) => JSON.parse(l.payload.slice(1)));
  assert.ok(loaded.length === 1 && loaded[0].snapshot === null, JSON.stringify(loaded));
  c.close();
});

async function startSupervisor(extraEnv = {}) {
  const port = await freePort();
  const proc = spawn(process.execPath, [SUPERVISOR], {
    env: {
      ...process.env,
      PIWORK_TRANSPORT: "tcp",
      PIWORK_PORT: String(port),
      PIWORK_LISTEN: "127.0.0.1",
      PIWORK_PI_CLI: FAKE_PI,
      PIWORK_NO_POWEROFF: "1",
      PIWORK_NO_NETMUX: "1",
      PIWORK_SECRET_FILE: SECRET_FILE,
      ...extraEnv,
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  for (let i = 0; i < 100; i++) {
    try {
      const c = await connect(port);
      c.close();
      return { proc, port };
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new Error("supervisor did not listen");
}

/** A host-side connection that parses "<seq> <payload>" lines. */
function connect(port, auth = `auth ${SECRET}`) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, "127.0.0.1");
    if (auth !== null) sock.write(`${auth}\n`);
    let closed = false;
    sock.on("close", () => {
      closed = true;
    });
    const lines = [];
    const waiters = [];
    const split = new LineSplitter((buf) => {
      const text = buf.toString("utf8");
      const sp = text.indexOf(" ");
      const item = { seq: Number(text.slice(0, sp)), payload: text.slice(sp + 1) };
      lines.push(item);
      for (const w of [...waiters]) w();
    });
    sock.on("data", (c) => split.push(c));
    sock.once("error", reject);
    sock.once("connect", () =>
      resolve({
        lines,
        send: (s) => sock.write(s + "\n"),
        close: () => sock.destroy(),
        get closed() {
          return closed;
        },
        async waitFor(pred, ms = 5000) {
          const deadline = Date.now() + ms;
          for (;;) {
            const hit = lines.find(pred);
            if (hit) return hit;
            if (Date.now() > deadline) {
              throw new Error(`timed out; got ${JSON.stringify(lines)}`);
            }
            await new Promise((r) => {
              waiters.push(r);
              setTimeout(r, 50);
            });
          }
        },
      }),
    );
  });
}

const ev = (name) => (l) => l.payload.startsWith("!") && JSON.parse(l.payload.slice(1)).ev === name;
const piLine = (pred) => (l) => l.payload.startsWith("{") && pred(JSON.parse(l.payload));

test("LineSplitter splits on \\n only and keeps U+2028 inside a line", () => {
  const got = [];
  const s = new LineSplitter((b) => got.push(b.toString("utf8")));
  s.push(Buffer.from('{"a":"x\u2028y"}\r\n{"b"'));
  s.push(Buffer.from(':1}\n'));
  assert.deepEqual(got, ['{"a":"x\u2028y"}', '{"b":1}']);
});

test("Outbox keeps at most its byte limit and reports a gap on replay", () => {
  const box = new Outbox(100);
  for (let i = 0; i < 20; i++) box.add(Buffer.from(`{"n":${i}}`));
  assert.ok(box.bytes <= 100);
  box.replayAfter(0);
  const gap = JSON.parse(box.next().toString().slice(3));
  assert.equal(gap.ev, "gap");
  assert.equal(gap.from, 1);
  assert.equal(box.next().toString().split(" ")[0], String(box.firstHeld()));
});

test("hello, start, echo, replay after reconnect, stdin never closed", async (t) => {
  const { proc, port } = await startSupervisor();
  t.after(() => proc.kill("SIGKILL"));

  const a = await connect(port);
  a.send('!{"op":"hello","after":0}');
  const hello = await a.waitFor(ev("hello"));
  assert.equal(hello.seq, 0);
  await a.waitFor(ev("ready"));
  a.send(`!{"op":"start","argv":["--mode","rpc"],"env":{"X":"1"},"cwd":"/tmp"}`);
  await a.waitFor(ev("started"));
  a.send('{"type":"get_state","id":"1"}');
  const echo = await a.waitFor(piLine((o) => o.type === "echo"));
  assert.deepEqual(JSON.parse(echo.payload).argv, ["--mode", "rpc"]);
  const lastSeen = echo.seq;
  a.close(); // the host goes away

  await new Promise((r) => setTimeout(r, 200));
  const b = await connect(port);
  b.send('{"type":"after-reconnect"}'); // pi must still be there to answer
  b.send(`!{"op":"hello","after":${lastSeen}}`);
  const reply = await b.waitFor(piLine((o) => o.line === '{"type":"after-reconnect"}'));
  assert.ok(reply.seq > lastSeen);
  const numbered = b.lines.filter((l) => l.seq > 0);
  // Nothing at or below lastSeen is replayed after hello, and nothing is skipped.
  const afterHello = numbered.slice(numbered.findIndex((l) => l.seq === lastSeen + 1));
  afterHello.forEach((l, i) => assert.equal(l.seq, lastSeen + 1 + i));
  assert.ok(!b.lines.some(piLine((o) => o.type === "stdin_eof")), "pi saw EOF on stdin");
  b.close();
});

test("ping answers with uptime fields; stop reports pi's exit", async (t) => {
  const { proc, port } = await startSupervisor();
  t.after(() => proc.kill("SIGKILL"));
  const c = await connect(port);
  c.send('!{"op":"hello","after":0}');
  c.send('!{"op":"ping","id":7}');
  const pong = JSON.parse((await c.waitFor(ev("pong"))).payload.slice(1));
  assert.equal(pong.id, 7);
  assert.ok("uptime" in pong && "memAvailableKb" in pong);
  c.send('!{"op":"start","argv":[]}');
  await c.waitFor(ev("started"));
  c.send('!{"op":"stop"}');
  const exit = JSON.parse((await c.waitFor(ev("exit"))).payload.slice(1));
  assert.equal(exit.signal, "SIGTERM");
  c.send('{"type":"late"}');
  await c.waitFor((l) => ev("error")(l) && l.payload.includes("not running"));
  c.close();
});

test("a start waits for /init's modules mark; lines sent meanwhile reach that pi in order", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-mods-"));
  const mark = path.join(dir, "modules-loaded");
  const { proc, port } = await startSupervisor({ PIWORK_MODULES_MARK: mark });
  t.after(() => {
    proc.kill("SIGKILL");
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const c = await connect(port);
  c.send('!{"op":"hello","after":0}');
  c.send('!{"op":"start","argv":[]}');
  c.send('{"n":1}');
  c.send('{"n":2}');
  await new Promise((r) => setTimeout(r, 400));
  assert.ok(!c.lines.some(ev("started")), "pi started before the modules were loaded");
  assert.ok(!c.lines.some(ev("error")), "a line for the waiting pi was dropped");
  fs.writeFileSync(mark, "");
  const started = JSON.parse((await c.waitFor(ev("started"))).payload.slice(1));
  // Where the start went, for `piwork bench`: plain numbers of milliseconds.
  assert.ok(Number.isInteger(started.ms.prepare) && Number.isInteger(started.ms.go));
  const echoes = [];
  for (const n of [1, 2]) {
    echoes.push(await c.waitFor(piLine((o) => o.line === `{"n":${n}}`)));
  }
  assert.ok(echoes[0].seq < echoes[1].seq);
  // The first line pi wrote is announced, numbered just before it.
  const first = await c.waitFor(ev("first-output"));
  assert.equal(first.seq, echoes[0].seq - 1);
  assert.ok(Number.isInteger(JSON.parse(first.payload.slice(1)).ms));
  c.close();
});

test("a second start while pi runs is refused; bad control lines are reported", async (t) => {
  const { proc, port } = await startSupervisor();
  t.after(() => proc.kill("SIGKILL"));
  const c = await connect(port);
  c.send('!{"op":"hello","after":0}');
  c.send('!{"op":"start","argv":[]}');
  await c.waitFor(ev("started"));
  c.send('!{"op":"start","argv":[]}');
  await c.waitFor((l) => ev("error")(l) && l.payload.includes("already running"));
  c.send("!{not json");
  await c.waitFor((l) => ev("error")(l) && l.payload.includes("bad supervisor command"));
  c.send('!{"op":"poweroff"}');
  await c.waitFor(ev("poweroff"));
  const code = await new Promise((r) => proc.once("exit", r));
  assert.equal(code, 0);
  c.close();
});

test("the launcher loads the real pi before start, then runs it with the task's argv, env and cwd", async () => {
  const os = await import("node:os");
  const fs = await import("node:fs");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-launcher-"));
  const { proc, port } = await startSupervisor({
    PIWORK_LAUNCHER: LAUNCHER,
    PIWORK_PI_DIR: PI_DIR,
    PIWORK_EXTENSIONS_DIR: EXTENSIONS,
  });
  try {
    const c = await connect(port);
    c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
    await c.waitFor(ev("preloaded"), 60000); // pi is loaded; no task is known yet
    const cwd = path.join(tmp, "work");
    const env = { HOME: tmp, PI_CODING_AGENT_DIR: path.join(tmp, "agent"), TASK_MARK: "t1" };
    const argv = BARE_RPC;
    c.send(`!${JSON.stringify({ op: "start", argv, env, cwd })}`);
    const started = JSON.parse((await c.waitFor(ev("started"))).payload.slice(1));
    assert.equal(started.preloaded, true);
    c.send(JSON.stringify({ id: "s1", type: "bash", command: "pwd; echo $TASK_MARK" }));
    const reply = await c.waitFor(piLine((o) => o.type === "response" && o.id === "s1"), 30000);
    const out = JSON.parse(reply.payload).data.output.trim().split("\n");
    assert.deepEqual(out, [cwd, "t1"]);
    c.close();
  } finally {
    proc.kill();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("tcp transport: without the run's secret a connection is closed and cannot drive pi", async (t) => {
  const { proc, port } = await startSupervisor();
  t.after(() => proc.kill("SIGKILL"));
  const good = await connect(port);
  good.send('!{"op":"hello","after":0}');
  await good.waitFor(ev("hello"));
  const tries = {
    none: await connect(port, null),
    wrong: await connect(port, `auth ${crypto.randomBytes(24).toString("hex")}`),
    prefix: await connect(port, `auth ${SECRET.slice(0, -1)}`),
    opFirst: await connect(port, '!{"op":"hello","after":0}'),
  };
  for (const [name, c] of Object.entries(tries)) {
    c.send('!{"op":"hello","after":0}');
    c.send('!{"op":"start","argv":[]}');
    c.send('!{"op":"ping","id":99}');
  }
  await new Promise((r) => setTimeout(r, 500));
  for (const [name, c] of Object.entries(tries)) {
    if (name !== "none") assert.ok(c.closed, `${name}: still open`);
    assert.deepEqual(c.lines, [], `${name} got lines`);
  }
  // No op of theirs reached the supervisor: pi was never started, and the host's
  // own connection is still the current one.
  good.send('!{"op":"ping","id":1}');
  await good.waitFor(ev("pong"));
  assert.ok(!good.lines.some(ev("started")), "an unauthenticated start ran pi");
  tries.none.close();
  // A silent connection is closed after the auth timeout (not waited for here);
  // a long first line is closed at once.
  const long = await connect(port, "x".repeat(400));
  await new Promise((r) => setTimeout(r, 300));
  assert.ok(long.closed);
  good.close();
});

test("tcp transport: with no secret available every connection is refused, until it appears", async (t) => {
  const late = path.join(SECRET_DIR, "late");
  const { proc, port } = await startSupervisor({ PIWORK_SECRET_FILE: late });
  t.after(() => proc.kill("SIGKILL"));
  for (const auth of ["auth ", `auth ${SECRET}`]) {
    const c = await connect(port, auth);
    c.send('!{"op":"hello","after":0}');
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(c.closed, auth);
    assert.deepEqual(c.lines, []);
  }
  // In the guest the file is fw_cfg's, there once /init has loaded qemu_fw_cfg, which
  // may be after the supervisor started listening: the host's connection then works.
  fs.writeFileSync(late, SECRET, { mode: 0o600 });
  const host = await connect(port);
  host.send('!{"op":"hello","after":0}');
  await host.waitFor(ev("hello"));
  assert.ok(!host.closed);
  host.close();
  const wrong = await connect(port, "auth ");
  wrong.send('!{"op":"hello","after":0}');
  await new Promise((r) => setTimeout(r, 300));
  assert.ok(wrong.closed);
  assert.deepEqual(wrong.lines, []);
});

test("start with workbench runs the setup beside pi and reports its result", async (t) => {
  // A stand-in setup script: records its mode; fails (writing the reason) when told to.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-wb-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const setup = path.join(dir, "setup.sh");
  fs.writeFileSync(
    setup,
    `echo "$1" > "${dir}/mode"\n[ -e "${dir}/fail" ] && { echo "no disk" > "${dir}/error"; exit 1; }\nexit 0\n`,
  );
  for (const [mode, fail] of [["disk", false], ["tmpfs", true]]) {
    if (fail) fs.writeFileSync(path.join(dir, "fail"), "");
    const { proc, port } = await startSupervisor({
      PIWORK_WORKBENCH_SETUP: setup,
      PIWORK_WORKBENCH_DIR: dir,
    });
    t.after(() => proc.kill("SIGKILL"));
    const c = await connect(port);
    c.send('!{"op":"hello","after":0}');
    c.send(`!{"op":"start","argv":[],"workbench":"${mode}"}`);
    await c.waitFor(ev("started"));
    const done = JSON.parse((await c.waitFor(ev("workbench"))).payload.slice(1));
    assert.equal(done.ok, !fail);
    assert.equal(done.mode, mode);
    assert.equal(done.error, fail ? "no disk" : null);
    assert.equal(fs.readFileSync(path.join(dir, "mode"), "utf8").trim(), mode);
    assert.ok(fs.existsSync(path.join(dir, "started"))); // the bash wrapper waits on setup
    c.close();
    proc.kill("SIGKILL");
  }
});

test("start without workbench runs no setup", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-wb-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const setup = path.join(dir, "setup.sh");
  fs.writeFileSync(setup, `touch "${dir}/ran"\n`);
  const { proc, port } = await startSupervisor({ PIWORK_WORKBENCH_SETUP: setup, PIWORK_WORKBENCH_DIR: dir });
  t.after(() => proc.kill("SIGKILL"));
  const c = await connect(port);
  c.send('!{"op":"hello","after":0}');
  c.send('!{"op":"start","argv":[]}');
  await c.waitFor(ev("started"));
  await new Promise((r) => setTimeout(r, 300));
  assert.ok(!fs.existsSync(path.join(dir, "ran")) && !fs.existsSync(path.join(dir, "started")));
  c.close();
});

// A saved VM's pi is primed: main() has run with no task (a models.json naming
// a model nobody serves, an in-memory session). The restored VM binds it to the
// task: the task's env and cwd replace the prime's, and switch_session makes pi
// build its session, models and extensions again from them.
async function primedSupervisor(tmp) {
  const extDir = path.join(tmp, "extensions");
  fs.mkdirSync(extDir);
  // A precompiled extension (X.ts + X.mjs) whose factory records the env and cwd it ran with.
  fs.writeFileSync(path.join(extDir, "mark.ts"), "not TypeScript {{{\n");
  fs.writeFileSync(
    path.join(extDir, "mark.mjs"),
    'import fs from "node:fs";\n' +
      "export default function mark() {\n" +
      '  fs.appendFileSync(process.env.MARK_FILE, `${process.env.TASK_MARK} ${process.cwd()}\\n`);\n' +
      "}\n",
  );
  const { proc, port } = await startSupervisor({
    PIWORK_LAUNCHER: LAUNCHER,
    PIWORK_PI_DIR: PI_DIR,
    PIWORK_EXTENSIONS_DIR: extDir,
  });
  const c = await connect(port);
  c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
  await c.waitFor(ev("preloaded"), 60000);
  const agentDir = path.join(tmp, "state", "agent");
  const ext = path.join(extDir, "mark.ts");
  const models = (provider, model) =>
    JSON.stringify({
      providers: {
        [provider]: {
          baseUrl: "http://127.0.0.1:9/v1",
          api: "openai-completions",
          apiKey: "none",
          models: [{ id: model, name: model, contextWindow: 1000, maxTokens: 100, reasoning: false, input: ["text"] }],
        },
      },
    });
  const common = ["--mode", "rpc", "--offline", "--no-extensions", "-e", ext];
  c.send(
    `!${JSON.stringify({
      op: "prime",
      argv: [...common, "--no-session", "--provider", "piwork-idle", "--model", "idle"],
      env: { HOME: path.join(tmp, "prime-home"), PI_CODING_AGENT_DIR: agentDir, TASK_MARK: "prime", MARK_FILE: path.join(tmp, "marks") },
      cwd: path.join(tmp, "prime-cwd"),
      files: { "models.json": models("piwork-idle", "idle") },
    })}`,
  );
  const primed = JSON.parse((await c.waitFor(ev("primed"), 60000)).payload.slice(1));
  return { proc, c, primed, agentDir, common, models };
}

/** Run `body` with a primed supervisor in a fresh folder (see primedSupervisor), then clean up. */
async function withPrimed(body) {
  const tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "piwork-prime-")));
  const ctx = await primedSupervisor(tmp);
  try {
    assert.equal(ctx.primed.ok, true, JSON.stringify(ctx.primed));
    await body({ ...ctx, tmp });
  } finally {
    ctx.c.close();
    ctx.proc.kill();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** pi's response to the RPC command with this id, parsed. */
async function reply(c, id, ms = 30000) {
  return JSON.parse((await c.waitFor(piLine((o) => o.type === "response" && o.id === id), ms)).payload);
}

test("a primed pi is bound to the task: its env, cwd, session, model and extensions are the task's", () =>
  withPrimed(async ({ c, agentDir, common, models, tmp }) => {
    // What the task's mounted agent dir holds in the VM.
    fs.writeFileSync(path.join(agentDir, "models.json"), models("task", "m1"));
    const cwd = path.join(tmp, "work");
    fs.mkdirSync(cwd);
    const session = path.join(tmp, "state", "session.jsonl");
    const env = { HOME: path.join(tmp, "home"), PI_CODING_AGENT_DIR: agentDir, TASK_MARK: "t1", MARK_FILE: path.join(tmp, "marks") };
    const argv = [...common, "--session", session, "--provider", "task", "--model", "m1"];
    c.send(`!${JSON.stringify({ op: "start", argv, env, cwd, bind: true })}`);
    // Sent at once, before "started": held until pi has the task's env and cwd.
    c.send(JSON.stringify({ id: "sw", type: "switch_session", sessionPath: session }));
    const started = JSON.parse((await c.waitFor(ev("started"), 30000)).payload.slice(1));
    assert.equal(started.primed, true);
    const sw = await reply(c, "sw");
    assert.equal(sw.success, true, JSON.stringify(sw));
    c.send(JSON.stringify({ id: "b", type: "bash", command: "pwd; echo $TASK_MARK; echo $HOME" }));
    assert.deepEqual((await reply(c, "b")).data.output.trim().split("\n"), [cwd, "t1", env.HOME]);
    c.send(JSON.stringify({ id: "m", type: "set_model", provider: "task", modelId: "m1" }));
    const m = await reply(c, "m");
    assert.equal(m.success, true, JSON.stringify(m));
    c.send(JSON.stringify({ id: "st", type: "get_state" }));
    const st = await reply(c, "st");
    assert.equal(st.data.sessionFile, session);
    assert.equal(st.data.model.provider, "task");
    assert.equal(st.data.model.id, "m1");
    // The extension ran once for the prime and again, for the task, with the task's env and cwd.
    const marks = fs.readFileSync(path.join(tmp, "marks"), "utf8").trim().split("\n");
    assert.deepEqual(marks, [`prime ${path.join(tmp, "prime-cwd")}`, `t1 ${cwd}`]);
  }));

test("a start without bind never reuses a primed pi: a fresh one runs the task's argv", () =>
  withPrimed(async ({ c, tmp }) => {
    const cwd = path.join(tmp, "work");
    const env = { HOME: tmp, PI_CODING_AGENT_DIR: path.join(tmp, "agent2"), TASK_MARK: "t2", MARK_FILE: path.join(tmp, "marks") };
    c.send(`!${JSON.stringify({ op: "start", argv: BARE_RPC, env, cwd })}`);
    const started = JSON.parse((await c.waitFor(ev("started"), 30000)).payload.slice(1));
    assert.equal(started.primed, false);
    c.send(JSON.stringify({ id: "b", type: "bash", command: "pwd; echo $TASK_MARK" }));
    assert.deepEqual((await reply(c, "b", 60000)).data.output.trim().split("\n"), [cwd, "t2"]);
  }));

test("a prime that fails is said, and the VM can still start a task the ordinary way", async () => {
  const tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "piwork-prime-")));
  const { proc, port } = await startSupervisor({
    PIWORK_LAUNCHER: LAUNCHER,
    PIWORK_PI_DIR: PI_DIR,
    PIWORK_EXTENSIONS_DIR: path.join(tmp, "none"),
  });
  try {
    const c = await connect(port);
    c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
    await c.waitFor(ev("preloaded"), 60000);
    // A working directory that cannot be made (beneath a file): the launcher exits.
    fs.writeFileSync(path.join(tmp, "file"), "");
    const env = { HOME: tmp, PI_CODING_AGENT_DIR: path.join(tmp, "agent") };
    c.send(`!${JSON.stringify({ op: "prime", argv: BARE_RPC, env, cwd: path.join(tmp, "file", "cwd") })}`);
    const primed = JSON.parse((await c.waitFor(ev("primed"), 60000)).payload.slice(1));
    assert.equal(primed.ok, false);
    assert.match(primed.error, /exited while priming/);
    await c.waitFor(ev("preloaded"), 60000); // a new, unprimed pi is loaded
    c.send(`!${JSON.stringify({ op: "start", argv: BARE_RPC, env, cwd: tmp, bind: true })}`);
    const started = JSON.parse((await c.waitFor(ev("started"), 30000)).payload.slice(1));
    assert.equal(started.primed, false);
    c.close();
  } finally {
    proc.kill();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("a task bound without an extension the prime ran does not get it; one the prime lacked ends pi", async () => {
  for (const [extra, expectExit] of [[[], false], [["-e", "/nowhere/other.ts"], true]]) {
    await withPrimed(async ({ c, agentDir, models, tmp }) => {
      fs.writeFileSync(path.join(agentDir, "models.json"), models("task", "m1"));
      const cwd = path.join(tmp, "work");
      fs.mkdirSync(cwd);
      const session = path.join(tmp, "state", "session.jsonl");
      const env = { HOME: tmp, PI_CODING_AGENT_DIR: agentDir, TASK_MARK: "t1", MARK_FILE: path.join(tmp, "marks") };
      const argv = ["--mode", "rpc", "--offline", "--no-extensions", ...extra, "--session", session];
      c.send(`!${JSON.stringify({ op: "start", argv, env, cwd, bind: true })}`);
      if (expectExit) {
        const exit = JSON.parse((await c.waitFor(ev("exit"), 30000)).payload.slice(1));
        assert.equal(exit.code, 72);
        return;
      }
      c.send(JSON.stringify({ id: "sw", type: "switch_session", sessionPath: session }));
      const sw = await reply(c, "sw");
      assert.equal(sw.success, true, JSON.stringify(sw));
      const marks = fs.readFileSync(path.join(tmp, "marks"), "utf8").trim().split("\n");
      assert.deepEqual(marks, [`prime ${path.join(tmp, "prime-cwd")}`]); // not called for the task
    });
  }
});

// ------------------------------------------------------------ boot.sh
// /init starts pi's launcher at boot (runtime-pack/launcher/boot.sh), beside
// the supervisor, which adopts it through FIFOs: here with the host's sh, the
// real launcher and the real pi.
const BOOT_SH = path.join(here, "..", "launcher", "boot.sh");

async function bootLauncher(t) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "piwork-boot-"));
  const dir = path.join(tmp, "launcher");
  const env = {
    ...process.env,
    PIWORK_BOOT_LAUNCHER_DIR: dir,
    PIWORK_NODE: process.execPath,
    PIWORK_LAUNCHER: LAUNCHER,
    PIWORK_PI_DIR: PI_DIR,
    PIWORK_EXTENSIONS_DIR: EXTENSIONS,
    // the supervisor's own settings, which boot.sh must not hand the launcher
    PIWORK_TRANSPORT: "virtio",
    UV_THREADPOOL_SIZE: "8",
  };
  const r = spawnSync("/bin/sh", [BOOT_SH], { env, timeout: 30000, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const pid = Number(fs.readFileSync(path.join(dir, "pid"), "utf8"));
  // boot.sh returns once the pid is known, maybe before `env` and `setsid` have
  // exec'd node: until then the process has boot.sh's environment and group.
  const node = fs.realpathSync(process.execPath);
  const isNode = () => {
    try {
      return fs.readlinkSync(`/proc/${pid}/exe`) === node;
    } catch {
      return false;
    }
  };
  t.after(() => {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      /* gone */
    }
    fs.rmSync(tmp, { recursive: true, force: true });
  });
  await until(isNode, 15000, "boot.sh's launcher to be node");
  return { tmp, dir, pid, env: { PIWORK_BOOT_LAUNCHER_DIR: dir, PIWORK_LAUNCHER: LAUNCHER, PIWORK_PI_DIR: PI_DIR, PIWORK_EXTENSIONS_DIR: EXTENSIONS } };
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function until(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("boot.sh takes from the launcher's environment what the supervisor's childEnv takes", () => {
  const sup = fs.readFileSync(SUPERVISOR, "utf8");
  const body = sup.slice(sup.indexOf("function childEnv("), sup.indexOf("\n}\n", sup.indexOf("function childEnv(")));
  const removed = [...body.matchAll(/delete env\.([A-Z_]+);/g)].map((m) => m[1]).sort();
  const unset = [...fs.readFileSync(BOOT_SH, "utf8").matchAll(/-u ([A-Z_]+)/g)].map((m) => m[1]).sort();
  assert.ok(removed.length > 0);
  assert.deepEqual(unset, removed);
});

test("the launcher boot.sh started is adopted: pi runs through its FIFOs, and its end reaches the host", async (t) => {
  const boot = await bootLauncher(t);
  assert.ok(alive(boot.pid));
  // its environment is the one a spawned launcher gets
  const environ = fs.readFileSync(`/proc/${boot.pid}/environ`, "utf8").split("\0");
  assert.ok(environ.some((e) => e.startsWith("PIWORK_WARM_EXTENSIONS=") && e.includes("permission-gate.ts")), environ.join(" "));
  assert.ok(!environ.some((e) => /^(PIWORK_TRANSPORT|UV_THREADPOOL_SIZE)=/.test(e)), environ.join(" "));
  const { proc, port } = await startSupervisor(boot.env);
  t.after(() => proc.kill("SIGKILL"));
  const c = await connect(port);
  c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
  await c.waitFor(ev("preloaded"), 60000);
  assert.ok(fs.existsSync(path.join(boot.dir, "pid.adopted")), "not claimed");
  const cwd = path.join(boot.tmp, "work");
  const env = { HOME: boot.tmp, PI_CODING_AGENT_DIR: path.join(boot.tmp, "agent"), TASK_MARK: "t1" };
  const argv = BARE_RPC;
  c.send(`!${JSON.stringify({ op: "start", argv, env, cwd })}`);
  const started = JSON.parse((await c.waitFor(ev("started"))).payload.slice(1));
  assert.equal(started.pid, boot.pid, "the supervisor spawned its own launcher");
  assert.equal(started.preloaded, true);
  c.send(JSON.stringify({ id: "s1", type: "bash", command: "pwd; echo $TASK_MARK; echo oops >&2" }));
  const reply = await c.waitFor(piLine((o) => o.type === "response" && o.id === "s1"), 30000);
  assert.deepEqual(JSON.parse(reply.payload).data.output.trim().split("\n").slice(0, 2), [cwd, "t1"]);
  // stop: pi's group gets the signal; the exit the host hears is boot.sh's `wait` status
  c.send('!{"op":"stop","signal":"KILL"}');
  const exit = JSON.parse((await c.waitFor(ev("exit"), 15000)).payload.slice(1));
  assert.deepEqual([exit.code, exit.signal], [null, "SIGKILL"]);
  assert.equal(fs.readFileSync(path.join(boot.dir, "status"), "utf8").trim(), "137");
  assert.ok(!alive(boot.pid));
  // the next start spawns a launcher as before
  c.send(`!${JSON.stringify({ op: "start", argv, env, cwd })}`);
  const second = (l) => ev("started")(l) && c.lines.filter(ev("started"))[1] === l;
  const again = JSON.parse((await c.waitFor(second, 60000)).payload.slice(1));
  assert.notEqual(again.pid, boot.pid);
  c.close();
});

test("a boot launcher that dies before the start is seen as gone, and the start spawns one", async (t) => {
  const boot = await bootLauncher(t);
  const { proc, port } = await startSupervisor(boot.env);
  t.after(() => proc.kill("SIGKILL"));
  const c = await connect(port);
  c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
  await until(() => fs.existsSync(path.join(boot.dir, "pid.adopted")), 15000, "adoption");
  process.kill(-boot.pid, "SIGKILL"); // nobody reads its stdout yet: only looking can tell
  await until(() => fs.existsSync(path.join(boot.dir, "status")), 15000, "boot.sh's status");
  const cwd = path.join(boot.tmp, "work");
  const argv = BARE_RPC;
  await new Promise((r) => setTimeout(r, 600)); // the supervisor looks every 250 ms
  c.send(`!${JSON.stringify({ op: "start", argv, env: { HOME: boot.tmp }, cwd })}`);
  const started = JSON.parse((await c.waitFor(ev("started"), 60000)).payload.slice(1));
  assert.notEqual(started.pid, boot.pid);
  c.send(JSON.stringify({ id: "s2", type: "bash", command: "echo fine" }));
  const reply = await c.waitFor(piLine((o) => o.type === "response" && o.id === "s2"), 60000);
  assert.equal(JSON.parse(reply.payload).data.output.trim(), "fine");
  c.close();
});

test("a restarted supervisor does not adopt the boot's launcher again; with PIWORK_NO_PRELOAD it is stopped", async (t) => {
  const boot = await bootLauncher(t);
  const first = await startSupervisor(boot.env);
  await until(() => fs.existsSync(path.join(boot.dir, "pid.adopted")), 15000, "adoption");
  first.proc.kill("SIGKILL");
  // its stdin's only writer is gone: pi's launcher sees the end and exits
  await until(() => !alive(boot.pid), 30000, "the orphaned launcher to exit");
  const second = await startSupervisor(boot.env);
  t.after(() => second.proc.kill("SIGKILL"));
  const c = await connect(second.port);
  c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
  await c.waitFor(ev("preloaded"), 60000); // its own

  const other = await bootLauncher(t);
  const refusing = await startSupervisor({ ...other.env, PIWORK_NO_PRELOAD: "1" });
  t.after(() => refusing.proc.kill("SIGKILL"));
  await until(() => !alive(other.pid), 15000, "PIWORK_NO_PRELOAD to stop the boot's launcher");
  await until(() => fs.existsSync(path.join(other.dir, "status")), 15000, "boot.sh to finish");
});

test("a boot launcher that died before the supervisor came is not waited for", async (t) => {
  const boot = await bootLauncher(t);
  process.kill(-boot.pid, "SIGKILL");
  // busybox sh's boot.sh then stops waiting for the adoption and finishes; dash's
  // waits on (its child a zombie till then): either way nothing may block
  await new Promise((r) => setTimeout(r, 300));
  const t0 = Date.now();
  const { proc, port } = await startSupervisor(boot.env);
  t.after(() => proc.kill("SIGKILL"));
  assert.ok(Date.now() - t0 < 1500, `the supervisor took ${Date.now() - t0} ms to listen`);
  const c = await connect(port);
  c.send(`!${JSON.stringify({ op: "hello", after: 0 })}`);
  await c.waitFor(ev("hello"));
  await new Promise((r) => setTimeout(r, 600)); // it looks every 250 ms
  const argv = BARE_RPC;
  c.send(`!${JSON.stringify({ op: "start", argv, env: { HOME: boot.tmp }, cwd: path.join(boot.tmp, "w") })}`);
  const started = JSON.parse((await c.waitFor(ev("started"), 60000)).payload.slice(1));
  assert.notEqual(started.pid, boot.pid);
  c.close();
});
