// A TCP relay between a client and the server, on a reserved port, that a test can shut and open:
// a network link that can be held down. shut() drops every relayed connection and stops
// listening, so the client's tries are refused (as with a server that is down) while the server
// itself stays up and answers the test; open() listens again on the same port. Plain sockets:
// every byte passes unchanged.
import net from 'node:net';
import { reservePort } from '../integration/ports.mjs';

export class TcpGate {
  /** Relays to 127.0.0.1:`targetPort`. */
  constructor(targetPort) {
    this.target = targetPort;
    this.port = 0;
    this.server = null;
    this.sockets = new Set();
    this.accepted = 0;  // client connections relayed so far
  }

  async open() {
    if (!this.port) this.port = await reservePort();
    const server = net.createServer((down) => {
      this.accepted++;
      const up = net.connect(this.target, '127.0.0.1');
      for (const [s, peer] of [[down, up], [up, down]]) {
        this.sockets.add(s);
        s.on('error', () => {});  // the close follows
        s.on('close', () => {
          this.sockets.delete(s);
          peer.destroy();
        });
      }
      down.pipe(up);
      up.pipe(down);
    });
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ port: this.port, host: '127.0.0.1' }, resolve);
    });
    this.server = server;
    return this;
  }

  /** Drops every relayed connection and refuses new ones; resolves once the listener is closed. */
  async shut() {
    const server = this.server;
    this.server = null;
    if (!server) return;
    const closed = new Promise((resolve) => server.close(resolve));  // after the last connection ends
    for (const s of this.sockets) s.destroy();
    await closed;
  }
}
