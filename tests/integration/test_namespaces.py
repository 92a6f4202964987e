#!/usr/bin/python3
"""Namespaces (`[namespace."<prefix>"]` tables of the --config file) on the real binary, on the
embedded bus and on the Redis bus (a real redis-server):

- history size: a resume with `since` before six events replays as many as the topic's
  namespace keeps (mailbox: 2, mailbox:vip: 3: the longest prefix wins, others: the global 5),
  and says lost; on Redis a backend's own FCALL wspush_publish trims to the namespace's too;
- history age: an event of a namespace with a 1 s TTL is replayed before its TTL and not after
  it (the resume says lost), while an event of the global 300 s published with it still is;
- client publish: `client-publish = false` refuses a client's `pub` to mailbox: with
  {"op":"error","code":"forbidden",...} while room: and mailbox:vip: (its own namespace) take
  it; with tokens too, whatever the token's `pub` grants;
- compression: a client that negotiated permessage-deflate gets a big event of quiet:
  (`compression = false`) uncompressed (no RSV1), and one of room: compressed;
- the same on a Redis Cluster of three masters, where a stream also expires 2 x its namespace's
  TTL after its last publish.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import slot_of, tag_of  # noqa: E402
from wsp_redis import RedisCluster, RedisServer  # noqa: E402
from wsp_testlib import (ServerProcess, admin_port, arg_parser, check, mint_jwt, poll_until, publish_ok,  # noqa: E402
                         run_main, run_step, scaled, scrape_metrics)
from wsp_wire import OP_TEXT, RawWebSocket  # noqa: E402

SECRET = "namespaces-test-secret"

CONFIG = """# written by test_namespaces.py
history-size = 5
history-ttl = 300

[namespace."mailbox:"]
history-size = 2
client-publish = false

[namespace."mailbox:vip:"]
history-size = 3

[namespace."flash:"]
history-ttl = 1

[namespace."quiet:"]
compression = false
"""

SIZES = {"mailbox:1": 2, "mailbox:vip:1": 3, "room:1": 5}


class Streams:
    """Where a topic's stream is in Redis: the one Redis, or under Redis Cluster the master of its
    slot, its key carrying the slot's tag (docs/REDIS.md)."""

    def __init__(self, redis: "RedisServer | None" = None, cluster: "RedisCluster | None" = None):
        self.redis, self.cluster = redis, cluster

    @property
    def url(self) -> str:
        return self.cluster.url if self.cluster else self.redis.url

    def key(self, topic: str) -> str:
        return (f"wspush:{{{tag_of(slot_of(topic))}}}:" if self.cluster else "wspush:") + "stream:" + topic

    def command(self, topic: str, *args: str):
        node = self.cluster.node_of(slot_of(topic)) if self.cluster else self.redis
        return node.command(*args)

    def backend_publish(self, topic: str, data: str) -> None:
        """A backend's publish, without wspush."""
        declared = ["1", self.key(topic)] if self.cluster else ["0"]
        reply = self.command(topic, "FCALL", "wspush_publish", *declared, topic, data)
        check(isinstance(reply, str) and ":" in reply, f"FCALL wspush_publish {topic} answered {reply!r}")


def raw(port: int, deflate: bool = False, token: "str | None" = None) -> RawWebSocket:
    extra = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if deflate else ""
    return RawWebSocket(port, timeout=scaled(10)).open(path="/ws" + (f"?token={token}" if token else ""),
                                                       extra_headers=extra)


def message(ws: RawWebSocket) -> dict:
    event = ws.next_event()
    check(event.opcode == OP_TEXT, f"expected a text message, got {event.describe()}")
    return json.loads(event.payload)


def sub(ws: RawWebSocket, topics, since=None) -> dict:
    msg = {"op": "sub", "topics": topics}
    if since:
        msg["since"] = since
    ws.send_frame(OP_TEXT, json.dumps(msg).encode())
    reply = message(ws)
    check(reply.get("op") == "subbed", f"sub {topics} answered {reply}")
    return reply


def events_until(ws: RawWebSocket, marker: str) -> "list[dict]":
    """The events before the one whose id is `marker` (a live event of a topic of the same sub,
    published after `subbed`: the connection hears it once the replay is all out)."""
    out = []
    while True:
        m = message(ws)
        check("id" in m, f"expected an event, got {m}")
        if m["id"] == marker:
            return out
        out.append(m)


def resume(s: ServerProcess, topic: str, since: str) -> "tuple[list[str], bool]":
    """What a `sub` with `since` replays of `topic` (the ids), and whether it says lost."""
    ws = raw(s.port)
    try:
        reply = sub(ws, [topic, "marker:1"], since={topic: since})
        marker = publish_ok(s, "marker:1", {"marker": True})
        events = events_until(ws, marker)
        check(all(e.get("topic") == topic for e in events), f"a resume of {topic} replayed {events}")
        return [e["id"] for e in events], topic in reply.get("lost", [])
    finally:
        ws.close_socket()


def sizes(s: ServerProcess, redis: "Streams | None") -> None:
    for topic, keep in SIZES.items():
        ids = [publish_ok(s, topic, {"n": k}) for k in range(7)]  # a resume from the first: 6 after it
        replayed, lost = resume(s, topic, ids[0])
        check(replayed == ids[-keep:], f"{topic}: a resume from the first of 6 replayed {replayed}, expected the "
                                       f"last {keep}: {ids[-keep:]}")
        check(lost, f"{topic}: keeping {keep} of 6, the resume did not say lost")
    if redis:
        # A backend's publish without wspush trims to the namespace's size as well.
        for topic, keep in SIZES.items():
            for k in range(6):
                redis.backend_publish(topic + ":b", str(k))
            n = int(redis.command(topic + ":b", "XLEN", redis.key(topic + ":b")))
            check(n == keep, f"{topic}:b after 6 FCALL wspush_publish holds {n} entries, expected {keep}")


def ages(s: ServerProcess, redis: "Streams | None") -> None:
    first = publish_ok(s, "flash:1", {"n": 1})
    second = publish_ok(s, "flash:1", {"n": 2})
    r_first = publish_ok(s, "room:2", {"n": 1})
    r_second = publish_ok(s, "room:2", {"n": 2})
    replayed, lost = resume(s, "flash:1", first)
    check(replayed == [second] and not lost, f"flash:1 within its 1 s TTL replayed {replayed} (lost {lost})")
    if redis and redis.cluster:
        # Under Redis Cluster a stream expires 2 x its namespace's TTL after its last publish.
        flash, room = (int(redis.command(t, "PTTL", redis.key(t))) for t in ("flash:1", "room:2"))
        check(0 < flash <= 2000, f"flash:1's stream expires in {flash} ms, expected at most 2 x its 1 s TTL")
        check(2000 < room <= 600000, f"room:2's stream expires in {room} ms, expected 2 x the global 300 s")
    if redis is None:
        # The embedded history sweeps once a second: its TTL evictions say when the age passed.
        admin = admin_port(s)
        check(poll_until(lambda: scrape_metrics(admin).get('wspush_history_evictions_total{cause="ttl"}', 0) >= 2,
                         scaled(10)), "the flash: events were not expired by their 1 s TTL")
        replayed, lost = resume(s, "flash:1", first)
    else:
        # On Redis an entry past its age is not replayed (no eviction to watch): resume until.
        outcome = []
        passed = poll_until(lambda: outcome.append(resume(s, "flash:1", first)) or outcome[-1] == ([], True),
                            scaled(10), interval=0.2)
        check(passed, f"flash:1 after its 1 s TTL still replayed: {outcome[-1] if outcome else None}")
        replayed, lost = outcome[-1]
    check(replayed == [] and lost, f"flash:1 after its TTL replayed {replayed} (lost {lost})")
    replayed, lost = resume(s, "room:2", r_first)
    check(replayed == [r_second] and not lost, f"room:2 (300 s) replayed {replayed} (lost {lost}) after flash: expired")


def pubs(s: ServerProcess, token: "str | None" = None) -> None:
    watcher = raw(s.port, token=token)
    publisher = raw(s.port, token=token)
    try:
        sub(watcher, ["room:3", "mailbox:3", "mailbox:vip:3"])
        publisher.send_frame(OP_TEXT, json.dumps({"op": "pub", "topic": "mailbox:3", "data": {"n": 1}}).encode())
        reply = message(publisher)
        check(reply == {"op": "error", "code": "forbidden", "topic": "mailbox:3", "of": "pub"},
              f"a pub to mailbox: (client-publish = false) answered {reply}")
        for topic in ("room:3", "mailbox:vip:3"):
            publisher.send_frame(OP_TEXT, json.dumps({"op": "pub", "topic": topic, "data": {"from": "client"}}).encode())
            event = message(watcher)
            check(event.get("topic") == topic and event.get("data") == {"from": "client"},
                  f"a pub to {topic} was not delivered: the watcher got {event}")
    finally:
        watcher.close_socket()
        publisher.close_socket()


def compression(s: ServerProcess) -> None:
    ws = raw(s.port, deflate=True)
    try:
        sub(ws, ["quiet:1", "room:4"])
        big = {"text": "a big event, the same words again and again " * 30}
        for topic, compressed in (("quiet:1", False), ("room:4", True), ("quiet:1", False)):
            eid = publish_ok(s, topic, big)
            event = ws.next_event()
            check(json.loads(event.payload).get("id") == eid, f"expected the event {eid}, got {event.describe()}")
            check(ws.last_compressed == compressed,
                  f"a big event of {topic} came {'compressed' if ws.last_compressed else 'plain'}")
    finally:
        ws.close_socket()


def node(args, config: str, redis: "Streams | None", extra=(), jwt: bool = False) -> ServerProcess:
    bus = ["--bus", redis.url] if redis else []
    auth = ["--jwt-secret", SECRET] if jwt else ["--allow-client-publish"]
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret="" if jwt else None,
                      extra=["--config", config, *bus, *auth, *extra]).start()
    if redis:
        check(poll_until(lambda: scrape_metrics(admin_port(s)).get("wspush_bus_up") == 1, scaled(30)),
              "the node's bus did not come up")
    return s


def on_bus(args, config: str, redis: "Streams | None") -> None:
    where = "Redis Cluster" if redis and redis.cluster else "the Redis bus" if redis else "the embedded bus"
    with node(args, config, redis) as s:
        run_step(f"{where}: each namespace keeps its history size, the longest prefix wins", sizes, s, redis)
        run_step(f"{where}: a 1 s namespace's events are not replayed past their age", ages, s, redis)
        run_step(f"{where}: client-publish = false refuses pubs, other namespaces take them", pubs, s)
        run_step(f"{where}: compression = false sends a big event plain to a deflate client", compression, s)
        check(s.alive(), "the server exited during the test\n" + s.log_tail())
    with node(args, config, redis, jwt=True) as s:
        token = mint_jwt({"sub": "u", "exp": int(time.time()) + 3600, "topics": ["*"], "pub": ["*"]}, SECRET)
        run_step(f"{where}: with tokens, client-publish = false refuses whatever the token grants", pubs, s, token)


def run(args) -> None:
    with tempfile.TemporaryDirectory(prefix="wspush-ns-") as tmp:
        config = os.path.join(tmp, "wspush.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        on_bus(args, config, None)
        redis = RedisServer(persistent=False).start()
        try:
            on_bus(args, config, Streams(redis=redis))
        finally:
            redis.close()
        cluster = RedisCluster(masters=3, replicas=0, persistent=False).start()
        try:
            on_bus(args, config, Streams(cluster=cluster))
        finally:
            cluster.close()


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
