#!/usr/bin/python3
"""Idempotency keys under Redis Cluster, through a master failover: a real cluster of three masters
with a replica each (RedisCluster, on loopback), two wspush nodes, Python `websockets` clients.

- the same key through both nodes, for topics of every master: one event, one id (the nodes'
  keyed batch over a master's slots, wspush_publish_many_keyed); a backend's FCALL wspush_publish
  with the topic's stream key and the key as its third argument answers the same id;
- a publisher that retries every 503, 504 and broken connection with its key while the master
  of two of its topics is killed (SIGKILL) and its replica takes over: the subscriber on the other
  node gets each event exactly once and in order, or is told the topic `lost` (Redis replicates
  asynchronously: what the dead master had not passed on is gone, its keys with it); a topic of
  another master, each event exactly once.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, node, slot_of  # noqa: E402
from wsp_redis import RedisCluster  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, poll_until, recv_json,  # noqa: E402
                         run_main, scaled, subscribe)
from test_redis_cluster import keys  # noqa: E402  (a topic's stream key, from docs/REDIS.md's rule)


def publish_key(s: ServerProcess, topic: str, data, key: str) -> "tuple[int, dict]":
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port(s)}/publish",
                                 data=json.dumps({"topic": topic, "data": data, "idempotency_key": key}).encode())
    try:
        with urllib.request.urlopen(req, timeout=scaled(10)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def publish_key_ok(s: ServerProcess, topic: str, data, key: str) -> str:
    status, body = publish_key(s, topic, data, key)
    check(status == 200 and body.get("id"), f"a publish with key {key} to {topic} answered {status} {body}")
    return body["id"]


def topics_of(c: RedisCluster, prefix: str, master_port: int, n: int) -> "list[str]":
    return [t for t in (f"{prefix}:{k}" for k in range(5000)) if c.node_of(slot_of(t)).port == master_port][:n]


async def every_master(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    topics = [topics_of(c, "idem", m.port, 1)[0] for m in c.masters()]
    w = await connect(a)
    try:
        await subscribe(w, topics)
        first = {t: publish_key_ok(a, t, t, "k-" + t) for t in topics}
        again = {t: publish_key_ok(b, t, t, "k-" + t) for t in topics}
        check(again == first, f"the same keys through the other node: {again}, first {first}")
        for t in topics:
            owner = c.node_of(slot_of(t))
            backend = owner.command("FCALL", "wspush_publish", "1", keys(t)[0], t, json.dumps(t), "k-" + t)
            check(backend == first[t], f"a backend's FCALL with the key on {t}: {backend}, first {first[t]}")
        sentinel = {t: publish_key_ok(b, t, "end", "end-" + t) for t in topics}
        got = []
        while len(got) < 2 * len(topics):
            got.append(await recv_json(w))
        want = sorted([(first[t], t) for t in topics] + [(sentinel[t], "end") for t in topics])
        check(sorted((e["id"], e["data"]) for e in got) == want, f"events: {got}")
    finally:
        await w.close()


class Publisher(threading.Thread):
    """Publishes 1, 2, ... to each topic in turn through `s`, each with its key "<topic>-<n>",
    retrying 503, 504 and broken connections with the same key until it is answered 200."""

    def __init__(self, s: ServerProcess, topics: "list[str]"):
        super().__init__(daemon=True)
        self.s, self.topics = s, topics
        self.n = {t: 0 for t in topics}
        self.retries = {t: 0 for t in topics}
        self.stop_flag = threading.Event()
        self.errors = []

    def run(self) -> None:
        while not self.stop_flag.is_set():
            for t in self.topics:
                n = self.n[t] + 1
                while not self.stop_flag.is_set():
                    try:
                        status, body = publish_key(self.s, t, n, f"{t}-{n}")
                    except (OSError, ValueError):
                        status, body = 0, {}
                    if status == 200:
                        self.n[t] = n
                        break
                    if status not in (0, 503, 504):
                        self.errors.append((t, n, status, body))
                        return
                    self.retries[t] += 1
                    time.sleep(0.01)  # a backend's retry waits a little


async def failover(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    victim = c.masters()[-1]
    other = c.masters()[0]
    on_victim = topics_of(c, "fo", victim.port, 2)
    elsewhere = topics_of(c, "fo", other.port, 1)
    topics = on_victim + elsewhere
    w = await connect(a)
    await subscribe(w, topics)
    pub = Publisher(b, topics)
    pub.start()
    seen = {t: [] for t in topics}
    told = {t: 0 for t in topics}

    async def read_until(until: "dict[str, int]", seconds: float) -> None:
        deadline = time.monotonic() + scaled(seconds)
        while any(not seen[t] or seen[t][-1] < until[t] for t in topics):
            check(time.monotonic() < deadline, f"stuck at { {t: seen[t][-1:] for t in topics} } of {until}")
            e = await recv_json(w, seconds)
            if e.get("op") == "lost":
                for t in e["topics"]:
                    told[t] += 1
                continue
            seen[e["topic"]].append(e["data"])

    try:
        await read_until({t: 10 for t in topics}, 30)
        victim.kill()
        check(poll_until(lambda: all(c.node_of(slot_of(t)).port != victim.port for t in on_victim), scaled(60)),
              "no replica took over")
        c.wait_ok(scaled(60))
        await read_until({t: pub.n[t] + 20 for t in topics}, 60)
    finally:
        pub.stop_flag.set()
        pub.join()
    try:
        # What the publisher had answered 200 and nothing after: a sentinel each, read up to.
        ends = {t: publish_key_ok(b, t, "end", "end-" + t) for t in topics}
        done = set()
        while len(done) < len(topics):
            e = await recv_json(w, 20)
            if e.get("op") == "lost":
                for t in e["topics"]:
                    told[t] += 1
                continue
            if e.get("data") == "end":
                check(e["id"] == ends[e["topic"]], f"the end of {e['topic']}: {e}")
                done.add(e["topic"])
            else:
                seen[e["topic"]].append(e["data"])
    finally:
        await w.close()
    check(not pub.errors, f"publisher: {pub.errors[:2]}")
    for t in topics:
        got, n = seen[t], pub.n[t]
        if told[t] == 0:
            check(got == list(range(1, n + 1)), f"{t} (never told lost): {len(got)} events of {n}, first wrong at "
                  f"{next((i for i, x in enumerate(got) if x != i + 1), None)}")
        else:
            # Told lost: what the dead master had not passed on may be missing, and a retry of a
            # publish whose key went with it may come again, once; the rest, and everything
            # after the takeover, exactly once.
            check(all(got.count(x) <= 2 for x in set(got)), f"{t}: an event more than twice: {got}")
            check(set(range(got[-1] - 9, n + 1)) <= set(got) and got[-1] == n, f"{t}: the tail is incomplete: {got[-30:]}")
    check(told[elsewhere[0]] == 0, f"{elsewhere[0]}, on a master that stayed, was told lost")
    print(f"    retries {pub.retries}; lost notices {told}; events {[len(seen[t]) for t in topics]} "
          f"of {[pub.n[t] for t in topics]}", flush=True)


def main(args) -> None:
    c = RedisCluster().start()
    try:
        a = node(args, c.url, "a node did not come up on the cluster")
        b = node(args, c.url, "a node did not come up on the cluster")
        f = Findings()
        f.step("the same key through both nodes, on every master: one event, one id",
               lambda: asyncio.run(every_master(c, a, b)))
        f.step("a master killed while a publisher retries with its keys: each event once, or lost",
               lambda: asyncio.run(failover(c, a, b)))
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        f.done()
    finally:
        c.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
