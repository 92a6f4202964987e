#!/usr/bin/python3
"""How late the server keeps its time promises: the figures the tests no longer assert (a test
on a loaded machine cannot hold a clock to account), measured here against the real binary.

Each promise is measured on N connections at once (default 200), as the time from the moment the
deadline was due to the moment the client saw its effect; the table gives min, median, p99 and
max of that lateness in milliseconds, and how many connections met the promise's stated slack.

- token expiry: a connection is closed with 1008 within a second of its token's `exp`;
- keepalive: an idle connection is pinged `--ping-interval` after its last message, and closed
  `--pong-timeout` after an unanswered ping;
- message timeout: a frame started and not finished is closed `--message-timeout` after its
  first byte;
- upgrade timeout: an upgrade request not complete is closed `--upgrade-timeout` after connect,
  and so is a TLS connection whose ClientHello stopped half way;
- admin listener: a connection without the API key that sends nothing is closed 5 s after
  connect (its unkeyed deadline);
- drain: on SIGTERM the 1001 closes spread over `--drain-seconds` and the process exits once
  every client answered.

Usage: loadgen/scenarios/deadlines.py [--server build/server/wspush] [--io uring|epoll]
       [--connections 200] [--json FILE]
The timing wheel ticks in coarse steps, so lateness up to a tick is by design (the server's
--help gives the tick); pin the server (taskset) for figures worth comparing across runs.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import select
import signal
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from wsp_testlib import (ServerProcess, admin_port, decode_frame, encode_frame, parse_close,  # noqa: E402
                         upgrade_request)
from wsp_tls import client_hello, make_cert, tls_args  # noqa: E402

SECRET = "deadlines-secret"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(claims: dict) -> str:
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(claims).encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(sig)}"


class Conn:
    """A raw client socket that records when it saw each frame (and EOF)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = bytearray()
        self.upgraded = False
        self.frames: "list[tuple[float, int, bytes]]" = []
        self.eof_at = 0.0
        self.opened_at = time.monotonic()

    def upgrade(self, path: str) -> None:
        self.sock.sendall(upgrade_request(path))

    def pump(self) -> None:
        now = time.monotonic()
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.eof_at = self.eof_at or now
            return
        self.buf += data
        if not self.upgraded:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.buf.startswith(b"HTTP/1.1 101"):
                raise SystemExit(f"upgrade refused: {bytes(self.buf[:80])!r}")
            del self.buf[:end + 4]
            self.upgraded = True
            self.opened_at = now
        pos = 0
        while True:
            frame, used = decode_frame(self.buf, pos)
            if frame is None:
                break
            self.frames.append((now, frame.opcode, bytes(frame.payload)))
            pos = used
        del self.buf[:pos]

    def first(self, opcode: int) -> "tuple[float, bytes] | None":
        return next(((t, p) for t, op, p in self.frames if op == opcode), None)


def pump_until(conns, done, limit: float) -> None:
    """Reads every socket until done() or `limit` seconds (a hang guard, not a figure)."""
    deadline = time.monotonic() + limit
    by_fd = {c.sock.fileno(): c for c in conns}
    while not done() and time.monotonic() < deadline:
        live = [c.sock for c in conns if not c.eof_at]
        if not live:
            break
        ready, _, _ = select.select(live, [], [], 0.05)
        for s in ready:
            by_fd[s.fileno()].pump()


def open_all(port: int, n: int, path: str) -> "list[Conn]":
    conns = [Conn(port) for _ in range(n)]
    for c in conns:
        c.upgrade(path)
    pump_until(conns, lambda: all(c.upgraded for c in conns), 60)
    assert all(c.upgraded for c in conns), "not every connection upgraded"
    return conns


def summary(name: str, promise: str, lateness_ms: "list[float]", slack_ms: float) -> dict:
    xs = sorted(lateness_ms)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    row = {"promise": name, "stated": promise, "n": len(xs), "min_ms": xs[0], "median_ms": statistics.median(xs),
           "p99_ms": p99, "max_ms": xs[-1], "within_slack": sum(1 for x in xs if x <= slack_ms), "slack_ms": slack_ms}
    print(f"| {name} | {promise} | {len(xs)} | {xs[0]:.0f} | {row['median_ms']:.0f} | {p99:.0f} | {xs[-1]:.0f} "
          f"| {row['within_slack']}/{len(xs)} |", flush=True)
    return row


def token_expiry(args) -> dict:
    with ServerProcess(args.server, io=args.io, mode="pubsub", jwt_secret=SECRET) as srv:
        exp = int(time.time()) + 3
        conns = open_all(srv.port, args.connections, "/ws?token=" + mint({"sub": "u", "exp": exp, "topics": ["t"]}))
        pump_until(conns, lambda: all(c.first(8) for c in conns), 30)
        wall_at_mono = time.time() - time.monotonic()
        late = [(c.first(8)[0] + wall_at_mono - exp) * 1000 for c in conns if c.first(8)]
        assert len(late) == len(conns), "some connections were never closed"
        assert all(parse_close(c.first(8)[1])[0] == 1008 for c in conns), "a close other than 1008"
        return summary("token expiry → 1008", "within 1 s of exp", late, 1000)


def keepalive(args) -> "list[dict]":
    extra = ["--ping-interval", "2", "--pong-timeout", "2"]
    with ServerProcess(args.server, io=args.io, mode="pubsub", extra=extra) as srv:
        conns = open_all(srv.port, args.connections, "/ws")
        pump_until(conns, lambda: all(c.eof_at for c in conns), 30)
        ping = [(c.first(9)[0] - c.opened_at - 2) * 1000 for c in conns if c.first(9)]
        # A peer that stopped answering gets no close frame, only the end of the connection.
        close = [(c.eof_at - c.first(9)[0] - 2) * 1000 for c in conns if c.eof_at and c.first(9)]
        assert len(ping) == len(close) == len(conns), "some connections were not pinged and closed"
        return [summary("idle → ping", "--ping-interval 2 s after the upgrade", ping, 1000),
                summary("unanswered ping → close", "--pong-timeout 2 s after the ping", close, 1000)]


def message_timeout(args) -> dict:
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--message-timeout", "2"]) as srv:
        conns = open_all(srv.port, args.connections, "/ws")
        started = {}
        for c in conns:
            c.sock.sendall(encode_frame(1, b"x" * 100)[:4])  # a header and no more
            started[c] = time.monotonic()
        pump_until(conns, lambda: all(c.first(8) or c.eof_at for c in conns), 30)
        late = [((c.first(8)[0] if c.first(8) else c.eof_at) - started[c] - 2) * 1000 for c in conns]
        return summary("partial frame → close", "--message-timeout 2 s after its first byte", late, 1000)


def upgrade_timeout(args) -> dict:
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--upgrade-timeout", "2"]) as srv:
        conns = [Conn(srv.port) for _ in range(args.connections)]
        for c in conns:
            c.sock.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
        pump_until(conns, lambda: all(c.eof_at for c in conns), 30)
        late = [(c.eof_at - c.opened_at - 2) * 1000 for c in conns if c.eof_at]
        assert len(late) == len(conns), "some half upgrades were never closed"
        return summary("half upgrade → close", "--upgrade-timeout 2 s after connect", late, 1000)


def half_connections(port: int, n: int, first_bytes: bytes) -> "list[Conn]":
    """n connections that send `first_bytes` and then nothing; returns once each has closed."""
    conns = [Conn(port) for _ in range(n)]
    for c in conns:
        if first_bytes:
            c.sock.sendall(first_bytes)
    pump_until(conns, lambda: all(c.eof_at for c in conns), 60)
    assert all(c.eof_at for c in conns), "some connections were never closed"
    return conns


def tls_half_hello(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="wspush-deadlines-") as tmp:
        extra = [*tls_args(*make_cert(tmp)), "--upgrade-timeout", "2"]
        with ServerProcess(args.server, io=args.io, mode="echo", extra=extra) as srv:
            hello = client_hello()
            conns = half_connections(srv.port, args.connections, hello[:len(hello) // 2])
            late = [(c.eof_at - c.opened_at - 2) * 1000 for c in conns]
            return summary("TLS: half ClientHello → close", "--upgrade-timeout 2 s after connect", late, 1000)


def admin_unkeyed(args) -> dict:
    n = min(args.connections, 150)  # below the slots unkeyed connections may hold (192): none evicted
    with ServerProcess(args.server, io=args.io, mode="pubsub", extra=["--api-key", "deadlines-key"]) as srv:
        conns = half_connections(admin_port(srv), n, b"")
        late = [(c.eof_at - c.opened_at - 5) * 1000 for c in conns]
        return summary("admin: silent keyless → close", "5 s after connect", late, 1000)


def drain(args) -> "list[dict]":
    srv = ServerProcess(args.server, io=args.io, mode="pubsub", extra=["--drain-seconds", "2"]).start()
    try:
        conns = open_all(srv.port, args.connections, "/ws")
        t0 = time.monotonic()
        srv.signal(signal.SIGTERM)

        def answered() -> bool:  # each client answers the 1001 with its own close, as a browser does
            for c in conns:
                if c.first(8) and not getattr(c, "answered", False):
                    c.sock.sendall(encode_frame(8, b"\x03\xe9"))
                    c.answered = True
            return all(c.eof_at for c in conns)
        pump_until(conns, answered, 60)
        srv.wait_exit(60)
        exited = time.monotonic()
        closes = sorted((c.first(8)[0] - t0) * 1000 for c in conns if c.first(8))
        assert len(closes) == len(conns), "some connections got no close"
        spread = [closes[-1] - 2000]
        rows = [summary("drain: last 1001 after SIGTERM", "spread over --drain-seconds 2 s", spread, 1000),
                summary("drain: exit after SIGTERM", "once every client answered, after --drain-seconds 2 s",
                        [(exited - t0) * 1000 - 2000], 1000)]
        print(f"  drain: first close {closes[0]:.0f} ms, median {statistics.median(closes):.0f} ms, "
              f"last {closes[-1]:.0f} ms after SIGTERM", flush=True)
        return rows
    finally:
        srv.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.join(HERE, "..", "..")
    ap.add_argument("--server", default=os.path.join(root, "build", "server", "wspush"))
    ap.add_argument("--io", choices=["uring", "epoll"], default="uring")
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    print(f"lateness in ms past each deadline, {args.connections} connections, --io={args.io}")
    print("| promise | stated | n | min | median | p99 | max | within 1 s |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [token_expiry(args), *keepalive(args), message_timeout(args), upgrade_timeout(args),
            tls_half_hello(args), admin_unkeyed(args), *drain(args)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
