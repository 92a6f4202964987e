// The browser client (server/web/wspush.mjs) in Node, with the `ws` package as its WebSocket, against
// the real server: backoff draws and growing windows, events, resume with `since` (by replay, while
// the link is held down), lost, a refused token, the in-band refresh, dead-connection detection
// through the heartbeat, a sub refused `unavailable` while Redis is away sent again until Redis is
// back, the server's "lost" after Redis came back empty, a pub's error answering no sub, and the module the server serves being this very source (the classic
// /wspush.js runs in Chromium: browser.test.mjs). The event-stream fallback with a small
// EventSource made here on node:http (Node has none): after three refused upgrades, a stream
// reopened with `since` at each subscribe and unsubscribe, a stream cut and resumed, WebSocket
// taken back once it opens, and the token refreshed by reopening. Node's test runner (node:test), run as a script:
//   WSPUSH_SERVER=build/server/wspush WSPUSH_IO=epoll node tests/web/client.test.mjs
// Exit 0 pass, 1 fail, 77 when io_uring was asked for and is not available.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
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

/** An EventSource for Node on node:http: the WHATWG stream format (data, event and id fields,
 * comments, CR/LF/CRLF line ends), "open" on a 200 of text/event-stream, a MessageEvent per event,
 * and "error" when the response is refused (readyState CLOSED), breaks or ends (CONNECTING).
 * Unlike a browser's it does not reconnect by itself: the client closes a stream that fails and
 * opens another (with `since`), so that is all a test sees. Each one is kept in `eventStreams`
 * with its URL, whether it opened, and the events it dispatched. */
const eventStreams = [];
class NodeEventSource extends EventTarget {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSED = 2;

  constructor(url) {
    super();
    this.url = url;
    this.readyState = NodeEventSource.CONNECTING;
    this.opened = false;
    this.dialsBefore = dials;  // WebSocket tries made before this stream
    this.events = [];  // {type, data, id}
    this.done = false;
    eventStreams.push(this);
    this.req = http.get(url, { headers: { Accept: 'text/event-stream' } }, (res) => {
      this.status = res.statusCode;
      if (res.statusCode !== 200 || !/^text\/event-stream/.test(res.headers['content-type'] || '')) {
        res.resume();
        return this.fail(NodeEventSource.CLOSED);
      }
      this.readyState = NodeEventSource.OPEN;
      this.opened = true;
      this.dispatchEvent(new Event('open'));
      notify();
      res.setEncoding('utf8');
      let buf = '';
      let type = '';
      let data = [];
      let lastId = '';
      res.on('data', (chunk) => {
        buf += chunk;
        for (let m; (m = /\r\n|\r(?=[^\n])|\n/.exec(buf));) {
          const line = buf.slice(0, m.index);
          buf = buf.slice(m.index + m[0].length);
          if (line === '') {  // the event ends
            if (data.length && !this.done) {
              const e = { type: type || 'message', data: data.join('\n'), id: lastId };
              this.events.push(e);
              this.dispatchEvent(new MessageEvent(e.type, { data: e.data, lastEventId: lastId }));
              notify();
            }
            type = '';
            data = [];
            continue;
          }
          if (line.startsWith(':')) continue;  // a comment: the keepalive
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'data') data.push(value);
          else if (field === 'event') type = value;
          else if (field === 'id' && !value.includes('\0')) lastId = value;
        }
      });
      res.on('close', () => this.fail(NodeEventSource.CONNECTING));
    });
    this.req.on('error', () => this.fail(NodeEventSource.CONNECTING));
  }

  fail(state) {
    if (this.done) return;
    this.done = true;
    this.readyState = state;
    this.dispatchEvent(new Event('error'));
    notify();
  }

  close() {
    this.done = true;
    this.readyState = NodeEventSource.CLOSED;
    this.req.destroy();
  }

  /** The stream's query: topics, since (each as the client wrote it, decoded) and token. */
  get query() {
    const q = new URL(this.url).searchParams;
    return { topics: q.get('topics')?.split(','), since: q.get('since'), token: q.get('token') };
  }
}

/** Every state a client takes with its transport ("open/sse"), from its first. */
function transports(client) {
  const seen = [`${client.state}/${client.transport}`];
  client.on('state', (s, transport) => {
    seen.push(`${s}/${transport}`);
    notify();
  });
  return seen;
}

/** Each topic's events as data in arrival order: a gap or a double shows as a list that is not 1..n. */
function byTopic(events) {
  const out = {};
  for (const e of events) (out[e.topic] ??= []).push(e.data.n);
  return out;
}
const upTo = (n) => Array.from({ length: n }, (_, k) => k + 1);

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

test('without an EventSource (Node) "auto" stays on WebSocket and "sse" is refused; the stream URL beside the WebSocket one', async () => {
  const ws = (url, options) => new WsPush(url, { WebSocket: Recording, ...options });
  assert.throws(() => ws('ws://127.0.0.1:1/ws', { transport: 'sse' }), /EventSource/);
  assert.throws(() => ws('ws://127.0.0.1:1/ws', { transport: 'carrier pigeon' }), /transport/);
  const port = await reservePort();  // never bound: every try is refused
  const c = client(`ws://127.0.0.1:${port}/ws`, { baseDelay: 5, maxDelay: 20 });
  const seen = transports(c);
  const before = dials;
  await until(() => dials >= before + 8, 'eight tries');
  assert.equal(c.transport, 'websocket');
  assert.ok(seen.every((s) => s.endsWith('/websocket')), `states ${seen}`);
  c.close();
  const at = (url, options = {}) => {
    const x = ws(url, { transport: 'websocket', ...options });
    x.close();
    return x._sseUrl;
  };
  assert.equal(at('ws://h:1/ws'), 'http://h:1/sse');
  assert.equal(at('wss://push.example.com/ws'), 'https://push.example.com/sse');
  assert.equal(at('wss://h/push/ws'), 'https://h/push/sse');
  assert.equal(at('ws://h/ws', { sseUrl: 'http://elsewhere/events' }), 'http://elsewhere/events');
});

test('WebSocket refused three times: event streams; each subscribe and unsubscribe reopens with since; 50 events once each', async () => {
  const server = await start();
  // An upgrade to a path that is not the server's WebSocket path is answered 404, as by a proxy
  // that refuses WebSocket; the stream URL (.../sse) is the server's.
  const c = client(`ws://127.0.0.1:${server.port}/refused`, {
    EventSource: NodeEventSource, baseDelay: 5, maxDelay: 20, wsRetryInterval: 3600e3,
  });
  const seen = transports(c);
  const dialed = dials - 1;  // the first try was made by the constructor
  const first = eventStreams.length;
  const got = [];
  const take = (e) => {
    got.push(e);
    notify();
  };
  c.subscribe('mailbox:31', take);
  await until(() => c.state === 'open' && c.transport === 'sse', 'the client open on streams');
  assert.deepEqual(seen, ['connecting/websocket', 'reconnecting/websocket', 'reconnecting/sse', 'open/sse']);
  await until(() => c.topicState('mailbox:31') === 'subscribed', 'mailbox:31 subscribed');
  const streams = () => eventStreams.slice(first);
  assert.equal(streams()[0].dialsBefore - dialed, 3, 'not three WebSocket tries before the first stream');
  assert.deepEqual(streams().at(-1).query, { topics: ['mailbox:31'], since: null, token: null });
  assert.match(streams().at(-1).url, /^http:\/\/127\.0\.0\.1:\d+\/sse\?topics=mailbox%3A31$/);
  for (let n = 1; n <= 5; n++) await publish(server, 'mailbox:31', { n });
  await until(() => got.length >= 5, 'five events');
  // A second topic: the stream is reopened with both, the first from the last event delivered,
  // the second with an empty position (it has none).
  c.subscribe('team:32', take);
  await until(() => c.topicState('team:32') === 'subscribed', 'team:32 subscribed');
  const two = streams().at(-1);
  assert.deepEqual(two.query, { topics: ['mailbox:31', 'team:32'], since: `${got[4].id},`, token: null });
  assert.equal(two.events[0].type, 'subbed');
  assert.equal(streams().filter((s) => !s.done).length, 1, 'more than one stream open');
  // Published while the stream is reopened again and again (a third topic comes and goes):
  // what falls between two streams comes by replay from since.
  for (let n = 6; n <= 30; n++) {
    if (n % 5 === 1) c.subscribe('other:33', () => {});
    if (n % 5 === 3) c.unsubscribe('other:33');
    await publish(server, 'mailbox:31', { n });
    await publish(server, 'team:32', { n: n - 5 });
  }
  await until(() => got.length >= 55, `55 events (${got.length} came)`);
  assert.ok(streams().length >= 10, `only ${streams().length} streams: the reopens did not happen`);
  // The last of them names what is subscribed now, in the order subscribed, from where each was.
  await until(() => streams().at(-1).opened && c.topicState('team:32') === 'subscribed', 'the last stream');
  assert.deepEqual(streams().at(-1).query.topics, ['mailbox:31', 'team:32']);
  // A last event each: anything doubled would have come before it.
  await publish(server, 'mailbox:31', { n: 31 });
  await publish(server, 'team:32', { n: 26 });
  await until(() => got.length >= 57, '57 events');
  assert.deepEqual(byTopic(got), { 'mailbox:31': upTo(31), 'team:32': upTo(26) });
  assert.equal(c.transport, 'sse');
  assert.equal(seen.at(-1), 'open/sse');
  // Once the streams were open WebSocket was tried once more (refused), then not for an hour.
  assert.equal(dials - dialed, 4);
  c.close();
});

test('transport "sse": a stream cut (the link held down) is reopened from every topic\'s last id: no gap, no double', async () => {
  const server = await start();
  const gate = await new TcpGate(server.port).open();
  const c = client(`ws://127.0.0.1:${gate.port}/ws`, { transport: 'sse', EventSource: NodeEventSource, baseDelay: 20, maxDelay: 200 });
  const seen = transports(c);
  const first = eventStreams.length;
  const dialed = dials;
  const got = [];
  for (const topic of ['mailbox:41', 'team:42']) {
    c.subscribe(topic, (e) => {
      got.push(e);
      notify();
    });
  }
  await until(() => c.topicState('mailbox:41') === 'subscribed' && c.topicState('team:42') === 'subscribed', 'both subscribed');
  // Four to one topic, two to the other: their last ids differ, so positions given to the wrong
  // topic would show.
  for (let n = 1; n <= 4; n++) await publish(server, 'mailbox:41', { n });
  for (let n = 1; n <= 2; n++) await publish(server, 'team:42', { n });
  await until(() => got.length >= 6, 'six events');
  const last = (topic) => got.filter((e) => e.topic === topic).at(-1).id;
  const since = `${last('mailbox:41')},${last('team:42')}`;
  await cutOff(gate, server);
  await until(() => c.state === 'reconnecting', 'the client to see the cut');
  for (let n = 5; n <= 7; n++) await publish(server, 'mailbox:41', { n });
  for (let n = 3; n <= 5; n++) await publish(server, 'team:42', { n });
  assert.equal(got.length, 6, 'an event arrived while the link was down');
  await gate.open();
  await until(() => got.length >= 12, `twelve events (${got.length} came)`);
  await publish(server, 'mailbox:41', { n: 8 });
  await until(() => got.length >= 13, 'the thirteenth');
  assert.deepEqual(byTopic(got), { 'mailbox:41': upTo(8), 'team:42': upTo(5) });
  // The stream that came back asked for what came after each topic's last event, in its order.
  const back = eventStreams.slice(first).filter((s) => s.opened).at(-1);
  assert.deepEqual(back.query, { topics: ['mailbox:41', 'team:42'], since, token: null });
  assert.deepEqual(seen, ['connecting/sse', 'open/sse', 'reconnecting/sse', 'open/sse']);
  assert.equal(dials, dialed, 'a WebSocket was tried');
  c.close();
  await gate.shut();
});

test('"auto" on event streams tries WebSocket again and moves back when it opens: resumed with since, nothing lost or doubled', async () => {
  const server = await start();
  const gate = await new TcpGate(server.port).open();  // WebSocket's way: held down at first
  await gate.shut();
  const c = client(`ws://127.0.0.1:${gate.port}/ws`, {
    EventSource: NodeEventSource, sseUrl: `http://127.0.0.1:${server.port}/sse`, baseDelay: 5, maxDelay: 20,
    wsRetryInterval: 400,
  });
  const seen = transports(c);
  const first = eventStreams.length;
  const got = [];
  for (const topic of ['mailbox:51', 'team:52']) {
    c.subscribe(topic, (e) => {
      got.push(e);
      notify();
    });
  }
  await until(() => c.transport === 'sse' && c.topicState('team:52') === 'subscribed', 'subscribed over a stream');
  const tried = dials;
  await until(() => dials >= tried + 2, 'WebSocket tried again twice');  // every 200-400 ms
  assert.equal(c.transport, 'sse');
  let n = 0;
  const both = async () => {
    n++;
    await publish(server, 'mailbox:51', { n });
    await publish(server, 'team:52', { n });
  };
  while (n < 5) await both();
  await until(() => got.length >= 10, 'ten events over the stream');
  // WebSocket passes again while events are published: the client moves at its next try.
  await gate.open();
  const deadline = Date.now() + scaled(10) * 1000;
  while (c.transport !== 'websocket' || c.topicState('team:52') !== 'subscribed') {
    assert.ok(Date.now() < deadline, `still on ${c.transport} (${c.state}) 10 s after WebSocket passes again`);
    await both();
    await new Promise((r) => setTimeout(r, 20));
  }
  for (let k = 0; k < 5; k++) await both();
  await until(() => got.length >= 2 * n, `${2 * n} events (${got.length} came)`);
  assert.deepEqual(byTopic(got), { 'mailbox:51': upTo(n), 'team:52': upTo(n) });
  // The WebSocket's sub resumed each topic from the event delivered just before its first event
  // on the WebSocket: the seam is exact.
  const ws = c._ws;
  const sub = ws.sent.find((m) => m.op === 'sub');
  for (const topic of ['mailbox:51', 'team:52']) {
    const firstOnWs = ws.frames.find((m) => m.topic === topic);
    assert.ok(firstOnWs, `no event of ${topic} came on the WebSocket`);
    const at = got.findIndex((e) => e.topic === topic && e.id === firstOnWs.id);
    const before = got.slice(0, at).filter((e) => e.topic === topic).at(-1);
    assert.equal(sub.since[topic], before.id, `${topic} resumed from ${sub.since[topic]}, not ${before.id}`);
  }
  assert.equal(eventStreams.slice(first).filter((s) => !s.done).length, 0, 'a stream is still open');
  assert.deepEqual(seen.slice(-2), ['open/sse', 'open/websocket']);
  c.close();
  await gate.shut();
});

test('on event streams the token is refreshed by reopening the stream before exp; without getToken, auth_failed at exp', async () => {
  const server = await start({ jwtSecret: SECRET });
  const short = mint({ exp: nowS() + Math.ceil(scaled(10)), topics: ['mailbox:61'] });
  const fresh = mint({ exp: nowS() + 3600, topics: ['mailbox:61'] });
  const url = `ws://127.0.0.1:${server.port}/ws`;
  let asked = 0;
  const first = eventStreams.length;
  const c = client(url, {
    transport: 'sse', EventSource: NodeEventSource, token: short, refreshAt: [0.4, 0.4],
    getToken: async () => { asked++; return fresh; },
  });
  const seen = transports(c);
  const got = collect(c, 'mailbox:61');
  await until(() => c.topicState('mailbox:61') === 'subscribed', 'subscribed');
  // The control: the same token, no getToken; the server ends its stream at exp.
  const control = client(url, { transport: 'sse', EventSource: NodeEventSource, token: short, baseDelay: 20 });
  const controlSeen = transports(control);
  control.subscribe('mailbox:61', () => {});
  await publish(server, 'mailbox:61', { n: 1 });
  await got.until(1);
  await until(() => controlSeen.includes('auth_failed/sse'), 'the control to fail at exp', 30);
  assert.equal(asked, 1);
  assert.equal(c._token, fresh);
  const mine = eventStreams.slice(first).filter((s) => s.query.token === fresh);
  assert.ok(mine.length >= 1 && mine[0].opened, 'no stream with the fresh token');
  assert.deepEqual(mine[0].query.since, got[0].id);
  await publish(server, 'mailbox:61', { n: 2 });
  await got.until(2);
  assert.deepEqual(got.map((e) => e.data.n), [1, 2]);
  assert.deepEqual(seen, ['connecting/sse', 'open/sse']);
  c.close();
});

test('a revoked user (close 4403, a stream\'s refused "revoked"): a fresh token first with getToken, else auth_failed at once', async () => {
  const server = await start({ jwtSecret: SECRET });
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const old = mint({ sub: 'u-revoked', iat: nowS() - 5, exp: nowS() + 3600, topics: ['mailbox:71'] });
  // Issued after the revoke (its second is refused too: iat not after it).
  const fresh = () => mint({ sub: 'u-revoked', iat: nowS() + 1, exp: nowS() + 3600, topics: ['mailbox:71'] });
  let asked = 0;
  const getToken = async () => { asked++; return fresh(); };
  const ws = client(url, { token: old, baseDelay: 20, getToken });
  const wsBare = client(url, { token: old, baseDelay: 20 });
  const sse = client(url, { transport: 'sse', EventSource: NodeEventSource, token: old, baseDelay: 20, getToken });
  const sseBare = client(url, { transport: 'sse', EventSource: NodeEventSource, token: old, baseDelay: 20 });
  const seen = [ws, wsBare, sse, sseBare].map(transports);
  const errors = [];
  sseBare.on('error', (e) => errors.push(e));
  for (const c of [ws, wsBare, sse, sseBare]) c.subscribe('mailbox:71', () => {});
  await until(() => [ws, wsBare, sse, sseBare].every((c) => c.topicState('mailbox:71') === 'subscribed'), 'all subscribed');
  const r = await fetch(`http://127.0.0.1:${server.adminPort}/disconnect`, { method: 'POST', body: JSON.stringify({ sub: 'u-revoked' }) });
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { disconnected: 4 });
  await until(() => seen[1].includes('auth_failed/websocket') && seen[3].includes('auth_failed/sse'), 'both without getToken to stop');
  await until(() => ws.state === 'open' && sse.state === 'open' && asked === 2, 'both with getToken to reopen');
  // Without getToken: stopped at once, the revoked token never tried again (no reconnecting).
  assert.deepEqual(seen[1], ['connecting/websocket', 'open/websocket', 'auth_failed/websocket']);
  assert.deepEqual(seen[3], ['connecting/sse', 'open/sse', 'auth_failed/sse']);
  assert.deepEqual(errors, [{ code: 'revoked' }]);
  // With it: asked first, so the revoked token was refused at no upgrade either.
  assert.equal(await metric(server, 'wspush_upgrades_total{result="revoked"}'), 0);
  assert.equal(await metric(server, 'wspush_revoked_connections_total'), 4);
  assert.notEqual(ws._token, old);
  assert.notEqual(sse._token, old);
  ws.close();
  sse.close();
});

/** A server whose `room:` topics keep presence and announce joins and leaves; `news:` keeps neither. */
async function presenceServer() {
  const config = path.join(mkdtempSync(path.join(tmpdir(), 'wspush-presence-')), 'wspush.toml');
  writeFileSync(config, '[namespace."room:"]\npresence = true\njoin-leave = true\n');
  return start({ jwtSecret: SECRET, extra: ['--config', config] });
}
const member = (sub) => mint({ sub, exp: nowS() + 3600, topics: ['room:*', 'news:*'] });

/** Every join and leave a client hears, as "join w room:1". */
function joinsAndLeaves(c) {
  const heard = [];
  for (const op of ['join', 'leave']) {
    c.on(op, ({ topic, user }) => {
      heard.push(`${op} ${user} ${topic}`);
      notify();
    });
  }
  return heard;
}

/** The code a promise is rejected with (fails if it resolves). */
async function refusal(promise) {
  try {
    const v = await promise;
    assert.fail(`resolved with ${JSON.stringify(v)}`);
  } catch (e) {
    if (e.code === undefined) throw e;
    return e.code;
  }
}

test('presence and presenceCount; join and leave once per user, not per tab; refusals carry their code', async () => {
  const server = await presenceServer();
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const room = 'room:1';
  const watcher = client(url, { token: member('w') });
  const heard = joinsAndLeaves(watcher);
  watcher.subscribe(room, () => {});
  // Asked while connecting: sent once the connection opens, after the sub.
  const early = watcher.presenceCount(room);
  await until(() => watcher.topicState(room) === 'subscribed', 'the watcher subscribed');
  assert.deepEqual(await early, { userCount: 1, connections: 1 });
  await until(() => heard.length >= 1, 'the watcher\'s own join');
  // Two tabs of alice: one join.
  const tabs = [client(url, { token: member('alice') }), client(url, { token: member('alice') })];
  for (const tab of tabs) tab.subscribe(room, () => {});
  await until(() => tabs.every((t) => t.topicState(room) === 'subscribed'), 'both tabs subscribed');
  assert.deepEqual(await watcher.presence(room), { users: { w: 1, alice: 2 }, userCount: 2, connections: 3, truncated: false });
  assert.deepEqual(await tabs[0].presenceCount(room), { userCount: 2, connections: 3 });
  // Several in flight at once, refusals among them: each answer goes to its own request.
  const many = [watcher.presence(room), watcher.presenceCount('news:1'), watcher.presenceCount(room),
    watcher.presence('secret:1'), watcher.presence('news:1'), watcher.presence('not a topic')];
  watcher.subscribe('news:1', () => {});  // a sub in between is answered in its turn
  const [all, , count] = await Promise.all([many[0], many[1].catch(() => {}), many[2]]);
  assert.equal(all.userCount, 2);
  assert.deepEqual(count, { userCount: 2, connections: 3 });
  assert.equal(await refusal(many[1]), 'not_enabled');
  assert.equal(await refusal(many[3]), 'forbidden');
  assert.equal(await refusal(many[4]), 'not_enabled');
  assert.equal(await refusal(many[5]), 'bad_request');  // refused before it was read: no `of`, in its turn
  await until(() => watcher.topicState('news:1') === 'subscribed', 'news:1 subscribed after the refusals');
  const err = await watcher.presence('news:1').catch((e) => e);
  assert.ok(err instanceof Error && err.code === 'not_enabled' && err.topic === 'news:1', `${err}`);
  // The first tab goes: alice is still there. The second: alice leaves, once.
  tabs[0].close();
  await until(async () => (await watcher.presenceCount(room)).connections === 2, 'the first tab gone');
  assert.deepEqual(heard, [`join w ${room}`, `join alice ${room}`]);
  tabs[1].close();
  await until(() => heard.length >= 3, 'alice\'s leave');
  assert.deepEqual(await watcher.presence(room), { users: { w: 1 }, userCount: 1, connections: 1, truncated: false });
  assert.deepEqual(heard, [`join w ${room}`, `join alice ${room}`, `leave alice ${room}`]);
  // Joins and leaves of a topic the page left are not told.
  watcher.unsubscribe(room);
  const bob = client(url, { token: member('bob') });
  bob.subscribe(room, () => {});
  await until(() => bob.topicState(room) === 'subscribed', 'bob subscribed');
  await watcher.presenceCount(room);  // answered after anything the room sent the watcher
  assert.equal(heard.length, 3);
  watcher.close();
  bob.close();
});

test('presence: a connection that closes before the answer, close() and auth_failed reject with "closed"', async () => {
  const server = await presenceServer();
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const c = client(url, { token: member('u1'), baseDelay: 20, maxDelay: 200 });
  await when(c, 'state', (s) => s === 'open');
  const first = c._ws;
  const cut = c.presence('room:2');
  first.terminate();  // gone before the answer can come
  assert.equal(await refusal(cut), 'closed');
  await until(() => c.state === 'open' && c._ws !== first, 'the client back');
  assert.deepEqual(await c.presenceCount('room:2'), { userCount: 0, connections: 0 });
  c.close();
  assert.equal(await refusal(c.presence('room:2')), 'closed');
  // Asked while connecting, then closed by the page.
  const d = client(url, { token: member('u2') });
  const waiting = d.presence('room:2');
  d.close();
  assert.equal(await refusal(waiting), 'closed');
  // Asked while connecting with a token refused (no getToken): auth_failed.
  const e = client(url, { token: mint({ sub: 'u3', exp: nowS() + 3600 }, 'wrong secret') });
  const never = e.presenceCount('room:2');
  await when(e, 'state', (s) => s === 'auth_failed');
  assert.equal(await refusal(never), 'closed');
});

test('on event streams: join and leave reach the same handlers; presence rejects "unsupported"', async () => {
  const server = await presenceServer();
  const room = 'room:3';
  const s = client(`ws://127.0.0.1:${server.port}/ws`, {
    transport: 'sse', EventSource: NodeEventSource, token: member('s'), baseDelay: 20,
  });
  const heard = joinsAndLeaves(s);
  s.subscribe(room, () => {});
  await until(() => s.state === 'open' && s.topicState(room) === 'subscribed', 'the stream open and subscribed');
  assert.equal(await refusal(s.presence(room)), 'unsupported');
  assert.equal(await refusal(s.presenceCount(room)), 'unsupported');
  const bob = client(`ws://127.0.0.1:${server.port}/ws`, { token: member('bob') });
  const bobHeard = joinsAndLeaves(bob);
  bob.subscribe(room, () => {});
  await until(() => heard.includes(`join bob ${room}`), 'bob\'s join on the stream');
  assert.deepEqual(await bob.presence(room), { users: { s: 1, bob: 1 }, userCount: 2, connections: 2, truncated: false });
  // The stream as the server wrote it: `event: join`, the JSON as data.
  const stream = eventStreams.at(-1);
  assert.ok(stream.events.some((e) => e.type === 'join' && JSON.parse(e.data).user === 'bob'), 'no `event: join` on the stream');
  bob.close();
  await until(() => heard.includes(`leave bob ${room}`), 'bob\'s leave on the stream');
  assert.ok(stream.events.some((e) => e.type === 'leave' && JSON.parse(e.data).user === 'bob'), 'no `event: leave`');
  assert.deepEqual(heard, [`join s ${room}`, `join bob ${room}`, `leave bob ${room}`]);
  assert.ok(bobHeard.includes(`join s ${room}`) === false, 'bob joined after s: nothing of s to hear');
  s.close();
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
