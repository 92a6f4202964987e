// Ports a test may bind, lose and bind again: the Node twin of wsp_ports.py, with the same lock
// files. A port from `listen(0)` lies in the kernel's ephemeral range, where outgoing connections
// take their source ports: a server restarted there can find its port taken. reservePort() picks
// one outside that range, checks that it can be bound, and records the reservation in
// /tmp/wspush-ports/<port> (holding our PID) so that tests running in parallel never share one.
import { mkdirSync, openSync, readFileSync, unlinkSync, writeSync, closeSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';

const LOCK_DIR = '/tmp/wspush-ports';
const held = new Set();
process.on('exit', () => { for (const port of held) releasePort(port); });

function ephemeralRange() {
  try {
    const [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(low) && Number.isInteger(high)) return [low, high];
  } catch { /* not Linux: the default below */ }
  return [32768, 60999];
}

function candidates() {
  const [low, high] = ephemeralRange();
  const ports = [];
  for (let p = 10000; p < 65536; p++) if (p < low || p > high) ports.push(p);
  for (let i = ports.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [ports[i], ports[j]] = [ports[j], ports[i]];
  }
  return ports;
}

function pidAlive(pid) {
  try { process.kill(pid, 0); return true; } catch (e) { return e.code === 'EPERM'; }
}

function tryLock(port) {
  const file = path.join(LOCK_DIR, String(port));
  for (let attempt = 0; attempt < 2; attempt++) {
    let fd;
    try {
      fd = openSync(file, 'wx', 0o666);
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
      let owner = 0;
      try { owner = Number(readFileSync(file, 'utf8').trim() || '0'); } catch { return false; }
      // No PID yet: its owner has created the file and not yet written it. Held.
      if (!owner || pidAlive(owner)) return false;
      try { unlinkSync(file); } catch { /* someone else took it over */ }
      continue;
    }
    writeSync(fd, String(process.pid));
    closeSync(fd);
    return true;
  }
  return false;
}

function bindable(port) {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen({ port, host: '127.0.0.1', exclusive: true }, () => s.close(() => resolve(true)));
  });
}

/** A free 127.0.0.1 port outside the ephemeral range, ours until this process exits (or releasePort). */
export async function reservePort() {
  mkdirSync(LOCK_DIR, { recursive: true, mode: 0o777 });
  for (const port of candidates()) {
    if (!tryLock(port)) continue;
    if (await bindable(port)) {
      held.add(port);
      return port;
    }
    unlinkSync(path.join(LOCK_DIR, String(port)));
  }
  throw new Error('no free port outside the ephemeral range');
}

export function releasePort(port) {
  if (!held.delete(port)) return;
  try { unlinkSync(path.join(LOCK_DIR, String(port))); } catch { /* already gone */ }
}
