#!/usr/bin/python3
"""The Redis bus over isolated shards: three real redis-server processes named in one --bus list,
two wspush nodes on loopback, Python `websockets` clients, raw RESP for what a backend does
straight into a shard.

- where a topic lives follows the documented rule (CRC16 slot of the topic, jump consistent hash
  over the shards), computed here by an independent transcription: each topic's stream and
  channel are on its shard and on no other, and a backend that publishes into the shard the rule
  names reaches the subscribers;
- one `sub` spanning all three shards on node A gets what node B publishes on each, each once;
  a client's pub on B reaches A;
- a resume with `since` on every shard, on the other node, replays each shard's events (each
  shard has its own epoch) and joins live with no gap and no duplicate;
- one shard killed: publishes of its topics are refused (503), the other shards' topics are
  delivered to the same connection, /readyz stays 200 while wspush_bus_up is 0 and
  wspush_bus_redis_up names the one that is down; a `sub` of a topic on it waits (held) and is
  answered once it is back, one of the others' topics is answered at once; after the restart
  the subscribers that stayed get the next events;
- every shard down: /readyz 503.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, node, readyz, resume_on_other_node, shard_of  # noqa: E402
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, metric, poll_until,  # noqa: E402
                         publish, publish_ok, recv_json, run_main, scaled, scrape_metrics, subscribe)

SHARDS = 3


# ---- helpers (the rule itself: wsp_bus.py, transcribed from docs/REDIS.md) ------------------------

def topics_on(shard: int, count: int, prefix: str) -> "list[str]":
    out, k = [], 0
    while len(out) < count:
        t = f"{prefix}:{k}"
        if shard_of(t, SHARDS) == shard:
            out.append(t)
        k += 1
    return out


def redis_up(s: ServerProcess) -> "dict[int, float]":
    """wspush_bus_redis_up by port."""
    out = {}
    for key, v in scrape_metrics(admin_port(s)).items():
        if key.startswith("wspush_bus_redis_up{"):
            port = int(key.split('redis="127.0.0.1:')[1].split("/")[0])
            out[port] = v
    return out


def epoch(event_id: str) -> str:
    return event_id.split(":")[0]


# ---- the steps ------------------------------------------------------------------------------------

async def placement(rss: "list[RedisServer]", a: ServerProcess, b: ServerProcess) -> None:
    topics = [topics_on(k, 1, "mailbox")[0] for k in range(SHARDS)]
    wa = await connect(a)
    try:
        r = await subscribe(wa, topics)
        check(r.get("lost") == [], f"a sub over three shards: {r}")
        ids = {}
        for t in topics:
            ids[t] = publish_ok(b, t, {"to": t})
            e = await recv_json(wa)
            check(e == {"topic": t, "id": ids[t], "data": {"to": t}}, f"A got {e} for {t}")
        # Each shard has its own epoch (set up together, they still differ), and its ids carry it.
        epochs = [rs.command("GET", "wspush:epoch") for rs in rss]
        check(len(set(epochs)) == SHARDS, f"the shards' epochs: {epochs}")
        for t in topics:
            check(epoch(ids[t]) == epochs[shard_of(t, SHARDS)], f"the id of {t} is not of its shard's epoch: {ids[t]}")
        for k, rs in enumerate(rss):
            for t in topics:
                want = 1 if shard_of(t, SHARDS) == k else 0
                got = rs.command("EXISTS", f"wspush:stream:{t}")
                check(got == want, f"the stream of {t} (shard {shard_of(t, SHARDS)}) on shard {k}: EXISTS {got}")
            channels = set(rs.command("PUBSUB", "CHANNELS", "wspush:topic:*"))
            want = {f"wspush:topic:{t}" for t in topics if shard_of(t, SHARDS) == k}
            check(channels == want, f"shard {k} has channels {sorted(channels)}, expected {sorted(want)}")
        # A backend publishing into the shard the rule names reaches the subscriber.
        for t in topics:
            eid = rss[shard_of(t, SHARDS)].command("FCALL", "wspush_publish", "0", t, '"backend"')
            e = await recv_json(wa)
            check(e == {"topic": t, "id": eid, "data": "backend"}, f"a backend's publish of {t}: {e}")
        # A client's pub on node B reaches node A, whatever its shard.
        wb = await connect(b)
        try:
            for t in topics:
                await wb.send(f'{{"op":"pub","topic":"{t}","data":"from b"}}')
                e = await recv_json(wa)
                check(e.get("topic") == t and e.get("data") == "from b", f"a client's pub of {t}: {e}")
        finally:
            await wb.close()
        # Each event came once: a fence on each topic is the next thing heard.
        for t in topics:
            fence = publish_ok(a, t, "fence")
            e = await recv_json(wa)
            check(e.get("id") == fence, f"expected only the fence of {t}, got {e}")
    finally:
        await wa.close()


async def resume_across_shards(a: ServerProcess, b: ServerProcess) -> None:
    await resume_on_other_node(a, b, [topics_on(k, 1, "resume")[0] for k in range(SHARDS)], "three shards")


async def one_shard_down(rss: "list[RedisServer]", a: ServerProcess, b: ServerProcess) -> None:
    down = 1
    topics = [topics_on(k, 1, "outage")[0] for k in range(SHARDS)]
    gone = topics[down]
    others = [t for t in topics if t != gone]
    wa = await connect(a)
    try:
        await subscribe(wa, topics)
        # An event of each before the outage: where the catch-up after it starts.
        for t in topics:
            eid = publish_ok(b, t, "before")
            check((await recv_json(wa)).get("id") == eid, f"{t} before the outage")
        rss[down].kill()
        check(poll_until(lambda: metric(a, "wspush_bus_up") == 0 and metric(b, "wspush_bus_up") == 0, scaled(10)),
              "wspush_bus_up stayed 1 with a shard gone")
        for s in (a, b):
            up = redis_up(s)
            check(up == {rs.port: (0.0 if k == down else 1.0) for k, rs in enumerate(rss)},
                  f"wspush_bus_redis_up with shard {down} gone: {up}")
            check(readyz(s) == 200, "a node is not ready with two shards of three up")
        status, body = publish(b, gone, "refused")
        check(status == 503, f"a publish to the shard that is down answered {status} {body}")
        for t in others:  # the other shards go on, to the same connection
            eid = publish_ok(b, t, "through")
            e = await recv_json(wa)
            check(e.get("id") == eid and e.get("topic") == t, f"{t} while shard {down} is down: {e}")
        # A sub of the shard that is down waits; one of the others is answered at once.
        held = await connect(a)
        await held.send(f'{{"op":"sub","topics":["{gone}"]}}')
        check(poll_until(lambda: metric(a, "wspush_bus_held_subs") == 1, scaled(10)),
              f"a sub of the shard that is down is not held: {metric(a, 'wspush_bus_held_subs')}")
        quick = await connect(a)
        r = await subscribe(quick, others)
        check(r.get("topics") == others and r.get("lost") == [], f"a sub of the shards that are up: {r}")
        await quick.close()
        rss[down].start()
        check(poll_until(lambda: metric(a, "wspush_bus_up") == 1 and metric(b, "wspush_bus_up") == 1, scaled(20)),
              "the nodes did not reconnect to the shard")
        r = await recv_json(held, 20)
        check(r.get("op") == "subbed" and r.get("topics") == [gone], f"the sub held through the outage: {r}")
        eid = publish_ok(b, gone, "back")
        for ws in (wa, held):
            e = await recv_json(ws)
            check(e.get("id") == eid and e.get("data") == "back", f"{gone} after its shard came back: {e}")
        await held.close()
    finally:
        await wa.close()


async def every_shard_down(rss: "list[RedisServer]", a: ServerProcess) -> None:
    for rs in rss:
        rs.kill()
    try:
        check(poll_until(lambda: readyz(a) == 503, scaled(10)), "/readyz stayed 200 with every shard down")
    finally:
        for rs in rss:
            rs.start()
    check(poll_until(lambda: readyz(a) == 200 and metric(a, "wspush_bus_up") == 1, scaled(20)),
          "the node did not come back")


def main(args) -> None:
    rss = [RedisServer().start() for _ in range(SHARDS)]
    try:
        bus = ",".join(rs.url for rs in rss)
        a = node(args, bus, "a node did not connect to every shard")
        b = node(args, bus, "a node did not connect to every shard")
        f = Findings()
        f.step("each topic on the shard the rule names", lambda: asyncio.run(placement(rss, a, b)))
        f.step("a resume over three shards on the other node", lambda: asyncio.run(resume_across_shards(a, b)))
        f.step("one shard down: only its topics refused", lambda: asyncio.run(one_shard_down(rss, a, b)))
        f.step("every shard down: not ready", lambda: asyncio.run(every_shard_down(rss, a)))
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        for rs in rss:
            check(not rs.crashed(), f"a redis-server crashed (exit {rs.proc.returncode})")
        f.done()
    finally:
        for rs in rss:
            rs.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
