// A line-oriented front end to the gate's classifier for the Python tests
// (tests/unit/test_gate_shells.py, test_gate_fuzz.py): they run what the
// classifier calls read-only under real shells. Not a test file itself.
//
// argv: SCOPE_DIR [READONLY_DIR]. stdin: one JSON object per line,
// {"command": "...", "cwd": "/abs"}; stdout: one JSON object per line,
// {"action", "needsDecision", "autoAllowed", "writes", "reasons"}.
import readline from "node:readline";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const C = await import(path.join(here, "..", "extensions", "gate", "classify.js"));

const [scope, readonly = "/nonexistent-readonly"] = process.argv.slice(2);
if (!scope) {
  process.stderr.write("usage: classify-server.mjs SCOPE_DIR [READONLY_DIR]\n");
  process.exit(2);
}
const config = { ...C.loadConfig({ PIWORK_SCOPE_DIRS: scope, PIWORK_READONLY_DIRS: readonly }), home: path.join(scope, ".home-not-there") };

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let out;
  try {
    const req = JSON.parse(line);
    const r = C.classifyToolCall("bash", { command: req.command }, { cwd: req.cwd ?? scope, config });
    out = {
      action: r.action,
      needsDecision: r.needsDecision,
      // what the host's default rules let through without a question: reads, and writes in scope
      autoAllowed: r.effects.every((e) => e.action === "read" || e.action === "write"),
      writes: r.effects.filter((e) => e.action === "write").map((e) => e.path),
      reasons: r.effects.filter((e) => e.action !== "read").map((e) => e.reason).slice(0, 3),
    };
  } catch (err) {
    out = { error: String(err) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
