// Which TCP ports something in the guest listens on, for previews (issue 20).
//
// The agent starts a dev server the usual way (`node server.js`, `npm run
// dev`); nothing tells piwork. The supervisor reads /proc/net/tcp and tcp6
// once a second while pi runs, and reports the set of listening ports to the
// host when it changes (the `ports` event, docs/guest-protocol.md). No agent
// cooperation is needed, and nothing here opens anything: the host decides,
// asks the person, and only then opens streams into a port (netmux CONNECT).
"use strict";

const fs = require("node:fs");

const LISTEN = "0A";
const MIN_PORT = 1024; // below: the supervisor's own listeners and system services
const MAX_REPORTED = 64; // a guest with thousands of listeners reports a bounded list

/**
 * Parse /proc/net/tcp{,6} text into [{port, host}] of listening sockets whose
 * address the guest's own loopback reaches (any address or loopback).
 * `host` is "127.0.0.1" or "::1": where the supervisor connects for a stream.
 */
function parse(text, v6) {
  const out = [];
  const lines = text.split("\n");
  for (let i = 1; i < lines.length; i++) {
    const cols = lines[i].trim().split(/\s+/);
    if (cols.length < 4 || cols[3] !== LISTEN) continue;
    const [addr, portHex] = cols[1].split(":");
    const port = parseInt(portHex, 16);
    if (!Number.isInteger(port) || port < MIN_PORT || port > 65535) continue;
    let host = null;
    if (!v6) {
      // Little-endian per 32-bit word: 0100007F is 127.0.0.1.
      if (addr === "00000000") host = "127.0.0.1";
      else if (addr.length === 8 && addr.endsWith("7F")) host = "127.0.0.1";
    } else if (addr === "00000000000000000000000000000000") {
      host = "127.0.0.1"; // dual-stack "::" (the default for Node servers) takes IPv4 too
    } else if (addr === "00000000000000000000000001000000") {
      host = "::1";
    } else if (addr.startsWith("0000000000000000FFFF0000") && addr.endsWith("7F")) {
      host = "127.0.0.1"; // ::ffff:127.x.x.x
    }
    if (host) out.push({ port, host });
  }
  return out;
}

/** Poll listeners; call `report(ports)` with the sorted port list when it changes. */
class PortWatcher {
  constructor(report, options = {}) {
    this.report = report;
    this.interval = options.interval || 1000;
    this.exclude = new Set(options.exclude || []);
    this.files = options.files || { "/proc/net/tcp": false, "/proc/net/tcp6": true };
    this.hosts = new Map(); // port -> host to connect to
    this.last = "";
    this.timer = null;
  }

  scan() {
    const hosts = new Map();
    for (const [file, v6] of Object.entries(this.files)) {
      let text = "";
      try {
        text = fs.readFileSync(file, "utf8");
      } catch {
        continue; // no IPv6 in this kernel, say
      }
      for (const { port, host } of parse(text, v6)) {
        if (this.exclude.has(port)) continue;
        if (!hosts.has(port) || host === "127.0.0.1") hosts.set(port, host);
      }
    }
    return hosts;
  }

  poll() {
    this.hosts = this.scan();
    const ports = [...this.hosts.keys()].sort((a, b) => a - b).slice(0, MAX_REPORTED);
    const key = ports.join(",");
    if (key !== this.last) {
      this.last = key;
      this.report(ports);
    }
  }

  start() {
    if (this.timer) return;
    this.poll();
    this.timer = setInterval(() => this.poll(), this.interval);
    this.timer.unref();
  }

  /** Stop polling; report an empty set if something was reported. */
  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.hosts = new Map();
    if (this.last !== "") {
      this.last = "";
      this.report([]);
    }
  }

  /** Where to connect for `port` (127.0.0.1 unless only ::1 listens). */
  hostFor(port) {
    return this.hosts.get(port) || "127.0.0.1";
  }
}

module.exports = { PortWatcher, parse, MIN_PORT, MAX_REPORTED };
