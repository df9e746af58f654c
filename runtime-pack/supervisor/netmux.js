// Guest end of the network multiplexer (host end and wire format:
// piwork/vm/netmux.py). The VM has no network card: pi and its tools connect
// to 10.0.2.100:80 (model gateway) and 10.0.2.101:3128 (egress proxy), both
// on the guest's lo; this module accepts those connections and carries each
// as a stream over the virtio-serial port "piwork.net". The host connects
// each stream to its own gateway or proxy; nothing else is reachable.
//
// Frames: type:u8 flags:u8 stream:u16 length:u32 (big-endian), then payload.
// HELLO 0, OPEN 1 (payload: target byte), DATA 2, EOF 3, CLOSE 4, WINDOW 5 (u32),
// CONNECT 6 (host -> guest, payload: u16 guest port; previews, issue 20).
// Streams the guest opens have ids 1..0x7fff, streams the host opens (CONNECT)
// 0x8000..0xffff, so the two sides never pick the same id.
// Connections are refused (closed at once) until the host's HELLO arrives,
// when MAX_STREAMS are in use, and after the host goes away (then every
// stream is dropped: a restored VM holds no stream of its template).
// A host-opened stream connects to the guest's own loopback, port chosen by the
// host; at most MAX_STREAMS of them, DATA past a stream's window closes it.
"use strict";

const fs = require("node:fs");
const net = require("node:net");

const serial = require("./port.js");

const PORT_NAME = "piwork.net";
const HEADER = 8;
const MAX_PAYLOAD = 64 * 1024;
const WINDOW = 256 * 1024;
const MAX_STREAMS = 64;
const MAGIC = Buffer.from("PWMUX2"); // 2: CONNECT (host-opened streams)
const HELLO_LEN = MAGIC.length + 8;
const T = { HELLO: 0, OPEN: 1, DATA: 2, EOF: 3, CLOSE: 4, WINDOW: 5, CONNECT: 6 };
const HOST_IDS = 0x8000; // ids from here up are opened by the host
const LISTEN = [
  { host: "10.0.2.100", port: 80, target: 0 },
  { host: "10.0.2.101", port: 3128, target: 1 },
];

function frame(type, id, payload) {
  const body = payload || Buffer.alloc(0);
  const h = Buffer.alloc(HEADER);
  h.writeUInt8(type, 0);
  h.writeUInt8(0, 1);
  h.writeUInt16BE(id, 2);
  h.writeUInt32BE(body.length, 4);
  return body.length ? Buffer.concat([h, body]) : h;
}

/** The mux state, independent of the port (unit-testable with any `send`). */
class Mux {
  constructor(send, log, options = {}) {
    this.send = send; // (Buffer) => void
    this.log = log || (() => {});
    // (port) => {host, port} to connect a host-opened stream to, or null to refuse.
    this.resolve = options.resolve || ((port) => ({ host: "127.0.0.1", port }));
    this.connect = options.connect || ((opts) => net.connect(opts));
    this.session = false;
    this.streams = new Map(); // id -> {sock, credit, closing, pending[], unacked}
    this.nextId = 1;
    this.buf = Buffer.alloc(0);
  }

  /** The host went away (or broke the framing): drop every stream, wait for HELLO. */
  reset() {
    this.session = false;
    this.buf = Buffer.alloc(0);
    for (const st of this.streams.values()) if (st.sock) st.sock.destroy();
    this.streams.clear();
  }

  // ------------------------------------------------------------ guest connections
  count(hostOpened) {
    let n = 0;
    for (const id of this.streams.keys()) if (id >= HOST_IDS === hostOpened) n++;
    return n;
  }

  accept(sock, target) {
    if (!this.session || this.count(false) >= MAX_STREAMS) {
      sock.destroy();
      return null;
    }
    let id = this.nextId;
    while (this.streams.has(id)) id = (id % (HOST_IDS - 1)) + 1;
    this.nextId = (id % (HOST_IDS - 1)) + 1;
    const st = this.track(id, sock);
    this.send(frame(T.OPEN, id, Buffer.from([target])));
    return st;
  }

  /** The host opens a stream into a guest port (a preview): connect to it locally. */
  connectIn(id, payload) {
    if (this.streams.has(id)) {
      // The host reused a live id: it broke the protocol.
      return false;
    }
    const where = payload.length === 2 ? this.resolve(payload.readUInt16BE(0)) : null;
    if (!where || this.count(true) >= MAX_STREAMS) {
      this.send(frame(T.CLOSE, id));
      return true;
    }
    // {host, port} on the guest's loopback, or {path} of a unix socket the supervisor serves.
    const sock = this.connect({ ...where, allowHalfOpen: true });
    this.track(id, sock);
    return true;
  }

  track(id, sock) {
    const st = { id, sock, credit: WINDOW, closing: false, pending: [], toCredit: 0, inFlight: 0 };
    this.streams.set(id, st);
    sock.setNoDelay(true);
    sock.on("data", (chunk) => this.fromGuest(st, chunk));
    sock.on("end", () => {
      if (!st.closing && this.streams.get(id) === st) {
        st.pending.push(null); // EOF after whatever is still waiting for credit
        this.flush(st);
      }
    });
    sock.on("error", () => {});
    sock.on("close", () => this.closeLocal(st));
    return st;
  }

  fromGuest(st, chunk) {
    if (st.closing) return;
    st.pending.push(chunk);
    this.flush(st);
  }

  /** Send what the window allows; pause the socket while the host has no room. */
  flush(st) {
    while (st.pending.length && !st.closing) {
      const head = st.pending[0];
      if (head === null) {
        st.pending.shift();
        this.send(frame(T.EOF, st.id));
        continue;
      }
      if (st.credit <= 0) break;
      const n = Math.min(head.length, st.credit, MAX_PAYLOAD);
      this.send(frame(T.DATA, st.id, head.subarray(0, n)));
      st.credit -= n;
      if (n === head.length) st.pending.shift();
      else st.pending[0] = head.subarray(n);
    }
    if (st.pending.length) st.sock.pause();
    else st.sock.resume();
  }

  closeLocal(st) {
    if (st.closing || this.streams.get(st.id) !== st) return;
    st.closing = true; // the id stays taken until the host's CLOSE answers
    st.pending = [];
    this.send(frame(T.CLOSE, st.id));
  }

  // ------------------------------------------------------------ host frames
  /** Bytes from the port. Returns false if the host broke the framing (reset done). */
  feed(data) {
    this.buf = this.buf.length ? Buffer.concat([this.buf, data]) : data;
    if (!this.session) {
      // Wait for HELLO: skip anything before it (a previous connection's bytes).
      const want = Buffer.concat([frame(T.HELLO, 0).subarray(0, 4), Buffer.from([0, 0, 0, HELLO_LEN]), MAGIC]);
      const at = this.buf.indexOf(want);
      if (at < 0) {
        this.buf = this.buf.subarray(Math.max(0, this.buf.length - want.length + 1));
        return true;
      }
      this.buf = this.buf.subarray(at);
    }
    while (this.buf.length >= HEADER) {
      const type = this.buf.readUInt8(0);
      const flags = this.buf.readUInt8(1);
      const id = this.buf.readUInt16BE(2);
      const len = this.buf.readUInt32BE(4);
      if (type > T.CONNECT || flags !== 0 || len > MAX_PAYLOAD) {
        this.log(`netmux: bad frame from the host (type ${type}, length ${len}); resetting`);
        this.reset();
        return false;
      }
      if (this.buf.length < HEADER + len) break;
      const payload = Buffer.from(this.buf.subarray(HEADER, HEADER + len));
      this.buf = this.buf.subarray(HEADER + len);
      if (!this.onFrame(type, id, payload)) return false;
    }
    return true;
  }

  onFrame(type, id, payload) {
    if (type === T.HELLO) {
      if (payload.length !== HELLO_LEN || !payload.subarray(0, MAGIC.length).equals(MAGIC)) return true;
      const rest = this.buf;
      this.reset();
      this.buf = rest;
      this.session = true;
      this.send(frame(T.HELLO, 0, payload));
      return true;
    }
    if (type === T.CONNECT) {
      if (id < HOST_IDS || !this.connectIn(id, payload)) {
        this.log(`netmux: bad CONNECT from the host (stream ${id}); resetting`);
        this.reset();
        return false;
      }
      return true;
    }
    const st = this.streams.get(id);
    if (!st) return true;
    if (type === T.CLOSE) {
      this.streams.delete(id);
      if (!st.closing) {
        st.closing = true;
        this.send(frame(T.CLOSE, id));
      }
      st.sock.destroy();
      return true;
    }
    if (st.closing) return true;
    if (type === T.DATA) {
      st.inFlight += payload.length;
      if (st.inFlight > WINDOW) {
        // The host overran its window: this stream ends, the port goes on.
        st.sock.destroy();
        this.closeLocal(st);
        return true;
      }
      st.sock.write(payload, () => {
        // Delivered to the local socket: give the host its window back, in batches.
        st.toCredit += payload.length;
        if (!st.closing && (st.toCredit >= WINDOW / 4 || st.sock.writableLength === 0)) {
          const inc = Buffer.alloc(4);
          inc.writeUInt32BE(st.toCredit, 0);
          st.inFlight -= st.toCredit;
          st.toCredit = 0;
          this.send(frame(T.WINDOW, id, inc));
        }
      });
    } else if (type === T.EOF) {
      st.sock.end();
    } else if (type === T.WINDOW && payload.length === 4) {
      st.credit = Math.min(WINDOW, st.credit + payload.readUInt32BE(0));
      this.flush(st);
    }
    return true;
  }
}

// ---------------------------------------------------------------- the port

/** Serve the port for the supervisor's life. Resolves never; logs and retries. */
async function run(log, options = {}) {
  const dev = await serial.waitForPort(PORT_NAME);
  if (!dev) {
    log(`netmux: no virtio-serial port named ${PORT_NAME}; the guest has no network`);
    return;
  }
  const fd = fs.openSync(dev, "r+");
  const queue = [];
  let wake = null;
  let generation = 0; // bumped on every reset: queued frames of an old session are dropped
  const mux = new Mux(
    (buf) => {
    queue.push({ buf, gen: generation });
    if (wake) {
      const w = wake;
      wake = null;
      w();
    }
  },
    log,
    options,
  );
  const resetAll = () => {
    generation += 1;
    queue.length = 0;
    mux.reset();
  };

  for (const { host, port, target } of LISTEN) {
    const server = net.createServer({ allowHalfOpen: true }, (sock) => mux.accept(sock, target));
    server.on("error", (err) => log(`netmux: listen ${host}:${port}: ${err.message}`));
    server.listen({ host, port, backlog: 64 });
  }

  const reader = () =>
    serial.readLoop(
      fd,
      "netmux: port",
      log,
      (chunk) => {
        if (!mux.feed(chunk)) generation += 1;
      },
      async () => {
        // No host connected: nothing may stay open (a template is saved like this).
        if (mux.session || mux.streams.size) resetAll();
        await serial.sleep(100);
      },
    );

  const writer = async () => {
    for (;;) {
      const item = queue.shift();
      if (!item) {
        await new Promise((r) => {
          wake = r;
        });
        continue;
      }
      if (item.gen !== generation) continue;
      await serial.writeAll(fd, item.buf, "netmux: port", log, () => item.gen !== generation);
    }
  };
  log(`netmux ${dev}`);
  await Promise.all([reader(), writer()]);
}

module.exports = { Mux, frame, run, T, WINDOW, MAX_STREAMS, MAX_PAYLOAD, HOST_IDS };
