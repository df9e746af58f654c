// The guest's layer service (supervisor/layer.js): what the agent changed, as the
// host asks for it. Directories stand in for the overlay's upper, lower and
// merged views (the VM tests use the real overlay: tests/vm/test_vm_changes.py);
// a whiteout is a real character device 0:0 (mknod, as root, like CI).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import net from "node:net";
import path from "node:path";
import crypto from "node:crypto";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const { Scanner, serve } = require(path.join(here, "..", "supervisor", "layer.js"));

function tree(root, files) {
  for (const [rel, data] of Object.entries(files)) {
    const p = path.join(root, rel);
    fs.mkdirSync(path.dirname(p), { recursive: true });
    if (data === null) fs.mkdirSync(p, { recursive: true });
    else fs.writeFileSync(p, data);
  }
}

function views() {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), "layer-"));
  const dirs = { upper: path.join(base, "upper"), lower: path.join(base, "lower"), merged: path.join(base, "merged") };
  for (const d of Object.values(dirs)) fs.mkdirSync(d);
  return { base, dirs };
}

async function scanAll(scanner, max = 1000) {
  const entries = [];
  const done = await scanner.scan(max, (e) => entries.push(e));
  const byPath = new Map(entries.map((e) => [Buffer.from(e.p, "base64").toString("latin1"), e]));
  return { entries, byPath, done };
}

const sha = (data) => crypto.createHash("sha256").update(data).digest("hex");
const isRoot = process.getuid && process.getuid() === 0;

test("files, folders and links of the upper are reported with their hashes", async () => {
  const { dirs } = views();
  tree(dirs.upper, { "src/app.js": "agent\n", "new/dir": null });
  fs.symlinkSync("../app.js", path.join(dirs.upper, "src", "link"));
  fs.chmodSync(path.join(dirs.upper, "src/app.js"), 0o755);
  const { byPath, done } = await scanAll(new Scanner(dirs));
  assert.equal(done.truncated, false);
  assert.deepEqual(byPath.get("src/app.js"), {
    p: Buffer.from("src/app.js").toString("base64"),
    k: "file",
    m: 0o755,
    s: 6,
    h: sha("agent\n"),
  });
  assert.equal(byPath.get("new/dir").k, "dir");
  assert.equal(Buffer.from(byPath.get("src/link").t, "base64").toString(), "../app.js");
});

test("a whiteout and a name an opaque folder hides are reported gone", { skip: !isRoot && "needs mknod (root)" }, async () => {
  const { dirs } = views();
  tree(dirs.lower, { "src/old.js": "old\n", "src/keep.js": "k\n", "build/a": "a", "build/b": "b" });
  tree(dirs.merged, { "src/keep.js": "k\n", "build/new": "n" }); // the agent's view
  tree(dirs.upper, { "build/new": "n" }); // build/ was replaced (opaque): a and b hidden
  fs.mkdirSync(path.join(dirs.upper, "src"));
  execFileSync("mknod", [path.join(dirs.upper, "src", "old.js"), "c", "0", "0"]);
  const { byPath } = await scanAll(new Scanner(dirs));
  assert.equal(byPath.get("src/old.js").k, "gone");
  assert.equal(byPath.get("build/a").k, "gone");
  assert.equal(byPath.get("build/b").k, "gone");
  assert.equal(byPath.has("src/keep.js"), false);
  assert.equal(byPath.get("build/new").k, "file");
});

test("names that are not UTF-8 keep their bytes", async () => {
  const { dirs } = views();
  const name = Buffer.from([0x66, 0xff, 0x0a, 0x67]); // f\xff\ng
  fs.writeFileSync(Buffer.concat([Buffer.from(dirs.upper + "/"), name]), "x");
  const { entries } = await scanAll(new Scanner(dirs));
  assert.deepEqual(Buffer.from(entries[0].p, "base64"), name);
});

test("a scan stops at the host's maximum and says so; hashes are reused", async () => {
  const { dirs } = views();
  const files = {};
  for (let i = 0; i < 30; i++) files[`f${i}`] = `${i}`;
  tree(dirs.upper, files);
  const scanner = new Scanner(dirs);
  const first = await scanAll(scanner, 10);
  assert.equal(first.entries.length, 10);
  assert.equal(first.done.truncated, true);
  const all = await scanAll(scanner, 1000);
  assert.equal(all.entries.length, 30);
  assert.equal(scanner.hashes.size, 30);
});

test("the service answers a scan and a read over a stream, and never reads through a link", async () => {
  const { base, dirs } = views();
  tree(dirs.upper, { "a.txt": "hello" });
  fs.writeFileSync(path.join(base, "secret"), "no");
  fs.symlinkSync(path.join(base, "secret"), path.join(dirs.upper, "l"));
  const scanner = new Scanner(dirs);
  const server = net.createServer((sock) => serve(sock, scanner));
  const sockPath = path.join(base, "s");
  await new Promise((r) => server.listen(sockPath, r));
  const client = net.connect(sockPath);
  let buf = Buffer.alloc(0);
  client.on("data", (c) => (buf = Buffer.concat([buf, c])));
  const waitFor = async (pred) => {
    for (let i = 0; i < 200 && !pred(); i++) await new Promise((r) => setTimeout(r, 10));
  };
  client.write(`${JSON.stringify({ op: "scan", max: 10 })}\n`);
  await waitFor(() => buf.includes('"done"'));
  assert.match(buf.toString(), /"k":"link"/);
  buf = Buffer.alloc(0);
  client.write(`${JSON.stringify({ op: "read", p: Buffer.from("a.txt").toString("base64"), max: 100 })}\n`);
  await waitFor(() => buf.length >= '{"size":5}\n'.length + 5);
  assert.equal(buf.toString(), '{"size":5}\nhello');
  buf = Buffer.alloc(0);
  client.write(`${JSON.stringify({ op: "read", p: Buffer.from("l").toString("base64"), max: 100 })}\n`);
  await waitFor(() => buf.includes("\n"));
  assert.match(buf.toString(), /"error"/);
  buf = Buffer.alloc(0);
  client.write(`${JSON.stringify({ op: "read", p: Buffer.from("a.txt").toString("base64"), max: 3 })}\n`);
  await waitFor(() => buf.includes("\n"));
  assert.match(buf.toString(), /too big/);
  client.destroy();
  server.close();
});
