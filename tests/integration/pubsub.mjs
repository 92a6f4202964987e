// The pub/sub protocol with Node `ws` clients (DESIGN.md "Wire protocol"): 1,000 mailboxes with two
// tabs each get exactly their own events from an admin batch publish; a client `pub` (allowed by
// --allow-client-publish) reaches the topic's subscribers byte for byte; a tab that reconnects with
// `since` gets what it missed, in order, then live events; with permessage-deflate (ws offers it) and
// without, the same events, and a compressed pub. Every connection also subscribes to a
// fence topic: once the fence event arrives, everything published before it has arrived too.
// Exit 0 pass, 1 fail, 77 io_uring unavailable.
import http from 'node:http';
import { check, connect, main, startServer, step, within } from './testlib.mjs';

const MAILBOXES = 1000;

function post(port, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: 'POST' }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function next(ws) {
  return JSON.parse((await ws.inbox.next(30)).data.toString());
}

async function subscribe(ws, topics, since) {
  ws.send(JSON.stringify(since ? { op: 'sub', topics, since } : { op: 'sub', topics }));
  const reply = await next(ws);
  check(reply.op === 'subbed' && JSON.stringify(reply.topics) === JSON.stringify(topics),
    `sub ${topics} answered ${JSON.stringify(reply)}`);
  return reply;
}

async function untilFence(ws) {
  const got = [];
  for (;;) {
    const msg = await next(ws);
    if (msg.topic === 'fence') return got;
    got.push(msg);
  }
}

async function mailboxes(server, admin) {
  const tabs = [];
  for (let k = 0; k < MAILBOXES; k++) {
    const pair = await Promise.all([connect(server.port, '/ws'), connect(server.port, '/ws')]);
    for (const ws of pair) tabs.push({ k, ws });
  }
  await Promise.all(tabs.map(({ k, ws }) => subscribe(ws, [`mailbox:${k}`, 'fence'])));
  const lines = Array.from({ length: MAILBOXES }, (_, k) => JSON.stringify({ topic: `mailbox:${k}`, data: { k } }));
  const res = await post(admin, '/publish/batch', lines.join('\n'));
  check(res.status === 200, `batch publish answered ${res.status} ${res.body}`);
  const ids = JSON.parse(res.body).results.map((r) => r.id);
  check((await post(admin, '/publish', '{"topic":"fence","data":0}')).status === 200, 'fence publish');
  const results = await within(120, 'every tab reaching the fence', Promise.all(tabs.map(({ ws }) => untilFence(ws))));
  results.forEach((got, n) => {
    const { k } = tabs[n];
    check(got.length === 1 && got[0].topic === `mailbox:${k}` && got[0].id === ids[k] && got[0].data.k === k,
      `a tab of mailbox ${k} got ${JSON.stringify(got)}`);
  });
  for (const { ws } of tabs) ws.terminate();
}

async function clientPublish(server) {
  const [a, b, c] = await Promise.all([0, 1, 2].map(() => connect(server.port, '/ws')));
  await subscribe(a, ['room', 'fence']);
  await subscribe(b, ['room', 'fence']);
  await subscribe(c, ['other', 'fence']);
  const raw = '{"text":"h\\u00e9llo", "list":[1,2.0,null] }';
  a.send(`{"op":"pub","topic":"room","data":${raw}}`);
  a.send('{"op":"pub","topic":"fence","data":0}');
  for (const ws of [a, b]) {
    const got = await untilFence(ws);
    check(got.length === 1, `room subscriber got ${JSON.stringify(got)}`);
  }
  check((await untilFence(c)).length === 0, 'a client of another topic got the room event');
  // byte for byte: the raw text of the event ends with the data exactly as published
  a.send(`{"op":"pub","topic":"room","data":${raw}}`);
  const text = (await b.inbox.next(30)).data.toString();
  check(text.endsWith(`"data":${raw}}`), `data not byte for byte: ${text}`);
  await a.inbox.next(30);
  for (const ws of [a, b, c]) ws.terminate();
}

/** permessage-deflate: ws offers it by default (and compresses what it sends from 1 KiB on). */
async function compression(server, admin) {
  const [z, plain] = await Promise.all([connect(server.port, '/ws'), connect(server.port, '/ws', { perMessageDeflate: false })]);
  check(z.extensions === 'permessage-deflate' && plain.extensions === '',
    `extensions ${JSON.stringify(z.extensions)} and ${JSON.stringify(plain.extensions)}`);
  for (const ws of [z, plain]) await subscribe(ws, ['zipped', 'fence']);
  const big = { kind: 'mail', subject: 'Re: quarterly report '.repeat(60) };
  const lines = [{ n: 0, pad: 'x' }, { n: 1, ...big }, { n: 2, ...big }, { n: 3 }].map((data) => JSON.stringify({ topic: 'zipped', data }));
  check((await post(admin, '/publish/batch', lines.join('\n'))).status === 200, 'batch publish');
  z.send(`{"op":"pub","topic":"zipped","data":${JSON.stringify({ n: 4, ...big })}}`); // compressed by ws
  z.send('{"op":"pub","topic":"fence","data":0}');
  const [a, b] = await within(30, 'both reaching the fence', Promise.all([untilFence(z), untilFence(plain)]));
  check(JSON.stringify(a) === JSON.stringify(b), 'the compressed and the plain subscriber heard different events');
  check(a.map((m) => m.data.n).join() === '0,1,2,3,4', `events ${a.map((m) => m.data.n).join()}`);
  check(a[4].data.subject === big.subject, 'the compressed pub did not arrive whole');
  z.terminate();
  plain.terminate();
}

async function resume(server, admin) {
  let ws = await connect(server.port, '/ws');
  await subscribe(ws, ['inbox:9']);
  const first = JSON.parse((await post(admin, '/publish', '{"topic":"inbox:9","data":0}')).body).id;
  check((await next(ws)).id === first, 'live event before the disconnect');
  ws.terminate();
  const missed = [];
  for (let n = 1; n <= 4; n++) missed.push(JSON.parse((await post(admin, '/publish', `{"topic":"inbox:9","data":${n}}`)).body).id);
  ws = await connect(server.port, '/ws');
  const reply = await subscribe(ws, ['inbox:9'], { 'inbox:9': first });
  check(Array.isArray(reply.lost) && reply.lost.length === 0, `lost: ${JSON.stringify(reply)}`);
  for (let n = 1; n <= 4; n++) {
    const msg = await next(ws);
    check(msg.id === missed[n - 1] && msg.data === n, `replayed ${JSON.stringify(msg)}, expected n=${n}`);
  }
  const live = JSON.parse((await post(admin, '/publish', '{"topic":"inbox:9","data":5}')).body).id;
  check((await next(ws)).id === live, 'live after the replay');
  ws.terminate();
}

await main(async (args) => {
  const server = await startServer({ ...args, mode: 'pubsub', extra: ['--allow-client-publish', '--threads', '2'] });
  const admin = Number((await server.waitForLog(/admin API at [0-9.]+:(\d+)/, 10, 'the admin line'))[1]);
  await step(`${MAILBOXES} mailboxes x 2 tabs get only their own events`, () => mailboxes(server, admin));
  await step('a client pub reaches the topic\'s subscribers only, byte for byte', () => clientPublish(server));
  await step('resume with since replays the missed events, then live', () => resume(server, admin));
  await step('compressed and plain subscribers hear the same events; a compressed pub arrives whole', () => compression(server, admin));
  check(server.alive(), `server exited during the test\n${server.logTail()}`);
});
