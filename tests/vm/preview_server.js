// What an agent serves in the VM, for tests/vm/test_vm_preview.py and the
// preview benchmark: Node's http module only (no npm package needed).
//
//   node preview_server.js PORT [EXTRA_LISTENERS [SECONDS]]
//
// GET /            a small page
// GET /big?n=N     N bytes of body
// GET /hold        a long poll, answered by GET /release
// GET /stats       {"live", "peak", "total"}: connections now, at most at once, ever
// GET /done        answers, then the server exits (the agent's tool call ends)
// upgrade /ws      a WebSocket echo (text frames, framing written by hand)
// EXTRA_LISTENERS  that many more listening ports (9000, 9001, ...) serving nothing
// SECONDS          exit after that long (default 900: never outlive a stuck test)
"use strict";

const http = require("node:http");
const net = require("node:net");
const crypto = require("node:crypto");

const port = Number(process.argv[2] || 8000);
const extra = Number(process.argv[3] || 0);
const seconds = Number(process.argv[4] || 900);
let live = 0;
let peak = 0;
let total = 0;
const held = [];

function wsAccept(key) {
  return crypto
    .createHash("sha1")
    .update(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
    .digest("base64");
}

/** Parse client frames (masked), answer each text frame with "echo: " + text. */
function wsEcho(sock) {
  let buf = Buffer.alloc(0);
  sock.on("data", (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    for (;;) {
      if (buf.length < 2) return;
      const op = buf[0] & 0x0f;
      let len = buf[1] & 0x7f;
      let off = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        sock.destroy();
        return;
      }
      if (buf.length < off + 4 + len) return;
      const mask = buf.subarray(off, off + 4);
      const data = Buffer.from(buf.subarray(off + 4, off + 4 + len));
      for (let i = 0; i < data.length; i++) data[i] ^= mask[i % 4];
      buf = buf.subarray(off + 4 + len);
      if (op === 8) {
        sock.end(Buffer.from([0x88, 0]));
        return;
      }
      if (op !== 1) continue;
      const out = Buffer.from("echo: " + data.toString("utf8"));
      const head = out.length < 126 ? Buffer.from([0x81, out.length]) : Buffer.from([0x81, 126, out.length >> 8, out.length & 255]);
      sock.write(Buffer.concat([head, out]));
    }
  });
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  if (url.pathname === "/") {
    res.end(`hello from the guest (Host: ${req.headers.host})`);
  } else if (url.pathname === "/big") {
    const n = Number(url.searchParams.get("n") || 0);
    res.writeHead(200, { "Content-Length": n });
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    let left = n;
    const more = () => {
      while (left > 0) {
        const k = Math.min(left, chunk.length);
        left -= k;
        if (!res.write(k === chunk.length ? chunk : chunk.subarray(0, k))) return res.once("drain", more);
      }
      res.end();
    };
    more();
  } else if (url.pathname === "/hold") {
    held.push(res);
  } else if (url.pathname === "/release") {
    for (const r of held.splice(0)) r.end("released");
    res.end("ok");
  } else if (url.pathname === "/stats") {
    res.end(JSON.stringify({ live, peak, total }));
  } else if (url.pathname === "/done") {
    res.end("bye");
    setTimeout(() => process.exit(0), 200);
  } else {
    res.writeHead(404);
    res.end();
  }
});
server.keepAliveTimeout = 60000;
server.on("connection", (sock) => {
  live += 1;
  total += 1;
  peak = Math.max(peak, live);
  sock.on("close", () => (live -= 1));
});
server.on("upgrade", (req, sock) => {
  sock.write(
    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
      `Sec-WebSocket-Accept: ${wsAccept(req.headers["sec-websocket-key"])}\r\n\r\n`,
  );
  wsEcho(sock);
});
server.listen(port, () => console.log(`SERVING ${port}`));
for (let i = 0; i < extra; i++) net.createServer((s) => s.destroy()).listen(9000 + i);
setTimeout(() => process.exit(0), seconds * 1000);
