// The gate extension loaded the way pi loads it (jiti, from pi's own
// node_modules), driven with a fake `pi` and `ctx`: which calls reach the
// host as a select, what the title carries, and what the model is told.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { PI_MODULES } from "./fixtures/pi.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const EXTENSION = path.join(here, "..", "extensions", "permission-gate.ts");
const { createJiti } = await import(pathToFileURL(path.join(PI_MODULES, "jiti", "lib", "jiti.mjs")).href);
const C = await import(pathToFileURL(path.join(here, "..", "extensions", "gate", "classify.js")).href);

let root, work, handler;
const saved = {};

before(async () => {
  root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "gate-ext-")));
  work = path.join(root, "work");
  fs.mkdirSync(work);
  for (const k of ["PIWORK_SCOPE_DIRS", "PIWORK_READONLY_DIRS", "PIWORK_TASK_ID"]) saved[k] = process.env[k];
  process.env.PIWORK_SCOPE_DIRS = `${work}:${path.join(root, "outputs")}`;
  process.env.PIWORK_READONLY_DIRS = path.join(root, "uploads");
  process.env.PIWORK_TASK_ID = "task-42";
  const jiti = createJiti(import.meta.url, { moduleCache: false });
  const factory = await jiti.import(EXTENSION, { default: true });
  assert.equal(typeof factory, "function");
  const handlers = {};
  factory({ on: (name, fn) => (handlers[name] = fn) });
  handler = handlers.tool_call;
  assert.equal(typeof handler, "function", "registers a tool_call handler");
});
after(() => {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  fs.rmSync(root, { recursive: true, force: true });
});

function fakeCtx(answer, { hasUI = true, signal } = {}) {
  const calls = [];
  return {
    calls,
    ctx: {
      cwd: work,
      hasUI,
      signal,
      ui: {
        select: async (title, options, opts) => {
          calls.push({ title, options, opts });
          return typeof answer === "function" ? answer(title, options, opts) : answer;
        },
      },
    },
  };
}

function payloadOf(title) {
  const open = title.lastIndexOf(C.MARKER_OPEN);
  return JSON.parse(title.slice(open + C.MARKER_OPEN.length, title.length - C.MARKER_CLOSE.length));
}

test("reads in scope run without asking", async () => {
  const { calls, ctx } = fakeCtx("Deny");
  assert.equal(await handler({ toolName: "read", toolCallId: "c1", input: { path: "a.txt" } }, ctx), undefined);
  assert.equal(await handler({ toolName: "bash", toolCallId: "c2", input: { command: "ls -la && git status" } }, ctx), undefined);
  assert.equal(calls.length, 0);
});

test("a delete asks with the payload in the title, the four options and ctx.signal", async () => {
  const ac = new AbortController();
  const { calls, ctx } = fakeCtx("Allow once", { signal: ac.signal });
  const res = await handler({ toolName: "bash", toolCallId: "c3", input: { command: "rm -r build" } }, ctx);
  assert.equal(res, undefined, "allowed");
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].options, ["Allow once", "Always allow in this folder", "Always allow everywhere", "Deny"]);
  assert.equal(calls[0].opts.signal, ac.signal);
  const p = payloadOf(calls[0].title);
  assert.equal(p.action, "delete");
  assert.equal(p.tool, "bash");
  assert.equal(p.taskId, "task-42");
  assert.equal(p.toolCallId, "c3");
  assert.equal(p.cwd, work);
  assert.equal(p.command, "rm -r build");
  assert.deepEqual(p.paths, [path.join(work, "build")]);
});

test("Deny blocks with a reason that tells the model not to retry", async () => {
  const { ctx } = fakeCtx("Deny");
  const res = await handler({ toolName: "write", toolCallId: "c4", input: { path: "/etc/hosts", content: "x" } }, ctx);
  assert.equal(res.block, true);
  assert.match(res.reason, /denied by the user/i);
  assert.match(res.reason, /Do not retry/);
});

test("a cancelled dialog (abort/stop) blocks", async () => {
  const { ctx } = fakeCtx(undefined);
  const res = await handler({ toolName: "bash", toolCallId: "c5", input: { command: "curl https://example.com" } }, ctx);
  assert.equal(res.block, true);
  assert.match(res.reason, /cancelled/);
});

test("an unexpected answer is not an allow", async () => {
  const { ctx } = fakeCtx("yes");
  const res = await handler({ toolName: "bash", toolCallId: "c6", input: { command: "make" } }, ctx);
  assert.equal(res.block, true);
});

test("without a UI, anything needing a decision is blocked", async () => {
  const { calls, ctx } = fakeCtx("Allow once", { hasUI: false });
  const res = await handler({ toolName: "bash", toolCallId: "c7", input: { command: "mv a b" } }, ctx);
  assert.equal(res.block, true);
  assert.equal(calls.length, 0);
});

test("unknown tools are asked about as connector", async () => {
  const { calls, ctx } = fakeCtx("Always allow everywhere");
  const res = await handler({ toolName: "mcp_search", toolCallId: "c8", input: { q: "x" } }, ctx);
  assert.equal(res, undefined);
  assert.equal(payloadOf(calls[0].title).action, "connector");
});

test("malformed input still asks rather than runs", async () => {
  const { calls, ctx } = fakeCtx("Deny");
  const res = await handler({ toolName: "write", toolCallId: "c9", input: {} }, ctx);
  assert.equal(res.block, true);
  assert.equal(calls.length, 1);
});
