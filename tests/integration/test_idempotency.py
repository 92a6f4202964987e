#!/usr/bin/python3
"""Idempotency keys on the embedded bus: the real binary, Python `websockets` clients, the admin API
over real sockets.

- the same key twice on a topic (admin /publish): both answered 200 with one id, one event, and
  counted in wspush_idempotent_duplicates_total;
- the same key on another topic: an event of its own;
- a key of 129 bytes: 400 naming idempotency_key (128 is taken); so is an empty one;
- /publish/batch: each line's key, a line repeating an earlier publish's key gets its id;
- a client's `pub` sent twice with its key: delivered once, and no error answers the retry;
- past --idempotency-window the same key publishes again.
Every "not delivered again" is checked by a later publish without a key arriving next.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, metric, poll_until,  # noqa: E402
                         publish_ok, recv_json, run_main, scaled, subscribe)

WINDOW = 2  # seconds: the last step waits it out


def post(s: ServerProcess, path: str, body: bytes) -> "tuple[int, dict]":
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port(s)}{path}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=scaled(10)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def publish_key(s: ServerProcess, topic: str, data, key: str) -> "tuple[int, dict]":
    return post(s, "/publish", json.dumps({"topic": topic, "data": data, "idempotency_key": key}).encode())


async def expect_events(ws, topic: str, want: list, sentinel: str) -> list:
    """Publishes `sentinel` (no key) and reads until it: what came before it must be `want`
    (the data of each event, in order). Returns the events."""
    sid = publish_ok(ws.server, topic, sentinel)
    got = []
    while True:
        e = await recv_json(ws)
        if e.get("op") is not None:
            raise AssertionError(f"a message that is not an event: {e}")
        if e.get("data") == sentinel:
            check(e.get("id") == sid, f"the sentinel came with {e}")
            break
        got.append(e)
    check([e["data"] for e in got] == want, f"events on {topic} before the sentinel: {got}, want the data {want}")
    return got


async def connect(s: ServerProcess):
    import websockets
    ws = await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None, max_size=None)
    ws.server = s
    return ws


async def admin_same_key(s: ServerProcess) -> None:
    w = await connect(s)
    try:
        await subscribe(w, ["idem:a", "idem:b"])
        dups = metric(s, "wspush_idempotent_duplicates_total")
        st1, b1 = publish_key(s, "idem:a", {"n": 1}, "order-17")
        st2, b2 = publish_key(s, "idem:a", {"n": 1}, "order-17")
        check(st1 == 200 and st2 == 200 and b1.get("id") and b1 == b2,
              f"the same key twice: {st1} {b1} then {st2} {b2}: want 200 and one id twice")
        got = await expect_events(w, "idem:a", [{"n": 1}], "after-a")
        check(metric(s, "wspush_idempotent_duplicates_total") == dups + 1, "the duplicate was not counted")
        check(metric(s, "wspush_idempotency_keys") >= 1, "wspush_idempotency_keys counts no key")
        check(got[0]["id"] == b1["id"], f"the event's id {got[0]['id']} is not the answer's {b1['id']}")
        st3, b3 = publish_key(s, "idem:b", {"n": 1}, "order-17")
        check(st3 == 200 and b3.get("id"), f"the key on another topic: {st3} {b3}")
        got = await expect_events(w, "idem:b", [{"n": 1}], "after-b")  # an event of its own
        check(got[0]["id"] == b3["id"], f"the event on the other topic came as {got[0]}, answered {b3}")
    finally:
        await w.close()


def bad_keys(s: ServerProcess) -> None:
    for key in ("k" * 129, "", "caf\u00e9", 7):
        status, body = publish_key(s, "idem:bad", 1, key)
        check(status == 400 and body.get("error") == "bad_request" and "idempotency_key" in body.get("reason", ""),
              f"key {key!r} answered {status} {body}: want 400 with a reason naming idempotency_key")
    status, body = publish_key(s, "idem:bad", 1, "k" * 128)
    check(status == 200 and body.get("id"), f"a key of 128 bytes answered {status} {body}")


async def batch_keys(s: ServerProcess) -> None:
    w = await connect(s)
    try:
        await subscribe(w, ["idem:batch"])
        _, first = publish_key(s, "idem:batch", "first", "b-1")
        lines = [{"topic": "idem:batch", "data": "first", "idempotency_key": "b-1"},   # an earlier publish's key
                 {"topic": "idem:batch", "data": "second", "idempotency_key": "b-2"},
                 {"topic": "idem:batch", "data": "second", "idempotency_key": "b-2"},  # twice in one batch
                 {"topic": "idem:batch", "data": "third"},
                 {"topic": "idem:batch", "data": "x", "idempotency_key": "k" * 129}]
        status, body = post(s, "/publish/batch", "\n".join(json.dumps(l) for l in lines).encode())
        r = body.get("results", [])
        check(status == 200 and len(r) == 5, f"the batch answered {status} {body}")
        check(r[0] == first and r[1] == r[2] and r[1].get("id") and r[3].get("id") and r[4] == {"error": "bad_request"},
              f"the batch's results {r} (the first publish was {first})")
        await expect_events(w, "idem:batch", ["first", "second", "third"], "after-batch")
    finally:
        await w.close()


async def client_pub_retry(s: ServerProcess) -> None:
    sub, pub = await connect(s), await connect(s)
    try:
        await subscribe(sub, ["idem:pub"])
        msg = json.dumps({"op": "pub", "topic": "idem:pub", "data": {"order": 9}, "idempotency_key": "pub-9"})
        await pub.send(msg)
        await pub.send(msg)  # the retry of a client that did not know whether the first went
        # The sentinel on the same connection: handled after both (a pub that goes is not answered).
        await pub.send(json.dumps({"op": "pub", "topic": "idem:pub", "data": "after-pub"}))
        got = []
        while not got or got[-1].get("data") != "after-pub":
            got.append(await recv_json(sub))
        check([e.get("data") for e in got] == [{"order": 9}, "after-pub"], f"a pub sent twice with its key: {got}")
        # Neither pub was answered with an error: the next answer the publisher gets is its sub's.
        await subscribe(pub, ["idem:other"])
        await pub.send(json.dumps({"op": "pub", "topic": "idem:pub", "data": 1, "idempotency_key": "k" * 129}))
        e = await recv_json(pub)
        check(e.get("op") == "error" and e.get("code") == "bad_request", f"a pub with a key of 129 bytes: {e}")
    finally:
        await sub.close()
        await pub.close()


async def window_ends(s: ServerProcess) -> None:
    w = await connect(s)
    try:
        await subscribe(w, ["idem:window"])
        _, first = publish_key(s, "idem:window", "w", "w-1")
        await expect_events(w, "idem:window", ["w"], "after-w1")
        # Only time ends the window: each try within it is a duplicate (and publishes nothing).
        ids = []
        check(poll_until(lambda: ids.append(publish_key(s, "idem:window", "w", "w-1")[1]) or ids[-1] != first,
                         scaled(WINDOW * 5), interval=0.2),
              f"the key was still taken {WINDOW * 5}s after a window of {WINDOW}s")
        await expect_events(w, "idem:window", ["w"], "after-w2")
        check(all(i == first for i in ids[:-1]), f"answers within the window: {ids}")
    finally:
        await w.close()


def main(args) -> None:
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--threads", "2", "--allow-client-publish", "--idempotency-window", str(WINDOW)]).start()
    f = Findings()
    f.step("the same key twice: one id, one event", lambda: asyncio.run(admin_same_key(s)))
    f.step("keys over 128 bytes or empty: 400 with a reason", lambda: bad_keys(s))
    f.step("/publish/batch: a key per line", lambda: asyncio.run(batch_keys(s)))
    f.step("a client's pub retried with its key: delivered once", lambda: asyncio.run(client_pub_retry(s)))
    f.step("past the window the key publishes again", lambda: asyncio.run(window_ends(s)))
    check(not s.crashed(), "the server crashed\n" + s.log_tail())
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
