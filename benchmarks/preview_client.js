// The preview benchmark's figures measured inside the guest, against the same
// server on the guest's own loopback (no netmux hop): what the guest's Node
// costs by itself under TCG. Writes JSON to the path given.
//
//   node preview_client.js PORT ROUNDS OUT.json
"use strict";

const fs = require("node:fs");
const http = require("node:http");

const [port, rounds, out] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4]];
const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });

function get(path) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: "127.0.0.1", port, path, agent }, (res) => {
        let n = 0;
        res.on("data", (c) => (n += c.length));
        res.on("end", () => resolve(n));
      })
      .on("error", reject);
  });
}

async function main() {
  const MB10 = 10 * 1024 * 1024;
  const down = [];
  for (let i = 0; i < rounds; i++) {
    const t = process.hrtime.bigint();
    if ((await get(`/big?n=${MB10}`)) !== MB10) throw new Error("short body");
    down.push(Number(process.hrtime.bigint() - t) / 1e9);
  }
  const lat = [];
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < 1000; i++) {
    const t = process.hrtime.bigint();
    await get("/");
    lat.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  const seq = Number(process.hrtime.bigint() - t0) / 1e9;
  const t1 = process.hrtime.bigint();
  for (let i = 0; i < 1000; i += 8) await Promise.all(Array.from({ length: 8 }, () => get("/")));
  const par = Number(process.hrtime.bigint() - t1) / 1e9;
  lat.sort((a, b) => a - b);
  const figures = {
    download_10mb_s: down,
    download_mib_per_s: down.map((s) => 10 / s),
    small_sequential_total_s: seq,
    small_latency_ms: {
      p50: lat[500],
      p90: lat[900],
      p99: lat[990],
      mean: lat.reduce((a, b) => a + b, 0) / lat.length,
    },
    small_8_at_once_total_s: par,
    small_8_at_once_req_per_s: 1000 / par,
  };
  fs.writeFileSync(out + ".tmp", JSON.stringify(figures));
  fs.renameSync(out + ".tmp", out);
}

main().catch((err) => {
  fs.writeFileSync(out, JSON.stringify({ error: String(err) }));
});
