// Broadcast mode with 1,000 Node `ws` clients. Three senders send numbered text messages concurrently,
// a fourth a binary message (ignored in broadcast mode); each ends with a text fence. Every client, the
// senders included, must get every text message exactly once and, per sender, in order, and no binary.
// Each sender's output is FIFO, so anything the server emits for it arrives before its fence.
// Exit 0 pass, 1 fail, 77 io_uring unavailable.
import { TestFailure, check, connect, main, startServer, step, within } from './testlib.mjs';

const CLIENTS = 1000;
const SENDERS = 3;
const PER_SENDER = 20;
const BINARY_SENDER = SENDERS;
const CONNECT_CONCURRENCY = 64;

async function openClients(port) {
  const clients = new Array(CLIENTS);
  let next = 0;
  async function worker() {
    while (next < CLIENTS) {
      const i = next++;
      clients[i] = await connect(port, `/ws?client=${i}`, { perMessageDeflate: false });
    }
  }
  await within(180, `opening ${CLIENTS} clients`, Promise.all(Array.from({ length: CONNECT_CONCURRENCY }, worker)));
  return clients;
}

/** Reads until every fence arrived; returns per-sender sequence lists. Throws on anything odd. */
async function collect(ws, index) {
  const seen = Array.from({ length: SENDERS }, () => []);
  const fences = new Set();
  while (fences.size < SENDERS + 1) {
    const { data, isBinary } = await ws.inbox.next(180);
    if (isBinary) {
      throw new TestFailure(`client ${index} received a binary message (${data.subarray(0, 20)}); ` +
        'binary messages must be ignored in broadcast mode');
    }
    const [kind, senderText, seq] = data.toString().split(':');
    const sender = Number(senderText);
    if (kind === 'fence') {
      check(!fences.has(sender), `client ${index} got fence ${sender} twice`);
      fences.add(sender);
    } else {
      check(!fences.has(sender), `client ${index} got ${data} after sender ${sender}'s fence`);
      seen[sender].push(Number(seq));
    }
  }
  return seen;
}

function verify(index, seen) {
  const want = Array.from({ length: PER_SENDER }, (_, i) => i);
  seen.forEach((seqs, sender) => {
    if (seqs.join(',') !== want.join(',')) {
      throw new TestFailure(`client ${index}, sender ${sender}: got ${seqs.length} messages, ` +
        `expected ${PER_SENDER} in order; got [${seqs.slice(0, PER_SENDER + 5)}]`);
    }
  });
}

function sendAll(ws, sender) {
  if (sender === BINARY_SENDER) ws.send(Buffer.from('binary must not be broadcast'));
  else for (let seq = 0; seq < PER_SENDER; seq++) ws.send(`msg:${sender}:${seq}`);
  ws.send(`fence:${sender}:0`);
}

await main(async (args) => {
  const server = await startServer({ ...args, mode: 'broadcast' });
  let clients = [];
  await step(`${CLIENTS} clients connect`, async () => { clients = await openClients(server.port); });
  await step('every client gets every text message once, in order, no binary', async () => {
    const readers = clients.map((ws, i) => collect(ws, i));
    for (let s = 0; s <= SENDERS; s++) sendAll(clients[s], s);
    const results = await within(200, 'every client receiving every fence', Promise.all(readers));
    results.forEach((seen, i) => verify(i, seen));
  });
  for (const ws of clients) ws.terminate();
  check(server.alive(), `server exited during the test\n${server.logTail()}`);
});
