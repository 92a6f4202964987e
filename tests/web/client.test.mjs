// The browser client (server/web/wspush.mjs) in Node, with the `ws` package as its WebSocket, against
// the real server: backoff draws and growing windows, events, resume with `since` (by replay, while
// the link is held down), lost, a refused token, the in-band refresh, dead-connection detection
// through the heartbeat, a sub refused `unavailable` while Redis is away sent again until Redis is
// back, the server's "lost" after Redis came back empty, a pub's error answering no sub, and the module the server serves being this very source (the classic
// /wspush.js runs in Chromium: browser.test.mjs). Node's test runner (node:test), run as a script:
//   WSPUSH_SERVER=build/server/wspush WSPUSH_IO=epoll node tests/web/client.test.mjs
// Exit 0 pass, 1 fail, 77 when io_uring was asked for and is not available.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import WebSocket from 'ws';

import { WsPush, backoffDelay, tokenExpiry } from '../../server/web/wspush.mjs';
import { Server, Skip, scaled } from '../integration/testlib.mjs';
import { reservePort } from '../integration/ports.mjs';
import { TcpGate } from './tcp_gate.mjs';

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

// Anything a test waits on (a frame, a state, a dial) wakes the waiters of until().
const wakers = new Set();
function notify() {
  for (const w of [...wakers]) w();
}

/** Resolves with cond()'s first truthy value (cond may be async), re-checked on every notify() and
 * every 100 ms (for what has no event: a metric); fails after `seconds` (scaled): only a hang stops it. */
async function until(cond, what, seconds = 10) {
  const deadline = Date.now() + scaled(seconds) * 1000;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${scaled(seconds)}s waiting for ${what}`);
    await new Promise((resolve) => {
      const wake = () => {
        wakers.delete(wake);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(wake, 100);
      wakers.add(wake);
    });
  }
}

/** Resolves when `emitter.on(event)` fires with a value passing `pred` (fails after `seconds`). */
function when(client, event, pred = () => true, seconds = 10) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no '${event}' within ${scaled(seconds)}s (state ${client.state})`));
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
  client.subscribe(topic, (e) => {
    got.push(e);
    notify();
  });
  got.until = (n, seconds = 10) => until(() => got.length >= n && got, `${n} events of ${topic} (${got.length} came)`, seconds);
  return got;
}

/** Every state a client takes, from its first ('connecting'). */
function states(client) {
  const seen = [client.state];
  client.on('state', (s) => {
    seen.push(s);
    notify();
  });
  return seen;
}

/** A real redis-server on a reserved port, without persistence: started again after stop(), it is
 * empty (a new epoch for the bus). Killed by PID. */
class Redis {
  constructor(port) {
    this.port = port;
    this.dir = mkdtempSync(path.join(tmpdir(), 'wspush-redis-'));
    this.proc = null;
  }

  async start() {
    const args = ['redis-server', '--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--save', '',
      '--appendonly', 'no', '--protected-mode', 'no', '--loglevel', 'warning'];
    const wrap = existsSync('/usr/bin/setpriv') ? ['/usr/bin/setpriv', '--pdeathsig', 'KILL', '--'] : [];
    const [cmd, ...rest] = [...wrap, ...args];
    const proc = spawn(cmd, rest, { stdio: 'ignore' });
    this.proc = proc;
    proc.exited = new Promise((resolve) => proc.on('exit', resolve));
    // Nothing to await but an answer: a refused connection has no event to wait on.
    await until(() => this.ping(), `redis-server on port ${this.port} to answer PING`, 30);
    return this;
  }

  ping() {
    return new Promise((resolve) => {
      const s = connect(this.port, '127.0.0.1');
      let got = '';
      s.on('connect', () => s.write('PING\r\n'));
      s.on('data', (d) => {
        got += d;
        if (got.includes('\r\n')) s.destroy();
      });
      s.on('error', () => resolve(false));
      s.on('close', () => resolve(got.startsWith('+PONG')));
    });
  }

  async stop() {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    process.kill(this.proc.pid, 'SIGKILL');
    await this.proc.exited;
  }
}
const redises = [];
async function redis() {
  const r = new Redis(await reservePort());
  redises.push(r);
  return r.start();
}

/** The `ws` WebSocket, numbering its connections (`dials`) and keeping what each sent and received. */
let dials = 0;
class Recording extends WebSocket {
  constructor(...args) {
    super(...args);
    this.dial = ++dials;
    this.sent = [];
    this.frames = [];
    this.on('message', (data) => {
      this.frames.push(JSON.parse(data.toString()));
      notify();
    });
    this.on('close', notify);
    notify();
  }

  send(data, ...rest) {
    this.sent.push(JSON.parse(data));
    return super.send(data, ...rest);
  }
}

const clients = [];
function client(url, options = {}) {
  const c = new WsPush(url, { WebSocket: Recording, ...options });
  clients.push(c);
  return c;
}

/** The server's `subbed` reply naming `topic` on the client's current connection: the sub is in force. */
function subbed(c, topic) {
  return until(() => c._ws?.frames?.some((m) => m.op === 'subbed' && m.topics.includes(topic)), `'subbed' for ${topic}`);
}

/** A client that reaches `server` through a TcpGate, open and subscribed to `topic`. */
async function gatedSubscriber(server, topic) {
  const gate = await new TcpGate(server.port).open();
  const c = client(`ws://127.0.0.1:${gate.port}/ws`, { baseDelay: 20, maxDelay: 200 });
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, topic);
  await subbed(c, topic);
  return { gate, c, got };
}

/** Shuts the gate, and waits until the server has dropped the subscription behind it. */
async function cutOff(gate, server) {
  await gate.shut();
  await until(async () => (await metric(server, 'wspush_subscriptions')) === 0, 'the server to drop the subscription');
}

/** The topics of each 'lost' the client emits, in order. */
function lostEvents(c) {
  const lost = [];
  c.on('lost', (topics) => {
    lost.push(topics);
    notify();
  });
  return lost;
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

test('reconnect tries to a server that is down: each waits its draw from a window that doubles', async () => {
  const port = await reservePort();  // reserved and never bound: every try is refused
  const attempts = [];
  class Counting extends Recording {
    constructor(...args) {
      attempts.push(performance.now());
      super(...args);
    }
  }
  const draws = [];  // what the client drew its delays from, and for which try in a row
  let c = null;
  const random = () => {
    const r = Math.random();
    draws.push({ attempt: c._attempt, r });
    return r;
  };
  c = client(`ws://127.0.0.1:${port}/ws`, { WebSocket: Counting, baseDelay: 40, maxDelay: 400, random });
  await until(() => attempts.length >= 8, 'eight tries');
  c.close();
  assert.equal(c.state, 'closed');
  // The first try is made at once; the k-th try after it draws from the window of try k-1 in a
  // row (40 ms doubling to the 400 ms cap, backoffDelay's unit test above), and comes no earlier
  // than its draw: a timer never fires early, a busy machine only makes it later.
  for (let k = 1; k < 8; k++) {
    assert.equal(draws[k - 1].attempt, k - 1, `draw ${k - 1} was for try ${draws[k - 1].attempt} in a row`);
    const delay = backoffDelay(k - 1, 40, 400, () => draws[k - 1].r);
    const gap = attempts[k] - attempts[k - 1];
    assert.ok(gap >= delay - 2, `try ${k} came ${gap.toFixed(1)} ms after the last, before its ${delay} ms delay`);
  }
});

test('events arrive as {topic, id, data}; what was published while the link was down comes by replay with since, once', async () => {
  const server = await start();
  const { gate, c, got } = await gatedSubscriber(server, 'mailbox:1');
  for (let n = 1; n <= 3; n++) await publish(server, 'mailbox:1', { n, subject: `mail ${n}` });
  await got.until(3);
  assert.deepEqual(Object.keys(got[0]).sort(), ['data', 'id', 'topic']);
  assert.deepEqual(got[0].data, { n: 1, subject: 'mail 1' });
  const first = c._ws;

  // The link drops and stays down: the client's tries are refused while 4-6 are published.
  await cutOff(gate, server);
  await until(() => c.state === 'reconnecting', 'the client to see the drop');
  for (let n = 4; n <= 6; n++) await publish(server, 'mailbox:1', { n, subject: `mail ${n}` });
  const triedBefore = dials;
  await until(() => dials >= triedBefore + 2, 'two refused tries');
  assert.equal(c.state, 'reconnecting');
  assert.equal(got.length, 3, 'an event arrived while the link was down');
  assert.equal(await metric(server, 'wspush_subscriptions'), 0);

  await gate.open();
  await got.until(6);
  const again = c._ws;
  assert.notEqual(again, first);
  // It asked for what came after 3, and got the subbed reply and then 4-6: acknowledged while no
  // connection held the subscription, they can only have come by replay.
  assert.deepEqual(again.sent[0], { op: 'sub', topics: ['mailbox:1'], since: { 'mailbox:1': got[2].id } });
  const onAgain = again.frames.filter((m) => m.op === 'subbed' || m.topic === 'mailbox:1')
    .map((m) => (m.op === 'subbed' ? `subbed ${m.topics} lost ${m.lost ?? []}` : m.data.n));
  assert.deepEqual(onAgain, ['subbed mailbox:1 lost ', 4, 5, 6]);
  await publish(server, 'mailbox:1', { n: 7, subject: 'mail 7' });
  await got.until(7);
  assert.deepEqual(got.map((e) => e.data.n), [1, 2, 3, 4, 5, 6, 7]);
  assert.equal(new Set(got.map((e) => e.id)).size, 7);
  c.close();
  await gate.shut();
});

test('a topic whose first events come while the link is down: the resume starts where subbed put it', async () => {
  const server = await start();
  const { gate, c, got } = await gatedSubscriber(server, 'mailbox:3');
  const first = c._ws;
  const answer = first.frames.find((m) => m.op === 'subbed');
  const at = answer?.at?.['mailbox:3'];
  assert.ok(at, `subbed ${JSON.stringify(answer)} gives no position`);

  await cutOff(gate, server);  // down before any event: without the position, these two would be missed
  for (let n = 1; n <= 2; n++) await publish(server, 'mailbox:3', n);
  assert.equal(got.length, 0, 'an event arrived while the link was down');
  await gate.open();
  await got.until(2);
  const again = c._ws;
  assert.notEqual(again, first);
  assert.deepEqual(again.sent[0], { op: 'sub', topics: ['mailbox:3'], since: { 'mailbox:3': at } });
  assert.deepEqual(got.map((e) => e.data), [1, 2]);
  // Resumed with a since, not lost: the position this answer gives is not taken, and the next
  // resume starts at event 2.
  assert.ok(again.frames.find((m) => m.op === 'subbed')?.at?.['mailbox:3']);
  assert.equal(c._topics.get('mailbox:3').since, got[1].id);
  c.close();
  await gate.shut();
});

test('past the history window the application is told "lost", and gets what is retained', async () => {
  const server = await start({ extra: ['--history-size', '2'] });
  const { gate, c, got } = await gatedSubscriber(server, 'mailbox:2');
  await publish(server, 'mailbox:2', 1);
  await got.until(1);
  const lost = lostEvents(c);
  await cutOff(gate, server);  // down while five are published: the history keeps the last two
  for (let n = 2; n <= 6; n++) await publish(server, 'mailbox:2', n);
  assert.equal(got.length, 1, 'an event arrived while the link was down');
  await gate.open();
  await until(() => lost.length >= 1, "'lost'");
  await got.until(3);
  assert.deepEqual(lost, [['mailbox:2']]);
  assert.deepEqual(got.map((e) => e.data), [1, 5, 6]);
  c.close();
  await gate.shut();
});

test('a topic found lost with nothing kept resumes from the position subbed gave: told once, not at every reconnect', async () => {
  const server = await start({ extra: ['--history-size', '0'] });
  const { gate, c, got } = await gatedSubscriber(server, 'mailbox:4');
  await publish(server, 'mailbox:4', 1);
  await got.until(1);
  const lost = lostEvents(c);
  await cutOff(gate, server);
  await publish(server, 'mailbox:4', 2);  // nothing is kept: lost
  await gate.open();
  await until(() => lost.length >= 1, "'lost'");
  const second = c._ws;
  const answer = second.frames.find((m) => m.op === 'subbed');
  assert.deepEqual(answer.lost, ['mailbox:4']);
  assert.ok(answer.at?.['mailbox:4'], `subbed ${JSON.stringify(answer)} gives no position`);
  await until(() => c._topics.get('mailbox:4').since === answer.at['mailbox:4'], 'since to be the position');
  // Nothing published while away the second time: the resume is from the position, not lost.
  await cutOff(gate, server);
  await gate.open();
  await until(() => c._ws !== second && c._ws?.frames?.some((m) => m.op === 'subbed'), 'the next subbed');
  assert.deepEqual(c._ws.sent[0], { op: 'sub', topics: ['mailbox:4'], since: { 'mailbox:4': answer.at['mailbox:4'] } });
  assert.deepEqual(c._ws.frames.find((m) => m.op === 'subbed').lost, []);
  assert.deepEqual(lost, [['mailbox:4']]);
  assert.deepEqual(got.map((e) => e.data), [1]);
  c.close();
  await gate.shut();
});

test('a sub refused "unavailable" while Redis is away is sent again, and subscribed once Redis is back', async () => {
  const r = await redis();
  const server = await start({ extra: ['--bus', `redis://127.0.0.1:${r.port}`] });
  await until(async () => (await metric(server, 'wspush_bus_up')) === 1, 'the bus up');
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { baseDelay: 20, maxDelay: 200 });
  const changes = [];
  c.on('subscription', (s) => {
    changes.push(`${s.topic} ${s.state}`);
    notify();
  });
  await when(c, 'state', (s) => s === 'open');
  collect(c, 'mailbox:5');
  await until(() => c.topicState('mailbox:5') === 'subscribed', 'mailbox:5 subscribed');
  const ws = c._ws;

  await r.stop();
  await until(async () => (await metric(server, 'wspush_bus_up')) === 0, 'the bus down');
  // The server holds the sub 10 s, then refuses it; the page sees the refusal and the topic retrying.
  const refused = when(c, 'error', (e) => e.code === 'unavailable', 30)
    .then((e) => ({ ...e, state: c.topicState('mailbox:6') }));
  const got = collect(c, 'mailbox:6');
  assert.equal(c.topicState('mailbox:6'), 'subscribing');
  assert.deepEqual(await refused, { code: 'unavailable', topic: 'mailbox:6', state: 'retrying' });
  assert.equal(c.topicState('mailbox:5'), 'subscribed');
  // Sent again on the same connection (at most 0.5 s later), held again while Redis is away.
  const subs = () => ws.sent.filter((m) => m.op === 'sub' && m.topics.includes('mailbox:6')).length;
  await until(() => subs() >= 2, 'the sub sent again');
  assert.equal(c.topicState('mailbox:6'), 'subscribing');

  await r.start();  // empty: what it had is gone, and the retried sub goes through
  await until(() => c.topicState('mailbox:6') === 'subscribed', 'mailbox:6 subscribed', 30);
  assert.equal(c._ws, ws, 'the client reconnected');
  // Each refusal in the hold makes one more retrying/subscribing round; it ends subscribed.
  const six = changes.filter((x) => x.startsWith('mailbox:6 ')).map((x) => x.split(' ')[1]);
  assert.deepEqual(six.slice(0, 3), ['subscribing', 'retrying', 'subscribing']);
  assert.equal(six.at(-1), 'subscribed');
  await publish(server, 'mailbox:6', 'after the outage');
  await got.until(1);
  assert.equal(got[0].data, 'after the outage');
  c.close();
  await r.stop();
});

test('Redis restarted empty under a subscriber: the server\'s {"op":"lost"} is the page\'s "lost"', async () => {
  const r = await redis();
  const server = await start({ extra: ['--bus', `redis://127.0.0.1:${r.port}`] });
  await until(async () => (await metric(server, 'wspush_bus_up')) === 1, 'the bus up');
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { baseDelay: 20, maxDelay: 200 });
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, 'mailbox:7');
  await until(() => c.topicState('mailbox:7') === 'subscribed', 'mailbox:7 subscribed');
  await publish(server, 'mailbox:7', 1);
  await got.until(1);
  const ws = c._ws;
  const lost = when(c, 'lost', () => true, 30);
  await r.stop();
  await until(async () => (await metric(server, 'wspush_bus_up')) === 0, 'the bus down');
  await r.start();
  assert.deepEqual(await lost, ['mailbox:7']);
  assert.equal(c._ws, ws, 'the client reconnected');
  assert.ok(ws.frames.some((m) => m.op === 'lost' && m.topics.includes('mailbox:7')), 'no {"op":"lost"} frame');
  assert.equal(c.topicState('mailbox:7'), 'subscribed');
  await publish(server, 'mailbox:7', 2);
  await got.until(2);
  c.close();
  await r.stop();
});

test('without a token, a 1008 for what the connection sent is not an auth failure: the client reconnects', async () => {
  const server = await start();
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { baseDelay: 20, maxDelay: 200 });
  const seen = states(c);
  await when(c, 'state', (s) => s === 'open');
  const got = collect(c, 'mailbox:8');
  await until(() => c.topicState('mailbox:8') === 'subscribed', 'mailbox:8 subscribed');
  const first = c._ws;
  const closed = new Promise((resolve) => first.once('close', resolve));
  // Refused 8 times in a row: the server closes with 1008.
  for (let k = 0; k < 8; k++) WebSocket.prototype.send.call(first, 'nope');
  assert.equal(await closed, 1008);
  await until(() => c.state === 'open' && c._ws !== first && c.topicState('mailbox:8') === 'subscribed',
    'the client back and subscribed');
  assert.deepEqual(seen, ['connecting', 'open', 'reconnecting', 'open']);
  await publish(server, 'mailbox:8', 'again');
  await got.until(1);
  c.close();
});

test('an error answering a pub ("of":"pub") answers no sub: the sub sent after the pub is subscribed', async () => {
  const server = await start(); // without --allow-client-publish: a pub is refused `forbidden`
  const c = client(`ws://127.0.0.1:${server.port}/ws`);
  await when(c, 'state', (s) => s === 'open');
  const errors = [];
  c.on('error', (e) => errors.push(e));
  // The page's own pub on the client's connection (the client has no method for it), then a sub:
  // the server answers them in that order.
  WebSocket.prototype.send.call(c._ws, JSON.stringify({ op: 'pub', topic: 'mailbox:9', data: 1 }));
  c.subscribe('mailbox:9', () => {});
  await subbed(c, 'mailbox:9');
  assert.deepEqual(errors, [{ code: 'forbidden', topic: 'mailbox:9', of: 'pub' }]);
  assert.equal(c.topicState('mailbox:9'), 'subscribed');
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
  await subbed(good, 'mailbox:3');
  await publish(server, 'mailbox:3', 'hello');
  await got.until(1);
  good.close();
});

test('the token is refreshed in-band before it expires, without a reconnect; without getToken, 1008 then auth_failed', async () => {
  const server = await start({ jwtSecret: SECRET });
  // Both connections must open and c subscribe before exp; the waits below end with the control's
  // close at exp, not with a clock, so a long life costs only its length.
  const short = mint({ exp: nowS() + Math.ceil(scaled(10)), topics: ['mailbox:4'] });
  const fresh = mint({ exp: nowS() + 3600, topics: ['mailbox:4'] });
  const url = `ws://127.0.0.1:${server.port}/ws`;
  let asked = 0;
  const c = client(url, {
    token: short, refreshAt: [0.4, 0.4], getToken: async () => { asked++; return fresh; },
  });
  const seen = states(c);
  // The control: the same token, no getToken. The server closes it with 1008 once the token has
  // expired; when it has, the first token is good nowhere, and only the refresh keeps c open.
  const control = client(url, { token: short, baseDelay: 20 });
  const controlSeen = states(control);
  await until(() => c.state === 'open', 'the refreshing client to open');
  const got = collect(c, 'mailbox:4');
  await subbed(c, 'mailbox:4');
  await until(() => controlSeen.includes('auth_failed'), 'the control to be closed at exp', 30);
  assert.deepEqual(controlSeen, ['connecting', 'open', 'auth_failed']);
  assert.equal(await metric(server, 'wspush_token_expired_closes_total'), 1);
  assert.equal(asked, 1);
  assert.ok(c._ws.frames.some((m) => m.op === 'authed'), 'the server never answered an auth');
  assert.ok(c._ws.sent.some((m) => m.op === 'auth' && m.token === fresh), 'no auth was sent');
  assert.equal(c._token, fresh);
  assert.deepEqual(seen, ['connecting', 'open']);
  await publish(server, 'mailbox:4', 'still here');
  await got.until(1);
  assert.deepEqual(seen, ['connecting', 'open']);
  c.close();
});

test('a server that goes silent is detected by the heartbeat and left; the client comes back', async () => {
  // Generous on both sides, so that only the hang below ends a connection on a busy machine: the
  // server closes a client whose pong is 5 s (scaled) late, and the client leaves a server it has
  // not heard for 10 s (scaled). The server pings again a pong timeout after its last ping (once
  // the connection has been silent for the ping interval), so the client hears one every 5-5.5 s.
  const server = await start({ extra: ['--ping-interval', '0.5', '--pong-timeout', String(scaled(5))] });
  const c = client(`ws://127.0.0.1:${server.port}/ws`, { heartbeatTimeout: scaled(10) * 1000, baseDelay: 100 });
  const seen = states(c);
  await until(() => c.state === 'open', 'open');
  // Alive, it pings and the client answers: four pongs on one connection, which span more than a
  // heartbeat timeout: the pings are what keep the client.
  const before = await metric(server, 'wspush_messages_in_total');
  await until(async () => (await metric(server, 'wspush_messages_in_total')) - before >= 4, 'four pongs', 60);
  assert.ok(c._ws.frames.filter((m) => m.op === 'ping').length >= 4, 'pongs without pings');
  assert.deepEqual(seen, ['connecting', 'open']);
  const first = c._ws;
  // The server hangs: TCP stays up, nothing arrives, only the client's heartbeat can leave.
  process.kill(server.proc.pid, 'SIGSTOP');
  try {
    await until(() => c.state === 'reconnecting', 'the client to leave the silent connection', 30);
  } finally {
    process.kill(server.proc.pid, 'SIGCONT');
  }
  await until(() => c.state === 'open', 'the client back', 20);
  assert.notEqual(c._ws, first);
  assert.deepEqual(seen, ['connecting', 'open', 'reconnecting', 'open']);
  c.close();
});

test('the server serves this source as /wspush.mjs, and /wspush.js as a script', async () => {
  const server = await start();
  const source = readFileSync(new URL('../../server/web/wspush.mjs', import.meta.url), 'utf8');
  const mjs = await fetch(`http://127.0.0.1:${server.port}/wspush.mjs`);
  assert.equal(mjs.status, 200);
  assert.match(mjs.headers.get('content-type'), /javascript/);
  assert.equal(await mjs.text(), source);
  const js = await fetch(`http://127.0.0.1:${server.port}/wspush.js`);
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /javascript/);  // run as a page's classic script in browser.test.mjs
  assert.equal(tokenExpiry(mint({ exp: 1234 })), 1234);
  assert.equal(tokenExpiry('not a token'), 0);
});

test.after(() => {
  for (const c of clients) c.close();
  for (const s of servers) s.kill();  // by PID; the test's event loop then drains and it exits
  for (const r of redises) r.stop();
});
