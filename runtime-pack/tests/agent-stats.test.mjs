// launcher/agent-stats.mjs: pi's polled agent-dir files are stat()ed once per change,
// and a change made by another process is seen (inotify), as pi expects.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs, { statSync as importedStatSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { arm, disarm } from "../launcher/agent-stats.mjs";

function tmpDir() {
  return fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "piwork-agent-stats-")));
}

/** Another process writes (pi's own writes and a tool's look the same to the kernel). */
function writeElsewhere(file, text) {
  execFileSync("sh", ["-c", 'printf %s "$2" > "$1"', "sh", file, text]);
}

async function until(pred, what, ms = 5000) {
  const t0 = Date.now();
  while (!pred()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const size = (p) => {
  try {
    return Number(fs.statSync(p, { bigint: true }).size);
  } catch (err) {
    if (err.code === "ENOENT") return -1;
    throw err;
  }
};

test("a polled file's stat is kept until the directory changes, then taken again", async () => {
  const dir = tmpDir();
  const auth = path.join(dir, "auth.json");
  try {
    assert.equal(arm(dir), "on");
    assert.equal(size(auth), -1);
    writeElsewhere(auth, "{}");
    assert.equal(size(auth), 2); // a missing file is asked again at once
    const a = fs.statSync(auth, { bigint: true });
    assert.equal(fs.statSync(auth, { bigint: true }), a); // kept: the same object
    assert.equal(importedStatSync(auth, { bigint: true }), a); // ES imports get it too
    writeElsewhere(auth, '{"x":{"type":"api_key","key":"k"}}');
    await until(() => size(auth) > 2, "the rewritten file");
    assert.notEqual(fs.statSync(auth, { bigint: true }), a);
    // The other polled file; anything else is never kept.
    const store = path.join(dir, "models-store.json");
    writeElsewhere(store, "{}");
    await until(() => size(store) === 2, "models-store.json");
    const other = path.join(dir, "settings.json");
    writeElsewhere(other, "{}");
    assert.notEqual(fs.statSync(other), fs.statSync(other));
  } finally {
    disarm();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("the directory moved away and another put in its place is seen, then and later", async () => {
  const dir = tmpDir();
  const agent = path.join(dir, "agent");
  fs.mkdirSync(agent);
  const auth = path.join(agent, "auth.json");
  writeElsewhere(auth, "{}");
  try {
    assert.equal(arm(agent), "on");
    assert.equal(size(auth), 2);
    execFileSync("sh", ["-c", 'mv "$1" "$1.old" && mkdir "$1" && printf 1234 > "$1/auth.json"', "sh", agent]);
    await until(() => size(auth) === 4, "the new directory's file");
    writeElsewhere(auth, "123456"); // the old watch cannot tell: nothing is kept any more
    assert.equal(size(auth), 6);
  } finally {
    disarm();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("disarmed, or on a directory it cannot watch, nothing is kept", () => {
  const dir = tmpDir();
  const auth = path.join(dir, "auth.json");
  fs.writeFileSync(auth, "{}");
  try {
    assert.equal(arm(dir), "on");
    assert.equal(fs.statSync(auth), fs.statSync(auth));
    disarm();
    assert.notEqual(fs.statSync(auth), fs.statSync(auth));
    assert.match(arm(path.join(dir, "missing")), /^off: ENOENT/);
    assert.notEqual(fs.statSync(auth), fs.statSync(auth));
    assert.match(arm("relative/agent"), /^off: /);
    assert.match(arm(undefined), /^off: /);
  } finally {
    disarm();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
