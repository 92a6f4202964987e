"""Helpers of the tests of the Redis bus over one Redis, isolated shards or a Redis Cluster: where
a topic lives, transcribed from docs/REDIS.md (not from the server's code), a node on a bus, its
readiness, a client, and a resume on the other node checked event by event."""
from __future__ import annotations

import urllib.error
import urllib.request

import websockets

from wsp_testlib import ServerProcess, admin_port, check, metric, poll_until, publish_ok, recv_json, scaled, subscribe


# ---- where a topic lives (docs/REDIS.md) -------------------------------------------------------

def crc16(data: bytes) -> int:
    """CRC16-XMODEM, Redis Cluster's."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot_of(topic: str) -> int:
    return crc16(topic.encode()) % 16384


DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(n: int) -> str:
    out = DIGITS[n % 36]
    while n >= 36:
        n //= 36
        out = DIGITS[n % 36] + out
    return out


def tag_of(slot: int) -> str:
    """Under Redis Cluster, the tag of a slot's keys: the first word 0, 1, ..., z, 10, ... (base 36)
    whose CRC16 falls in the slot."""
    n = 0
    while slot_of(base36(n)) != slot:
        n += 1
    return base36(n)


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach, 2014)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(topic: str, shards: int) -> int:
    return jump_hash(slot_of(topic), shards)


# ---- nodes and clients ------------------------------------------------------------------------

def node(args, bus: str, what: str = "a node did not come up on the bus", extra=()) -> ServerProcess:
    """A node on `bus` (two shards, a long history, clients may publish, then `extra`), once it
    is up on every Redis of the bus and ready."""
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", bus, "--threads", "2", "--history-size", "1000", "--allow-client-publish",
                             *extra]).start()
    check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(20)), what + "\n" + s.log_tail())
    return s


def readyz(s: ServerProcess) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{admin_port(s)}/readyz", timeout=scaled(5)).status
    except urllib.error.HTTPError as e:
        return e.code


async def connect(s: ServerProcess, port: int = 0):
    return await websockets.connect(f"ws://127.0.0.1:{port or s.port}/ws", ping_interval=None, max_size=None)


async def resume_on_other_node(a: ServerProcess, b: ServerProcess, topics: "list[str]", what: str) -> None:
    """An event of each topic heard on node A; three more published while no one listens; a
    resume on node B from the first gets those three of each, then live events, each once."""
    wa = await connect(a)
    await subscribe(wa, topics)
    first = {t: publish_ok(a, t, 0) for t in topics}
    for _ in topics:
        await recv_json(wa)
    await wa.close()
    later = {t: [publish_ok(a, t, n) for n in (1, 2, 3)] for t in topics}
    wb = await connect(b)
    try:
        r = await subscribe(wb, topics, since=first)
        check(r.get("lost") == [], f"a resume over {what}: {r}")
        got = {t: [] for t in topics}
        for _ in range(3 * len(topics)):
            e = await recv_json(wb)
            got[e["topic"]].append((e["id"], e["data"]))
        for t in topics:
            check(got[t] == list(zip(later[t], (1, 2, 3))), f"the replay of {t}: {got[t]}")
        # Live behind the replay, once.
        for t in topics:
            eid = publish_ok(a, t, 4)
            e = await recv_json(wb)
            check(e.get("id") == eid and e.get("data") == 4, f"live after the resume of {t}: {e}")
    finally:
        await wb.close()
