#!/usr/bin/python3
"""Durable publishes (--redis-wait-replicas): a real redis-server master and its replica, a wspush
node that waits for one replica, Python `websockets` clients, raw RESP to read the replica.

- every publish answered 200 is on the replica already when the answer arrives (read there at
  once, the entry with that id), for admin publishes and for a client's `pub` (on loopback the
  replica is fast enough that this would mostly hold without WAIT too: the next step is the one
  only WAIT passes);
- the replica gone: a publish is answered 504 `timeout` saying it was published with that id on
  the master but not on the replica within --redis-wait-ms; it is delivered (the master has it)
  and counted in wspush_bus_unreplicated_total; a client's `pub` hears `timeout`; forty publishes
  at once are all answered 504, the batches sharing WAITs (one in flight at a time), and the bus
  is never taken for stalled (--redis-timeout 2 s, eight times --redis-wait-ms);
- the replica back and in sync: publishes are answered 200 again, and are on it.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import concurrent.futures
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, readyz  # noqa: E402
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, arg_parser, check, metric, poll_until, publish,  # noqa: E402
                         publish_ok, recv_json, run_main, scaled, subscribe)

WAIT_MS = 250
TOPIC = "mailbox:durable"


def replica_in_sync(master: RedisServer) -> bool:
    """The master counts one replica online (INFO replication: slave0:...,state=online)."""
    info = master.command("INFO", "replication")
    return "connected_slaves:1" in info and "state=online" in info


def on_replica(replica: RedisServer, event_id: str) -> bool:
    """The replica holds the topic's stream entry with this id (`<epoch>:<stream id>`)."""
    sid = event_id.split(":", 1)[1]
    return bool(replica.command("XRANGE", f"wspush:stream:{TOPIC}", sid, sid))


async def replicated(s: ServerProcess, replica: RedisServer) -> None:
    w = await connect(s)
    try:
        await subscribe(w, [TOPIC])
        for n in range(50):
            eid = publish_ok(s, TOPIC, n)
            # Read on the replica the moment the answer came: WAIT made it so, nothing else does.
            check(on_replica(replica, eid), f"publish {n} answered 200 as {eid} is not on the replica")
            e = await recv_json(w)
            check(e == {"topic": TOPIC, "id": eid, "data": n}, f"the subscriber got {e}")
        for n in range(10):
            await w.send(json.dumps({"op": "pub", "topic": TOPIC, "data": {"pub": n}}))
            got = await recv_json(w)
            check(got.get("topic") == TOPIC and got.get("data") == {"pub": n}, f"the pub's event: {got}")
            check(on_replica(replica, got["id"]), f"a client's pub delivered as {got['id']} is not on the replica")
    finally:
        await w.close()


async def replica_gone(s: ServerProcess, master: RedisServer, replica: RedisServer) -> None:
    replica.kill()
    check(poll_until(lambda: "connected_slaves:0" in master.command("INFO", "replication"), scaled(10)),
          "the master still counts its replica")
    before = metric(s, "wspush_bus_unreplicated_total")
    w = await connect(s)
    try:
        await subscribe(w, [TOPIC])
        status, body = publish(s, TOPIC, "alone")
        check(status == 504 and body.get("error") == "timeout", f"a publish with no replica answered {status} {body}")
        reason = body.get("reason", "")
        check(f"but 0 of 1 replicas had it within {WAIT_MS} ms" in reason, f"the 504 does not say why: {reason!r}")
        e = await recv_json(w)
        check(e.get("data") == "alone" and f"published as {e.get('id')}," in reason,
              f"the master ran it, so it is delivered with the id the 504 names: {e} / {reason!r}")
        check(metric(s, "wspush_bus_unreplicated_total") == before + 1, "wspush_bus_unreplicated_total did not count it")
        await w.send(json.dumps({"op": "pub", "topic": TOPIC, "data": "pub alone"}))
        got = [await recv_json(w), await recv_json(w)]
        errors = [g for g in got if g.get("op") == "error"]
        events = [g for g in got if g.get("data") == "pub alone"]
        check(len(errors) == 1 and errors[0].get("code") == "timeout" and len(events) == 1,
              f"a client's pub with no replica: {got}")
        check(readyz(s) == 200, "a missing replica is not the bus down: /readyz should stay 200")
        # Many at once: without a shared WAIT each batch would wait behind every WAIT before it.
        waits = master.command("INFO", "commandstats").split("cmdstat_wait:calls=")[1].split(",")[0]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda n: publish(s, TOPIC, {"many": n})[0], range(40)))
        print(f"    forty publishes with no replica answered in {time.monotonic() - t0:.2f} s, "
              f"{int(master.command('INFO', 'commandstats').split('cmdstat_wait:calls=')[1].split(',')[0]) - int(waits)} WAITs",
              flush=True)
        check(answers == [504] * 40, f"forty publishes with no replica: {sorted(set(answers))}")
        check(metric(s, "wspush_bus_stalled") == 0 and readyz(s) == 200,
              "waiting for replicas was taken for a stalled Redis\n" + s.log_tail())
    finally:
        await w.close()
    replica.start()
    check(poll_until(lambda: replica_in_sync(master), scaled(20)), "the replica did not come back in sync")
    eid = publish_ok(s, TOPIC, "back")
    check(on_replica(replica, eid), f"{eid} answered 200 with the replica back is not on it")


def main(args) -> None:
    master = RedisServer().start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(master.port))).start()
    try:
        check(poll_until(lambda: replica_in_sync(master), scaled(20)), "the replica did not sync")
        s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                          extra=["--bus", master.url, "--threads", "2", "--allow-client-publish",
                                 "--redis-wait-replicas", "1", "--redis-wait-ms", str(WAIT_MS),
                                 "--redis-timeout", "2"]).start()
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(20)),
              "the node did not come up on the bus\n" + s.log_tail())
        f = Findings()
        f.step("answered 200: on the replica already", lambda: asyncio.run(replicated(s, replica)))
        f.step("no replica: 504 naming the id, delivered, counted", lambda: asyncio.run(replica_gone(s, master, replica)))
        check(not s.crashed(), "the node crashed\n" + s.log_tail())
        for rs in (master, replica):
            check(not rs.crashed(), f"a redis-server crashed (exit {rs.proc.returncode})")
        f.done()
    finally:
        replica.close()
        master.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
