#!/usr/bin/python3
"""The rates a node holds against hostile clients, on the real binary.

`--upgrade-rate R`: a storm of raw WebSocket upgrades and event streams, sent as fast as the
sockets take them, gets at most a second's burst plus R a second through (101 / 200); the rest get
`503` with a `Retry-After` drawn between 1 s and the time the node needs for the refused (so they
come back spread out, not together), the refused sockets are closed, each refusal is counted in
`wspush_upgrades_total{result="rate_limited"}`, and once the storm is over upgrades go through
again.

`--max-connection-lifetime S`: every WebSocket connection is closed with 1001 after S +-10%, each
at its own time (connections opened together do not end together); a client that resumes with
`since` after each such close, while events are published all along, gets every event once, in
order; an event stream ends with `retry:`. Counted in `wspush_lifetime_closes_total`.

`--client-message-rate R --client-message-burst B`: a client gets its burst, then one message
per 1/R s; one past it is answered `{"op":"error","code":"rate_limited"}` and not handled; a client
that keeps to its rate is never refused; a flood is closed with 1008 after 16 refusals. Counted in
`wspush_client_messages_rate_limited_total`.

`--max-connections-per-user N` (tokens): a user's N+1th connection on the node, WebSocket or
event stream, gets `429` with `Retry-After`; another user is not affected; a connection that
closes (by the client, or refused later) frees its place. And a connection keeps the user it
opened with: an in-band `auth` with a token of another `sub` is refused `forbidden` and changes
nothing, one of the same `sub` is `authed`.

`--bus redis`: the same checks against a node on the Redis bus (a real redis-server, the node
ready on it before each step): the upgrade storm, the lifetime closes and a resume across them
that loses nothing (the positions are Redis's), the message rate (a pub past it refused, and not
published: no subscriber hears it), the user limit. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import base64
import hashlib
import hmac
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import (ServerProcess, arg_parser, check, metric, poll_until, publish_ok, recv_json,  # noqa: E402
                         run_main, run_step, scaled)
from wsp_bus import readyz  # noqa: E402
from wsp_redis import RedisServer  # noqa: E402

def start_node(args, extra, jwt_secret=None) -> ServerProcess:
    """A pub/sub node with `extra`: on the embedded bus, or with --bus redis on `args.redis`, once
    it is up on it and ready."""
    bus = ["--bus", args.redis.url] if args.redis else []
    server = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret=jwt_secret,
                           extra=[*bus, *extra]).start()
    if args.redis:
        check(poll_until(lambda: metric(server, "wspush_bus_up") == 1 and readyz(server) == 200, scaled(20)),
              "the node did not come up on the Redis bus\n" + server.log_tail())
    return server


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


LIFETIME = 2.0


async def lifetimes(server: ServerProcess) -> None:
    """Ten connections opened together end with 1001 within the lifetime +-10% (and a tick), not
    all at once."""
    url = f"ws://127.0.0.1:{server.port}/ws"
    conns = [await websockets.connect(url, ping_interval=None) for _ in range(10)]
    opened = time.monotonic()

    async def closed_at(ws):
        try:
            await asyncio.wait_for(ws.recv(), scaled(LIFETIME * 3))
        except websockets.ConnectionClosed as e:
            check(e.rcvd is not None and e.rcvd.code == 1001, f"closed with {e.rcvd}, not 1001")
            return time.monotonic() - opened
        raise AssertionError("a message came where the close was expected")

    ends = await asyncio.gather(*(closed_at(ws) for ws in conns))
    print(f"  closed after {min(ends):.2f}..{max(ends):.2f} s")
    check(min(ends) >= LIFETIME * 0.9 - 0.1, f"a connection closed after {min(ends):.2f} s, before its lifetime")
    check(max(ends) <= LIFETIME * 1.1 + scaled(0.5), f"a connection lived {max(ends):.2f} s")
    check(max(ends) - min(ends) >= 0.1, f"all ten closed together ({min(ends):.2f}..{max(ends):.2f} s)")


async def resume_across_lifetimes(server: ServerProcess) -> None:
    """Events published every 50 ms for three lifetimes; the client resumes with since after each
    1001 and gets every event once, in order."""
    url = f"ws://127.0.0.1:{server.port}/ws"
    sent: list = []
    done = asyncio.Event()

    async def publisher():
        k = 0
        until = time.monotonic() + LIFETIME * 3
        while time.monotonic() < until:
            sent.append(await asyncio.to_thread(publish_ok, server, "mailbox:life", {"k": k}))
            k += 1
            await asyncio.sleep(0.05)
        done.set()

    got: list = []
    closes = 0
    task = None  # publishing starts once the first subscription is active
    since = None
    hard = time.monotonic() + LIFETIME * 3 + scaled(20)
    while not (done.is_set() and len(got) >= len(sent)) and time.monotonic() < hard:
        ws = await websockets.connect(url, ping_interval=None)
        msg = {"op": "sub", "topics": ["mailbox:life"]}
        if since:
            msg["since"] = {"mailbox:life": since}
        await ws.send(json.dumps(msg))
        reply = await recv_json(ws)
        check(reply.get("op") == "subbed" and reply["lost"] == [], f"resume answered {reply}")
        since = since or reply["at"]["mailbox:life"]
        task = task or asyncio.create_task(publisher())
        try:
            while not (done.is_set() and len(got) >= len(sent)):
                try:
                    ev = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except asyncio.TimeoutError:
                    continue
                got.append(ev["id"])
                since = ev["id"]
            await ws.close()
        except websockets.ConnectionClosed as e:
            check(e.rcvd is not None and e.rcvd.code == 1001, f"closed with {e.rcvd}")
            closes += 1
    await task
    check(closes >= 2, f"only {closes} lifetime closes in {LIFETIME * 3} s")
    check(got == sent, f"{len(sent)} published, {len(got)} received: "
                       f"missing {sorted(set(sent) - set(got))[:5]}, doubled {len(got) - len(set(got))}")


def stream_lifetime(server: ServerProcess) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10))
    s.sendall(STREAM)
    data = b""
    started = time.monotonic()
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    took = time.monotonic() - started
    check(b"\nretry: " in data, f"a stream at its lifetime ended without retry: ({data[-60:]!r})")
    check(LIFETIME * 0.9 - 0.1 <= took <= LIFETIME * 1.1 + scaled(0.5), f"the stream lived {took:.2f} s")


def lifetime(args) -> None:
    server = start_node(args, ["--max-connection-lifetime", str(LIFETIME)])
    before = metric(server, "wspush_lifetime_closes_total")
    asyncio.run(lifetimes(server))
    check(metric(server, "wspush_lifetime_closes_total") - before >= 10, "wspush_lifetime_closes_total")
    asyncio.run(resume_across_lifetimes(server))
    stream_lifetime(server)
    server.kill()


MSG_RATE, MSG_BURST = 10, 5


async def message_rate(server: ServerProcess) -> int:
    """Returns how many pubs of the flood check were refused (the rest are counted by the caller)."""
    url = f"ws://127.0.0.1:{server.port}/ws"
    sub = json.dumps({"op": "sub", "topics": ["mailbox:rate"]})
    ws = await websockets.connect(url, ping_interval=None)
    for k in range(MSG_BURST):  # the burst, at once
        await ws.send(sub)
    for k in range(MSG_BURST):
        reply = await recv_json(ws)
        check(reply.get("op") == "subbed", f"message {k} of the burst answered {reply}")
    await ws.send(sub)
    reply = await recv_json(ws)
    check(reply == {"op": "error", "code": "rate_limited"}, f"past the burst: {reply}")
    await asyncio.sleep(1.5 / MSG_RATE)
    await ws.send(sub)
    check((await recv_json(ws)).get("op") == "subbed", "a message at the rate after a refusal was refused")
    await ws.close()
    # A refused pub says so (of: pub), and a heartbeat's pong is neither counted nor refused.
    ws = await websockets.connect(url, ping_interval=None)
    for k in range(MSG_BURST):
        await ws.send(sub)
    for _ in range(3):
        await ws.send(json.dumps({"op": "pong"}))
    await ws.send(json.dumps({"op": "pub", "topic": "mailbox:rate", "data": 1}))
    replies = [await recv_json(ws) for _ in range(MSG_BURST + 1)]
    check(all(r.get("op") == "subbed" for r in replies[:MSG_BURST]), f"the burst answered {replies}")
    check(replies[-1] == {"op": "error", "code": "rate_limited", "topic": "mailbox:rate", "of": "pub"},
          f"a pub past the rate answered {replies[-1]} (the pongs are not answered)")
    await ws.close()
    # The pubs past the rate reach no one: a subscriber (the publisher itself) hears the burst's
    # alone, then an event published after them all.
    ws = await websockets.connect(url, ping_interval=None)
    await ws.send(json.dumps({"op": "sub", "topics": ["mailbox:flood"]}))
    check((await recv_json(ws)).get("op") == "subbed", "the flood's subscription")
    await asyncio.sleep(1.5 * MSG_BURST / MSG_RATE)  # the burst refills
    sent_at = time.monotonic()
    for k in range(MSG_BURST + 3):
        await ws.send(json.dumps({"op": "pub", "topic": "mailbox:flood", "data": k}))
    replies = [await recv_json(ws) for _ in range(MSG_BURST + 3)]
    took = time.monotonic() - sent_at
    heard = [r["data"] for r in replies if r.get("topic") == "mailbox:flood" and "op" not in r]
    refused = [r for r in replies if r == {"op": "error", "code": "rate_limited", "topic": "mailbox:flood", "of": "pub"}]
    check(len(heard) + len(refused) == MSG_BURST + 3, f"the pubs were answered {replies}")
    check(MSG_BURST <= len(heard) <= MSG_BURST + took * MSG_RATE + 1,
          f"{len(heard)} of {MSG_BURST + 3} pubs published in {took:.2f} s (burst {MSG_BURST}, {MSG_RATE}/s)")
    check(heard == list(range(len(heard))), f"the pubs published out of order: {heard}")
    marker = await asyncio.to_thread(publish_ok, server, "mailbox:flood", "marker")
    ev = await recv_json(ws)
    check(ev.get("id") == marker, f"after the flood, heard {ev} before the marker: a refused pub was published")
    await ws.close()
    # A client that keeps to its rate (a little under it) is never refused.
    polite = await websockets.connect(url, ping_interval=None)
    for k in range(int(MSG_RATE * 2)):
        await polite.send(sub)
        reply = await recv_json(polite)
        check(reply.get("op") == "subbed", f"a polite client's message {k} answered {reply}")
        await asyncio.sleep(1.2 / MSG_RATE)
    await polite.close()
    # A flood is refused, then closed with 1008.
    flood = await websockets.connect(url, ping_interval=None)
    for _ in range(100):
        await flood.send(sub)
    codes = []
    try:
        while True:
            codes.append((await recv_json(flood)).get("code", "subbed"))
    except websockets.ConnectionClosed as e:
        check(e.rcvd is not None and e.rcvd.code == 1008, f"the flood was closed with {e.rcvd}, not 1008")
    check(codes.count("rate_limited") == 15 and codes.count("subbed") == MSG_BURST,
          f"the flood got {codes.count('subbed')} subbed and {codes.count('rate_limited')} rate_limited before 1008")
    return len(refused)


def message_rate_step(args) -> None:
    server = start_node(args, ["--client-message-rate", str(MSG_RATE), "--client-message-burst", str(MSG_BURST),
                               "--allow-client-publish"])
    before = metric(server, "wspush_client_messages_rate_limited_total")
    refused_pubs = asyncio.run(message_rate(server))
    counted = metric(server, "wspush_client_messages_rate_limited_total") - before
    check(counted == 1 + 1 + refused_pubs + 16,
          f"{counted} counted as rate limited, {18 + refused_pubs} were (the pongs are not)")
    server.kill()


SECRET = "limits-test-secret"
PER_USER = 3


def token(sub: str, exp_in: float = 3600) -> str:
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = enc(json.dumps({"sub": sub, "exp": int(time.time() + exp_in), "topics": ["mailbox:*"]}).encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{enc(sig)}"


def raw_open(port: int, tok: str, stream: bool = False) -> "tuple[socket.socket, bytes]":
    s = socket.create_connection(("127.0.0.1", port), timeout=scaled(10))
    req = (f"GET /sse?topics=mailbox:1&token={tok} HTTP/1.1\r\nHost: x\r\n\r\n" if stream else
           f"GET /ws?token={tok} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    s.sendall(req.encode())
    return s, head_of(s)


async def users(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    alice = token("alice")
    held = [await websockets.connect(f"{url}?token={alice}", ping_interval=None) for _ in range(PER_USER - 1)]
    stream, head = raw_open(server.port, alice, stream=True)  # a stream counts as a connection too
    check(head.startswith(b"HTTP/1.1 200"), f"alice's stream answered {head[:40]!r}")
    for stream_too in (False, True):
        s, head = raw_open(server.port, alice, stream_too)
        s.close()
        check(head.startswith(b"HTTP/1.1 429"), f"alice's connection {PER_USER + 1} answered {head[:60]!r}")
        retry = [l for l in head.split(b"\r\n") if l.lower().startswith(b"retry-after:")]
        check(len(retry) == 1 and 1 <= int(retry[0].split(b":")[1]) <= 60, f"429 without a Retry-After: {head!r}")
    bob = await websockets.connect(f"{url}?token={token('bob')}", ping_interval=None)  # another user: room
    # Closing one of alice's frees its place (the stream's close, seen by the server as EOF).
    stream.close()
    deadline = time.monotonic() + scaled(10)
    while True:
        s, head = raw_open(server.port, alice)
        if head.startswith(b"HTTP/1.1 101"):
            break
        s.close()
        check(time.monotonic() < deadline, f"a closed connection did not free alice's place: {head[:40]!r}")
        await asyncio.sleep(0.05)
    s.close()
    # The user is fixed: bob's token on alice's connection is refused, alice's own refresh is not.
    ws = held[0]
    await ws.send(json.dumps({"op": "auth", "token": token("bob")}))
    reply = await recv_json(ws)
    check(reply == {"op": "error", "code": "forbidden"}, f"another user's token answered {reply}")
    await ws.send(json.dumps({"op": "auth", "token": token("alice", 7200)}))
    reply = await recv_json(ws)
    check(reply.get("op") == "authed", f"alice's own new token answered {reply}")
    for c in held + [bob]:
        await c.close()
    # Every place is free again once they are all closed.
    deadline = time.monotonic() + scaled(10)
    opened = []
    while len(opened) < PER_USER:
        s, head = raw_open(server.port, alice)
        if head.startswith(b"HTTP/1.1 101"):
            opened.append(s)
            continue
        s.close()
        check(time.monotonic() < deadline, f"places not freed after every close: {len(opened)} of {PER_USER}")
        await asyncio.sleep(0.05)
    for s in opened:
        s.close()


def users_step(args) -> None:
    server = start_node(args, ["--max-connections-per-user", str(PER_USER)], jwt_secret=SECRET)
    asyncio.run(users(server))
    check(metric(server, 'wspush_upgrades_total{result="user_limit"}') >= 2, "429s not counted as user_limit")
    server.kill()


def steps(args) -> None:
    where = " (Redis bus)" if args.redis else ""
    server = start_node(args, ["--upgrade-rate", str(RATE)])
    run_step("--upgrade-rate against a storm of upgrades and streams" + where, upgrade_rate, server)
    server.kill()
    run_step("--max-connection-lifetime: 1001 each at its time, resume loses nothing" + where, lifetime, args)
    run_step("--client-message-rate: burst, rate, rate_limited (pubs unpublished), a flood closed 1008" + where,
             message_rate_step, args)
    run_step("--max-connections-per-user: 429, places freed; the user fixed at the upgrade" + where, users_step, args)


def main(args) -> None:
    args.redis = None
    if args.bus == "embedded":
        return steps(args)
    args.redis = RedisServer(persistent=False).start()
    try:
        steps(args)
    finally:
        args.redis.close()


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--bus", choices=["embedded", "redis"], default="embedded",
                        help="the node's bus: embedded, or a real redis-server started for the test")
    run_main(main, parser)
