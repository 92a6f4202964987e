#!/usr/bin/python3
"""wspush's Redis functions under a real Redis Cluster (3 masters, 3 replicas, made with
`redis-cli --cluster create` on loopback), driven as a backend would, with raw RESP.

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
  `wspush_epoch` with a slot's epoch key, `wspush_mark` on a node's shard channel.
The nodes' use of the cluster (--bus redis-cluster://...) is not built yet.
Exit 0 pass, 1 fail.
"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisCluster, RedisServer, _encode, _read_resp  # noqa: E402
from wsp_testlib import Findings, arg_parser, check, run_main, scaled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTL_MS = 60000
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


# ---- the rule, transcribed from docs/REDIS.md ---------------------------------------------------

def crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot_of(topic: str) -> int:
    return crc16(topic.encode()) % 16384


def base36(n: int) -> str:
    out = DIGITS[n % 36]
    while n >= 36:
        n //= 36
        out = DIGITS[n % 36] + out
    return out


def tag_of(slot: int) -> str:
    """The first word 0, 1, ..., z, 10, ... (base 36) whose CRC16 falls in the slot."""
    n = 0
    while crc16(base36(n).encode()) % 16384 != slot:
        n += 1
    return base36(n)


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
        check(eid.split(":")[0] == owner.command("GET", epoch_key), f"{eid} is not of its slot's epoch")
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
        for n in c.nodes:
            check(not n.crashed(), f"a cluster node crashed (exit {n.proc.returncode})")
        f.done()
    finally:
        c.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
