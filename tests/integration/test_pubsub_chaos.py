#!/usr/bin/python3
"""Pub/sub under a seeded random mix of everything a client may send, right or wrong.

40 Python `websockets` clients connect, send random sub (with and without `since`, with ids of
every kind), unsub, pub, malformed JSON and bad requests, read a little or not at all, and
disconnect cleanly or by aborting the TCP connection, over and over, while the admin API
publishes to the same topics. The server runs with small limits (history of 5, 8 topics per
connection, 64 KiB of pending output) so that every refusal path is taken.

Each session also subscribes to a topic of its own first; a session that ends cleanly then has
an event published there and reads until it comes: every client must see that at least once
(it keeps going past the 8 s until it has). Every disconnect must be one the chaos explains: a
close by the server with 1008 (too many refused messages in a row) or 1013 (slow consumer), or,
for a client whose library had stopped reading (its queue of 32 full), a connection reset
without the close frame it never read. Anything else fails: an upgrade refused, a connection
refused, 1011 or any other close code, a reset while the client was reading. Afterwards the
server must still be alive, answer a fresh client correctly, and once every client is gone hold
no connection, no subscription and no topic (nothing leaked). Exit 0 pass, 1 fail, 77 io_uring
unavailable.
"""
import asyncio
import json
import os
import random
import sys
import threading
import time
from collections import Counter

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (ServerProcess, TestFailure, admin_port, arg_parser, check, no_positions, http_request,  # noqa: E402
                         run_main, run_step, scaled, scrape_metrics, subscribe)

SECONDS = 8
CLIENTS = 40
TOPICS = [f"t{k}" for k in range(12)]
IDS = ["x:1", "0", "zz", "a" * 70, "nope:"]
GARBAGE = ["{", "[]", '{"op":"sub","topics":[1]}', '{"op":"pub","topic":"a b","data":1}', "\x00" * 10,
           '{"op":"sub","topics":["t1"],"since":{"t9":"1"}}', '{"op":"unsub","topics":[]}', '"just a string"']


def random_message(rnd: random.Random) -> str:
    r, topics = rnd.random(), rnd.sample(TOPICS, rnd.randint(1, 5))
    if r < 0.35:
        return json.dumps({"op": "sub", "topics": topics})
    if r < 0.5:
        return json.dumps({"op": "sub", "topics": topics, "since": {t: rnd.choice(IDS) for t in topics}})
    if r < 0.65:
        return json.dumps({"op": "unsub", "topics": topics})
    if r < 0.85:
        return json.dumps({"op": "pub", "topic": topics[0], "data": {"n": rnd.random(), "s": "x" * rnd.randint(0, 3000)}})
    return rnd.choice(GARBAGE)


# Closes the chaos causes: the server refused too many messages in a row, or the client read too
# slowly. Any other code (1011 above all) is a failure.
EXPECTED_CLOSES = {1008: "policy: refused messages in a row", 1013: "slow consumer"}
UNREAD_RESET = "reset behind unread messages"


class Tally:
    """What the clients saw: sessions and verified deliveries per client, expected disconnects by
    kind, and failures (every one counted, the first few kept)."""

    def __init__(self) -> None:
        self.sessions = Counter()
        self.verified = Counter()
        self.expected = Counter()
        self.failures = 0
        self.failure_notes: "list[str]" = []

    def fail(self, seed: int, what: str) -> None:
        self.failures += 1
        if len(self.failure_notes) < 10:
            self.failure_notes.append(f"client {seed}: {what}")


def classify_close(tally: Tally, seed: int, ws, closed: websockets.ConnectionClosed) -> None:
    code = closed.rcvd.code if closed.rcvd else None
    if code in EXPECTED_CLOSES:
        tally.expected[code] += 1
    elif code is None and ws is not None and ws.max_queue and len(ws.messages) >= ws.max_queue:
        # The library had stopped reading (queue full): whatever the server sent last, a close frame
        # included, waits unread; after --close-timeout the server resets the connection.
        tally.expected[UNREAD_RESET] += 1
    else:
        unread = len(ws.messages) if ws is not None else "?"
        tally.fail(seed, f"disconnected with close code {code} ({closed}; {unread} messages unread)")


async def delivered(ws, admin: int, topic: str, marker: int) -> None:
    """Publishes `marker` to `topic` (subscribed to by `ws`) and reads until it comes."""
    status, text = await asyncio.to_thread(http_request, admin, "POST", "/publish",
                                           json.dumps({"topic": topic, "data": {"marker": marker}}).encode())
    check(status == 200, f"publishing to {topic} answered {status} {text}")
    deadline = time.monotonic() + scaled(30)  # a timeout that only stops a hang
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise TestFailure(f"the event published to {topic} after its subbed never came") from None
        msg = json.loads(raw)
        if msg.get("topic") == topic and msg.get("data") == {"marker": marker}:
            return


async def chaos_client(port: int, admin: int, seed: int, deadline: float, tally: Tally) -> None:
    rnd, own = random.Random(seed), f"own{seed}"
    give_up = deadline + scaled(60)
    while time.monotonic() < deadline or not tally.verified[seed]:
        if time.monotonic() >= give_up:
            return tally.fail(seed, f"no session of {tally.sessions[seed]} got its own event, {scaled(60):.0f}s past "
                                    "the end of the chaos")
        ws = None
        try:
            # close_timeout: a client that stopped reading (its queue of 32 is full) never sees the
            # server's close reply; do not wait the default 10 s for it
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None, close_timeout=1,
                                          open_timeout=scaled(30)) as ws:
                tally.sessions[seed] += 1
                await subscribe(ws, [own])
                for _ in range(rnd.randint(1, 60)):
                    await ws.send(random_message(rnd))
                    if rnd.random() < 0.5:  # read a little, sometimes nothing (slow consumers)
                        try:
                            await asyncio.wait_for(ws.recv(), 0.05)
                        except asyncio.TimeoutError:
                            pass
                if rnd.random() < 0.3:
                    ws.transport.abort()  # no close handshake: a reset
                    continue
                await delivered(ws, admin, own, tally.sessions[seed])
                tally.verified[seed] += 1
        except websockets.ConnectionClosed as closed:
            classify_close(tally, seed, ws, closed)
        except websockets.InvalidStatusCode as exc:
            return tally.fail(seed, f"upgrade refused: {exc}")
        except (websockets.WebSocketException, OSError, asyncio.TimeoutError) as exc:
            where = "connecting" if ws is None else "in a session"
            return tally.fail(seed, f"{type(exc).__name__} {where}: {exc}")
        except TestFailure as exc:
            return tally.fail(seed, str(exc))


def publisher(admin: int, deadline: float, failures: list) -> None:
    rnd = random.Random(99)
    while time.monotonic() < deadline:
        body = json.dumps({"topic": rnd.choice(TOPICS), "data": [1, 2, "three"]}).encode()
        status, text = http_request(admin, "POST", "/publish", body)
        if status != 200:
            failures.append((status, text))


async def chaos(server: ServerProcess, admin: int) -> None:
    deadline = time.monotonic() + SECONDS
    failures: list = []
    tally = Tally()
    thread = threading.Thread(target=publisher, args=(admin, deadline, failures), daemon=True)
    thread.start()
    await asyncio.gather(*(chaos_client(server.port, admin, seed, deadline, tally) for seed in range(CLIENTS)))
    thread.join()
    print(f"   ({sum(tally.sessions.values())} sessions, {sum(tally.verified.values())} of them got their own event; "
          f"expected disconnects {dict(tally.expected)}; failures {tally.failures})")
    check(server.alive(), "the server died under the random traffic\n" + server.log_tail())
    check(not failures, f"admin publishes failed: {failures[:3]}")
    check(not tally.failures, f"{tally.failures} disconnect(s) or check(s) the chaos does not explain:\n  "
          + "\n  ".join(tally.failure_notes))
    missing = [seed for seed in range(CLIENTS) if not tally.verified[seed]]
    check(not missing, f"clients {missing} never got the event published to their own topic")
    slow = scrape_metrics(admin).get("wspush_slow_consumer_closes_total", 0)
    check(tally.expected[1013] <= slow, f"{tally.expected[1013]} clients saw 1013, the server counted {slow:g} "
                                        "slow-consumer closes")
    # A fresh client still gets the protocol right.
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["after"]}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(no_positions(reply) == {"op": "subbed", "topics": ["after"], "lost": []}, f"after the chaos, sub answered {reply}")
        http_request(admin, "POST", "/publish", b'{"topic":"after","data":true}')
        event = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(event["topic"] == "after" and event["data"] is True, f"after the chaos, got {event}")


def nothing_left(server: ServerProcess, admin: int) -> None:
    """Once every client is gone the server holds no connection, subscription or topic. The
    closes are asynchronous (close handshakes, lingering closes with a timeout): wait for them."""
    deadline = time.monotonic() + scaled(30)
    while True:
        m = scrape_metrics(admin)
        held = {k: v for k, v in m.items()
                if (k.startswith("wspush_connections{") or k in ("wspush_subscriptions", "wspush_topics")) and v}
        if not held:
            return
        check(time.monotonic() < deadline, f"still held after every client left: {held}")
        time.sleep(0.2)  # polling a gauge: the server has no event to wait on for "all closed"


def run(args) -> None:
    extra = ["--allow-client-publish", "--threads", "2", "--history-size", "5", "--max-topics-per-connection", "8",
             "--max-pending-bytes", "65536", "--close-timeout", "2"]
    with ServerProcess(args.server, io=args.io, mode="pubsub", extra=extra, quiet=not args.verbose).start() as server:
        admin = admin_port(server)
        run_step(f"{CLIENTS} random clients for {SECONDS} s", asyncio.run, chaos(server, admin))
        run_step("nothing leaked once they are gone", nothing_left, server, admin)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
