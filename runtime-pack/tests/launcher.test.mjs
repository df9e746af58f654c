// The pi launcher (launcher/launch.mjs) run on the host with the real pi: an
// extension the pack builder precompiled (X.ts -> X.mjs) is imported before
// "go" and handed to pi as a factory, so pi never loads X.ts through jiti;
// an extension without a compiled twin still goes through pi's own loader.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { PI_DIR } from "./fixtures/pi.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const LAUNCHER = path.join(here, "..", "launcher", "launch.mjs");

function lines(stream, onLine) {
  let buf = "";
  stream.on("data", (c) => {
    buf += c.toString("utf8");
    let nl;
    while ((nl = buf.indexOf("\n")) !== -1) {
      onLine(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
  });
}

function waitFor(list, pred, ms, what) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const tick = () => {
      const hit = list.find(pred);
      if (hit !== undefined) return resolve(hit);
      if (Date.now() - t0 > ms) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 20);
    };
    tick();
  });
}

async function runLauncher(tmp, warm, argvExt, env = {}) {
  const proc = spawn(process.execPath, [LAUNCHER], {
    cwd: tmp,
    env: { ...process.env, PIWORK_PI_DIR: PI_DIR, PIWORK_WARM_EXTENSIONS: warm.join(":") },
    stdio: ["pipe", "pipe", "pipe", "pipe"],
  });
  const ctl = [];
  const out = [];
  lines(proc.stdio[3], (l) => ctl.push(JSON.parse(l)));
  lines(proc.stdout, (l) => out.push(l));
  proc.stderr.resume();
  try {
    await waitFor(ctl, (m) => m.ev === "loaded", 60000, "loaded");
    const argv = ["--mode", "rpc", "--offline", "--no-session", "--no-extensions", ...argvExt];
    const goEnv = { HOME: tmp, PI_CODING_AGENT_DIR: path.join(tmp, "agent"), ...env };
    proc.stdio[3].write(`${JSON.stringify({ op: "go", argv, env: goEnv, cwd: tmp })}\n`);
    proc.stdin.write(`${JSON.stringify({ id: "s1", type: "get_state" })}\n`);
    const reply = await waitFor(out, (l) => l.includes('"id":"s1"'), 60000, "get_state reply");
    return { reply: JSON.parse(reply) };
  } finally {
    proc.kill();
  }
}

test("a precompiled extension is a factory pi calls with the task's env; its .ts is never loaded", async () => {
  const tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "piwork-launcher-ext-")));
  try {
    const ts = path.join(tmp, "mark.ts");
    // Not valid TypeScript: if pi (jiti) loaded it, the load would fail and say so.
    fs.writeFileSync(ts, "this is not TypeScript {{{\n");
    fs.writeFileSync(
      path.join(tmp, "mark.mjs"),
      'import fs from "node:fs";\n' +
        "export default function mark(pi) {\n" +
        "  fs.writeFileSync(process.env.MARK_FILE, typeof pi.on);\n" +
        "}\n",
    );
    const mark = path.join(tmp, "called");
    const { reply } = await runLauncher(tmp, [ts], ["-e", ts], { MARK_FILE: mark });
    assert.equal(reply.success, true);
    assert.equal(fs.readFileSync(mark, "utf8"), "function"); // called with pi's API, task env
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("an extension with no compiled twin is left to pi's own loader", async () => {
  const tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "piwork-launcher-ext-")));
  try {
    const ts = path.join(tmp, "plain.ts");
    fs.writeFileSync(
      ts,
      'import fs from "node:fs";\n' +
        "export default function plain(pi: { on: unknown }): void {\n" +
        '  fs.writeFileSync(process.env.MARK_FILE as string, "ts:" + typeof pi.on);\n' +
        "}\n",
    );
    const mark = path.join(tmp, "called");
    const { reply } = await runLauncher(tmp, [ts], ["-e", ts], { MARK_FILE: mark });
    assert.equal(reply.success, true);
    assert.equal(fs.readFileSync(mark, "utf8"), "ts:function");
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
