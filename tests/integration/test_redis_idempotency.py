#!/usr/bin/python3
"""Idempotency keys on the Redis bus: a real redis-server, two wspush nodes on loopback, Python
`websockets` clients, Debian's `redis` client for a backend publishing straight into Redis.

- the same key on two nodes within the window: one event (each node's subscriber gets it once),
  one id; also when both nodes publish it at the same moment;
- a backend's FCALL wspush_publish with the key as a third argument: the id the nodes gave it,
  nothing published; the old shapes (no key; wspush_publish_batch with pairs, as a node of the
  previous version calls it) still publish;
- a client's `pub` with a key, sent twice, and the same key through the other node's admin API:
  delivered once;
- a keyed publish answered 504 (Redis stalled, SIGSTOP): Redis runs it when it goes on, and the
  retry answers that event's id and publishes nothing;
- a node that dies with a publish sent to a stopped Redis: Redis runs it once it goes on, and the
  publisher's retry through the other node answers that event's id and publishes nothing;
- a publisher that retries every 503, 504 and broken connection with its key while one node is
  killed (SIGKILL) and started again: the subscriber on the other node gets each event exactly
  once, in order, and the topic's stream holds each once; a retry through the restarted node of
  a key published before the kill answers the first id;
- a key of 129 bytes: 400 naming idempotency_key, and the function refuses it too;
- a library of the previous version loaded (no wspush_publish_keyed): publishes without a key go
  on, a keyed one is refused 503 and the node loads its library again; the retry publishes once;
- what Redis keeps: per topic a hash per generation of the window, expiring at the end of the
  next one, at most 10,000 keys each (past them a publish is not remembered).
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, node  # noqa: E402
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, poll_until, publish_ok,  # noqa: E402
                         recv_json, run_main, scaled, subscribe)

WINDOW = 120  # seconds (--idempotency-window)


def post(port: int, path: str, body: bytes, timeout: float = 10) -> "tuple[int, dict]":
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=scaled(timeout)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def publish_key(s: ServerProcess, topic: str, data, key: str) -> "tuple[int, dict]":
    return post(admin_port(s), "/publish", json.dumps({"topic": topic, "data": data, "idempotency_key": key}).encode())


def publish_key_ok(s: ServerProcess, topic: str, data, key: str) -> str:
    status, body = publish_key(s, topic, data, key)
    check(status == 200 and body.get("id"), f"a publish with key {key} to {topic} answered {status} {body}")
    return body["id"]


async def until_sentinel(ws, via: ServerProcess, topic: str, sentinel: str, sid: str = "") -> list:
    """Publishes `sentinel` (no key) through `via` (unless `sid` names it published already) and
    returns the events of `topic` before it."""
    sid = sid or publish_ok(via, topic, sentinel)
    got = []
    while True:
        e = await recv_json(ws)
        check(e.get("op") is None and e.get("topic") == topic, f"a message that is not an event of {topic}: {e}")
        if e.get("data") == sentinel:
            check(e.get("id") == sid, f"the sentinel came with {e}")
            return got
        got.append(e)


async def two_nodes(a: ServerProcess, b: ServerProcess, r: redis.Redis) -> None:
    topic = "idem:two"
    wa, wb = await connect(a), await connect(b)
    try:
        await subscribe(wa, [topic])
        await subscribe(wb, [topic])
        first = publish_key_ok(a, topic, {"n": 1}, "two-1")
        again = publish_key_ok(b, topic, {"n": 1}, "two-1")
        check(again == first, f"the key through the other node: {again}, first {first}")
        # Both nodes at the same moment, a key neither used before.
        answers = []
        threads = [threading.Thread(target=lambda s=s: answers.append(publish_key_ok(s, topic, {"n": 2}, "two-2")))
                   for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(len(answers) == 2 and answers[0] == answers[1], f"at once on both nodes: {answers}")
        # A backend straight into Redis: the key as the third argument.
        backend = r.fcall("wspush_publish", 0, topic, json.dumps({"n": 1}), "two-1").decode()
        check(backend == first, f"FCALL wspush_publish with the key: {backend}, first {first}")
        sid = publish_ok(a, topic, "after")
        for ws, via in ((wa, a), (wb, b)):
            got = await until_sentinel(ws, via, topic, "after", sid)
            check([(e["id"], e["data"]) for e in got] == [(first, {"n": 1}), (answers[0], {"n": 2})],
                  f"the subscriber on the node at {via.port} got {got}")
    finally:
        await wa.close()
        await wb.close()


async def old_shapes(a: ServerProcess, r: redis.Redis) -> None:
    topic = "idem:old"
    w = await connect(a)
    try:
        await subscribe(w, [topic])
        plain = r.fcall("wspush_publish", 0, topic, '"plain"').decode()
        pairs = [x.decode() for x in r.fcall("wspush_publish_batch", 0, topic, '"pair-1"', topic, '"pair-2"')]
        got = await until_sentinel(w, a, topic, "after-old")
        check([(e["id"], e["data"]) for e in got] == [(plain, "plain"), (pairs[0], "pair-1"), (pairs[1], "pair-2")],
              f"the old shapes published {got}")
        try:
            r.fcall("wspush_publish", 0, topic, '"x"', "k" * 129)
            raise AssertionError("FCALL wspush_publish took a key of 129 bytes")
        except redis.ResponseError as e:
            check("idempotency key" in str(e), f"a key of 129 bytes refused with {e}")
        status, body = publish_key(a, topic, "x", "k" * 129)
        check(status == 400 and "idempotency_key" in body.get("reason", ""), f"a key of 129 bytes: {status} {body}")
    finally:
        await w.close()


async def client_pub(a: ServerProcess, b: ServerProcess) -> None:
    topic = "idem:pub"
    sub, pub = await connect(b), await connect(a)
    try:
        await subscribe(sub, [topic])
        msg = json.dumps({"op": "pub", "topic": topic, "data": {"order": 7}, "idempotency_key": "pub-7"})
        await pub.send(msg)
        await pub.send(msg)
        # The sentinel on the same connection: handled, and published, after both (a pub is
        # answered only when it fails, so nothing else says they are done).
        await pub.send(json.dumps({"op": "pub", "topic": topic, "data": "after-pubs"}))
        got = []
        while not got or got[-1]["data"] != "after-pubs":
            got.append(await recv_json(sub))
        check([e["data"] for e in got] == [{"order": 7}, "after-pubs"], f"a pub sent twice with its key: {got}")
        check(publish_key_ok(b, topic, {"order": 7}, "pub-7") == got[0]["id"], "the key through the other node's API")
        check(await until_sentinel(sub, b, topic, "after-admin") == [], "the admin retry of a pub's key published")
        await subscribe(pub, ["idem:other"])  # no error answered either pub: the sub's answer is next
    finally:
        await sub.close()
        await pub.close()


async def older_library(a: ServerProcess, r: redis.Redis) -> None:
    """A node of the previous version loads its functions (as every node does when it connects):
    one without wspush_publish_keyed. A publish without a key still goes (the old functions did
    not change); a keyed one is refused 503 (it did not run), the node loads its own library
    again, and the retry with the key publishes it, once."""
    topic = "idem:upgrade"
    lua = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server", "bus", "wspush.lua")).read()
    older = "\n".join(line for line in lua.splitlines() if "'wspush_publish_keyed'" not in line)
    check(older != lua, "the library has no wspush_publish_keyed to take out")
    r.function_load(older, replace=True)
    has_keyed = lambda: "wspush_publish_keyed" in str(r.function_list())  # noqa: E731
    check(not has_keyed(), "the older library still has wspush_publish_keyed")
    w = await connect(a)
    try:
        await subscribe(w, [topic])
        plain = publish_ok(a, topic, "plain")
        status, body = publish_key(a, topic, "keyed", "up-1")
        check(status == 503, f"a keyed publish Redis had no function for was answered {status} {body}")
        check(poll_until(has_keyed, scaled(10)), "the node did not load its functions again")
        eid = publish_key_ok(a, topic, "keyed", "up-1")
        check(publish_key_ok(a, topic, "keyed", "up-1") == eid, "the retry after the reload published again")
        got = await until_sentinel(w, a, topic, "after-upgrade")
        check([(e["id"], e["data"]) for e in got] == [(plain, "plain"), (eid, "keyed")], f"events: {got}")
    finally:
        await w.close()


def redis_queued_from(rs: RedisServer, pid: int) -> int:
    """Bytes Redis has not read yet (it is stopped) on its connections from process `pid`."""
    ours = subprocess.run(["ss", "-Htnp", "state", "established", f"dport = :{rs.port}"],
                          capture_output=True, text=True).stdout
    ports = {line.split()[2].rsplit(":", 1)[1] for line in ours.splitlines() if f"pid={pid}," in line}
    theirs = subprocess.run(["ss", "-Htn", "state", "established", f"sport = :{rs.port}"],
                            capture_output=True, text=True).stdout
    return sum(int(line.split()[0]) for line in theirs.splitlines() if line.split()[3].rsplit(":", 1)[1] in ports)


async def died_after_sending(args, nodes: list, rs: RedisServer, extra) -> None:
    """The case a key is for: a node sends a publish to Redis and dies before Redis answers (Redis
    stopped meanwhile, so the publish waits in its socket). Redis runs it once it goes on; the
    publisher, whose connection broke, retries through the other node with the key: the id of
    the event that was published, and nothing more."""
    topic, data = "idem:died", "x" * 4000  # long enough to tell it in Redis's socket queue
    a, b = nodes
    w = await connect(b)
    try:
        await subscribe(w, [topic])
        answers = []
        os.kill(rs.proc.pid, signal.SIGSTOP)
        try:
            def send() -> None:
                try:
                    answers.append(publish_key(a, topic, data, "died-1"))
                except (OSError, http.client.HTTPException) as exc:  # the node died under it
                    answers.append((0, {"broken": str(exc)}))
            t = threading.Thread(target=send)
            t.start()
            check(poll_until(lambda: redis_queued_from(rs, a.proc.pid) >= len(data), scaled(10)),
                  "the node did not send the publish to Redis")
            a.kill()
        finally:
            os.kill(rs.proc.pid, signal.SIGCONT)
        t.join(scaled(15))
        check(not answers or answers[0][0] != 200, f"the publisher was answered {answers} by a node that died")
        e = await recv_json(w)
        check(e.get("data") == data, f"what the dead node's publish became: {e}")
        retry = publish_key_ok(b, topic, data, "died-1")
        check(retry == e["id"], f"the retry through the other node answered {retry}, the event was {e['id']}")
        check(await until_sentinel(w, b, topic, "after-died") == [], "the retry published again")
    finally:
        await w.close()
        if not nodes[0].alive():
            nodes[0] = node(args, rs.url, "the node did not come up again", extra)


async def answered_504(a: ServerProcess, rs: RedisServer) -> None:
    """Redis stalls (SIGSTOP) with a keyed publish sent: the node answers 504 after its 5 s wait
    (it may have been published). Redis goes on and runs it; the retry with the key answers the
    id of the event that came, and publishes nothing."""
    topic = "idem:stall"
    w = await connect(a)
    try:
        await subscribe(w, [topic])
        os.kill(rs.proc.pid, signal.SIGSTOP)
        try:
            status, body = publish_key(a, topic, "stalled", "stall-1")
        finally:
            os.kill(rs.proc.pid, signal.SIGCONT)
        check(status == 504 and body.get("error") == "timeout", f"a publish Redis left unanswered: {status} {body}")
        e = await recv_json(w)
        check(e.get("data") == "stalled", f"what the unanswered publish became: {e}")
        check(publish_key_ok(a, topic, "stalled", "stall-1") == e["id"], "the retry of the 504 did not answer its id")
        check(await until_sentinel(w, a, topic, "after-stall") == [], "the retry of the 504 published again")
    finally:
        await w.close()


class Publisher(threading.Thread):
    """Publishes 0..n-1 to `topic`, each with key "r-<i>", through the node `target()` names,
    retrying each 503, 504 and broken connection (with its key) until it is answered 200."""

    def __init__(self, target, topic: str, n: int):
        super().__init__(daemon=True)
        self.target, self.topic, self.n = target, topic, n
        self.ids: "list[str]" = []
        self.retries = 0
        self.error = ""
        self.progress = threading.Condition()

    def run(self) -> None:
        try:
            for i in range(self.n):
                while True:
                    try:
                        status, body = publish_key(self.target(), self.topic, i, f"r-{i}")
                    except (OSError, ValueError, AssertionError):
                        status, body = 0, {}  # the node died under it, or is not up yet
                    if status == 200:
                        break
                    check(status in (0, 503, 504), f"publish {i} answered {status} {body}")
                    self.retries += 1
                    time.sleep(0.05)  # the publisher's own backoff between retries
                with self.progress:
                    self.ids.append(body["id"])
                    self.progress.notify_all()
        except Exception as e:  # noqa: BLE001 — reported by the test
            self.error = f"{e}"
            with self.progress:
                self.progress.notify_all()

    def wait_for(self, count: int, seconds: float) -> None:
        with self.progress:
            check(self.progress.wait_for(lambda: len(self.ids) >= count or self.error, scaled(seconds)),
                  f"the publisher is stuck at {len(self.ids)} of {count}")
        check(not self.error, f"the publisher failed: {self.error}")


async def node_restart(args, nodes: list, rs: RedisServer, r: redis.Redis, extra) -> None:
    topic, n = "idem:restart", 300
    a, b = nodes
    w = await connect(b)
    try:
        await subscribe(w, [topic])
        before = publish_key_ok(a, topic, "before", "before-kill")
        got = [await recv_json(w)]
        pub = Publisher(lambda: nodes[0], topic, n)
        pub.start()
        pub.wait_for(60, 30)
        a.kill()  # SIGKILL, with publishes in flight
        nodes[0] = node(args, rs.url, "the restarted node did not come up", extra)
        again = publish_key_ok(nodes[0], topic, "before", "before-kill")
        check(again == before, f"a retry through the restarted node: {again}, first {before}")
        pub.wait_for(n, 120)
        pub.join(scaled(10))
        while len(got) < n + 1:
            got.append(await recv_json(w))
        check(await until_sentinel(w, b, topic, "after-restart") == [], "events after the last publish")
        check([e["data"] for e in got] == ["before"] + list(range(n)),
              f"the subscriber on the node that stayed: {[e['data'] for e in got][:20]}...")
        check([e["id"] for e in got[1:]] == pub.ids, "the ids the subscriber got are not the ones the publisher was answered")
        entries = r.xrange(f"wspush:stream:{topic}")
        data = [json.loads(fields[b"d"]) for _, fields in entries]
        check(data == ["before"] + list(range(n)) + ["after-restart"], f"the stream holds {data[:20]}...")
        print(f"  {pub.retries} retries, none published twice", flush=True)
    finally:
        await w.close()


def generation_keys(r: redis.Redis, topic: str) -> "list[bytes]":
    """The topic's hashes of remembered keys, one per generation of the window."""
    return sorted(k for k in r.scan_iter(f"wspush:idem:*:{topic}") if k.split(b":", 3)[2].isdigit())


def what_redis_keeps(r: redis.Redis) -> None:
    topic = "idem:two"
    window_ms = WINDOW * 1000
    gens = generation_keys(r, topic)
    check(1 <= len(gens) <= 2 and all(r.type(k) == b"hash" for k in gens), f"the topic's keys in Redis: {gens}")
    now_ms = int(r.time()[0]) * 1000
    for k in gens:
        g = int(k.split(b":")[2])
        check(r.pexpiretime(k) == (g + 2) * window_ms, f"{k} expires at {r.pexpiretime(k)}, want the end of the next generation")
        check(g * window_ms <= now_ms + 1000 and now_ms < (g + 2) * window_ms, f"{k} is not of this generation or the one before")
    check(r.hget("wspush:config", "idem_ms") == str(window_ms).encode(), "wspush:config idem_ms is not the window")
    # At most 10,000 keys a generation: past them a publish is not remembered.
    for attempt in range(3):  # a run that straddles two generations is done again on a new topic
        cap = f"idem:cap{attempt}"
        p = r.pipeline(transaction=False)
        for i in range(1, 10006):
            p.fcall("wspush_publish", 0, cap, "1", f"cap-{i}")
        p.execute()
        gens = generation_keys(r, cap)
        if len(gens) == 1:
            break
    check(len(gens) == 1 and r.hlen(gens[0]) == 10000, f"{[(k, r.hlen(k)) for k in gens]} keys remembered on a topic")
    check(r.hexists(gens[0], "cap-1") and not r.hexists(gens[0], "cap-10001"), "past the cap a key was remembered")
    maxlen = int(r.hget("wspush:config", "maxlen"))
    check(r.xlen(f"wspush:stream:{cap}") == min(10005, maxlen), "the publishes past the cap were not published")


def main(args) -> None:
    rs = RedisServer().start()
    try:
        extra = ["--idempotency-window", str(WINDOW)]
        nodes = [node(args, rs.url, extra=extra) for _ in range(2)]
        r = redis.Redis(port=rs.port)
        f = Findings()
        f.step("the same key on two nodes: one event, one id", lambda: asyncio.run(two_nodes(nodes[0], nodes[1], r)))
        f.step("the old shapes of the functions still publish", lambda: asyncio.run(old_shapes(nodes[0], r)))
        f.step("a client's pub with a key, sent twice", lambda: asyncio.run(client_pub(nodes[0], nodes[1])))
        f.step("what Redis keeps, and its bounds", lambda: what_redis_keeps(r))
        f.step("a library of the previous version: keyed publishes refused, then the node's again",
               lambda: asyncio.run(older_library(nodes[0], r)))
        f.step("504 from a stalled Redis: the retry answers the id of what Redis ran",
               lambda: asyncio.run(answered_504(nodes[0], rs)))
        f.step("a node dies with a publish sent: Redis runs it, the retry answers its id",
               lambda: asyncio.run(died_after_sending(args, nodes, rs, extra)))
        f.step("a publisher retrying through a node restart: each event once",
               lambda: asyncio.run(node_restart(args, nodes, rs, r, extra)))
        for s in nodes:
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        check(not rs.crashed(), "redis-server crashed")
        f.done()
    finally:
        rs.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
