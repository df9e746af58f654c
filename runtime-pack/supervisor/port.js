// virtio-serial ports as the guest's supervisor uses them: found by name, opened
// once read-write, read and written in a loop that outlives a host that comes
// and goes. Shared by the RPC channel (supervisor.js, "piwork.rpc") and the
// network multiplexer (netmux.js, "piwork.net").
"use strict";

const fs = require("node:fs");
const path = require("node:path");

const READ_SIZE = 256 * 1024;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The /dev node of the virtio-serial port called `name`, or null. */
function findPort(name) {
  const base = "/sys/class/virtio-ports";
  let names = [];
  try {
    names = fs.readdirSync(base);
  } catch {
    return null;
  }
  for (const n of names) {
    try {
      if (fs.readFileSync(path.join(base, n, "name"), "utf8").trim() === name) return `/dev/${n}`;
    } catch {
      /* not a named port */
    }
  }
  return null;
}

/** Wait up to 10 s for the port to appear (its module may still be loading). */
async function waitForPort(name) {
  // /init loads virtio_console while the supervisor starts: look often (a
  // directory listing) so the port is used as soon as it appears.
  for (let i = 0; i < 500; i++) {
    const dev = findPort(name);
    if (dev) return dev;
    await sleep(20);
  }
  return null;
}

/**
 * Read the port forever. `onData(chunk)` gets every chunk (a copy); a read of 0
 * bytes means no host is connected: `onEmpty()` is awaited before the next read.
 * A failed read is logged and retried.
 */
async function readLoop(fd, label, log, onData, onEmpty) {
  const buf = Buffer.alloc(READ_SIZE);
  for (;;) {
    let n;
    try {
      n = await new Promise((res, rej) =>
        fs.read(fd, buf, 0, buf.length, null, (e, k) => (e ? rej(e) : res(k))),
      );
    } catch (err) {
      log(`${label} read: ${err.message}`);
      await sleep(200);
      continue;
    }
    if (n === 0) {
      await onEmpty();
      continue;
    }
    onData(Buffer.from(buf.subarray(0, n)));
  }
}

/**
 * Write all of `buf`, retrying a failed write after 200 ms, unless `abandon()`
 * says the bytes are no longer wanted (checked after a failure).
 */
async function writeAll(fd, buf, label, log, abandon = () => false) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += await new Promise((res, rej) =>
        fs.write(fd, buf, off, buf.length - off, null, (e, k) => (e ? rej(e) : res(k))),
      );
    } catch (err) {
      log(`${label} write: ${err.message}`);
      await sleep(200);
      if (abandon()) return;
    }
  }
}

module.exports = { findPort, readLoop, sleep, waitForPort, writeAll };
