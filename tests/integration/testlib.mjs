// Shared helpers for the Node `ws` interop tests (the Node twin of wsp_testlib.py).
//
// startServer() runs the real wspush binary with port 0 and resolves once its `listening on` log line
// appears (never a sleep); every server started is killed by PID when the test exits, and through
// `setpriv --pdeathsig KILL` also if the test itself is killed. main() maps the outcome to exit codes:
// 0 pass, 1 fail (with a clear message), 77 when `--io uring` was asked for but the server fell back.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';

export const SKIP_EXIT = 77;
const LISTEN_RE = /listening on ([0-9.]+):(\d+)/;
const BACKEND_RE = /wspush: io backend: (uring|epoll)(.*)/;
const ADMIN_RE = /admin API at ([0-9.]+):(\d+)/;

export class TestFailure extends Error {}
export class Skip extends Error {}

export function check(cond, message) {
  if (!cond) throw new TestFailure(message);
}

/** Per-step timeouts grow with WSPUSH_TEST_TIMEOUT_SCALE (ASan servers are ~3x slower). */
export function scaled(seconds) {
  const scale = Number(process.env.WSPUSH_TEST_TIMEOUT_SCALE || '1');
  return seconds * (Number.isFinite(scale) && scale > 1 ? scale : 1);
}

/** Rejects with a TestFailure naming `what` if `promise` has not settled within `seconds` (scaled). */
export function within(seconds, what, promise) {
  const limit = scaled(seconds);
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new TestFailure(`timed out after ${limit}s: ${what}`)), limit * 1000);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export function parseArgs(argv = process.argv.slice(2)) {
  const args = { server: '', io: 'epoll', verbose: false };
  for (let i = 0; i < argv.length; i++) {
    const [name, inline] = argv[i].split(/=(.*)/s, 2);
    const value = () => (inline !== undefined ? inline : argv[++i]);
    if (name === '--server') args.server = value();
    else if (name === '--io') args.io = value();
    else if (name === '--verbose') args.verbose = true;
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  if (!args.server) throw new Error('usage: --server PATH [--io uring|epoll] [--verbose]');
  if (!['uring', 'epoll'].includes(args.io)) throw new Error(`--io must be uring or epoll, not ${args.io}`);
  return args;
}

const liveServers = new Set();
const startedServers = [];
process.on('exit', () => { for (const s of liveServers) s.kill(); });

/** One wspush process on 127.0.0.1 with an OS-chosen port. */
export class Server {
  /** `jwtSecret`: tokens required (else --auth=none); `listen`: ADDR:PORT (default any free port). */
  constructor({ server, io = 'epoll', mode = 'echo', extra = [], env = {}, allowFallback = false, verbose = false,
    jwtSecret = null, listen = '127.0.0.1:0' }) {
    Object.assign(this, { binary: server, io, mode, extra, env, allowFallback, verbose, jwtSecret, listen });
    this.log = [];
    this.waiters = [];
    this.exited = null;
  }

  command() {
    const auth = this.jwtSecret ? ['--jwt-secret', this.jwtSecret] : ['--auth=none'];
    const args = ['--listen', this.listen, '--admin-listen', '127.0.0.1:0', `--mode=${this.mode}`, `--io=${this.io}`, ...auth, ...this.extra];
    const base = this.binary.endsWith('.py') ? ['/usr/bin/python3', this.binary] : [this.binary];
    const wrap = existsSync('/usr/bin/setpriv') ? ['/usr/bin/setpriv', '--pdeathsig', 'KILL', '--'] : [];
    return [...wrap, ...base, ...args];
  }

  async start(timeoutSeconds = 30) {
    const [cmd, ...args] = this.command();
    // Options also come from WSPUSH_* variables: only the test's own may reach the server.
    const inherited = Object.entries(process.env).filter(([k]) => !k.startsWith('WSPUSH_'));
    const env = { ...Object.fromEntries(inherited), ...this.env };
    this.proc = spawn(cmd, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    liveServers.add(this);
    startedServers.push(this);
    this.exitPromise = new Promise((resolve) => this.proc.on('exit', (code, sig) => {
      this.exited = { code, sig };
      liveServers.delete(this);
      this.onLine('<exited>');
      resolve(this.exited);
    }));
    let partial = '';
    this.proc.stderr.on('data', (chunk) => {
      const lines = (partial + chunk.toString('utf8')).split('\n');
      partial = lines.pop();
      for (const line of lines) this.onLine(line);
    });
    const match = await this.waitForLog(LISTEN_RE, timeoutSeconds, "the 'listening on' line");
    this.port = Number(match[2]);
    const admin = this.log.map((l) => ADMIN_RE.exec(l)).find((m) => m);
    this.adminPort = admin ? Number(admin[2]) : null;
    this.checkBackend();
    return this;
  }

  checkBackend() {
    const line = this.log.filter((l) => BACKEND_RE.test(l)).pop();
    check(line !== undefined, "server printed no 'wspush: io backend: ...' line before 'listening on'");
    this.backendLine = line;
    this.backend = BACKEND_RE.exec(line)[1];
    if (this.io === 'uring' && this.backend !== 'uring' && !this.allowFallback) {
      throw new Skip(`asked for --io=uring but the server fell back: ${line.trim()}`);
    }
    if (this.io === 'epoll') check(this.backend === 'epoll', `asked for --io=epoll, server says: ${line}`);
  }

  onLine(line) {
    if (this.verbose) process.stderr.write(`[server] ${line}\n`);
    this.log.push(line);
    for (const w of [...this.waiters]) w(line);
  }

  /** Resolves with the match of the first log line (from the start) that matches `regex`. */
  waitForLog(regex, timeoutSeconds, what) {
    const found = this.log.map((l) => regex.exec(l)).find((m) => m);
    if (found) return Promise.resolve(found);
    return within(timeoutSeconds, `waiting for ${what}\n${this.logTail()}`, new Promise((resolve, reject) => {
      const waiter = (line) => {
        const m = regex.exec(line);
        if (m || line === '<exited>') this.waiters.splice(this.waiters.indexOf(waiter), 1);
        if (m) resolve(m);
        else if (line === '<exited>') {
          reject(new TestFailure(`server exited (${JSON.stringify(this.exited)}) before ${what}\n${this.logTail()}`));
        }
      };
      this.waiters.push(waiter);
    }));
  }

  logTail(n = 30) {
    return 'server log (last lines):\n' + this.log.slice(-n).map((l) => `  | ${l}`).join('\n');
  }

  alive() { return this.proc && this.exited === null; }

  /** The process ended without the test stopping it. */
  crashed() { return this.died || (this.exited !== null && !this.stopped); }

  kill() {
    this.died = this.crashed();
    this.stopped = true;
    if (this.alive()) {
      try { process.kill(this.proc.pid, 'SIGKILL'); } catch { /* already gone */ }
    }
    liveServers.delete(this);
  }
}

export async function startServer(options) {
  return new Server(options).start();
}

/** Opens a client; resolves once the upgrade is done. Options go to `ws` (permessage-deflate is offered). */
export function connect(port, path = '/ws', options = {}) {
  const ws = new WebSocket(`ws://127.0.0.1:${port}${path}`, { maxPayload: 64 * 1024 * 1024, ...options });
  ws.inbox = new Inbox(ws);
  return within(20, `opening ws://127.0.0.1:${port}${path}`, new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws));
    ws.once('error', (err) => reject(new TestFailure(`connect failed: ${err.message}`)));
  }));
}

/** Queues what a client receives so that tests can await "the next message" or "the close". */
export class Inbox {
  constructor(ws) {
    this.items = [];
    this.waiter = null;
    this.closed = null;
    ws.on('message', (data, isBinary) => this.push({ data, isBinary }));
    ws.on('close', (code, reason) => { this.closed = { code, reason: reason.toString() }; this.push(null); });
    ws.on('error', (err) => { this.error = err.message; }); // the close event follows
  }

  push(item) {
    this.items.push(item);
    if (this.waiter) { const w = this.waiter; this.waiter = null; w(); }
  }

  /** The next message: {data: Buffer, isBinary}. Fails if the connection closes first. */
  async next(seconds = 20) {
    while (this.items.length === 0) {
      await within(seconds, 'waiting for a message', new Promise((resolve) => { this.waiter = resolve; }));
    }
    const item = this.items.shift();
    if (item === null) {
      this.items.unshift(null);
      const why = this.error ? `; client error: ${this.error}` : '';
      throw new TestFailure(`connection closed (code ${this.closed.code}) while a message was expected${why}`);
    }
    return item;
  }

  /** Resolves with {code, reason} once the connection has closed; fails on a message before it. */
  async close(seconds = 20) {
    while (this.closed === null) {
      if (this.items.length && this.items[0] !== null) {
        const { data } = this.items[0];
        throw new TestFailure(`expected the close, got a ${data.length}-byte message first`);
      }
      await within(seconds, 'waiting for the close', new Promise((resolve) => { this.waiter = resolve; }));
    }
    return this.closed;
  }
}

/** Runs `body(args)`; exits 0 on success, 77 on Skip, 1 on failure; kills every server by PID. */
export async function main(body) {
  let code = 0;
  try {
    await body(parseArgs());
    console.log('PASS');
  } catch (err) {
    if (err instanceof Skip) {
      console.log(`SKIP: ${err.message}`);
      code = SKIP_EXIT;
    } else {
      console.log(err instanceof TestFailure ? `FAIL: ${err.message}` : `FAIL: unexpected error\n${err.stack}`);
      code = 1;
      for (const s of startedServers) {
        if (s.crashed()) console.log(`server pid ${s.proc.pid} exited by itself (${JSON.stringify(s.exited)})\n${s.logTail(60)}`);
      }
    }
  }
  for (const s of liveServers) s.kill();
  process.exit(code);
}

/** Runs one named step and prints `ok - name`; a failure message is prefixed with the step name. */
export async function step(name, fn) {
  const started = Date.now();
  try {
    await fn();
  } catch (err) {
    if (err instanceof TestFailure) err.message = `[${name}] ${err.message}`;
    throw err;
  }
  console.log(`ok - ${name} (${((Date.now() - started) / 1000).toFixed(1)}s)`);
}

/** A self-signed P-256 certificate for localhost and 127.0.0.1 in `dir` (the openssl command); {cert, key} paths. */
export function makeTestCert(dir) {
  const cert = path.join(dir, 'server.crt');
  const key = path.join(dir, 'server.key');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=localhost',
    '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'], { stdio: 'ignore' });
  return { cert, key };
}
