#!/usr/bin/python3
"""Pub/sub under a seeded random mix of everything a client may send, right or wrong.

40 Python `websockets` clients connect, send random sub (with and without `since`, with ids of
every kind), unsub, pub, malformed JSON and bad requests, read a little or not at all, and
disconnect cleanly or by aborting the TCP connection, over and over, while the admin API
publishes to the same topics. The server runs with small limits (history of 5, 8 topics per
connection, 64 KiB of pending output) so that every refusal path is taken. Afterwards the
server must still be alive, answer a fresh client correctly, and once every client is gone
hold no connection, no subscription and no topic (nothing leaked). Exit 0 pass, 1 fail, 77
io_uring unavailable.
"""
import asyncio
import json
import os
import random
import sys
import threading
import time

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (ServerProcess, admin_port, arg_parser, check, http_request, run_main,  # noqa: E402
                         run_step, scaled, scrape_metrics)

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


async def chaos_client(port: int, seed: int, deadline: float) -> int:
    rnd, sessions = random.Random(seed), 0
    while time.monotonic() < deadline:
        try:
            # close_timeout: a client that stopped reading (its queue of 32 is full) never sees the
            # server's close reply; do not wait the default 10 s for it
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None, close_timeout=1) as ws:
                sessions += 1
                for _ in range(rnd.randint(1, 60)):
                    await ws.send(random_message(rnd))
                    if rnd.random() < 0.5:  # read a little, sometimes nothing (slow consumers)
                        try:
                            await asyncio.wait_for(ws.recv(), 0.05)
                        except asyncio.TimeoutError:
                            pass
                if rnd.random() < 0.3:
                    ws.transport.abort()  # no close handshake: a reset
        except (websockets.exceptions.WebSocketException, OSError):
            pass  # closed by the server (1008, 1009, 1013): reconnect
    return sessions


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
    thread = threading.Thread(target=publisher, args=(admin, deadline, failures), daemon=True)
    thread.start()
    sessions = await asyncio.gather(*(chaos_client(server.port, seed, deadline) for seed in range(CLIENTS)))
    thread.join()
    check(server.alive(), "the server died under the random traffic\n" + server.log_tail())
    check(not failures, f"admin publishes failed: {failures[:3]}")
    check(sum(sessions) >= CLIENTS, f"only {sum(sessions)} client sessions ran")
    # A fresh client still gets the protocol right.
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["after"]}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(reply == {"op": "subbed", "topics": ["after"], "lost": []}, f"after the chaos, sub answered {reply}")
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
