#!/usr/bin/python3
"""The Redis bus over a real Redis Cluster (3 masters, 3 replicas, made with `redis-cli --cluster
create` on loopback): wspush's functions driven as a backend would, with raw RESP, then two
wspush nodes on `--bus redis-cluster://<every node>` with Python `websockets` clients.

- a topic's keys named with its slot's tag (docs/REDIS.md) fall in the topic's slot, for the
  documented vectors and for topics spread over the three masters (CLUSTER KEYSLOT);
- `FCALL wspush_publish 1 wspush:{<tag>}:stream:<topic> <topic> <data>` on the master of the slot
  returns "<epoch>:<id>", the slot's own epoch, and publishes on the topic's shard channel only:
  a sharded subscriber hears it, `PUBSUB SHARDCHANNELS` lists the channel, `PUBSUB CHANNELS`
  lists nothing; the stream expires 2 * ttl_ms after its last publish (the limits the library
  was loaded with);
- on another master the call is redirected (MOVED); a key that is not the topic's stream, or a
  batch over two slots, is refused;
- `wspush_publish_batch` with a stream key per pair, `wspush_replay` with the stream key (paged),
  `wspush_epoch` with a slot's epoch key, `wspush_mark` on a node's shard channel;
- two nodes: one `sub` over topics of all three masters gets what the other node publishes (the
  admin API, a client's pub) and what a backend publishes into the cluster, each once; each
  node's subscriptions are shard channels on the topic's master (`PUBSUB SHARDCHANNELS`), none
  a plain channel but revokes' `wspush:control` on the master of `wspush:revocations`' slot; a resume on the other node over all three masters replays each topic and
  joins live; the nodes hear marks from every master;
- a --bus with a cluster seed that is not a cluster node keeps the node down and says why.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, node, readyz, resume_on_other_node, slot_of, tag_of  # noqa: E402
from wsp_redis import RedisCluster, RedisServer, _encode, _read_resp  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, arg_parser, check, metric, poll_until,  # noqa: E402
                         publish, publish_ok, recv_json, run_main, scaled, subscribe)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTL_MS = 60000


# ---- the rule, transcribed from docs/REDIS.md (the slot and its tag: wsp_bus.py) -----------------

def keys(topic: str) -> "tuple[str, str, str]":
    """(stream, shard channel, epoch) of a topic under Redis Cluster."""
    p = "wspush:{" + tag_of(slot_of(topic)) + "}:"
    return p + "stream:" + topic, p + "topic:" + topic, p + "epoch"


class ShardSubscriber:
    """A raw connection in sharded pub/sub mode on one node."""

    def __init__(self, node: RedisServer, *channels: str):
        self.sock = socket.create_connection(("127.0.0.1", node.port), timeout=scaled(10))
        self.f = self.sock.makefile("rb")
        self.sock.sendall(_encode("SSUBSCRIBE", *channels))
        for ch in channels:
            r = _read_resp(self.f)
            check(r[0] == "ssubscribe" and r[1] == ch, f"SSUBSCRIBE {ch} answered {r}")

    def next(self) -> list:
        return _read_resp(self.f)

    def close(self) -> None:
        self.sock.close()


def library() -> str:
    text = open(os.path.join(ROOT, "server", "bus", "wspush.lua")).read()
    line = "local cluster_config = nil -- @cluster_config@"
    check(line in text, "the library has no line for the cluster's limits")
    return text.replace(line, f"local cluster_config = {{100, {TTL_MS}, 1048576}}")


def refused(node: RedisServer, *args: str) -> str:
    try:
        r = node.command(*args)
    except RuntimeError as exc:
        return str(exc)
    raise AssertionError(f"{args[:4]} was not refused: {r}")


# ---- the steps ------------------------------------------------------------------------------------

def slots_and_tags(c: RedisCluster) -> None:
    any_node = c.nodes[0]
    for topic, slot, tag in (("mailbox:42", 5893, "b8u"), ("mailbox:7", 11632, "dkm"), ("user/7/inbox", 9314, "mq3"),
                             ("room.lobby", 12685, "bc")):
        check(slot_of(topic) == slot and tag_of(slot) == tag, f"the vector of {topic}: {slot_of(topic)}, {tag_of(slot)}")
        for key in keys(topic):
            got = any_node.command("CLUSTER", "KEYSLOT", key)
            check(got == slot, f"CLUSTER KEYSLOT {key} = {got}, the topic's slot is {slot}")
    # A topic with braces of its own: its keys still fall in its slot.
    t = "a{b}c}"
    for key in keys(t):
        check(any_node.command("CLUSTER", "KEYSLOT", key) == slot_of(t), f"the keys of {t!r}")


def spread_topics(c: RedisCluster) -> "dict[int, str]":
    """A topic on each master: its port -> the topic."""
    out, k = {}, 0
    masters = {n.port for n in c.masters()}
    while len(out) < len(masters):
        t = f"mailbox:{k}"
        out.setdefault(c.node_of(slot_of(t)).port, t)
        k += 1
    return out


def publish_and_hear(c: RedisCluster) -> None:
    for port, topic in spread_topics(c).items():
        owner = next(n for n in c.nodes if n.port == port)
        stream, channel, epoch_key = keys(topic)
        sub = ShardSubscriber(owner, channel)
        try:
            eid = owner.command("FCALL", "wspush_publish", "1", stream, topic, '{"n":1}')
            msg = sub.next()
            check(msg == ["smessage", channel, f'{eid} {{"n":1}}'], f"the shard channel of {topic} carried {msg}")
        finally:
            sub.close()
        check(eid.split(":")[0] == owner.command("GET", epoch_key).split()[0], f"{eid} is not of its slot's epoch")
        pttl = owner.command("PTTL", stream)
        check(2 * TTL_MS - 5000 < pttl <= 2 * TTL_MS, f"the stream of {topic} expires in {pttl} ms")
        for m in c.masters():
            check(m.command("PUBSUB", "CHANNELS") == [], f"a plain channel on {m.port}")
        # Replayed from the stream, paged.
        eid2 = owner.command("FCALL", "wspush_publish", "1", stream, topic, '{"n":2}')
        page = owner.command("FCALL", "wspush_replay", "1", stream, topic, eid, "event", "64", "1000000")
        check(page == [0, "", eid2, '{"n":2}'], f"the replay of {topic} after {eid}: {page}")
        # Elsewhere: redirected.
        other = next(m for m in c.masters() if m.port != port)
        why = refused(other, "FCALL", "wspush_publish", "1", stream, topic, '{"n":3}')
        check(why.startswith("MOVED "), f"a publish on the wrong master: {why}")


def shard_channels_listed(c: RedisCluster) -> None:
    topics = spread_topics(c)
    subs = []
    try:
        for port, topic in topics.items():
            owner = next(n for n in c.nodes if n.port == port)
            subs.append(ShardSubscriber(owner, keys(topic)[1]))
            listed = owner.command("PUBSUB", "SHARDCHANNELS", "wspush:*")
            check(keys(topic)[1] in listed, f"PUBSUB SHARDCHANNELS on {port}: {listed}")
            check(owner.command("PUBSUB", "CHANNELS", "wspush:*") == [], "a plain channel is listed")
    finally:
        for s in subs:
            s.close()


def refusals(c: RedisCluster) -> None:
    t = "mailbox:1"
    owner = c.node_of(slot_of(t))
    stream = keys(t)[0]
    why = refused(owner, "FCALL", "wspush_publish", "1", stream, "mailbox:other-topic", '"x"')
    check("not the topic's stream" in why, f"a key of another topic: {why}")
    why = refused(owner, "FCALL", "wspush_publish", "1", "some:key", t, '"x"')
    check("not a wspush stream" in why or why.startswith("MOVED"), f"a key that is not ours: {why}")
    # Two topics of two slots in one batch: Redis refuses it before the function runs.
    u = next(f"mailbox:{k}" for k in range(2, 200) if slot_of(f"mailbox:{k}") != slot_of(t))
    why = refused(owner, "FCALL", "wspush_publish_batch", "2", keys(t)[0], keys(u)[0], t, '"x"', u, '"y"')
    check(why.startswith("CROSSSLOT"), f"a batch over two slots: {why}")


def batch_epoch_mark(c: RedisCluster) -> None:
    t = "mailbox:5"
    slot = slot_of(t)
    owner = c.node_of(slot)
    stream, channel, epoch_key = keys(t)
    ids = owner.command("FCALL", "wspush_publish_batch", "2", stream, stream, t, '"a"', t, '"b"')
    check(isinstance(ids, list) and len(ids) == 2 and all(":" in i for i in ids), f"a batch in one slot: {ids}")
    check(owner.command("FCALL", "wspush_epoch", "1", epoch_key) == ids[0].split(":")[0], "wspush_epoch of the slot")
    # The epoch of a slot that has none yet is made, salted.
    other = "room:fresh:9"
    e = c.node_of(slot_of(other)).command("FCALL", "wspush_epoch", "1", keys(other)[2], "ab1")
    check(e.endswith("ab1") and len(e) <= 16, f"a new slot epoch: {e}")
    node_channel = "wspush:{" + tag_of(slot) + "}:node:n1"
    sub = ShardSubscriber(owner, node_channel)
    try:
        check(owner.command("FCALL", "wspush_mark", "1", node_channel) == 1, "wspush_mark")
        msg = sub.next()
        check(msg[0] == "smessage" and msg[1] == node_channel and msg[2].startswith(f"mark {ids[0].split(':')[0]} "),
              f"the mark: {msg}")
    finally:
        sub.close()


def publish_many(c: RedisCluster) -> None:
    """The nodes' batch over the slots of one master: each triple published, or refused alone
    when its slot is served elsewhere."""
    m = c.masters()[0]
    mine = [t for t in (f"many:{k}" for k in range(400)) if c.node_of(slot_of(t)).port == m.port][:5]
    other = next(t for t in (f"many:{k}" for k in range(400)) if c.node_of(slot_of(t)).port != m.port)
    check(len({slot_of(t) for t in mine}) == len(mine), "the batch's topics share a slot")
    order = mine[:2] + [other] + mine[2:]
    args = []
    for t in order:
        args += [keys(t)[0], t, f'"{t}"']
    subs = [ShardSubscriber(m, keys(t)[1]) for t in mine]
    try:
        out = m.command("FCALL", "wspush_publish_many", "1", keys(mine[0])[0], *args)
        check(isinstance(out, list) and len(out) == len(order), f"wspush_publish_many answered {out}")
        for t, r in zip(order, out):
            if t == other:
                check(isinstance(r, RuntimeError) and "not served here" in str(r), f"a topic of another master: {r}")
                check(c.node_of(slot_of(other)).command("EXISTS", keys(other)[0]) == 0, "it was published anyway")
            else:
                check(r.split(":")[0] == m.command("GET", keys(t)[2]).split()[0], f"{t}: {r}")
        for t, sub in zip(mine, subs):
            msg = sub.next()
            check(msg[1] == keys(t)[1] and msg[2].endswith(f'"{t}"'), f"{t}'s shard channel carried {msg}")
    finally:
        for sub in subs:
            sub.close()


# ---- nodes on the cluster ---------------------------------------------------------------------------

async def nodes_deliver(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    spread = spread_topics(c)
    topics = list(spread.values())
    wa = await connect(a)
    wb = await connect(b)
    try:
        r = await subscribe(wa, topics)
        check(r.get("lost") == [], f"a sub over three masters: {r}")
        for t in topics:
            eid = publish_ok(b, t, {"to": t})
            e = await recv_json(wa)
            check(e == {"topic": t, "id": eid, "data": {"to": t}}, f"A got {e} for {t}")
            owner = c.node_of(slot_of(t))
            check(eid.split(":")[0] == owner.command("GET", keys(t)[2]).split()[0], f"{eid}: not its slot's epoch")
        # A client's pub on B, and a backend's publish straight into the cluster.
        for t in topics:
            await wb.send(f'{{"op":"pub","topic":"{t}","data":"from b"}}')
            e = await recv_json(wa)
            check(e.get("topic") == t and e.get("data") == "from b", f"a client's pub of {t}: {e}")
            eid = c.node_of(slot_of(t)).command("FCALL", "wspush_publish", "1", keys(t)[0], t, '"backend"')
            e = await recv_json(wa)
            check(e == {"topic": t, "id": eid, "data": "backend"}, f"a backend's publish of {t}: {e}")
        # Where the node is subscribed: shard channels, each on its topic's master.
        for port, t in spread.items():
            owner = next(n for n in c.nodes if n.port == port)
            listed = owner.command("PUBSUB", "SHARDCHANNELS", "wspush:*:topic:*")
            check(keys(t)[1] in listed, f"{t}'s shard channel is not on its master {port}: {listed}")
            for other in c.masters():
                if other.port != port:
                    check(keys(t)[1] not in other.command("PUBSUB", "SHARDCHANNELS", "wspush:*"),
                          f"{t}'s shard channel on another master {other.port}")
        # The one plain channel: revokes', on the master of the revocation list's slot.
        control = c.node_of(slot_of("wspush:revocations")).port
        for m in c.masters():
            plain = m.command("PUBSUB", "CHANNELS")
            check(plain == (["wspush:control"] if m.port == control else []),
                  f"plain channels on master {m.port}: {plain} (wspush:control only, on {control})")
        # Each event came once: a fence on each topic is the next thing heard.
        for t in topics:
            fence = publish_ok(a, t, "fence")
            e = await recv_json(wa)
            check(e.get("id") == fence, f"expected only the fence of {t}, got {e}")
    finally:
        await wa.close()
        await wb.close()


async def resume_across_masters(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    topics = [f"resume:{k}" for k in range(6)]
    check(len({c.node_of(slot_of(t)).port for t in topics}) > 1, "the resumed topics are all on one master")
    await resume_on_other_node(a, b, topics, "the masters")


class Publisher(threading.Thread):
    """Publishes 1, 2, 3, ... to each of its topics in turn through a node's admin API until
    stopped. A publish refused with 503 did not run: it is sent again (what a backend does). A
    504 (sent, no answer) may have run: with `maybe_ok` it is noted and the next number goes
    (the test then allows a gap there, told or not), else it is an error."""

    def __init__(self, node_: ServerProcess, topics: "list[str]", maybe_ok: bool = False):
        super().__init__(daemon=True)
        self.node, self.topics, self.maybe_ok = node_, topics, maybe_ok
        self.n = {t: 0 for t in topics}
        self.ids = {t: {} for t in topics}
        self.maybe = {t: set() for t in topics}
        self.stop_flag = threading.Event()
        self.refused = 0
        self.errors = []

    def run(self) -> None:
        while not self.stop_flag.is_set():
            for t in self.topics:
                status, body = publish(self.node, t, self.n[t] + 1)
                if status == 503:
                    self.refused += 1
                    time.sleep(0.01)  # a backend's retry waits a little
                    continue  # sent again in the next turn
                if status == 504 and self.maybe_ok:
                    self.n[t] += 1
                    self.maybe[t].add(self.n[t])
                    continue
                if status != 200:
                    self.errors.append((t, status, body))
                    return
                self.n[t] += 1
                self.ids[t][self.n[t]] = body["id"]


async def follow(ws, topics: "list[str]", last: "dict[str, int]", until: "dict[str, int]", seconds: float) -> None:
    """Reads events until every topic reached `until`; each must be the next of its topic
    (`last`: the last of each so far, updated)."""
    deadline = time.monotonic() + scaled(seconds)
    while any(last[t] < until[t] for t in topics):
        check(time.monotonic() < deadline, f"stuck at {last} of {until}")
        try:
            e = await recv_json(ws, seconds)
        except asyncio.TimeoutError:
            raise AssertionError(f"nothing more after {last} (of {until}); the node: " + DIAG()) from None
        if e.get("op") == "lost":
            raise AssertionError(f"told {e.get('topics')} lost, after {last}")
        t = e.get("topic")
        check(t in last and e.get("data") == last[t] + 1, f"{t}: got {e.get('data')} after {last.get(t)} (a gap or a duplicate)")
        last[t] = e["data"]


def DIAG() -> str:
    return ""


async def reshard_under_load(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    """Slots move between masters (redis-cli --cluster reshard) while a publisher runs: the
    subscriber on the other node gets every event once, in order."""
    src = c.masters()[0]
    dst = c.masters()[1]
    first = min(f for f, _, port, _ in c.slots() if port == src.port)
    moved = [t for t in (f"reshard:{k}" for k in range(20000)) if first <= slot_of(t) < first + 50][:2]
    stay = next(t for t in (f"stay:{k}" for k in range(400)) if c.node_of(slot_of(t)).port == dst.port)
    topics = moved + [stay]
    check(len(moved) == 2, "no topic in the slots that move")
    global DIAG
    DIAG = lambda: (", ".join(f"{m} {metric(a, m):.0f}" for m in ("wspush_bus_topics", "wspush_bus_pending",
                                                                   "wspush_bus_held_subs", "wspush_bus_catchup_events_total",
                                                                   "wspush_bus_reconnects_total")) +
                    "; shard channels: " + "; ".join(f"{m.port}: {m.command('PUBSUB', 'SHARDCHANNELS', 'wspush:*')}"
                                                       for m in c.masters()) +
                    f"; slots of the moved topics at {[c.node_of(slot_of(t)).port for t in moved]}; the publisher at "
                    f"{pub.n}, {'running' if pub.is_alive() else 'stopped'}, {pub.errors[:2]}\n" + a.log_tail(40))
    ws = await connect(a)
    await subscribe(ws, topics)
    pub = Publisher(b, topics)
    pub.start()
    try:
        last = {t: 0 for t in topics}
        await follow(ws, topics, last, {t: 20 for t in topics}, 30)
        src_id, dst_id = src.command("CLUSTER", "MYID"), dst.command("CLUSTER", "MYID")
        done = subprocess.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{src.port}", "--cluster-from", src_id,
                               "--cluster-to", dst_id, "--cluster-slots", "100", "--cluster-yes"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(120))
        check(done.returncode == 0, f"redis-cli --cluster reshard failed: {done.stdout[-400:]} {done.stderr[-400:]}")
        for t in moved:
            check(c.node_of(slot_of(t)).port == dst.port, f"{t}'s slot did not move")
        target = {t: pub.n[t] + 30 for t in topics}
        await follow(ws, topics, last, target, 60)
        # The node now subscribes the moved topics at their new master.
        listed = dst.command("PUBSUB", "SHARDCHANNELS", "wspush:*:topic:reshard:*")
        check(all(keys(t)[1] in listed for t in moved), f"the moved topics at their new master: {listed}")
    finally:
        pub.stop_flag.set()
        pub.join()
        await ws.close()
    check(not pub.errors, f"publisher: {pub.errors[:2]}")
    print(f"    {pub.refused} publishes refused while the slots moved, sent again")


async def failover_under_load(c: RedisCluster, a: ServerProcess, b: ServerProcess) -> None:
    """A master SIGKILLed while a publisher runs; its replica takes over. The subscriber that
    stayed gets each topic's events in order, once, and any it misses after a `lost` notice;
    a client resuming from before the failover gets every event after its id, or the topic in
    `lost`. Never a silent gap."""
    victim = c.masters()[-1]
    vslots = [(f, l) for f, l, port, _ in c.slots() if port == victim.port]
    on_victim = [t for t in (f"fail:{k}" for k in range(2000)) if any(f <= slot_of(t) <= l for f, l in vslots)][:2]
    elsewhere = next(t for t in (f"fail:{k}" for k in range(2000)) if c.node_of(slot_of(t)).port != victim.port)
    topics = on_victim + [elsewhere]
    # A topic of the victim's with a history longer than a page, and no publish after the
    # failover: its slot's epoch is voided until one comes.
    quiet = next(t for t in (f"quiet:{k}" for k in range(2000)) if any(f <= slot_of(t) <= l for f, l in vslots)
                 and slot_of(t) not in {slot_of(x) for x in on_victim})
    quiet_ids = [publish_ok(b, quiet, n) for n in range(70)]
    ws = await connect(a)
    await subscribe(ws, topics)
    pub = Publisher(b, topics, maybe_ok=True)
    pub.start()
    last = {t: 0 for t in topics}
    last_id = {t: "" for t in topics}
    told = {t: 0 for t in topics}

    async def read_until(until: "dict[str, int]", seconds: float) -> None:
        deadline = time.monotonic() + scaled(seconds)
        while any(last[t] < until[t] for t in topics):
            check(time.monotonic() < deadline, f"stuck at {last} of {until}")
            e = await recv_json(ws, seconds)
            if e.get("op") == "lost":
                for t in e["topics"]:
                    told[t] += 1
                continue
            t, n = e.get("topic"), e.get("data")
            check(n > last[t], f"{t}: {n} after {last[t]} (a duplicate)")
            gap = set(range(last[t] + 1, n)) - pub.maybe[t]
            check(not gap or told[t] > 0, f"{t}: {sorted(gap)} missing, and no lost notice")
            last[t] = n
            last_id[t] = e["id"]

    try:
        await read_until({t: 10 for t in topics}, 30)
        # A resume point from before the failover: each topic's last event so far.
        before = {t: (last[t], last_id[t]) for t in topics}
        t0 = time.monotonic()
        victim.kill()

        def taken_over() -> bool:
            try:
                return all(c.node_of(slot_of(t)).port != victim.port for t in on_victim)
            except (OSError, RuntimeError, AssertionError):
                return False
        check(poll_until(taken_over, scaled(60)), "no replica took over")
        t1 = time.monotonic()
        c.wait_ok(scaled(60))
        await read_until({t: pub.n[t] + 20 for t in topics}, 60)
        print(f"    a replica took over {t1 - t0:.1f}s after the kill; the subscriber had 20 more of each "
              f"{time.monotonic() - t0:.1f}s after it")
    finally:
        pub.stop_flag.set()
        pub.join()
        await ws.close()
    check(not pub.errors, f"publisher: {pub.errors[:2]}")
    print(f"    {pub.refused} publishes refused during the failover, sent again; 504: "
          f"{ {t: sorted(m) for t, m in pub.maybe.items() if m} }; lost notices {told}")
    # A client resuming from before the failover: every event after it, or lost.
    wr = await connect(b)
    try:
        r = await subscribe(wr, topics, since={t: before[t][1] for t in topics})
        lost = set(r.get("lost", []))
        want = {t: [n for n in range(before[t][0] + 1, pub.n[t] + 1) if n not in pub.maybe[t]] for t in topics
                if t not in lost}
        got = {t: [] for t in want}
        while any(len(got[t]) < len(want[t]) for t in want):
            e = await recv_json(wr, 20)
            if e.get("op") == "lost":  # told in the stream: as good as in `subbed`
                for t in e["topics"]:
                    lost.add(t)
                    want.pop(t, None)
                    got.pop(t, None)
                continue
            t = e.get("topic")
            if t in got and e.get("data") not in pub.maybe[t]:
                got[t].append(e["data"])
            check(t in topics, f"a resume got {e}")
        for t in want:
            check(got[t] == want[t], f"{t} resumed from {before[t][0]} and not lost: got {got[t][:5]}..., missing "
                                     f"{sorted(set(want[t]) - set(got[t]))[:5]}")
        print(f"    a resume from before the failover: lost {sorted(lost)}, replayed {sorted(want)}")
    finally:
        await wr.close()
    # The quiet topic: lost (its ids are not trusted any more), not a failed sub.
    wq = await connect(a)
    try:
        r = await subscribe(wq, [quiet], since={quiet: quiet_ids[0]})
        check(r.get("lost") == [quiet], f"a resume of a quiet topic of the failed master: {r}")
    finally:
        await wq.close()
    victim.start()  # back, as a replica of the new master


def marks_from_every_master(a: ServerProcess) -> None:
    before = metric(a, "wspush_bus_marks_total")
    # Once a second from each of the three masters.
    check(poll_until(lambda: metric(a, "wspush_bus_marks_total") >= before + 6, scaled(10)),
          f"marks heard: {metric(a, 'wspush_bus_marks_total') - before:.0f} in the wait")


def not_a_cluster(args) -> None:
    plain = RedisServer().start()
    try:
        s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                          extra=["--bus", f"redis-cluster://127.0.0.1:{plain.port}"]).start()
        check(poll_until(lambda: "does not give the cluster's map" in s.log_tail(40), scaled(10)),
              "a seed that is no cluster node was not said\n" + s.log_tail())
        check(readyz(s) == 503 and metric(s, "wspush_bus_up") == 0, "a node on a seed that is no cluster is up")
        s.kill()
    finally:
        plain.close()


def main(args) -> None:
    c = RedisCluster().start()
    try:
        for m in c.masters():
            check(m.command("FUNCTION", "LOAD", "REPLACE", library()) == "wspush", "FUNCTION LOAD")
        f = Findings()
        f.step("a topic's keys fall in its slot", slots_and_tags, c)
        f.step("publish on the slot's master, heard on its shard channel", publish_and_hear, c)
        f.step("shard channels only", shard_channels_listed, c)
        f.step("keys that are not the topic's, slots mixed: refused", refusals, c)
        f.step("a batch, a slot's epoch, a mark", batch_epoch_mark, c)
        f.step("the nodes' batch over the slots of a master", publish_many, c)
        a = node(args, c.url, "a node did not come up on the cluster")
        b = node(args, c.url, "a node did not come up on the cluster")
        f.step("two nodes on the cluster: delivery over three masters", lambda: asyncio.run(nodes_deliver(c, a, b)))
        f.step("a resume on the other node over the masters", lambda: asyncio.run(resume_across_masters(c, a, b)))
        f.step("marks from every master", marks_from_every_master, a)
        f.step("slots resharded while a publisher runs: no gap, no duplicate",
               lambda: asyncio.run(reshard_under_load(c, a, b)))
        f.step("a master killed while a publisher runs: no silent gap",
               lambda: asyncio.run(failover_under_load(c, a, b)))
        f.step("a seed that is no cluster node", not_a_cluster, args)
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        for n in c.nodes:
            check(not n.crashed(), f"a cluster node crashed (exit {n.proc.returncode})")
        f.done()
    finally:
        c.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
