#!/usr/bin/python3
"""Redis's CPU per publish, as the nodes publish: N subscribed topics, publishes in pipelined
batches (FCALL wspush_publish_batch, as a node sends what it has queued; or FCALL wspush_publish
one by one, as a backend does), a subscriber that reads everything (as a node's subscriber link).

Starts its own redis-server (pinned with taskset to --redis-cpu), loads server/bus/wspush.lua, and
measures Redis's own CPU (INFO cpu, user + sys) over each round of one publish per topic: the
first round creates every topic's stream, the next ones add to them.

  loadgen/scenarios/redis_publish_cpu.py                          # 19,000 topics, batches of 16
  loadgen/scenarios/redis_publish_cpu.py --topics 1000000 --batch 64
  loadgen/scenarios/redis_publish_cpu.py --function wspush_publish   # one by one
  loadgen/scenarios/redis_publish_cpu.py --node-bytes 512           # stream-node-max-bytes
  loadgen/scenarios/redis_publish_cpu.py --topics 1000000 --rounds 1 --marks 6 --ttl 300
      # then what a node's wspush_mark costs, one a second, with its step of the streams' sweep
  loadgen/scenarios/redis_publish_cpu.py --batch 64 --keys new      # each publish with a new idempotency key
  loadgen/scenarios/redis_publish_cpu.py --batch 64 --keys repeat   # each a retry of a key remembered

With --keys the batches go to wspush_publish_keyed (a node's batch with a key per publish), or
wspush_publish gets the key as its third argument; `new` gives every publish a key of its own (36
bytes, a UUID's length), `repeat` resends the first keyed round's keys (the duplicates a retrying
backend sends: nothing published). After the rounds it prints the Redis memory the remembered keys
hold: used_memory before and after deleting every wspush:idem:* key, per key remembered.
"""

import argparse
import os
import select
import socket
import sys
import threading
import time

import redis

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from wsp_redis import RedisServer  # noqa: E402

LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server", "bus", "wspush.lua")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=19000)
    p.add_argument("--batch", type=int, default=16, help="publishes per wspush_publish_batch call")
    p.add_argument("--function", default="wspush_publish_batch", choices=["wspush_publish_batch", "wspush_publish"])
    p.add_argument("--rounds", type=int, default=3, help="one publish per topic each (the first creates the streams)")
    p.add_argument("--node-bytes", type=int, default=4096, help="Redis's stream-node-max-bytes")
    p.add_argument("--port", type=int, default=16453)
    p.add_argument("--redis-cpu", default="1")
    p.add_argument("--lua", default=LUA, help="the function library to load (another version's, to compare)")
    p.add_argument("--data", default='{"subject":"New mail","from":"alice@example.com","n":12345}')
    p.add_argument("--ttl", type=int, default=300, help="history ttl in seconds (wspush:config ttl_ms)")
    p.add_argument("--keys", default="none", choices=["none", "new", "repeat"],
                   help="idempotency keys: none, a new one per publish, or the first keyed round's again")
    p.add_argument("--window", type=int, default=300, help="the idempotency window in seconds (--keys)")
    p.add_argument("--marks", type=int, default=0,
                   help="after the rounds, this many wspush_mark calls a second apart (each runs a step of the sweep)")
    a = p.parse_args()

    rs = RedisServer(port=a.port, persistent=False, cpu=a.redis_cpu,
                     extra=("--stream-node-max-bytes", str(a.node_bytes))).start()
    try:
        r = redis.Redis(port=a.port)
        r.function_load(open(a.lua).read(), replace=True)
        r.hset("wspush:config", mapping={"maxlen": 100, "ttl_ms": a.ttl * 1000, "max_event_bytes": 1 << 20})
        # The subscriber: every topic's channel, read as fast as Redis writes (a raw socket).
        sub = socket.create_connection(("127.0.0.1", a.port))
        stop = threading.Event()
        received = [0]

        def drain() -> None:
            while not stop.is_set():
                if select.select([sub], [], [], 0.2)[0]:
                    received[0] += len(sub.recv(1 << 20))

        t = threading.Thread(target=drain, daemon=True)
        t.start()
        for k in range(0, a.topics, 1000):
            names = " ".join(f"wspush:topic:box:{i}" for i in range(k, min(a.topics, k + 1000)))
            sub.sendall(f"SUBSCRIBE {names}\r\n".encode())
        while r.execute_command("PUBSUB", "NUMSUB", f"wspush:topic:box:{a.topics - 1}")[1] == 0:
            time.sleep(0.1)

        def cpu() -> float:
            i = r.info("cpu")
            return float(i["used_cpu_sys"]) + float(i["used_cpu_user"])

        def key(rnd: int, i: int) -> str:  # 36 bytes, a UUID's length
            if a.keys == "repeat" and rnd > 0:
                rnd = 1  # the first keyed round's (round 1: round 0 creates the streams without keys)
            return f"{rnd:08x}-0000-4000-8000-{i:012x}"

        for rnd in range(a.rounds):
            keyed = a.keys != "none" and rnd > 0  # round 0 creates the streams: the same work either way
            c0 = cpu()
            for start in range(0, a.topics, 20000):  # pipelines of bounded size
                pipe = r.pipeline(transaction=False)
                end = min(a.topics, start + 20000)
                if a.function == "wspush_publish":
                    for i in range(start, end):
                        pipe.fcall("wspush_publish", 0, f"box:{i}", a.data, *([key(rnd, i)] if keyed else []))
                else:
                    for i in range(start, end, a.batch):
                        args = [str(a.window * 1000)] if keyed else []
                        for k in range(i, min(end, i + a.batch)):
                            args += [f"box:{k}", a.data] + ([key(rnd, k)] if keyed else [])
                        pipe.fcall("wspush_publish_keyed" if keyed else "wspush_publish_batch", 0, *args)
                pipe.execute()
            used = cpu() - c0
            what = "new streams" if rnd == 0 else "existing streams"
            retries = a.keys == "repeat" and rnd > 1
            keys = f", keys: {'retries of remembered ones' if retries else 'a new one each'}" if keyed else ""
            print(f"{a.topics} topics, {a.function}{'' if a.function == 'wspush_publish' else f' x {a.batch}'}, "
                  f"stream-node-max-bytes {a.node_bytes}, round {rnd + 1} ({what}{keys}): "
                  f"{used / a.topics * 1e6:.2f} us of Redis CPU per publish", flush=True)
        print(f"Redis used_memory {r.info('memory')['used_memory'] / (1 << 20):.1f} MB", flush=True)
        if a.keys != "none":
            names = list(r.scan_iter("wspush:idem:*", count=10000))
            remembered = sum(r.hlen(k) for k in names)
            m0 = r.info("memory")["used_memory"]
            for start in range(0, len(names), 10000):
                r.delete(*names[start:start + 10000])
            m1 = r.info("memory")["used_memory"]
            print(f"remembered keys: {remembered} over {a.topics} topics ({remembered / a.topics:.0f} a topic), "
                  f"{(m0 - m1) / remembered:.0f} bytes of Redis memory each ({(m0 - m1) / (1 << 20):.1f} MB)",
                  flush=True)
        if a.marks:
            # The first step finds no earlier one and takes 10 s worth of keys: not counted.
            r.fcall("wspush_mark", 0, "wspush:node:bench")
            time.sleep(1)
            # Three passes in four read idle times; the fourth reads every stream.
            for what, pass_no in (("reading idle times", 0), ("reading every stream", 3)):
                r.hset("wspush:sweep", "pass", pass_no)
                r.config_resetstat()
                for _ in range(a.marks):
                    r.fcall("wspush_mark", 0, "wspush:node:bench")
                    time.sleep(1)
                st = r.info("commandstats")
                print(f"wspush_mark, one a second, {a.topics} streams, ttl {a.ttl} s, a pass {what}: "
                      f"{st['cmdstat_fcall']['usec_per_call'] / 1000:.2f} ms of Redis each "
                      f"(SCAN {st.get('cmdstat_scan', {}).get('usec_per_call', 0) / 1000:.2f} ms; "
                      f"{st.get('cmdstat_object|idletime', {}).get('calls', 0) // a.marks} idle times and "
                      f"{st.get('cmdstat_xrevrange', {}).get('calls', 0) // a.marks} newest entries read a step)",
                      flush=True)
        stop.set()
        t.join()
    finally:
        rs.close()


if __name__ == "__main__":
    sys.exit(main())
