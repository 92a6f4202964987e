// Node `ws` over wss:// (the server started with a certificate made here, which the clients verify):
// 200 tabs subscribe over TLS and each gets exactly its own event from a batch publish, plus a
// shared 60 KB event; Node's own TLS stack negotiates http/1.1 by ALPN and resumes a session with
// the server's ticket; a TLS 1.2 renegotiation attempt is refused and the connection closed, and
// counted. Exit 0 pass, 1 fail, 77 io_uring unavailable.
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import WebSocket from 'ws';
import { Inbox, check, main, makeTestCert, startServer, step, within } from './testlib.mjs';

const TABS = 200;

function post(port, urlPath, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: urlPath, method: 'POST' }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function get(port, urlPath) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: urlPath }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve(text));
    }).on('error', reject);
  });
}

async function tlsCount(admin, result) {
  const text = await get(admin, '/metrics');
  const m = text.match(new RegExp(`^wspush_tls_handshakes_total\\{result="${result}"\\} (\\d+)`, 'm'));
  return m ? Number(m[1]) : 0;
}

function connectWss(port, ca) {
  const ws = new WebSocket(`wss://localhost:${port}/ws`, { ca, maxPayload: 1 << 20 });
  ws.inbox = new Inbox(ws);
  return within(20, 'opening wss://', new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws));
    ws.once('error', (err) => reject(new Error(`wss connect failed: ${err.message}`)));
  }));
}

async function next(ws) {
  return JSON.parse((await ws.inbox.next(30)).data.toString());
}

async function tabs(server, admin, ca) {
  const all = [];
  for (let k = 0; k < TABS; k += 20) {
    all.push(...await Promise.all(Array.from({ length: 20 }, () => connectWss(server.port, ca))));
  }
  await Promise.all(all.map(async (ws, k) => {
    ws.send(JSON.stringify({ op: 'sub', topics: [`tab:${k}`, 'all'] }));
    const r = await next(ws);
    check(r.op === 'subbed', `tab ${k}: sub answered ${JSON.stringify(r)}`);
  }));
  const lines = all.map((_, k) => JSON.stringify({ topic: `tab:${k}`, data: { k } }));
  check((await post(admin, '/publish/batch', lines.join('\n'))).status === 200, 'batch publish');
  const big = 'y'.repeat(60000);
  check((await post(admin, '/publish', JSON.stringify({ topic: 'all', data: big }))).status === 200, 'publish');
  await within(60, 'every tab\'s events', Promise.all(all.map(async (ws, k) => {
    const own = await next(ws);
    check(own.topic === `tab:${k}` && own.data.k === k, `tab ${k} got ${JSON.stringify(own).slice(0, 80)}`);
    const shared = await next(ws);
    check(shared.topic === 'all' && shared.data === big, `tab ${k}: the 60 KB event came wrong`);
  })));
  for (const ws of all) ws.close();
  await Promise.all(all.map((ws) => ws.inbox.close()));
}

function handshake(port, ca, options = {}) {
  return within(20, 'a TLS handshake', new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca, ALPNProtocols: ['http/1.1'], ...options });
    s.once('error', reject);
    s.once('secureConnect', () => resolve(s));
  }));
}

async function alpnAndResumption(server, ca) {
  const first = await handshake(server.port, ca);
  check(first.alpnProtocol === 'http/1.1', `ALPN ${first.alpnProtocol}`);
  // A TLS 1.3 ticket arrives after the handshake: ask for something, and wait for the session.
  const session = await within(10, 'the session ticket', new Promise((resolve) => {
    first.once('session', resolve);
    first.write('GET /wspush.mjs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
    first.resume();
  }));
  first.destroy();
  const second = await handshake(server.port, ca, { session });
  check(second.isSessionReused(), 'the session ticket was not accepted');
  second.destroy();
}

async function renegotiation(server, admin, ca) {
  const before = await tlsCount(admin, 'renegotiation');
  const s = await handshake(server.port, ca, { maxVersion: 'TLSv1.2' });
  const closed = new Promise((resolve) => s.once('close', resolve));
  s.on('error', () => {});  // the refusal surfaces as an error on the socket, then the close
  s.renegotiate({}, () => {});
  await within(10, 'the server closing the renegotiating connection', closed);
  await within(10, 'the renegotiation count', (async () => {
    while (await tlsCount(admin, 'renegotiation') < before + 1) await new Promise((r) => setTimeout(r, 50));
  })());
}

await main(async (args) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wspush-tls-'));
  try {
    const { cert, key } = makeTestCert(dir);
    const ca = fs.readFileSync(cert);
    const server = await startServer({ ...args, mode: 'pubsub', extra: ['--tls-cert', cert, '--tls-key', key, '--threads', '2'] });
    const admin = Number((await server.waitForLog(/admin API at [0-9.]+:(\d+)/, 10, 'the admin line'))[1]);
    await step(`${TABS} wss:// tabs get their own events and a shared 60 KB one`, () => tabs(server, admin, ca));
    await step('ALPN http/1.1 and a resumed session', () => alpnAndResumption(server, ca));
    await step('a renegotiation is refused and counted', () => renegotiation(server, admin, ca));
    check(server.alive(), `server exited during the test\n${server.logTail()}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
