// The guest end of the network multiplexer (supervisor/netmux.js), with real
// loopback sockets standing in for pi's connections and a captured port.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const { Mux, frame, T, WINDOW, MAX_STREAMS, MAX_PAYLOAD } = require(
  path.join(here, "..", "supervisor", "netmux.js"),
);

const HELLO = frame(T.HELLO, 0, Buffer.concat([Buffer.from("PWMUX1"), Buffer.alloc(8, 7)]));

/** A mux whose port output is parsed into frames. */
function harness() {
  const sent = [];
  let buf = Buffer.alloc(0);
  const mux = new Mux((b) => {
    buf = Buffer.concat([buf, b]);
    while (buf.length >= 8 && buf.length >= 8 + buf.readUInt32BE(4)) {
      const len = buf.readUInt32BE(4);
      sent.push({ type: buf[0], id: buf.readUInt16BE(2), payload: buf.subarray(8, 8 + len) });
      buf = buf.subarray(8 + len);
    }
  });
  return { mux, sent };
}

/** Pairs of (guest-side accepted socket, client socket) on loopback. */
async function pairs(n) {
  const accepted = [];
  const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: false }, (s) =>
    accepted.push(s),
  );
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const clients = [];
  for (let i = 0; i < n; i++) {
    const c = net.connect(server.address().port, "127.0.0.1");
    c.on("error", () => {});
    clients.push(c);
  }
  while (accepted.length < n) await new Promise((r) => setTimeout(r, 5));
  server.close();
  return accepted.map((s, i) => ({ sock: s, client: clients[i] }));
}

const tick = (ms = 20) => new Promise((r) => setTimeout(r, ms));

test("connections are refused until the host's HELLO, which is echoed after stale bytes", async () => {
  const { mux, sent } = harness();
  const [p] = await pairs(1);
  assert.equal(mux.accept(p.sock, 0), null);
  await tick();
  assert.ok(p.sock.destroyed);
  assert.ok(mux.feed(Buffer.concat([Buffer.from("junk from an earlier connection"), HELLO])));
  assert.equal(mux.session, true);
  assert.deepEqual(sent.map((f) => f.type), [T.HELLO]);
  assert.ok(sent[0].payload.equals(HELLO.subarray(8)));
  p.client.destroy();
});

test("at most MAX_STREAMS at once; the rest are closed; reset drops them all", async () => {
  const { mux, sent } = harness();
  mux.feed(HELLO);
  const ps = await pairs(MAX_STREAMS + 5);
  const got = ps.map((p) => mux.accept(p.sock, 0));
  assert.equal(got.filter(Boolean).length, MAX_STREAMS);
  assert.equal(sent.filter((f) => f.type === T.OPEN).length, MAX_STREAMS);
  assert.ok(sent.filter((f) => f.type === T.OPEN).every((f) => f.payload.equals(Buffer.from([0]))));
  mux.reset(); // the host went away (or a template is being saved)
  await tick();
  assert.equal(mux.streams.size, 0);
  assert.ok(ps.every((p) => p.sock.destroyed));
  assert.equal(mux.accept((await pairs(1))[0].sock, 0), null); // no session: refused
  for (const p of ps) p.client.destroy();
});

test("data both ways within windows; EOF and CLOSE", async () => {
  const { mux, sent } = harness();
  mux.feed(HELLO);
  const [p] = await pairs(1);
  const st = mux.accept(p.sock, 1);
  const id = st.id;
  // Host -> guest data reaches the client, and the window comes back.
  mux.feed(frame(T.DATA, id, Buffer.from("from the host")));
  const got = await new Promise((r) => p.client.once("data", r));
  assert.equal(got.toString(), "from the host");
  await tick();
  const credit = sent.filter((f) => f.type === T.WINDOW && f.id === id);
  assert.equal(credit.reduce((a, f) => a + f.payload.readUInt32BE(0), 0), 13);
  // Guest -> host: never more than the window before the host credits it.
  const big = Buffer.alloc(WINDOW + 3 * MAX_PAYLOAD, 0x61);
  p.client.write(big);
  await tick(200);
  const data = () => sent.filter((f) => f.type === T.DATA && f.id === id);
  const total = () => data().reduce((a, f) => a + f.payload.length, 0);
  assert.equal(total(), WINDOW);
  assert.ok(data().every((f) => f.payload.length <= MAX_PAYLOAD));
  const inc = Buffer.alloc(4);
  inc.writeUInt32BE(WINDOW, 0);
  mux.feed(frame(T.WINDOW, id, inc));
  await tick(200);
  assert.equal(total(), big.length);
  // Client half-closes: EOF to the host; host EOF ends the socket; CLOSE both ways.
  p.client.end();
  await tick(50);
  assert.ok(sent.some((f) => f.type === T.EOF && f.id === id));
  mux.feed(frame(T.EOF, id));
  await new Promise((r) => p.client.once("end", r));
  await tick(50);
  assert.ok(sent.some((f) => f.type === T.CLOSE && f.id === id));
  mux.feed(frame(T.CLOSE, id));
  assert.equal(mux.streams.size, 0);
});

test("a broken frame from the host resets the mux instead of crashing", async () => {
  const { mux } = harness();
  mux.feed(HELLO);
  const [p] = await pairs(1);
  mux.accept(p.sock, 0);
  const bad = Buffer.alloc(8);
  bad.writeUInt8(99, 0);
  assert.equal(mux.feed(bad), false);
  assert.equal(mux.session, false);
  await tick();
  assert.ok(p.sock.destroyed);
  p.client.destroy();
});

test("after the host goes away and comes back (a restore), a new HELLO starts a fresh session", async () => {
  const { mux, sent } = harness();
  mux.feed(HELLO);
  const [a] = await pairs(1);
  const old = mux.accept(a.sock, 0);
  mux.feed(frame(T.DATA, old.id, Buffer.from("half a fr"))); // then the host vanishes
  mux.reset();
  assert.equal(mux.session, false);
  const again = Buffer.concat([Buffer.from([2, 0, 0]), HELLO]); // stale tail, then HELLO
  assert.ok(mux.feed(again));
  assert.equal(mux.session, true);
  assert.equal(sent.filter((f) => f.type === T.HELLO).length, 2);
  const [b] = await pairs(1);
  const st = mux.accept(b.sock, 0);
  assert.ok(st);
  assert.equal(mux.streams.size, 1);
  await tick();
  assert.ok(a.sock.destroyed);
  a.client.destroy();
  b.client.destroy();
});
