// The mailbox demo page in real Chromium (Debian's /usr/bin/chromium, driven by playwright-core; no
// browser is downloaded): the page connects, a publish through the admin API appears on it; the
// server is killed and a fresh one started on the same port while the page's link is held down (a
// TCP gate in front of the server): the page reconnects by itself once the link is back, says the
// history was lost (the embedded bus keeps none across a restart), shows what the new server
// published while it was away (replayed) and what came after. A screenshot is taken and must not
// be blank. Then the same page over https:// from a server with a certificate made here
// (certificate errors are ignored in that browser context only): its client connects over wss://
// and a publish arrives. Then the classic script /wspush.js in a page: window.WsPush, its backoff
// through a server restart (and topicState through it), its heartbeat leaving a server that hangs, and its in-band token
// refresh, each against the real server. Then the event-stream fallback: behind nginx (the shipped
// deploy/nginx/wspush.conf) made to refuse WebSocket upgrades, the client moves to EventSource
// after three refused tries and receives every event once through reopened streams; and with
// transport "sse", a stream cut by a TCP gate is resumed from every topic's last id.
//   WSPUSH_SERVER=build/server/wspush WSPUSH_IO=epoll node tests/web/browser.test.mjs
// Exit 0 pass, 1 fail, 77 when io_uring was asked for and is not available.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inflateSync } from 'node:zlib';
import { chromium } from 'playwright-core';

import { Server, Skip, makeTestCert, scaled } from '../integration/testlib.mjs';
import { reservePort } from '../integration/ports.mjs';
import { TcpGate } from './tcp_gate.mjs';

const binary = process.env.WSPUSH_SERVER;
const io = process.env.WSPUSH_IO || 'epoll';
const chromiumPath = process.env.WSPUSH_CHROMIUM || '/usr/bin/chromium';
const artifacts = process.env.WSPUSH_ARTIFACTS || 'build/web-artifacts';
const SECRET = 'browser-test-secret';
if (!binary) {
  console.error('set WSPUSH_SERVER to the wspush binary');
  process.exit(2);
}
if (!existsSync(chromiumPath)) {
  console.error(`no Chromium at ${chromiumPath} (apt-get install chromium)`);
  process.exit(1);
}

const servers = [];
/** A server on 127.0.0.1:`port` (0: any free port); `options` go to Server (extra, jwtSecret). */
async function start(port, options = {}) {
  const server = new Server({ server: binary, io, mode: 'pubsub', listen: `127.0.0.1:${port}`, ...options });
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

/** Kills the server by PID and waits until it has exited (its port is free again). */
async function stop(server) {
  server.kill();
  await server.exitPromise;
}

let launched = null;
function browser() {
  launched ??= chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  return launched;
}

function mint(claims, secret = SECRET) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const head = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(claims)}`;
  return `${head}.${createHmac('sha256', secret).update(head).digest('base64url')}`;
}
const nowS = () => Math.floor(Date.now() / 1000);

async function publish(server, topic, data) {
  const r = await fetch(`http://127.0.0.1:${server.adminPort}/publish`, {
    method: 'POST', body: JSON.stringify({ topic, data }),
  });
  assert.equal(r.status, 200);
}

async function metric(server, name) {
  const text = await (await fetch(`http://127.0.0.1:${server.adminPort}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

/** Polls an async condition (a metric: it has no event) until it holds; fails only on a hang. */
async function until(cond, what, seconds = 10) {
  const deadline = Date.now() + scaled(seconds) * 1000;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${scaled(seconds)}s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Runs in the page before its client is made: numbers the page's WebSocket connections
 * (window.__dials), keeps what each received and sent (window.__frames, window.__sent), and
 * which one opened last (window.__opened); keeps the URL of every EventSource (window.__streams). */
function instrument() {
  window.__dials = 0;
  window.__opened = 0;
  window.__frames = [];
  window.__sent = [];
  window.__streams = [];
  const NativeStream = window.EventSource;
  window.EventSource = class extends NativeStream {
    constructor(url, ...rest) {
      super(url, ...rest);
      window.__streams.push(String(url));
    }
  };
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      const dial = ++window.__dials;
      this.dial = dial;
      this.addEventListener('open', () => { window.__opened = dial; });
      this.addEventListener('message', (e) => window.__frames.push({ dial, m: JSON.parse(e.data) }));
    }

    send(data) {
      window.__sent.push({ dial: this.dial, m: JSON.parse(data) });
      return super.send(data);
    }
  };
}

/** Waits in the page for the server's `subbed` naming `topic` on connection `dial` (default: the latest). */
function subbed(page, topic, dial = 0) {
  return page.waitForFunction(([t, d]) => window.__frames.some((f) => f.dial === (d || window.__dials)
    && f.m.op === 'subbed' && f.m.topics.includes(t)), [topic, dial], { timeout: scaled(10) * 1000 });
}

/** Distinct byte values in a PNG's decompressed scanlines: a blank page has a handful. */
function pngVariety(png) {
  assert.equal(png.subarray(1, 4).toString(), 'PNG');
  const idat = [];
  for (let at = 8; at < png.length;) {
    const len = png.readUInt32BE(at);
    const type = png.subarray(at + 4, at + 8).toString();
    if (type === 'IDAT') idat.push(png.subarray(at + 8, at + 8 + len));
    at += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  return new Set(raw).size;
}

test('the demo page: live notifications, a server restart survived, lost reported, screenshot', async () => {
  const port = await reservePort();  // the server's, reused by the restart
  let server = await start(port);
  const gate = await new TcpGate(port).open();  // the page's link to it
  const context = await (await browser()).newContext({ viewport: { width: 900, height: 700 } });
  try {
    const page = await context.newPage();
    await page.addInitScript(instrument);
    const wait = { timeout: scaled(10) * 1000 };
    const stateIs = (s) => page.waitForFunction((want) => document.getElementById('state').dataset.state === want, s, wait);
    await page.goto(`http://127.0.0.1:${gate.port}/?mailbox=7`);
    const state = page.getByTestId('state');
    const notes = page.getByTestId('notifications');
    await stateIs('open');
    await subbed(page, 'mailbox:7');
    await publish(server, 'mailbox:7', { from: 'alice', subject: 'Hello from the test' });
    await notes.getByText('alice: Hello from the test').waitFor(wait);
    const first = await page.evaluate(() => window.__opened);  // the connection alice came on

    // Quick tries once the link is back (the default window grows to 30 s).
    await page.evaluate(() => { window.wspushClient._base = 100; window.wspushClient._max = 400; });
    await stop(server);
    await stateIs('reconnecting');
    // The link is held down while a fresh process (its history empty, in a new epoch) starts on
    // the same port and publishes: the page can only get bob by replay.
    await gate.shut();
    server = await start(port);
    await publish(server, 'mailbox:7', { from: 'bob', subject: 'Sent while you were away' });
    assert.equal(await metric(server, 'wspush_connections_accepted_total'), 0, 'the page reached the server through a shut gate');
    assert.equal(await state.getAttribute('data-state'), 'reconnecting');
    await gate.open();
    await stateIs('open');
    await page.getByTestId('log').getByText('no longer reaches back for mailbox:7').waitFor(wait);
    await notes.getByText('bob: Sent while you were away').waitFor(wait);
    // On the connection that came back (the one that opened: one made while the gate was shut
    // may still be connecting when it opens, and be the one that gets through), the sub asked
    // for what came after alice, the reply said the new server's history does not reach back
    // (lost), and bob followed it.
    const dial = await page.evaluate(() => window.__opened);
    assert.ok(dial > first, `the page is on connection ${dial}, the one alice came on was ${first}`);
    const frames = await page.evaluate((d) => window.__frames.filter((f) => f.dial === d).map((f) => f.m), dial);
    const sent = await page.evaluate((d) => window.__sent.filter((f) => f.dial === d).map((f) => f.m), dial);
    assert.ok(sent[0].op === 'sub' && sent[0].since?.['mailbox:7'], `the resubscription ${JSON.stringify(sent[0])} has no since`);
    const seq = frames.filter((m) => m.op === 'subbed' || m.topic === 'mailbox:7')
      .map((m) => (m.op === 'subbed' ? `subbed lost ${m.lost}` : m.data.from));
    assert.deepEqual(seq, ['subbed lost mailbox:7', 'bob']);
    // Chromium offers permessage-deflate: carol's event (over --compression-min-bytes) comes
    // compressed, once for the node, and the page reads it.
    assert.ok(await metric(server, 'wspush_compression_connections') >= 1, 'the page did not negotiate permessage-deflate');
    const long = 'After the restart: the minutes of Tuesday, the quarterly report, the plan for the week ahead, '
      + 'and the list of what is still open for the storage migration (owners, dates, and who reviews what). Reply by Friday.';
    await publish(server, 'mailbox:7', { from: 'carol', subject: long });
    await notes.getByText(`carol: ${long}`).waitFor(wait);
    assert.equal(await metric(server, 'wspush_compressed_events_total'), 1, 'carol\'s event was not compressed');
    assert.equal(await state.textContent(), 'open');
    assert.equal(await notes.locator('li').count(), 3);

    mkdirSync(artifacts, { recursive: true });
    const shot = await page.screenshot({ fullPage: true });
    writeFileSync(`${artifacts}/demo-page-${io}.png`, shot);
    assert.ok(shot.length > 10000, `a ${shot.length}-byte screenshot`);
    assert.ok(pngVariety(shot) > 40, 'the screenshot is blank (almost no distinct pixel values)');
  } finally {
    await context.close();
    await gate.shut();
  }
});

test('the page over https:// and its client over wss://', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'wspush-page-tls-'));
  const { cert, key } = makeTestCert(dir);
  const port = await reservePort();
  const server = await start(port, { extra: ['--tls-cert', cert, '--tls-key', key] });
  // The test's certificate is self-signed: this context (and only it) accepts it.
  const context = await (await browser()).newContext({ ignoreHTTPSErrors: true });
  try {
    const page = await context.newPage();
    await page.addInitScript(instrument);
    const wait = { timeout: scaled(10) * 1000 };
    await page.goto(`https://localhost:${port}/?mailbox=9`);
    await page.waitForFunction(() => document.getElementById('state').dataset.state === 'open', null, wait);
    assert.equal(await page.evaluate(() => location.protocol), 'https:');
    assert.ok((await page.evaluate(() => window.wspushClient._url)).startsWith('wss://'), 'the client is not on wss://');
    await subbed(page, 'mailbox:9');
    await publish(server, 'mailbox:9', { from: 'dave', subject: 'Over TLS' });
    await page.getByTestId('notifications').getByText('dave: Over TLS').waitFor(wait);
    const metrics = await (await fetch(`http://127.0.0.1:${server.adminPort}/metrics`)).text();
    const ok = Number(metrics.match(/^wspush_tls_handshakes_total\{result="ok"\} (\d+)/m)[1]);
    assert.ok(ok >= 1, 'no TLS handshake counted');
  } finally {
    await context.close();
    server.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A page that has run the classic /wspush.js of the server on `port` (window.WsPush), instrumented.
 * `sameOrigin`: the page is on http://127.0.0.1:port (an EventSource needs that: the server sends
 * no CORS headers), else on about:blank. */
async function classicPage(port, sameOrigin = false) {
  const context = await (await browser()).newContext();
  const page = await context.newPage();
  if (sameOrigin) await page.goto(`http://127.0.0.1:${port}/wspush.js`);
  await page.setContent('<!doctype html><title>wspush classic script</title>');
  await page.evaluate(instrument);
  await page.addScriptTag({ url: `http://127.0.0.1:${port}/wspush.js` });
  assert.equal(await page.evaluate(() => typeof window.WsPush), 'function');
  return { context, page };
}

/** Makes window[name] a WsPush(url, options) in the page, its states in window[name + 'States']. */
function makeClient(page, name, url, options = {}) {
  return page.evaluate(([n, u, o]) => {
    if (o.fresh) {
      const fresh = o.fresh;
      window.__asked = 0;
      o.getToken = async () => { window.__asked++; return fresh; };
      delete o.fresh;
    }
    const c = new window.WsPush(u, o);
    window[n] = c;
    window[`${n}States`] = [c.state];
    window[`${n}Transports`] = [`${c.state}/${c.transport}`];
    c.on('state', (s, transport) => {
      window[`${n}States`].push(s);
      window[`${n}Transports`].push(`${s}/${transport}`);
    });
    window[`${n}Events`] = [];
    window[`${n}All`] = [];
  }, [name, url, options]);
}

function waitState(page, name, state, seconds = 10) {
  return page.waitForFunction(([n, s]) => window[n].state === s, [name, state], { timeout: scaled(seconds) * 1000 });
}

function subscribe(page, name, topic) {
  return page.evaluate(([n, t]) => { window[n].subscribe(t, (e) => window[`${n}Events`].push(e.data)); }, [name, topic]);
}

/** Subscribes `topics`, every event ({topic, id, data}) kept in window[name + 'All']. */
function subscribeAll(page, name, topics) {
  return page.evaluate(([n, ts]) => {
    for (const t of ts) window[n].subscribe(t, (e) => window[`${n}All`].push(e));
  }, [name, topics]);
}

/** Each topic's events (data.n) in arrival order: a gap or a double shows as a list that is not 1..n. */
async function byTopic(page, name) {
  const out = {};
  for (const e of await page.evaluate((n) => window[`${n}All`], name)) (out[e.topic] ??= []).push(e.data.n);
  return out;
}
const upTo = (n) => Array.from({ length: n }, (_, k) => k + 1);

/** nginx running `conf` (an http-level config) from a throwaway prefix made by
 * tests/integration/wsp_nginx.py, as one process (master_process off) killed by PID in stop();
 * resolves once it listens on `port`. */
async function startNginx(conf, port) {
  const helper = new URL('../integration/', import.meta.url).pathname;
  const made = spawnSync('python3', ['-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
    + 'from wsp_nginx import nginx_prefix; print(nginx_prefix(sys.stdin.read()))', helper], { input: conf, encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  const dir = made.stdout.trim();
  const args = ['-p', dir, '-e', `${dir}/error.log`, '-c', `${dir}/nginx.conf`, '-g', 'master_process off;'];
  const checked = spawnSync('nginx', ['-t', '-q', ...args], { encoding: 'utf8' });
  assert.equal(checked.status, 0, `nginx -t: ${checked.stderr}`);
  const wrap = existsSync('/usr/bin/setpriv') ? ['/usr/bin/setpriv', '--pdeathsig', 'KILL', '--'] : [];
  const [cmd, ...rest] = [...wrap, 'nginx', ...args];
  const proc = spawn(cmd, rest, { stdio: 'ignore' });
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) process.kill(proc.pid, 'SIGKILL');
    await exited;
    rmSync(dir, { recursive: true, force: true });
  };
  const listening = () => new Promise((resolve) => {
    const s = tcpConnect(port, '127.0.0.1');
    s.on('connect', () => { s.destroy(); resolve(true); });
    s.on('error', () => resolve(false));
  });
  try {
    await until(listening, `nginx to listen on ${port}`);
  } catch (err) {
    await stop();
    throw err;
  }
  return { stop, log: () => readFileSync(`${dir}/error.log`, 'utf8') };
}

/** The shipped deploy/nginx/wspush.conf on 127.0.0.1:`port` in front of one node, with its
 * WebSocket location made to answer an upgrade 403 (as some proxies do): only the event-stream
 * location and plain requests pass. */
function refusingUpgrades(port, nodePort) {
  let conf = readFileSync(new URL('../../deploy/nginx/wspush.conf', import.meta.url), 'utf8');
  const swap = (re, to, what) => {
    const next = conf.replace(re, to);
    assert.notEqual(next, conf, `the shipped nginx config has no ${what}: update this test`);
    conf = next;
  };
  swap(/^    listen 80;$/m, `    listen 127.0.0.1:${port};`, 'listen 80');
  swap(/^    server 127\.0\.0\.1:\d+ .*\n/gm, '', 'upstream servers');
  swap(/^    least_conn;$/m, `    least_conn;\n    server 127.0.0.1:${nodePort};`, 'least_conn');
  swap(/^    location \/ \{$/m, '    location / {\n        if ($http_upgrade) { return 403; }', 'location /');
  assert.match(conf, /location = \/sse \{[^}]*proxy_buffering off;/, 'the shipped config has no event-stream location');
  return conf;
}

test('the classic /wspush.js in Chromium: window.WsPush; its backoff rides out a server restart', async () => {
  const port = await reservePort();
  let server = await start(port);
  const { context, page } = await classicPage(port);
  try {
    const wait = { timeout: scaled(10) * 1000 };
    assert.equal(await page.evaluate(() => window.WsPush.tokenExpiry('e30.eyJleHAiOjEyMzR9.x')), 1234);
    await makeClient(page, 'c', `ws://127.0.0.1:${port}/ws`, { baseDelay: 100, maxDelay: 400 });
    await waitState(page, 'c', 'open');
    await subscribe(page, 'c', 'mailbox:11');
    await subbed(page, 'mailbox:11');
    await page.waitForFunction(() => window.c.topicState('mailbox:11') === 'subscribed', null, wait);
    assert.equal(await page.evaluate(() => window.c.topicState('mailbox:12')), null);
    await publish(server, 'mailbox:11', 'before');
    await page.waitForFunction(() => window.cEvents.includes('before'), null, wait);

    await stop(server);
    await waitState(page, 'c', 'reconnecting');
    assert.equal(await page.evaluate(() => window.c.topicState('mailbox:11')), 'subscribing');
    // While it is down the page keeps trying, and is refused.
    const dials = await page.evaluate(() => window.__dials);
    await page.waitForFunction((d) => window.__dials >= d + 2, dials, wait);
    assert.equal(await page.evaluate(() => window.c.state), 'reconnecting');
    server = await start(port);
    await waitState(page, 'c', 'open', 15);
    assert.deepEqual(await page.evaluate(() => window.cStates), ['connecting', 'open', 'reconnecting', 'open']);
    await subbed(page, 'mailbox:11');
    await page.waitForFunction(() => window.c.topicState('mailbox:11') === 'subscribed', null, wait);
    await publish(server, 'mailbox:11', 'after');
    await page.waitForFunction(() => window.cEvents.includes('after'), null, wait);
    assert.deepEqual(await page.evaluate(() => window.cEvents), ['before', 'after']);
  } finally {
    await context.close();
  }
});

test('the classic /wspush.js in Chromium: the heartbeat leaves a server that hangs, and comes back', async () => {
  // Generous on both sides, so that only the hang below ends a connection on a busy machine: the
  // server closes a page whose pong is 5 s (scaled) late, and the page leaves a server it has not
  // heard for 10 s (scaled). The server pings again a pong timeout after its last ping (once the
  // connection has been silent for the ping interval), so the page hears one every 5-5.5 s.
  const server = await start(0, { extra: ['--ping-interval', '0.5', '--pong-timeout', String(scaled(5))] });
  const { context, page } = await classicPage(server.port);
  try {
    const url = `ws://127.0.0.1:${server.port}/ws`;
    await makeClient(page, 'c', url, { heartbeatTimeout: scaled(10) * 1000, baseDelay: 100 });
    await waitState(page, 'c', 'open');
    // Alive, the server pings and the page answers: three pongs on one connection.
    await until(async () => (await metric(server, 'wspush_messages_in_total')) >= 3, 'three pongs', 60);
    assert.ok(await page.evaluate(() => window.__frames.filter((f) => f.dial === 1 && f.m.op === 'ping').length >= 3),
      'pongs without pings');
    assert.deepEqual(await page.evaluate(() => window.cStates), ['connecting', 'open']);
    // TCP stays up, nothing arrives: only the page's heartbeat can leave.
    process.kill(server.proc.pid, 'SIGSTOP');
    try {
      await waitState(page, 'c', 'reconnecting', 30);
    } finally {
      process.kill(server.proc.pid, 'SIGCONT');
    }
    await waitState(page, 'c', 'open', 20);
    assert.deepEqual(await page.evaluate(() => window.cStates), ['connecting', 'open', 'reconnecting', 'open']);
    assert.ok(await page.evaluate(() => window.__dials) >= 2);
  } finally {
    await context.close();
  }
});

test('the classic /wspush.js in Chromium: the token is refreshed in-band and the connection outlives it', async () => {
  const server = await start(0, { jwtSecret: SECRET });
  const url = `ws://127.0.0.1:${server.port}/ws`;
  const { context, page } = await classicPage(server.port);
  try {
    const wait = { timeout: scaled(10) * 1000 };
    // Minted once the page is ready: both connections must open and c subscribe before exp. The
    // waits below end with the control's close at exp, not with a clock, so a long life costs
    // only its length.
    const short = mint({ exp: nowS() + Math.ceil(scaled(10)), topics: ['mailbox:12'] });
    const fresh = mint({ exp: nowS() + 3600, topics: ['mailbox:12'] });
    await makeClient(page, 'c', url, { token: short, refreshAt: [0.4, 0.4], fresh });  // connection 1
    // The control (connection 2): the same token, no getToken. The server closes it with 1008
    // once the token has expired: from then the first token is good nowhere.
    await makeClient(page, 'control', url, { token: short, baseDelay: 20 });
    await waitState(page, 'c', 'open');
    await subscribe(page, 'c', 'mailbox:12');
    await subbed(page, 'mailbox:12', 1);
    await waitState(page, 'control', 'auth_failed', 30);
    assert.deepEqual(await page.evaluate(() => window.controlStates), ['connecting', 'open', 'auth_failed']);
    assert.equal(await metric(server, 'wspush_token_expired_closes_total'), 1);
    assert.equal(await page.evaluate(() => window.__asked), 1);
    const sent = await page.evaluate(() => window.__sent.filter((f) => f.dial === 1).map((f) => f.m));
    assert.ok(sent.some((m) => m.op === 'auth' && m.token), 'the page sent no auth');
    const frames = await page.evaluate(() => window.__frames.filter((f) => f.dial === 1).map((f) => f.m));
    assert.ok(frames.some((m) => m.op === 'authed'), 'the server answered no auth');
    assert.equal(await page.evaluate(() => window.c._token), fresh);
    await publish(server, 'mailbox:12', 'still here');
    await page.waitForFunction(() => window.cEvents.includes('still here'), null, wait);
    assert.deepEqual(await page.evaluate(() => window.cStates), ['connecting', 'open']);
    assert.equal(await page.evaluate(() => window.__dials), 2);
  } finally {
    await context.close();
  }
});

test('behind a proxy that refuses WebSocket upgrades: event streams after three tries, 50 events over two topics once each', async () => {
  const server = await start(0);
  const port = await reservePort();
  const proxy = await startNginx(refusingUpgrades(port, server.port), port);
  const { context, page } = await classicPage(port, true);  // the page comes through the proxy too
  try {
    const wait = { timeout: scaled(15) * 1000 };
    await makeClient(page, 'c', `ws://127.0.0.1:${port}/ws`, { baseDelay: 50, maxDelay: 200 });
    await subscribeAll(page, 'c', ['mailbox:21', 'team:22']);
    await page.waitForFunction(() => window.c.transport === 'sse' && window.c.topicState('mailbox:21') === 'subscribed'
      && window.c.topicState('team:22') === 'subscribed', null, wait);
    assert.deepEqual(await page.evaluate(() => window.cTransports),
      ['connecting/websocket', 'reconnecting/websocket', 'reconnecting/sse', 'open/sse']);
    assert.ok(await page.evaluate(() => window.__dials) >= 3);
    assert.equal(await page.evaluate(() => window.__opened), 0, 'a WebSocket opened through the proxy');
    assert.match((await page.evaluate(() => window.__streams))[0],
      new RegExp(`^http://127\\.0\\.0\\.1:${port}/sse\\?topics=mailbox%3A21,team%3A22$`));
    // 25 events to each topic; meanwhile a third topic comes and goes four times, and each time
    // the stream is reopened from the positions the client holds.
    for (let n = 1; n <= 25; n++) {
      if (n % 5 === 1) await page.evaluate(() => window.c.subscribe('other:23', () => {}));
      if (n % 5 === 3) await page.evaluate(() => window.c.unsubscribe('other:23'));
      await publish(server, 'mailbox:21', { n });
      await publish(server, 'team:22', { n });
    }
    await page.waitForFunction(() => window.cAll.length >= 50, null, wait);
    // A last event each: anything doubled would have come before it.
    await publish(server, 'mailbox:21', { n: 26 });
    await publish(server, 'team:22', { n: 26 });
    await page.waitForFunction(() => window.cAll.length >= 52, null, wait);
    assert.deepEqual(await byTopic(page, 'c'), { 'mailbox:21': upTo(26), 'team:22': upTo(26) });
    const streams = await page.evaluate(() => window.__streams);
    assert.ok(streams.length >= 11, `${streams.length} streams: the reopens did not happen`);
    for (const url of streams.slice(1)) {
      const since = new URL(url).searchParams.get('since');
      assert.ok(since && since.split(',')[0], `a reopened stream without mailbox:21's position: ${url}`);
    }
    assert.equal(await page.evaluate(() => window.c.transport), 'sse');
    assert.equal(await page.evaluate(() => window.c.state), 'open');
    // Each stream was closed when the next one opened: one is left.
    await until(async () => (await metric(server, 'wspush_event_streams')) === 1, 'the server to hold one stream');
  } finally {
    await context.close();
    await proxy.stop();
  }
});

test('transport "sse" in Chromium: a stream cut (the link held down) is resumed from every topic\'s last id, no gap, no double', async () => {
  const port = await reservePort();
  const server = await start(port);
  const gate = await new TcpGate(port).open();
  const { context, page } = await classicPage(gate.port, true);
  try {
    const wait = { timeout: scaled(10) * 1000 };
    await makeClient(page, 'c', `ws://127.0.0.1:${gate.port}/ws`, { transport: 'sse', baseDelay: 100, maxDelay: 400 });
    await subscribeAll(page, 'c', ['mailbox:24', 'team:25']);
    await page.waitForFunction(() => window.c.topicState('mailbox:24') === 'subscribed'
      && window.c.topicState('team:25') === 'subscribed', null, wait);
    // Five to one topic, two to the other: their last ids differ, so positions given to the
    // wrong topic would show.
    for (let n = 1; n <= 5; n++) await publish(server, 'mailbox:24', { n });
    for (let n = 1; n <= 2; n++) await publish(server, 'team:25', { n });
    await page.waitForFunction(() => window.cAll.length >= 7, null, wait);
    const last = (topic) => page.evaluate((t) => window.cAll.filter((e) => e.topic === t).at(-1).id, topic);
    const since = `${await last('mailbox:24')},${await last('team:25')}`;
    // The link drops and stays down while more are published: they can come only by replay.
    await gate.shut();
    await until(async () => (await metric(server, 'wspush_subscriptions')) === 0, 'the server to drop the stream');
    await waitState(page, 'c', 'reconnecting');
    for (let n = 6; n <= 10; n++) await publish(server, 'mailbox:24', { n });
    for (let n = 3; n <= 7; n++) await publish(server, 'team:25', { n });
    assert.equal(await page.evaluate(() => window.cAll.length), 7, 'an event arrived while the link was down');
    await gate.open();
    await page.waitForFunction(() => window.cAll.length >= 17, null, wait);
    await publish(server, 'mailbox:24', { n: 11 });
    await publish(server, 'team:25', { n: 8 });
    await page.waitForFunction(() => window.cAll.length >= 19, null, wait);
    assert.deepEqual(await byTopic(page, 'c'), { 'mailbox:24': upTo(11), 'team:25': upTo(8) });
    // The stream that came back named the topics in their order, each from its last event.
    const back = new URL((await page.evaluate(() => window.__streams)).at(-1)).searchParams;
    assert.equal(back.get('topics'), 'mailbox:24,team:25');
    assert.equal(back.get('since'), since);
    assert.deepEqual(await page.evaluate(() => window.cTransports), ['connecting/sse', 'open/sse', 'reconnecting/sse', 'open/sse']);
    assert.equal(await page.evaluate(() => window.__dials), 0, 'a WebSocket was tried');
  } finally {
    await context.close();
    await gate.shut();
  }
});

test.after(async () => {
  for (const s of servers) s.kill();
  if (launched) await (await launched).close();
});
