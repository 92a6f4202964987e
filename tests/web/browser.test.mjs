// The mailbox demo page in real Chromium (Debian's /usr/bin/chromium, driven by playwright-core; no
// browser is downloaded): the page connects, a publish through the admin API appears on it; the
// server is killed and a fresh one started on the same port: the page reconnects by itself, says
// the history was lost (the embedded bus keeps none across a restart), shows what the new server
// published while it was away and what came after. A screenshot is taken and must not be blank.
// Then the same page over https:// from a server with a certificate made here (certificate errors
// are ignored in that browser context only): its client connects over wss:// and a publish arrives.
//   WSPUSH_SERVER=build/server/wspush WSPUSH_IO=epoll node tests/web/browser.test.mjs
// Exit 0 pass, 1 fail, 77 when io_uring was asked for and is not available.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:net';
import { inflateSync } from 'node:zlib';
import { chromium } from 'playwright-core';

import { Server, Skip, makeTestCert, scaled } from '../integration/testlib.mjs';

const binary = process.env.WSPUSH_SERVER;
const io = process.env.WSPUSH_IO || 'epoll';
const chromiumPath = process.env.WSPUSH_CHROMIUM || '/usr/bin/chromium';
const artifacts = process.env.WSPUSH_ARTIFACTS || 'build/web-artifacts';
if (!binary) {
  console.error('set WSPUSH_SERVER to the wspush binary');
  process.exit(2);
}
if (!existsSync(chromiumPath)) {
  console.error(`no Chromium at ${chromiumPath} (apt-get install chromium)`);
  process.exit(1);
}

async function freePort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const servers = [];
async function start(port, extra = []) {
  const server = new Server({ server: binary, io, mode: 'pubsub', listen: `127.0.0.1:${port}`, extra });
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

async function publish(server, topic, data) {
  const r = await fetch(`http://127.0.0.1:${server.adminPort}/publish`, {
    method: 'POST', body: JSON.stringify({ topic, data }),
  });
  assert.equal(r.status, 200);
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
  const port = await freePort();
  let server = await start(port);
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
    const wait = { timeout: scaled(10) * 1000 };
    await page.goto(`http://127.0.0.1:${port}/?mailbox=7`);
    const state = page.getByTestId('state');
    const notes = page.getByTestId('notifications');
    await page.waitForFunction(() => document.getElementById('state').dataset.state === 'open', null, wait);
    await publish(server, 'mailbox:7', { from: 'alice', subject: 'Hello from the test' });
    await notes.getByText('alice: Hello from the test').waitFor(wait);

    // The next reconnect, deterministic: ~2.9 s after the connection drops (a lost connection's
    // first window is 2 x base).
    await page.evaluate(() => { window.wspushClient._base = 1500; window.wspushClient._random = () => 0.97; });
    process.kill(server.proc.pid, 'SIGKILL');
    await page.waitForFunction(() => document.getElementById('state').dataset.state === 'reconnecting', null, wait);
    server = await start(port);  // a fresh process: its history starts empty, in a new epoch
    await publish(server, 'mailbox:7', { from: 'bob', subject: 'Sent while you were away' });
    await page.waitForFunction(() => document.getElementById('state').dataset.state === 'open', null,
      { timeout: scaled(15) * 1000 });
    await page.getByTestId('log').getByText('no longer reaches back for mailbox:7').waitFor(wait);
    await notes.getByText('bob: Sent while you were away').waitFor(wait);  // replayed from the new history
    await publish(server, 'mailbox:7', { from: 'carol', subject: 'After the restart' });
    await notes.getByText('carol: After the restart').waitFor(wait);
    assert.equal(await state.textContent(), 'open');
    assert.equal(await notes.locator('li').count(), 3);

    mkdirSync(artifacts, { recursive: true });
    const shot = await page.screenshot({ fullPage: true });
    writeFileSync(`${artifacts}/demo-page-${io}.png`, shot);
    assert.ok(shot.length > 10000, `a ${shot.length}-byte screenshot`);
    assert.ok(pngVariety(shot) > 40, 'the screenshot is blank (almost no distinct pixel values)');
  } finally {
    await browser.close();
  }
});

test('the page over https:// and its client over wss://', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'wspush-page-tls-'));
  const { cert, key } = makeTestCert(dir);
  const port = await freePort();
  const server = await start(port, ['--tls-cert', cert, '--tls-key', key]);
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    // The test's certificate is self-signed: this context (and only it) accepts it.
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    const wait = { timeout: scaled(10) * 1000 };
    await page.goto(`https://localhost:${port}/?mailbox=9`);
    await page.waitForFunction(() => document.getElementById('state').dataset.state === 'open', null, wait);
    assert.equal(await page.evaluate(() => location.protocol), 'https:');
    assert.ok((await page.evaluate(() => window.wspushClient._url)).startsWith('wss://'), 'the client is not on wss://');
    await publish(server, 'mailbox:9', { from: 'dave', subject: 'Over TLS' });
    await page.getByTestId('notifications').getByText('dave: Over TLS').waitFor(wait);
    const metrics = await (await fetch(`http://127.0.0.1:${server.adminPort}/metrics`)).text();
    const ok = Number(metrics.match(/^wspush_tls_handshakes_total\{result="ok"\} (\d+)/m)[1]);
    assert.ok(ok >= 1, 'no TLS handshake counted');
  } finally {
    await browser.close();
    server.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.after(() => {
  for (const s of servers) s.kill();
});
