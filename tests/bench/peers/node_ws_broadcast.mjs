// Peer for the whole-system benchmarks: Node `ws` doing the same broadcast as
// `wspush --mode=broadcast` (every text message to every connected client, the sender included;
// binary messages are ignored). Run from the repository so Node finds node_modules/ws:
//   node tests/bench/peers/node_ws_broadcast.mjs --port 0
// Prints `listening on 127.0.0.1:PORT` once it accepts connections; SIGTERM/SIGINT close every
// client with 1001 and exit 0.
import { WebSocketServer, WebSocket } from "ws";

function option(name, fallback) {
  const args = process.argv.slice(2);
  for (let i = 0; i < args.length; i++) {
    if (args[i] === name && i + 1 < args.length) return args[i + 1];
    if (args[i].startsWith(name + "=")) return args[i].slice(name.length + 1);
  }
  return fallback;
}

const host = option("--host", "127.0.0.1");
const port = Number(option("--port", "8080"));

// No compression (wspush negotiates none), default payload limit, client tracking for broadcast.
const wss = new WebSocketServer({ host, port, perMessageDeflate: false, clientTracking: true });

wss.on("connection", (ws) => {
  ws.on("error", () => {});   // a reset client must not take the server down
  ws.on("message", (data, isBinary) => {
    if (isBinary) return;
    for (const client of wss.clients) {
      if (client.readyState === WebSocket.OPEN) client.send(data, { binary: false });
    }
  });
});

wss.on("listening", () => {
  const addr = wss.address();
  process.stdout.write(`listening on ${addr.address}:${addr.port}\n`);
});

wss.on("error", (err) => {
  process.stderr.write(`node_ws_broadcast: ${err.message}\n`);
  process.exit(1);
});

function shutdown() {
  for (const client of wss.clients) client.close(1001, "going away");
  wss.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();   // do not wait on clients that never answer
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
