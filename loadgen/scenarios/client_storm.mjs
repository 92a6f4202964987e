#!/usr/bin/env node
// Reconnect storm with the real browser client (server/web/wspush.mjs, the module the page loads)
// in Node: N clients, each subscribed to its mailbox and to a topic every client shares, lose their
// server and come back. The server is sent SIGTERM (it drains: 1001 closes spread over
// --drain-seconds) or SIGKILL, and a fresh one is started on the same port once the old one is
// gone. A publisher posts to the shared topic every 100 ms throughout.
//
// Measured: when each client was back (seconds after the new server listened), how long each was
// away, the spread of the returns (an SVG histogram), and delivery: every event the new server
// published reaches every client exactly once (its history holds them all: a late client gets
// them replayed), and what each client got from the old server has no gap. A restart loses the
// embedded history, so every client is told `lost` for what it missed in between.
//
//   node loadgen/scenarios/client_storm.mjs --server build/server/wspush --clients 2000 --signal TERM \
//        [--drain-seconds 2] [--svg docs/client-storm-term.svg] [--json out.json]
// Exit 0 when every client came back and nothing inside the history window was lost.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import WebSocket from 'ws';

import { WsPush } from '../../server/web/wspush.mjs';

function option(name, fallback) {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}
const binary = option('server', 'build/server/wspush');
const count = Number(option('clients', '2000'));
const signal = option('signal', 'TERM');
const drainSeconds = Number(option('drain-seconds', '2'));
const svgPath = option('svg', '');
const jsonPath = option('json', '');
const limitS = Number(option('timeout', '120'));  // the whole run is bounded
const io = option('io', 'uring');
const TOPIC = 'all';

const die = (msg) => {
  console.error(`client_storm: ${msg}`);
  for (const p of procs) p.kill('SIGKILL');
  process.exit(1);
};
setTimeout(() => die(`not done within ${limitS}s`), limitS * 1000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function freePort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const procs = [];
function startServer(port) {
  return new Promise((resolve, reject) => {
    const p = spawn(binary, ['--listen', `127.0.0.1:${port}`, '--admin-listen', '127.0.0.1:0', '--auth=none',
      '--io', io, '--threads', '1', '--drain-seconds', String(drainSeconds), '--history-size', '1000'],
    { stdio: ['ignore', 'ignore', 'pipe'] });
    procs.push(p);
    let log = '';
    p.stderr.on('data', (d) => {
      log += d;
      const admin = /admin API at [0-9.]+:(\d+)/.exec(log);
      if (admin && /listening on/.test(log)) resolve({ proc: p, admin: Number(admin[1]), listenedAt: Date.now() });
    });
    p.on('exit', (code) => reject(new Error(`server exited (${code}) before listening:\n${log}`)));
  });
}

/** One publish to the shared topic; the seq it carries; false when the server did not take it. */
async function publish(server, seq) {
  try {
    const r = await fetch(`http://127.0.0.1:${server.admin}/publish`, {
      method: 'POST', body: JSON.stringify({ topic: TOPIC, data: { seq } }),
    });
    if (r.status !== 200) return null;
    return (await r.json()).id;
  } catch {
    return null;
  }
}

const port = await freePort();
let server = await startServer(port);
const url = `ws://127.0.0.1:${port}/ws`;

// The clients: each its mailbox and the shared topic.
const clients = [];
for (let i = 0; i < count; i++) {
  const c = new WsPush(url, { WebSocket });
  const rec = { c, got: new Map(), lostAt: null, backAt: null, lost: false, opened: 0 };
  c.subscribe(TOPIC, (e) => rec.got.set(e.id, (rec.got.get(e.id) || 0) + 1));
  c.subscribe(`mailbox:${i}`, () => {});
  c.on('state', (s) => {
    if (s === 'open') {
      rec.opened++;
      if (rec.lostAt !== null && rec.backAt === null) rec.backAt = Date.now();
    } else if (s === 'reconnecting' && rec.lostAt === null && rec.opened > 0) {
      rec.lostAt = Date.now();
    }
  });
  c.on('lost', () => { rec.lost = true; });
  clients.push(rec);
}
const allOpen = () => clients.every((r) => r.c.state === 'open');
for (let t = 0; !allOpen(); t++) {
  if (t > 600) die(`${clients.filter((r) => r.c.state === 'open').length} of ${count} connected`);
  await sleep(50);
}
await sleep(500);  // every sub answered (they were sent on open) before the first publish
console.log(`${count} clients up`);

// Publish throughout: every 100 ms, to whichever server is up.
let seq = 0;
const published = [];  // {seq, id, epoch: 'old'|'new'}
let publishing = true;
let current = { server, epoch: 'old' };
const publisher = (async () => {
  while (publishing) {
    const s = current;
    const id = await publish(s.server, ++seq);
    if (id) published.push({ seq, id, epoch: s.epoch });
    await sleep(100);
  }
})();

await sleep(2000);
const cutAt = Date.now();
server.proc.kill(`SIG${signal}`);
await new Promise((r) => server.proc.once('exit', r));
const goneAt = Date.now();
// A killed io_uring process lets go of its listening socket a moment after it exits (the ring
// is torn down asynchronously): retry the bind briefly.
for (let attempt = 0; ; attempt++) {
  try {
    server = await startServer(port);
    break;
  } catch (err) {
    if (attempt >= 50 || !/Address already in use/.test(err.message)) die(err.message);
    await sleep(100);
  }
}
current = { server, epoch: 'new' };
console.log(`SIG${signal}: old server gone after ${((goneAt - cutAt) / 1000).toFixed(2)} s; new one listening`);

for (let t = 0; !clients.every((r) => r.backAt !== null); t++) {
  if (t > 1200) die(`${clients.filter((r) => r.backAt !== null).length} of ${count} came back`);
  await sleep(50);
}
await sleep(3000);  // the last returns catch up on the replay and a few live events
publishing = false;
await publisher;
await sleep(1000);  // the last publish reaches everyone

// Delivery.
const fresh = published.filter((p) => p.epoch === 'new');
const old = published.filter((p) => p.epoch === 'old');
let missingNew = 0;
let dups = 0;
let oldGaps = 0;
for (const r of clients) {
  for (const p of fresh) if (!r.got.has(p.id)) missingNew++;
  for (const n of r.got.values()) if (n > 1) dups++;
  // What it got from the old server: a prefix, without holes.
  const have = old.map((p) => r.got.has(p.id));
  const last = have.lastIndexOf(true);
  for (let k = 0; k < last; k++) if (!have[k]) oldGaps++;
}

// Returns: seconds after the new server listened.
const back = clients.map((r) => (r.backAt - server.listenedAt) / 1000).sort((a, b) => a - b);
const away = clients.map((r) => (r.backAt - r.lostAt) / 1000).sort((a, b) => a - b);
const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor(p * xs.length))];
const bin = 0.25;
const bins = new Array(Math.max(1, Math.ceil((back[back.length - 1] + 1e-9) / bin))).fill(0);
for (const b of back) bins[Math.max(0, Math.floor(b / bin))]++;
const summary = {
  clients: count, signal, drain_seconds: drainSeconds,
  old_server_gone_after_s: (goneAt - cutAt) / 1000,
  back_after_new_server_s: { p0: back[0], p10: pct(back, 0.1), p50: pct(back, 0.5), p90: pct(back, 0.9), p100: back[back.length - 1] },
  away_s: { p50: pct(away, 0.5), p90: pct(away, 0.9), p100: away[away.length - 1] },
  busiest_quarter_second: Math.max(...bins),
  told_lost: clients.filter((r) => r.lost).length,
  published_old: old.length, published_new: fresh.length,
  missing_inside_history: missingNew, duplicates: dups, gaps_before_the_cut: oldGaps,
  histogram_250ms: bins,
};
console.log(JSON.stringify(summary, null, 2));
if (jsonPath) writeFileSync(jsonPath, JSON.stringify(summary, null, 2));
if (svgPath) writeFileSync(svgPath, svg(bins, summary));

for (const r of clients) r.c.close();
server.proc.kill('SIGTERM');
await new Promise((r) => server.proc.once('exit', r));
const ok = missingNew === 0 && dups === 0 && oldGaps === 0 && fresh.length > 0;
process.exit(ok ? 0 : 1);

/** A bar chart of returns per 250 ms after the new server listened. */
function svg(counts, s) {
  const w = 720, h = 300, left = 50, bottom = 40, top = 40;
  const max = Math.max(...counts, 1);
  const bw = (w - left - 20) / counts.length;
  const bars = counts.map((n, i) => {
    const bh = ((h - top - bottom) * n) / max;
    return `<rect x="${(left + i * bw).toFixed(1)}" y="${(h - bottom - bh).toFixed(1)}" width="${Math.max(1, bw - 1).toFixed(1)}" height="${bh.toFixed(1)}" fill="#3b7dd8"/>`;
  }).join('');
  const ticks = [];
  for (let t = 0; t <= counts.length * bin; t += counts.length * bin > 8 ? 2 : 1) {
    const x = left + (t / bin) * bw;
    ticks.push(`<text x="${x.toFixed(1)}" y="${h - bottom + 16}" font-size="11" text-anchor="middle">${t}s</text>`);
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
<text x="${left}" y="20" font-size="13">${s.clients} clients back after SIG${s.signal}: returns per 250 ms after the new server listened (busiest ${max})</text>
<line x1="${left}" y1="${h - bottom}" x2="${w - 20}" y2="${h - bottom}" stroke="#333"/>
<line x1="${left}" y1="${top}" x2="${left}" y2="${h - bottom}" stroke="#333"/>
<text x="${left - 6}" y="${top + 4}" font-size="11" text-anchor="end">${max}</text>
<text x="${left - 6}" y="${h - bottom}" font-size="11" text-anchor="end">0</text>
${bars}${ticks.join('')}
</svg>
`;
}
