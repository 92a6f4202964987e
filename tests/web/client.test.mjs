// The browser client (server/web/wspush.mjs) in Node, with the `ws` package as its WebSocket, against
// the real server: backoff bounds and jitter spread, events, resume with `since`, lost, a refused
// token, the in-band refresh, dead-connection detection through the heartbeat, and the module the
// server serves being this very source. Node's test runner (node:test), run as a script:
//   WSPUSH_SERVER=build/server/wspush WSPUSH_IO=epoll node tests/web/client.test.mjs
// Exit 0 pass, 1 fail, 77 when io_uring was asked for and is not available.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import vm from 'node:vm';
import WebSocket from 'ws';

import { WsPush, backoffDelay, tokenExpiry } from '../../server/web/wspush.mjs';
import { Server, Skip, scaled } from '../integration/testlib.mjs';

const binary = process.env.WSPUSH_SERVER;
const io = process.env.WSPUSH_IO || 'epoll';
const SECRET = 'client-test-secret';
if (!binary) {
  console.error('set WSPUSH_SERVER to the wspush binary');
  process.exit(2);
}

const servers = [];
async function start(options = {}) {
  const server = new Server({ server: binary, io, mode: 'pubsub', ...options });
  servers.push(server);
  try {
    return await server.start();
  } catch (err) {
    if (err instanceof Skip) {
      console.log(`SKIP: ${err.message}`);
      process.exit(77);
    }
    throw err;
  }
}

function mint(claims, secret = SECRET) {
  const b64 = (o) => Buffer.from(typeof o === 'string' ? o : JSON.stringify(o)).toString('base64url');
  const head = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(claims)}`;
  return `${head}.${createHmac('sha256', secret).update(head).digest('base64url')}`;
}
const nowS = () => Math.floor(Date.now() / 1000);

async function publish(server, topic, data) {
  const r = await fetch(`http://127.0.0.1:${server.adminPort}/publish`, {
    method: 'POST', body: JSON.stringify({ topic, data }),
  });
  assert.equal(r.status, 200, `publish answered ${r.status}`);
  return (await r.json()).id;
}

async function metric(server, name) {
  const text = await (await fetch(`http://127.0.0.1:${server.adminPort}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

/** Resolves when `emitter.on(event)` fires with a value passing `pred` (fails after `seconds`). */
function when(client, event, pred = () => true, seconds = 10) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no '${event}' within ${seconds}s (state ${client.state})`));
    }, scaled(seconds) * 1000);
    const off = client.on(event, (v) => {
      if (!pred(v)) return;
      clearTimeout(timer);
      off();
      resolve(v);
    });
  });
}

/** Collects a topic's events; `until(n)` resolves once n have arrived. */
function collect(client, topic) {
  const got = [];
  let wake = null;
  client.subscribe(topic, (e) => {
    got.push(e);
    wake?.();
  });
  got.until = async (n, seconds = 10) => {
    const deadline = Date.now() + scaled(seconds) * 1000;
    while (got.length < n) {
      if (Date.now() > deadline) throw new Error(`${got.length} of ${n} events of ${topic} arrived`);
      await new Promise((r) => { wake = r; setTimeout(r, 200); });
    }
    return got;
  };
  return got;
}

const clients = [];
function client(url, options = {}) {
  const c = new WsPush(url, { WebSocket, ...options });
  clients.push(c);
  return c;
}

/** A port nothing listens on. */
async function closedPort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

test('backoff: full jitter, uniform over [0, min(max, base * 2^n)]', () => {
  assert.equal(backoffDelay(0, 1000, 30000, () => 0), 0);
  assert.equal(backoffDelay(0, 1000, 30000, () => 0.999999), 999);
  assert.equal(backoffDelay(3, 1000, 30000, () => 0.5), 4000);
  assert.equal(backoffDelay(10, 1000, 30000, () => 0.999999), 29999);  // capped
  assert.equal(backoffDelay(1000, 1000, 30000, () => 0.5), 15000);     // no overflow, still capped
  // 20,000 real draws in a 10 s window: they cover it evenly (a fleet spreads over it).
  const window = 10000;
  const deciles = new Array(10).fill(0);
  let sum = 0;
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < 20000; i++) {
    const d = backoffDelay(20, 5, window);
    assert.ok(d >= 0 && d < window, `delay ${d} out of [0, ${window})`);
    deciles[Math.floor(d / (window / 10))]++;
    sum += d;
    min = Math.min(min, d);
    max = Math.max(max, d);
  }
  assert.ok(min < window * 0.01 && max > window * 0.99, `draws span [${min}, ${max}]`);
  assert.ok(Math.abs(sum / 20000 - window / 2) < window * 0.02, `mean ${sum / 20000}`);
  for (const n of deciles) assert.ok(n > 1600 && n < 2400, `deciles ${deciles}`);
});

test('reconnect attempts to a server that is down wait within their growing windows', async () => {
  const port = await closedPort();
  const attempts = [];
  class Counting extends WebSocket {
    constructor(...args) {
      attempts.push(Date.now());
      super(...args);
    }
  }
  const c = client(`ws://127.0.0.1:${port}/ws`, { WebSocket: Counting, baseDelay: 40, maxDelay: 400 });
  const deadline = Date.now() + scaled(10) * 1000;
  while (attempts.length < 8 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  c.close();
  assert.ok(attempts.length >= 8, `only ${attempts.length} attempts`);
  for (let k = 1; k < 8; k++) {
    const gap = attempts[k] - attempts[k - 1];
    const window = Math.min(400, 40 * 2 ** (k - 1));
    assert.ok(gap <= window + scaled(0.25) * 1000, `attempt ${k} came ${gap} ms after the last (window ${window} ms)`);
  }
  assert.equal(c.state, 'closed');
});

test('events arrive as {topic, id, data}; a dropped connection resumes with since: no gap, no duplicate', async () => {
  const server = await start();
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const c = client(url, { baseDelay: 200, random: () => 0.99 });
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, 'mailbox:1');
  // The sub must be in force before the first publish: a fence through another topic.
  const fence = collect(c, 'fence');
  await publish(server, 'fence', 0);
  await fence.until(1);
  for (let n = 1; n <= 3; n++) await publish(server, 'mailbox:1', { n, subject: `mail ${n}` });
  await got.until(3);
  assert.deepEqual(Object.keys(got[0]).sort(), ['data', 'id', 'topic']);
  assert.deepEqual(got[0].data, { n: 1, subject: 'mail 1' });
  c._ws.terminate();  // the network drops; the client comes back after its jittered delay (~400 ms)
  for (let n = 4; n <= 6; n++) await publish(server, 'mailbox:1', { n, subject: `mail ${n}` });
  await got.until(6);
  await publish(server, 'mailbox:1', { n: 7, subject: 'mail 7' });
  await got.until(7);
  assert.deepEqual(got.map((e) => e.data.n), [1, 2, 3, 4, 5, 6, 7]);
  assert.equal(new Set(got.map((e) => e.id)).size, 7);
  c.close();
});

test('past the history window the application is told "lost", and gets what is retained', async () => {
  const server = await start({ extra: ['--history-size', '2'] });
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { baseDelay: 750, random: () => 0.99 });
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, 'mailbox:2');
  const fence = collect(c, 'fence');
  await publish(server, 'fence', 0);
  await fence.until(1);
  await publish(server, 'mailbox:2', 1);
  await got.until(1);
  const lost = when(c, 'lost');
  c._ws.terminate();  // back in ~1.5 s (a lost connection's first window: 2 x 750 ms): five publishes meanwhile, the history keeps two
  for (let n = 2; n <= 6; n++) await publish(server, 'mailbox:2', n);
  assert.deepEqual(await lost, ['mailbox:2']);
  await got.until(3);
  assert.deepEqual(got.map((e) => e.data), [1, 5, 6]);
  c.close();
});

test('a refused token: getToken is asked once; a good fresh one reconnects, a bad one ends in auth_failed', async () => {
  const server = await start({ jwtSecret: SECRET });
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const expired = mint({ exp: nowS() - 10, topics: ['mailbox:3'] });
  let asked = 0;
  const bad = client(url, {
    token: expired, baseDelay: 20,
    getToken: async () => { asked++; return mint({ exp: nowS() + 3600, topics: ['mailbox:3'] }, 'wrong secret'); },
  });
  await when(bad, 'state', (s) => s === 'auth_failed');
  assert.equal(asked, 1);
  const none = client(url, { token: expired, baseDelay: 20 });  // no getToken at all
  await when(none, 'state', (s) => s === 'auth_failed');
  const good = client(url, {
    token: expired, baseDelay: 20, getToken: async () => mint({ exp: nowS() + 3600, topics: ['mailbox:3'] }),
  });
  await when(good, 'state', (s) => s === 'open');
  const got = collect(good, 'mailbox:3');
  await new Promise((r) => setTimeout(r, 100));
  await publish(server, 'mailbox:3', 'hello');
  await got.until(1);
  good.close();
  // A token that expires on an open connection without getToken: 1008, then auth_failed.
  const short = client(url, { token: mint({ exp: nowS() + 2, topics: ['mailbox:3'] }), baseDelay: 20 });
  await when(short, 'state', (s) => s === 'open');
  await when(short, 'state', (s) => s === 'auth_failed', 6);
});

test('the token is refreshed in-band before it expires, without a reconnect', async () => {
  const server = await start({ jwtSecret: SECRET });
  const exp = nowS() + 4;
  const fresh = mint({ exp: nowS() + 3600, topics: ['mailbox:4'] });
  let asked = 0;
  const c = client(`ws://127.0.0.1:${server.port}/ws`, {
    token: mint({ exp, topics: ['mailbox:4'] }), refreshAt: [0.4, 0.4],
    getToken: async () => { asked++; return fresh; },
  });
  const states = [];
  c.on('state', (s) => states.push(s));
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, 'mailbox:4');
  // Past the first token's exp (a deadline, not a synchronisation): without the refresh the
  // server would have closed the connection with 1008 by now.
  while (nowS() <= exp + 1) await new Promise((r) => setTimeout(r, 250));
  assert.equal(asked, 1);
  assert.equal(c._token, fresh);
  assert.deepEqual(states, ['open']);
  assert.equal(await metric(server, 'wspush_token_expired_closes_total'), 0);
  await publish(server, 'mailbox:4', 'still here');
  await got.until(1);
  c.close();
});

test('a server that goes silent is detected by the heartbeat and left; the client comes back', async () => {
  const server = await start({ extra: ['--ping-interval', '0.5', '--pong-timeout', '1'] });
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { heartbeatTimeout: 2000, baseDelay: 100 });
  await when(c, 'state', (s) => s === 'open');
  // Alive, it answers the text pings: the connection outlives several heartbeat timeouts.
  const before = await metric(server, 'wspush_messages_in_total');
  const settled = Date.now() + 5000;
  while (Date.now() < settled) await new Promise((r) => setTimeout(r, 250));
  assert.equal(c.state, 'open');
  assert.ok(await metric(server, 'wspush_messages_in_total') - before >= 4, 'no pongs answered the heartbeat');
  process.kill(server.proc.pid, 'SIGSTOP');  // the server hangs: TCP stays up, nothing arrives
  try {
    await when(c, 'state', (s) => s === 'reconnecting', 5);
  } finally {
    process.kill(server.proc.pid, 'SIGCONT');
  }
  await when(c, 'state', (s) => s === 'open', 10);
  c.close();
});

test('the server serves this source as /wspush.mjs, and as a classic script setting window.WsPush', async () => {
  const server = await start();
  const source = readFileSync(new URL('../../server/web/wspush.mjs', import.meta.url), 'utf8');
  const mjs = await fetch(`http://127.0.0.1:${server.port}/wspush.mjs`);
  assert.equal(mjs.status, 200);
  assert.match(mjs.headers.get('content-type'), /javascript/);
  assert.equal(await mjs.text(), source);
  const js = await (await fetch(`http://127.0.0.1:${server.port}/wspush.js`)).text();
  const page = { setTimeout, clearTimeout, URL, atob };  // a page's global object (window)
  vm.runInNewContext(js, page);
  assert.equal(typeof page.WsPush, 'function');
  assert.equal(page.WsPush.tokenExpiry(mint({ exp: 1234 })), 1234);
  assert.equal(tokenExpiry('not a token'), 0);
});

test.after(() => {
  for (const c of clients) c.close();
  for (const s of servers) s.kill();  // by PID; the test's event loop then drains and it exits
});
