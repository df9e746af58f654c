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
const { Mux, frame, T, WINDOW, MAX_STREAMS, MAX_PAYLOAD, HOST_IDS } = require(
  path.join(here, "..", "supervisor", "netmux.js"),
);
const { PortWatcher, parse } = require(path.join(here, "..", "supervisor", "ports.js"));

const HELLO = frame(T.HELLO, 0, Buffer.concat([Buffer.from("PWMUX2"), Buffer.alloc(8, 7)]));

/** A mux whose port output is parsed into frames. */
function harness(options) {
  const sent = [];
  let buf = Buffer.alloc(0);
  const mux = new Mux(
    (b) => {
    buf = Buffer.concat([buf, b]);
    while (buf.length >= 8 && buf.length >= 8 + buf.readUInt32BE(4)) {
      const len = buf.readUInt32BE(4);
      sent.push({ type: buf[0], id: buf.readUInt16BE(2), payload: buf.subarray(8, 8 + len) });
      buf = buf.subarray(8 + len);
    }
  },
    () => {},
    options,
  );
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

test("an older host's HELLO (PWMUX1) is never answered: the host refuses to go on", () => {
  const { mux, sent } = harness();
  const old = frame(T.HELLO, 0, Buffer.concat([Buffer.from("PWMUX1"), Buffer.alloc(8, 7)]));
  assert.ok(mux.feed(old));
  assert.equal(mux.session, false);
  assert.equal(sent.length, 0);
});

/** A guest server on loopback: echoes upper-cased, records what it saw. */
async function guestServer() {
  const seen = { conns: 0, bytes: 0, socks: [] };
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    seen.conns += 1;
    seen.socks.push(s);
    s.on("data", (d) => {
      seen.bytes += d.length;
      s.write(Buffer.from(d.toString().toUpperCase()));
    });
    s.on("end", () => s.end("BYE"));
    s.on("error", () => {});
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { server, port: server.address().port, seen };
}

const portBuf = (p) => {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(p, 0);
  return b;
};

test("a host-opened stream (CONNECT) reaches the guest port both ways, with EOF and CLOSE", async () => {
  const g = await guestServer();
  const { mux, sent } = harness();
  mux.feed(HELLO);
  const id = HOST_IDS + 5;
  mux.feed(frame(T.CONNECT, id, portBuf(g.port)));
  mux.feed(frame(T.DATA, id, Buffer.from("get /")));
  for (let i = 0; i < 100 && !sent.some((f) => f.type === T.DATA && f.id === id); i++) await tick();
  const data = sent.filter((f) => f.type === T.DATA && f.id === id);
  assert.equal(Buffer.concat(data.map((f) => f.payload)).toString(), "GET /");
  assert.ok(sent.some((f) => f.type === T.WINDOW && f.id === id));
  mux.feed(frame(T.EOF, id));
  for (let i = 0; i < 100 && !sent.some((f) => f.type === T.EOF && f.id === id); i++) await tick();
  const all = Buffer.concat(sent.filter((f) => f.type === T.DATA && f.id === id).map((f) => f.payload));
  assert.equal(all.toString(), "GET /BYE");
  mux.feed(frame(T.CLOSE, id));
  await tick();
  assert.equal(mux.streams.size, 0);
  g.server.close();
});

test("CONNECT to a refused port, a closed port or past the cap answers CLOSE; a guest id is a reset", async () => {
  const g = await guestServer();
  const { mux, sent } = harness({ resolve: (p) => (p >= 1024 ? { host: "127.0.0.1", port: p } : null) });
  mux.feed(HELLO);
  mux.feed(frame(T.CONNECT, HOST_IDS + 1, portBuf(80))); // below 1024: refused at once
  assert.ok(sent.some((f) => f.type === T.CLOSE && f.id === HOST_IDS + 1));
  const closed = net.createServer();
  await new Promise((r) => closed.listen(0, "127.0.0.1", r));
  const dead = closed.address().port;
  await new Promise((r) => closed.close(r));
  mux.feed(frame(T.CONNECT, HOST_IDS + 2, portBuf(dead))); // nothing listens: CLOSE after connect fails
  for (let i = 0; i < 100 && !sent.some((f) => f.type === T.CLOSE && f.id === HOST_IDS + 2); i++) await tick();
  assert.ok(sent.some((f) => f.type === T.CLOSE && f.id === HOST_IDS + 2));
  mux.feed(frame(T.CLOSE, HOST_IDS + 1));
  mux.feed(frame(T.CLOSE, HOST_IDS + 2));
  for (let i = 0; i < MAX_STREAMS + 3; i++) mux.feed(frame(T.CONNECT, HOST_IDS + 100 + i, portBuf(g.port)));
  for (let i = 0; i < 100 && g.seen.socks.length < MAX_STREAMS; i++) await tick();
  await tick(100);
  assert.equal(g.seen.socks.length, MAX_STREAMS);
  const over = [0, 1, 2].map((k) => HOST_IDS + 100 + MAX_STREAMS + k);
  for (const id of over) assert.ok(sent.some((f) => f.type === T.CLOSE && f.id === id), `${id} refused`);
  // A CONNECT with a guest-side id, or of a live id, breaks the protocol: everything resets.
  assert.equal(mux.feed(frame(T.CONNECT, 7, portBuf(g.port))), false);
  assert.equal(mux.session, false);
  assert.equal(mux.streams.size, 0);
  g.server.close();
  for (const s of g.seen.socks) s.destroy();
});

test("a host overrunning a host-opened stream's window loses that stream only", async () => {
  const g = await guestServer();
  // A guest server that never reads: nothing is credited back.
  const stuck = net.createServer((s) => s.pause());
  await new Promise((r) => stuck.listen(0, "127.0.0.1", r));
  const { mux, sent } = harness();
  mux.feed(HELLO);
  const a = HOST_IDS + 1;
  const b = HOST_IDS + 2;
  mux.feed(frame(T.CONNECT, a, portBuf(stuck.address().port)));
  mux.feed(frame(T.CONNECT, b, portBuf(g.port)));
  const chunk = Buffer.alloc(MAX_PAYLOAD, 0x61);
  for (let i = 0; i < WINDOW / MAX_PAYLOAD + 2; i++) mux.feed(frame(T.DATA, a, chunk));
  await tick(50);
  assert.ok(sent.some((f) => f.type === T.CLOSE && f.id === a));
  assert.equal(mux.session, true);
  mux.feed(frame(T.DATA, b, Buffer.from("still")));
  for (let i = 0; i < 100 && !sent.some((f) => f.type === T.DATA && f.id === b); i++) await tick();
  assert.ok(sent.some((f) => f.type === T.DATA && f.id === b && f.payload.toString() === "STILL"));
  mux.reset();
  g.server.close();
  stuck.close();
});

test("guest-opened ids stay below the host's range", async () => {
  const { mux } = harness();
  mux.feed(HELLO);
  mux.nextId = HOST_IDS - 2;
  const ps = await pairs(4);
  const ids = ps.map((p) => mux.accept(p.sock, 0).id);
  assert.ok(ids.every((id) => id >= 1 && id < HOST_IDS), String(ids));
  mux.reset();
  for (const p of ps) p.client.destroy();
});

test("the port watcher reads /proc/net/tcp{,6}: listeners the guest's loopback reaches, >= 1024", () => {
  const v4 = [
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
    "   0: 6400020A:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1",
    "   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2",
    "   2: 00000000:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3",
    "   3: 0100007F:1F41 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4",
    "   4: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5",
    "   5: 6500020A:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6",
  ].join("\n");
  assert.deepEqual(parse(v4, false), [
    { port: 8000, host: "127.0.0.1" },
    { port: 3000, host: "127.0.0.1" },
  ]);
  const v6 = [
    "  sl  local_address                         remote_address                        st",
    "   0: 00000000000000000000000000000000:1388 00000000000000000000000000000000:0000 0A",
    "   1: 00000000000000000000000001000000:1389 00000000000000000000000000000000:0000 0A",
    "   2: 0000000000000000FFFF00000100007F:138A 00000000000000000000000000000000:0000 0A",
  ].join("\n");
  assert.deepEqual(parse(v6, true), [
    { port: 5000, host: "127.0.0.1" },
    { port: 5001, host: "::1" },
    { port: 5002, host: "127.0.0.1" },
  ]);
});

test("the port watcher reports changes only, and an empty set when stopped", async () => {
  const reports = [];
  const w = new PortWatcher((p) => reports.push(p), { interval: 20, exclude: [7000] });
  const server = net.createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const port = server.address().port;
  w.start();
  await tick(100);
  assert.ok(reports.length >= 1 && reports.at(-1).includes(port), JSON.stringify(reports));
  const n = reports.length;
  await tick(100);
  assert.equal(reports.length, n); // nothing changed: nothing reported
  await new Promise((r) => server.close(r));
  await tick(100);
  assert.ok(!reports.at(-1).includes(port));
  w.stop();
  assert.deepEqual(reports.at(-1), []);
});
