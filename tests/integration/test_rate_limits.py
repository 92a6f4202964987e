#!/usr/bin/python3
"""The rates a node holds against hostile clients, on the real binary.

`--upgrade-rate R`: a storm of raw WebSocket upgrades and event streams, sent as fast as the
sockets take them, gets at most a second's burst plus R a second through (101 / 200); the rest get
`503` with a `Retry-After` drawn between 1 s and the time the node needs for the refused (so they
come back spread out, not together), the refused sockets are closed, each refusal is counted in
`wspush_upgrades_total{result="rate_limited"}`, and once the storm is over upgrades go through
again. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (ServerProcess, arg_parser, check, metric, run_main, run_step, scaled)  # noqa: E402

RATE = 20
STORM = 200

UPGRADE = ("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
STREAM = b"GET /sse?topics=mailbox:1 HTTP/1.1\r\nHost: x\r\n\r\n"


def head_of(sock: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + scaled(10)
    while b"\r\n\r\n" not in data and time.monotonic() < deadline:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def storm(port: int) -> "tuple[int, list[int], float]":
    """STORM upgrades (every fourth an event stream) as fast as possible: (admitted,
    Retry-After of each refusal, seconds the storm took)."""
    socks = []
    started = time.monotonic()
    for k in range(STORM):
        s = socket.create_connection(("127.0.0.1", port), timeout=scaled(10))
        s.sendall(STREAM if k % 4 == 3 else UPGRADE)
        socks.append(s)
    admitted, retry = 0, []
    for s in socks:
        head = head_of(s)
        status = head.split(b" ", 2)[1] if head else b""
        if status in (b"101", b"200"):
            admitted += 1
        else:
            check(status == b"503", f"a storm's upgrade answered {head[:80]!r}")
            line = [l for l in head.split(b"\r\n") if l.lower().startswith(b"retry-after:")]
            check(len(line) == 1, f"a 503 without one Retry-After: {head!r}")
            retry.append(int(line[0].split(b":")[1]))
            s.settimeout(scaled(10))
            rest = b""
            while True:  # the refused socket is closed by the server
                chunk = s.recv(4096)
                if not chunk:
                    break
                rest += chunk
    elapsed = time.monotonic() - started
    for s in socks:
        s.close()
    return admitted, retry, elapsed


def upgrade_rate(server: ServerProcess) -> None:
    before = metric(server, 'wspush_upgrades_total{result="rate_limited"}')
    admitted, retry, elapsed = storm(server.port)
    refused = STORM - admitted
    print(f"  {admitted} admitted, {refused} refused in {elapsed:.2f} s; Retry-After {min(retry)}..{max(retry)}")
    check(admitted >= RATE, f"only {admitted} admitted: the burst is {RATE}")
    check(admitted <= RATE + RATE * elapsed + 2, f"{admitted} admitted in {elapsed:.2f} s at --upgrade-rate {RATE}")
    counted = metric(server, 'wspush_upgrades_total{result="rate_limited"}') - before
    check(counted == refused, f"{refused} refused, {counted} counted as rate_limited")
    check(min(retry) >= 1 and max(retry) <= 60, f"Retry-After out of 1..60: {min(retry)}..{max(retry)}")
    # The refused come back spread over the time the node needs for them (here ~9 s), not at once.
    check(max(retry) >= 4 and len(set(retry)) >= 4, f"Retry-After not spread: {sorted(set(retry))}")
    time.sleep(1.5)  # the gate refills (what the storm booked is past)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10))
    s.sendall(UPGRADE)
    head = head_of(s)
    s.close()
    check(head.startswith(b"HTTP/1.1 101"), f"after the storm an upgrade answered {head[:60]!r}")


def main(args) -> None:
    server = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                           extra=["--upgrade-rate", str(RATE)]).start()
    run_step("--upgrade-rate against a storm of upgrades and streams", upgrade_rate, server)


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__))
