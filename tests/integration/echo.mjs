// Echo mode driven by Node `ws`: text and binary at every length form up to 16 MiB (and one byte past
// it: close 1009), compressed both ways (permessage-deflate, which ws offers), fragmented sends with `{fin: false}` (a UTF-8 character split across fragments
// included), ping/pong, and the close handshake with a code. Exit 0 pass, 1 fail, 77 io_uring unavailable.
import { randomBytes } from 'node:crypto';
import { check, connect, main, startServer, step } from './testlib.mjs';

const LIMIT = 16 * 1024 * 1024;
const SIZES = [0, 1, 125, 126, 127, 65535, 65536, 1 << 20, LIMIT];

/** A string whose UTF-8 encoding is exactly n bytes, with 2-, 3- and 4-byte characters in it. */
function textOfSize(n) {
  const unit = 'aé€😀'; // 1 + 2 + 3 + 4 = 10 bytes
  const text = unit.repeat(Math.floor(n / 10));
  return text + 'z'.repeat(n - Buffer.byteLength(text));
}

function send(ws, data, options = {}) {
  return new Promise((resolve, reject) => ws.send(data, options, (err) => (err ? reject(err) : resolve())));
}

async function expectEcho(ws, sent, isBinary, seconds) {
  const what = `echo of ${Buffer.byteLength(sent)}-byte ${isBinary ? 'binary' : 'text'}`;
  let got;
  try {
    got = await ws.inbox.next(seconds);
  } catch (err) {
    err.message = `${what}: ${err.message}`;
    throw err;
  }
  check(got.isBinary === isBinary, `sent ${isBinary ? 'binary' : 'text'}, echo came back as ${got.isBinary ? 'binary' : 'text'}`);
  const want = Buffer.isBuffer(sent) ? sent : Buffer.from(sent);
  check(got.data.equals(want), `echo differs: sent ${want.length} bytes, got ${got.data.length}; ` +
    `first bytes sent ${want.subarray(0, 20).toString('hex')}, got ${got.data.subarray(0, 20).toString('hex')}`);
}

async function echoSizes(port) {
  // ws offers permessage-deflate and compresses messages of 1 KiB or more; the server inflates
  // them and compresses its echo of those over --compression-min-bytes.
  const ws = await connect(port, '/ws?via=echo');
  check(ws.extensions === 'permessage-deflate', `server answered extensions ${JSON.stringify(ws.extensions)}`);
  for (const n of SIZES) {
    const seconds = 20 + 60 * n / LIMIT;
    const text = textOfSize(n);
    await send(ws, text);
    await expectEcho(ws, text, false, seconds);
    const bin = randomBytes(n);
    await send(ws, bin);
    await expectEcho(ws, bin, true, seconds);
  }
  ws.close(1000);
  await ws.inbox.close();
}

async function overLimit(port, isBinary) {
  const ws = await connect(port, '/ws', { perMessageDeflate: false });
  ws.send(isBinary ? randomBytes(LIMIT + 1) : 'x'.repeat(LIMIT + 1), { binary: isBinary }, () => {});
  const { code } = await ws.inbox.close(80);
  check(code === 1009, `${isBinary ? 'binary' : 'text'} of ${LIMIT + 1} bytes: close code ${code}, expected 1009`);
}

async function fragmented(port) {
  const ws = await connect(port, '/ws', { perMessageDeflate: false });
  const euro = Buffer.from('€'); // 3 bytes: split it across fragments
  const textParts = [Buffer.from('frag '), euro.subarray(0, 1), euro.subarray(1, 2), Buffer.concat([euro.subarray(2), Buffer.from(' end')])];
  const binParts = [randomBytes(10), Buffer.alloc(0), randomBytes(70000), randomBytes(1)];
  for (const [parts, binary] of [[textParts, false], [binParts, true]]) {
    for (let i = 0; i < parts.length; i++) {
      await send(ws, parts[i], { binary, fin: i === parts.length - 1 });
    }
    await expectEcho(ws, Buffer.concat(parts), binary, 20);
  }
  ws.close(1000);
  await ws.inbox.close();
}

async function pingPong(port) {
  const ws = await connect(port, '/ws', { perMessageDeflate: false });
  const pongs = [];
  ws.on('pong', (data) => pongs.push(data));
  const payloads = [Buffer.alloc(0), Buffer.from('p'), randomBytes(125), Buffer.from('node ping')];
  for (const p of payloads) ws.ping(p);
  await send(ws, 'after pings'); // the echo comes after every pong: the server handles frames in order
  await expectEcho(ws, 'after pings', false, 20);
  // RFC 6455 §5.5.3: a ping still unanswered when the next arrives may be answered only by the
  // pong to the most recent one (the server keeps at most one pong waiting). So: the pongs
  // answer pings in order, none twice, and the last answers the last ping.
  check(pongs.length >= 1 && pongs.length <= payloads.length, `sent ${payloads.length} pings, got ${pongs.length} pongs`);
  let next = 0;
  for (const [i, pong] of pongs.entries()) {
    while (next < payloads.length && !payloads[next].equals(pong)) next++;
    check(next < payloads.length, `pong ${i} payload ${pong.toString('hex')} answers no ping after the previous pong's`);
    next++;
  }
  check(pongs[pongs.length - 1].equals(payloads[payloads.length - 1]), 'the last pong answers the last ping');
  ws.close(1000);
  await ws.inbox.close();
}

async function closeHandshake(port, server) {
  for (const [code, reason] of [[1000, ''], [4001, 'bye'], [3000, 'r'.repeat(120)]]) {
    const ws = await connect(port, '/ws', { perMessageDeflate: false });
    await send(ws, 'before close');
    await expectEcho(ws, 'before close', false, 20);
    ws.close(code, reason);
    const closed = await ws.inbox.close();
    check(closed.code === code, `closed with ${code}: server answered ${closed.code}`);
  }
  const again = await connect(port, '/ws', { perMessageDeflate: false });
  await send(again, 'still serving');
  await expectEcho(again, 'still serving', false, 20);
  again.close(1000);
  await again.inbox.close();
  check(server.alive(), `server exited\n${server.logTail()}`);
}

await main(async (args) => {
  const server = await startServer({ ...args, mode: 'echo' });
  await step('echo text and binary, 0 B to 16 MiB', () => echoSizes(server.port));
  await step('binary of 16 MiB + 1 -> 1009', () => overLimit(server.port, true));
  await step('text of 16 MiB + 1 -> 1009', () => overLimit(server.port, false));
  await step('fragmented sends echoed whole', () => fragmented(server.port));
  await step('ping -> pong with the same payload', () => pingPong(server.port));
  await step('close handshake echoes the code', () => closeHandshake(server.port, server));
  check(server.alive(), `server exited during the test\n${server.logTail()}`);
});
