#!/usr/bin/python3
"""Many nodes on the Redis bus: a real redis-server and two wspush nodes on loopback (two shards
each), Python `websockets` clients, Debian's `redis` client for what a backend does straight
into Redis, and nginx in front for the failover.

- cross-node delivery both ways (admin publishes, a client's pub), a topic held on both nodes
  delivered once to each subscriber;
- a backend publishing into Redis with a stock client (FCALL wspush_publish); malformed messages
  on a topic channel counted and skipped; bad JSON refused by the function;
- `subbed` means active: a publish straight into Redis right after it always arrives;
- 2,000 mailboxes subscribe at once: a few SUBSCRIBE commands, not 2,000; a batch publish
  reaches every one;
- resume on the other node with a publisher running throughout: no gap, no duplicate at the seam;
- an admin publish Redis leaves unanswered (SIGSTOP) is answered 504 `timeout`, not 503, and its
  event arrives once Redis resumes;
- the load generator resends an admin publish refused with 503 (Redis gone for a moment): no gap;
- Redis killed and restarted (append-only file kept): /readyz 503, admin 503, `unavailable` for
  subs, connections stay; then delivery resumes and a resume gets what the stream kept; after
  Redis lost its data (FLUSHALL), an older id is answered `lost`;
- a node cut off from Redis catches its subscribers up on what was published meanwhile;
- a node started with Redis unreachable waits, then serves once Redis appears;
- bad --bus URLs are refused at start;
- a node killed with SIGKILL behind nginx (deploy/nginx/wspush.conf): its client reconnects
  through nginx to the other node and resumes with nothing lost.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import redis
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_nginx import nginx_prefix  # noqa: E402
from wsp_ports import reserve_port  # noqa: E402
from wsp_bus import connect, readyz  # noqa: E402
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, _die_with_parent, admin_port, arg_parser,  # noqa: E402
                         check, no_positions, metric, poll_until, publish, publish_ok, recv_json, run_main, scaled,
                         subscribe)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- helpers --------------------------------------------------------------------------------------

def node(args, redis_url: str, extra=()) -> ServerProcess:
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", redis_url, "--threads", "2", "--history-size", "1000",
                             "--allow-client-publish", *extra]).start()
    wait_ready(s, True)
    return s


def wait_ready(s: ServerProcess, ready: bool, seconds: float = 20) -> None:
    deadline = time.monotonic() + scaled(seconds)
    want = 200 if ready else 503
    while readyz(s) != want:
        check(time.monotonic() < deadline, f"/readyz did not become {want} within {scaled(seconds):.0f}s")
        time.sleep(0.05)








# ---- the steps ------------------------------------------------------------------------------------

async def cross_node(a: ServerProcess, b: ServerProcess) -> None:
    wa, wb = await connect(a), await connect(b)
    try:
        await subscribe(wa, ["mailbox:1", "shared"])
        await subscribe(wb, ["mailbox:2", "shared"])
        id1 = publish_ok(b, "mailbox:1", {"to": 1})
        e = await recv_json(wa)
        check(e == {"topic": "mailbox:1", "id": id1, "data": {"to": 1}}, f"A got {e}")
        id2 = publish_ok(a, "mailbox:2", {"to": 2})
        e = await recv_json(wb)
        check(e.get("id") == id2 and e.get("data") == {"to": 2}, f"B got {e}")
        ids = publish_ok(a, "shared", "both")
        for ws in (wa, wb):
            e = await recv_json(ws)
            check(e.get("id") == ids, f"the shared event: {e}")
        # A client's pub on node A reaches node B's subscriber.
        await wa.send(json.dumps({"op": "pub", "topic": "mailbox:2", "data": {"from": "a"}}))
        e = await recv_json(wb)
        check(e.get("topic") == "mailbox:2" and e.get("data") == {"from": "a"}, f"client pub reached B as {e}")
        # Nothing else arrived (each event exactly once): a fence on each.
        fence = publish_ok(b, "shared", "fence")
        for ws in (wa, wb):
            e = await recv_json(ws)
            check(e.get("id") == fence, f"expected only the fence, got {e}")
    finally:
        await wa.close()
        await wb.close()


async def straight_into_redis(rs: RedisServer, a: ServerProcess, b: ServerProcess) -> None:
    r = redis.Redis(host="127.0.0.1", port=rs.port, decode_responses=True)
    wa, wb = await connect(a), await connect(b)
    try:
        await subscribe(wa, ["backend:1"])
        await subscribe(wb, ["backend:1"])
        eid = r.fcall("wspush_publish", 0, "backend:1", '{"from":"backend"}')
        for ws in (wa, wb):
            e = await recv_json(ws)
            check(e == {"topic": "backend:1", "id": eid, "data": {"from": "backend"}}, f"got {e}")
        try:
            r.fcall("wspush_publish", 0, "backend:1", "{not json")
            raise AssertionError("the function took data that is not JSON")
        except redis.ResponseError as exc:
            check("JSON" in str(exc), f"refused with {exc}")
        before = metric(a, "wspush_bus_malformed_total")
        for junk in ("no-space-here", "x:1-0 {broken", "bad id {}", ""):
            r.publish("wspush:topic:backend:1", junk)
        eid = r.fcall("wspush_publish", 0, "backend:1", "[1,2,3]")
        e = await recv_json(wa)
        check(e.get("id") == eid and e.get("data") == [1, 2, 3], f"after the junk: {e}")
        e = await recv_json(wb)
        check(e.get("id") == eid and e.get("data") == [1, 2, 3], f"after the junk, on B: {e}")
        check(metric(a, "wspush_bus_malformed_total") - before == 4,
              f"malformed went {before} -> {metric(a, 'wspush_bus_malformed_total')}")
        # The nodes' batch: each pair answered in order (an id, or an error: it bounds the size,
        # the node checked topic and JSON); the others reach every subscriber in that order, a
        # new topic's stream included.
        await subscribe(wa, ["backend:new"])
        big = json.dumps("x" * (1 << 20))
        got = r.fcall("wspush_publish_batch", 0, "backend:1", '"b1"', "backend:1", big, "backend:new", '"n1"',
                      "backend:1", '"b2"')
        check(len(got) == 4, f"the batch was answered {got}")
        check(isinstance(got[1], redis.ResponseError) and "max_event_bytes" in str(got[1]), f"data over the bound answered {got[1]!r}")
        ids = [got[0], got[2], got[3]]
        check(all(isinstance(i, str) and ":" in i for i in ids), f"the good ones answered {ids}")
        want = [("backend:1", ids[0], "b1"), ("backend:new", ids[1], "n1"), ("backend:1", ids[2], "b2")]
        heard = [await recv_json(wa) for _ in range(3)]
        check([(e.get("topic"), e.get("id"), e.get("data")) for e in heard] == want, f"A heard {heard}")
        heard = [await recv_json(wb) for _ in range(2)]
        check([(e.get("topic"), e.get("id"), e.get("data")) for e in heard] == [want[0], want[2]], f"B heard {heard}")
        check([x[1]["d"] for x in r.xrange("wspush:stream:backend:1")][-2:] == ['"b1"', '"b2"'],
              "the stream does not hold the batch's events in order")
        for odd in ((), ("backend:1",)):
            try:
                r.fcall("wspush_publish_batch", 0, *odd)
                raise AssertionError(f"the batch took {len(odd)} arguments")
            except redis.ResponseError as exc:
                check("pairs" in str(exc), f"refused with {exc}")
    finally:
        await wa.close()
        await wb.close()


async def older_library(rs: RedisServer, a: ServerProcess) -> None:
    """A node of an older version loads its functions (FUNCTION LOAD REPLACE, as every node does
    when it connects), one without wspush_publish_batch: the node's next batch is refused (a
    retry is safe: it did not run), and the node loads its own functions again."""
    r = redis.Redis(host="127.0.0.1", port=rs.port, decode_responses=True)
    lua = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server", "bus", "wspush.lua")).read()
    older = "\n".join(line for line in lua.splitlines() if "'wspush_publish_batch'" not in line)
    check(older != lua, "the library has no wspush_publish_batch to take out")
    r.function_load(older, replace=True)
    has_batch = lambda: "wspush_publish_batch" in str(r.function_list())  # noqa: E731
    check(not has_batch(), "the older library still has wspush_publish_batch")
    ws = await connect(a)
    try:
        await subscribe(ws, ["upgrade"])
        status, body = publish(a, "upgrade", "during")
        check(status == 503, f"a batch Redis had no function for was answered {status} {body}")
        check(poll_until(has_batch, scaled(10)), "the node did not load its functions again")
        a.wait_for_log("loading this node's again", scaled(5), "the log line for the older library")
        eid = publish_ok(a, "upgrade", "after")
        e = await recv_json(ws)
        check(e.get("id") == eid and e.get("data") == "after", f"after the reload the subscriber heard {e}")
    finally:
        await ws.close()


async def subbed_means_active(rs: RedisServer, a: ServerProcess) -> None:
    r = redis.Redis(host="127.0.0.1", port=rs.port, decode_responses=True)
    for k in range(50):
        ws = await connect(a)
        try:
            await subscribe(ws, [f"fresh:{k}"])
            eid = r.fcall("wspush_publish", 0, f"fresh:{k}", str(k))
            e = await recv_json(ws, 5)
            check(e.get("id") == eid, f"fresh:{k}: the publish right after subbed came as {e}")
        finally:
            await ws.close()


async def many_mailboxes(rs: RedisServer, a: ServerProcess, b: ServerProcess) -> None:
    n = 2000
    socks = []
    for start in range(0, n, 250):
        socks += await asyncio.gather(*[connect(a) for _ in range(start, min(n, start + 250))])
    # Redis is held (SIGSTOP) until the node has read every mailbox's sub and sent its first
    # SUBSCRIBE, which waits there: every mailbox that asked meanwhile must join the next
    # command (one per round trip), not queue a command of its own.
    subscribes = 'wspush_bus_commands_total{command="subscribe"}'
    before, read0 = metric(a, subscribes), metric(a, "wspush_messages_in_total")
    os.kill(rs.proc.pid, signal.SIGSTOP)
    try:
        await asyncio.gather(*[ws.send(json.dumps({"op": "sub", "topics": [f"box:{k}"]}))
                               for k, ws in enumerate(socks)])
        deadline = time.monotonic() + scaled(60)
        # No event tells when the node has read them: its counters are polled.
        while metric(a, "wspush_messages_in_total") < read0 + n or metric(a, subscribes) < before + 1:
            check(time.monotonic() < deadline, f"the node read {metric(a, 'wspush_messages_in_total') - read0:.0f} "
                                               f"of {n} subs and sent {metric(a, subscribes) - before:.0f} SUBSCRIBE")
            await asyncio.sleep(0.05)
    finally:
        os.kill(rs.proc.pid, signal.SIGCONT)
    replies = await asyncio.gather(*[recv_json(ws, 60) for ws in socks])
    for k, reply in enumerate(replies):
        check(reply.get("op") == "subbed" and reply.get("topics") == [f"box:{k}"], f"box:{k}'s sub answered {reply}")
    commands = metric(a, subscribes) - before
    check(commands <= 10, f"{n} mailboxes took {commands:.0f} SUBSCRIBE commands")
    check(metric(a, "wspush_bus_topics") >= n, f"bus topics {metric(a, 'wspush_bus_topics')}")
    body = "\n".join(json.dumps({"topic": f"box:{k}", "data": k}) for k in range(n)).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port(b)}/publish/batch", data=body)
    with urllib.request.urlopen(req, timeout=scaled(30)) as resp:
        results = json.loads(resp.read())["results"]
    check(all("id" in x for x in results), f"batch results: {[x for x in results if 'id' not in x][:3]}")
    got = await asyncio.gather(*[recv_json(ws, 30) for ws in socks])
    for k, e in enumerate(got):
        check(e.get("topic") == f"box:{k}" and e.get("data") == k and e.get("id") == results[k]["id"],
              f"box:{k} got {e}")
    await asyncio.gather(*[ws.close() for ws in socks])
    deadline = time.monotonic() + scaled(20)
    while metric(a, "wspush_bus_topics") >= n:
        check(time.monotonic() < deadline, "the node kept its mailboxes' channels after they closed")
        await asyncio.sleep(0.1)


class Publisher(threading.Thread):
    """Publishes data 1, 2, 3, ... to a topic through a node's admin API until stopped."""

    def __init__(self, node_: ServerProcess, topic: str):
        super().__init__(daemon=True)
        self.node, self.topic, self.n, self.ids = node_, topic, 0, {}
        self.stop_flag = threading.Event()
        self.errors = []

    def run(self) -> None:
        while not self.stop_flag.is_set():
            status, body = publish(self.node, self.topic, self.n + 1)
            if status != 200:
                self.errors.append((status, body))
                return
            self.n += 1
            self.ids[self.n] = body["id"]


async def resume_from_position(a: ServerProcess, b: ServerProcess) -> None:
    """A sub without since is given a position (a moment: the node's last mark); a client whose
    connection ended before the topic's first event resumes from it on the other node, and gets
    what was published meanwhile, once. A topic nothing was published to since is not lost;
    a moment Redis's clock has not reached is."""
    # Published before the sub, then two marks heard (a mark's millisecond may hold an event from
    # before it, which a resume brings): the position is past it.
    before = publish_ok(a, "pos:1", 0)
    marks = metric(a, "wspush_bus_marks_total")
    check(poll_until(lambda: metric(a, "wspush_bus_marks_total") >= marks + 2, scaled(10)), "node A heard no marks")
    wa = await connect(a)
    r = await subscribe(wa, ["pos:1", "pos:quiet"])
    at = r.get("at") or {}
    check(set(at) == {"pos:1", "pos:quiet"} and all(v.endswith("-18446744073709551615") for v in at.values()),
          f"subbed gave no positions: {r}")
    ms = lambda i: int(i.split(":")[1].split("-")[0])  # noqa: E731
    check(ms(at["pos:1"]) >= ms(before), f"the position {at['pos:1']} is not past {before}")
    await wa.close()
    ids = [publish_ok(a, "pos:1", n) for n in (1, 2)]
    wb = await connect(b)
    r = await subscribe(wb, ["pos:1", "pos:quiet"], since=at)
    check(r.get("lost") == [], f"a resume from the positions answered {r}")
    got = [await recv_json(wb) for _ in ids]
    check([(e["topic"], e["id"], e["data"]) for e in got] == [("pos:1", i, n) for i, n in zip(ids, (1, 2))],
          f"from the position: {got}, published {ids}")
    live = publish_ok(a, "pos:quiet", 3)
    e = await recv_json(wb)
    check(e.get("id") == live, f"live after the replay, nothing between: {e}")
    await wb.close()
    epoch, moment = at["pos:1"].split(":")
    ahead = f"{epoch}:{int(moment.split('-')[0]) + 10**9}-18446744073709551615"
    wb = await connect(b)
    r = await subscribe(wb, ["pos:1"], since={"pos:1": ahead})
    check(r.get("lost") == ["pos:1"], f"a moment Redis has not reached answered {r}")
    # Found lost, it has a position all the same: a resume from it is not told lost again.
    back = (r.get("at") or {}).get("pos:1")
    check(back is not None, f"a topic found lost has no position: {r}")
    await wb.close()
    wb = await connect(b)
    r = await subscribe(wb, ["pos:1"], since={"pos:1": back})
    check(r.get("lost") == [], f"a resume from the position given with lost answered {r}")
    await wb.close()


async def resume_on_other_node(a: ServerProcess, b: ServerProcess) -> None:
    pub = Publisher(a, "seam")
    wa = await connect(a)
    await subscribe(wa, ["seam"])
    pub.start()
    try:
        last = 0
        while last < 30:
            e = await recv_json(wa)
            check(e.get("data") == last + 1, f"live on A: {e} after {last}")
            last = e["data"]
        last_id = e["id"]
        await wa.close()
        deadline = time.monotonic() + scaled(60)
        while pub.n < last + 50:  # published while no one listened (the publisher's count, polled)
            check(pub.is_alive() and time.monotonic() < deadline,
                  f"the publisher stopped at {pub.n}: {pub.errors[:2]}")
            await asyncio.sleep(0.01)
        wb = await connect(b)
        r = await subscribe(wb, ["seam"], since={"seam": last_id})
        check(r.get("lost") == [], f"resume answered {r}")
        target = pub.n + 100
        while last < target:
            e = await recv_json(wb)
            check(e.get("data") == last + 1, f"after the resume on B: got {e.get('data')} after {last} (gap or duplicate)")
            last = e["data"]
        await wb.close()
    finally:
        pub.stop_flag.set()
        pub.join()
    check(not pub.errors, f"publisher: {pub.errors[:2]}")


async def unanswered_publish(rs: RedisServer, a: ServerProcess) -> None:
    """Redis stops answering (SIGSTOP) with an admin publish already sent to it. The publisher
    must not hear 503 (`unavailable`: nothing happened, retry) for it: Redis runs it once it
    resumes, and a retry would deliver it twice. It hears 504 (`timeout`: it may have been
    published), and the event does arrive."""
    ws = await connect(a)
    try:
        await subscribe(ws, ["unanswered"])
        os.kill(rs.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            status, body = await asyncio.to_thread(publish, a, "unanswered", {"k": 1})
            waited = time.monotonic() - t0
        finally:
            os.kill(rs.proc.pid, signal.SIGCONT)
        check(status == 504 and body.get("error") == "timeout",
              f"a publish Redis held unanswered was answered {status} {body} after {waited:.1f} s")
        e = await recv_json(ws, 20)
        check(e.get("topic") == "unanswered" and e.get("data") == {"k": 1}, f"the event after Redis resumed: {e}")
        check(metric(a, 'wspush_publishes_total{source="admin",result="timeout"}') == 1,
              "the unanswered publish is not counted as result=\"timeout\"")
        wait_ready(a, True)
        publish_ok(a, "unanswered", {"k": 2})
        e = await recv_json(ws)
        check(e.get("data") == {"k": 2}, f"a publish after Redis resumed: {e}")
    finally:
        await ws.close()


def check_running(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        out, err = proc.communicate()
        check(False, f"the load generator ended early (exit {proc.returncode}): {out} {err}")


def loadgen_resends_refused(args, rs: RedisServer, a: ServerProcess, b: ServerProcess) -> None:
    """The load generator publishes through node B's admin API while Redis goes away for a
    moment: the publishes B answers 503 (nothing published) are sent again with the same
    number, so the subscribers on node A see no gap and the run counts no loss."""
    loadgen = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.server))), "loadgen", "wspush-loadgen")
    check(os.access(loadgen, os.X_OK), f"no load generator at {loadgen}")
    ok = 'wspush_publishes_total{source="admin",result="ok"}'
    refused = 'wspush_publishes_total{source="admin",result="unavailable"}'
    ok0, refused0 = metric(b, ok), metric(b, refused)
    messages = 10  # 5 s of publishing at 2/s: Redis goes away after the first, while more are due
    proc = subprocess.Popen([loadgen, "fanout", "--url", f"ws://127.0.0.1:{a.port}/ws", "--admin",
                             f"http://127.0.0.1:{admin_port(b)}", "--connections", "20", "--messages", str(messages),
                             "--publish-rate", "2", "--topic", "lg-resend", "--hold", "0", "--json", "--quiet",
                             "--timeout", str(int(scaled(120))), "--drain-timeout", str(int(scaled(30)))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + scaled(30)
        while metric(b, ok) < ok0 + 1:   # publishing has begun
            check_running(proc)
            check(time.monotonic() < deadline, "the load generator did not publish")
            time.sleep(0.02)
        rs.kill()
        while metric(b, refused) < refused0 + 1:   # one was refused
            check_running(proc)
            check(time.monotonic() < deadline, "no publish refused with Redis gone")
            time.sleep(0.02)
        check_running(proc)
        rs.start()
        out, err = proc.communicate(timeout=scaled(180))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = next((l for l in reversed(out.splitlines()) if l.startswith("{")), None)
    check(line is not None, f"no JSON from the load generator (exit {proc.returncode}): {out} {err}")
    r = json.loads(line)
    c = r["counters"]
    check(c.get("publish_retries", 0) >= 1, f"no publish was sent again: {c}")
    check(proc.returncode == 0 and r["ok"] and r["loss"] == 0 and c["duplicates"] == 0
          and c["unique"] == c["expected"] == 20 * messages, f"after the resends: {r}")
    wait_ready(a, True)
    wait_ready(b, True)


async def redis_restart(rs: RedisServer, a: ServerProcess, b: ServerProcess) -> None:
    wa = await connect(a)
    await subscribe(wa, ["restart"])
    ids = [publish_ok(b, "restart", k) for k in (1, 2, 3)]
    for k in (1, 2, 3):
        check((await recv_json(wa)).get("data") == k, "before the restart")
    rs.kill()
    wait_ready(a, False)
    wait_ready(b, False)
    check(metric(a, "wspush_bus_up") == 0, "wspush_bus_up still 1 with Redis gone")
    status, body = publish(a, "restart", 99)
    check(status == 503, f"a publish with Redis gone answered {status} {body}")
    # A sub made meanwhile waits for Redis (held, not refused), and is answered once it is back.
    w2 = await connect(a)
    await w2.send(json.dumps({"op": "sub", "topics": ["other"]}))
    check(poll_until(lambda: metric(a, "wspush_bus_held_subs") == 1, scaled(10)),
          f"a sub with Redis gone is not held: wspush_bus_held_subs {metric(a, 'wspush_bus_held_subs')}")
    pong = await wa.ping()
    await asyncio.wait_for(pong, scaled(5))  # the connection stayed
    rs.start()
    wait_ready(a, True)
    wait_ready(b, True)
    check(metric(a, "wspush_bus_reconnects_total") >= 1, "no reconnect counted")
    e = await recv_json(w2, 20)
    check(no_positions(e) == {"op": "subbed", "topics": ["other"], "lost": []}, f"a sub held while Redis was gone: {e}")
    check(metric(a, "wspush_bus_held_subs") == 0, "a sub answered is still counted held")
    eid = publish_ok(b, "other", 5)
    e = await recv_json(w2)
    check(e == {"topic": "other", "id": eid, "data": 5}, f"the sub held through the restart got {e}")
    await w2.close()
    publish_ok(b, "restart", 4)
    e = await recv_json(wa)
    check(e.get("data") == 4, f"after the restart the subscriber got {e}")
    await wa.close()
    # The append-only file kept the stream: a resume from 1 gets 2, 3, 4.
    wb = await connect(b)
    r = await subscribe(wb, ["restart"], since={"restart": ids[0]})
    check(r.get("lost") == [], f"resume after the restart: {r}")
    got = [(await recv_json(wb)).get("data") for _ in range(3)]
    check(got == [2, 3, 4], f"replayed {got}")
    await wb.close()
    # Redis that lost its data: an id from before is answered lost.
    rs.command("FLUSHALL")
    wb = await connect(b)
    r = await subscribe(wb, ["restart"], since={"restart": ids[2]})
    check(r.get("lost") == ["restart"], f"an id from before the data was lost: {r}")
    await wb.close()


async def catch_up_after_cut(rs: RedisServer, a: ServerProcess, b: ServerProcess) -> None:
    """Redis cuts the nodes off and turns them away (their user, `default`, is switched off: a
    reconnect is answered NOAUTH) while a backend, as another user, publishes 2 and 3. Both are
    acknowledged before the nodes can be back, so node A's subscriber can only get them from the
    catch-up: replayed from the stream, each once, in order, and counted. The same for the first
    event ever of a topic (no event of it seen before the cut: caught up from the last mark)."""
    caught = "wspush_bus_catchup_events_total"
    rs.command("ACL", "SETUSER", "backend", "on", ">backend-pw", "~*", "&*", "+@all")
    r = redis.Redis(host="127.0.0.1", port=rs.port, username="backend", password="backend-pw",
                    decode_responses=True)
    reconnects = {s: metric(s, "wspush_bus_reconnects_total") for s in (a, b)}
    caught0 = metric(a, caught)
    lost0 = metric(a, "wspush_bus_lost_notices_total")
    wa = await connect(a)
    try:
        marks = metric(a, "wspush_bus_marks_total")
        await subscribe(wa, ["cut", "cut-first"])
        # A mark heard after the subscription: the node knows it has seen every event of
        # "cut-first" up to that moment (none), and catches it up from there after the cut. Two:
        # the first may have been on its way before the subscription was confirmed.
        check(poll_until(lambda: metric(a, "wspush_bus_marks_total") >= marks + 2, scaled(10)), "no mark heard")
        r.fcall("wspush_publish", 0, "cut", "1")
        check((await recv_json(wa)).get("data") == 1, "before the cut")
        r.execute_command("ACL", "SETUSER", "default", "off")
        try:
            check(r.execute_command("CLIENT", "KILL", "USER", "default") >= 4, "the nodes' connections were not cut")
            tried0 = r.info("stats")["total_connections_received"]
            wait_ready(a, False)
            missed = [r.fcall("wspush_publish", 0, "cut", str(k)) for k in (2, 3)]
            first = r.fcall("wspush_publish", 0, "cut-first", "10")  # its first event ever
            # The nodes try again meanwhile (two connections each) and are turned away: the link
            # is held down. (Which of its connections hears NOAUTH first is a race, so the node's
            # log may or may not say so; Redis's count of connections does.)
            deadline = time.monotonic() + scaled(30)
            while r.info("stats")["total_connections_received"] < tried0 + 4:
                check(time.monotonic() < deadline, "the nodes did not try to reconnect")
                await asyncio.sleep(0.05)
            check(readyz(a) == 503, "node A is ready with its user switched off")
        finally:
            r.execute_command("ACL", "SETUSER", "default", "on")
        wait_ready(a, True)
        got = [await recv_json(wa) for _ in range(3)]
        check([(e.get("id"), e.get("data")) for e in got if e.get("topic") == "cut"] == [(missed[0], 2), (missed[1], 3)]
              and [(e.get("id"), e.get("data")) for e in got if e.get("topic") == "cut-first"] == [(first, 10)],
              f"the subscriber that stayed got {got} after the cut")
        # The catch-up counts its events when it hands them on: polled until it has.
        deadline = time.monotonic() + scaled(20)
        while metric(a, caught) < caught0 + 3:
            check(time.monotonic() < deadline, f"{caught} went {caught0:.0f} -> {metric(a, caught):.0f}, not by 3")
            await asyncio.sleep(0.05)
        # Live again, and nothing came twice: the next event is the next publish.
        live = r.fcall("wspush_publish", 0, "cut", "4")
        e = await recv_json(wa)
        check(e.get("id") == live and e.get("data") == 4, f"after the catch-up: {e}")
        check(metric(a, caught) == caught0 + 3, f"{caught} went {caught0:.0f} -> {metric(a, caught):.0f}, not by 3")
        check(metric(a, "wspush_bus_lost_notices_total") == lost0, "a catch-up that covered everything announced a loss")
    finally:
        await wa.close()
        rs.command("ACL", "DELUSER", "backend")
        r.close()
    for s, before in reconnects.items():  # both nodes are back before the next step
        deadline = time.monotonic() + scaled(20)
        while metric(s, "wspush_bus_reconnects_total") <= before or readyz(s) != 200:
            check(time.monotonic() < deadline, "a node did not reconnect after the cut")
            await asyncio.sleep(0.05)


async def serves(c: ServerProcess, topic: str, what: str) -> None:
    """A subscriber of `topic` on node c gets what c's admin API publishes."""
    ws = await connect(c)
    await subscribe(ws, [topic])
    eid = publish_ok(c, topic, "hello")
    check((await recv_json(ws)).get("id") == eid, what)
    await ws.close()


async def unreachable_at_start(args) -> None:
    # A reserved port (outside the ephemeral range, locked against parallel tests): nothing
    # listens on it until this Redis starts there.
    port = reserve_port()
    c = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", f"redis://127.0.0.1:{port}", "--threads", "1"]).start()
    rs = RedisServer(port, persistent=False)
    try:
        c.wait_for_log(r"bus: cannot reach", scaled(10))
        check(readyz(c) == 503, "ready without Redis")
        rs.start()
        wait_ready(c, True)
        await serves(c, "late", "served once Redis appeared")
        check(not rs.crashed(), "redis-server crashed")
    finally:
        c.kill()
        rs.close()
    check(not c.crashed(), "node c crashed\n" + c.log_tail())


async def setup_refused_then_accepted(args) -> None:
    """A node whose set-up Redis refuses keeps trying, and comes up once Redis accepts it, with
    neither restarted. Here Redis's ACL does not yet allow functions: it answers the node's
    FUNCTION LOAD and FCALL with NOPERM and keeps the connection open, as it answers LOADING to
    a node that connects while it still loads its append-only file."""
    rs = RedisServer(persistent=False).start()
    rs.command("ACL", "SETUSER", "default", "-@scripting")
    c = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", rs.url, "--threads", "1"]).start()
    try:
        c.wait_for_log(r"bus: Redis refused the set-up", scaled(10))
        check(readyz(c) == 503, "ready with its set-up refused")
        rs.command("ACL", "SETUSER", "default", "+@all")
        wait_ready(c, True)
        await serves(c, "granted", "served once Redis took the set-up")
        check(not rs.crashed(), "redis-server crashed")
    finally:
        c.kill()
        rs.close()
    check(not c.crashed(), "node c crashed\n" + c.log_tail())


def listeners(port: int) -> int:
    """Sockets listening on 127.0.0.1:port (one per reactor thread of each --reuseport node)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                n += 1
    return n


async def sharing_one_port(args, rs: RedisServer) -> None:
    """Two processes with --reuseport on one port, each its own node with its own admin port."""
    port = reserve_port()  # both bind it: nobody else may take it in between
    nodes = [node(args, rs.url, extra=["--listen", f"127.0.0.1:{port}", "--reuseport", "--drain-seconds", "600"])
             for _ in range(2)]
    try:
        check(all(n.port == port for n in nodes), f"ports {[n.port for n in nodes]}")
        socks = await asyncio.gather(*[websockets.connect(f"ws://127.0.0.1:{port}/ws", ping_interval=None)
                                       for _ in range(200)])
        await asyncio.gather(*[subscribe(ws, ["port:shared"]) for ws in socks])
        per_node = [metric(n, 'wspush_connections{state="open"}') for n in nodes]
        check(all(c > 0 for c in per_node) and sum(per_node) == 200, f"the kernel spread them {per_node}")
        eid = publish_ok(nodes[0], "port:shared", "all")
        got = await asyncio.gather(*[recv_json(ws) for ws in socks])
        check(all(e.get("id") == eid for e in got), "every connection, on either process, got the publish")
        # A rolling restart: a node that drains must leave the port's group at once. Were its
        # socket still listening, the kernel would keep handing it about half of the new
        # connections, which would wait in its backlog, never accepted, for the whole drain.
        listening = listeners(port)
        nodes[0].signal(signal.SIGTERM)
        wait_ready(nodes[0], False)
        # /readyz says 503 from the signal on; the shards leave the group a moment later.
        deadline = time.monotonic() + scaled(10)
        while listeners(port) != listening // 2:
            check(time.monotonic() < deadline, f"{listeners(port)} sockets still listen on the port, "
                                               f"{listening // 2} expected once one node drains")
            time.sleep(0.02)
        before = metric(nodes[1], "wspush_connections_accepted_total")
        # Were any left in the draining node's backlog, its opening would hang for the drain's
        # 600 s: the timeout only turns that hang into a failure.
        fresh = await asyncio.gather(*[websockets.connect(f"ws://127.0.0.1:{port}/ws", ping_interval=None,
                                                          open_timeout=scaled(60)) for _ in range(100)])
        await asyncio.gather(*[subscribe(ws, ["port:shared"]) for ws in fresh])
        check(metric(nodes[1], "wspush_connections_accepted_total") - before == 100,
              "every connection opened during the drain went to the node still serving")
        check(nodes[0].proc.poll() is None, "the draining node is still draining (its 600 s window)")
        check(not nodes[1].crashed(), "the node still serving crashed\n" + nodes[1].log_tail())
        await asyncio.gather(*[ws.close() for ws in fresh])
        await asyncio.gather(*[ws.close() for ws in socks], return_exceptions=True)
    finally:
        for n in nodes:
            n.kill()


def bad_urls(args) -> None:
    for url in ("redis://", "http://127.0.0.1:6379", "redis://127.0.0.1:99999", "redis://:@127.0.0.1:1",
                "redis://127.0.0.1:6379/99", "redis://user@127.0.0.1", "redis://u:p%zz@127.0.0.1"):
        p = subprocess.run([args.server, "--auth=none", "--bus", url], capture_output=True, timeout=scaled(10))
        err = p.stderr.decode()
        check(p.returncode == 2 and "--bus" in err and "redis://" in err, f"{url}: exit {p.returncode}, {err!r}")


async def failover_through_nginx(a: ServerProcess, b: ServerProcess) -> None:
    if shutil.which("nginx") is None:
        raise AssertionError("nginx is needed (Debian package nginx-light)")
    shipped = open(os.path.join(ROOT, "deploy", "nginx", "wspush.conf")).read()
    port = reserve_port()  # nginx binds it later: nobody else may take it in between
    conf, n = re.subn(r"(?m)^    listen 80;$", f"    listen 127.0.0.1:{port};", shipped)
    check(n == 1, "the shipped config's listen line changed: update this test")
    conf, n = re.subn(r"(?m)^    server 127\.0\.0\.1:\d+ (max_fails=1 fail_timeout=5s;)\n", "", conf)
    check(n == 2, "the shipped config's upstream servers changed: update this test")
    servers = "".join(f"    server 127.0.0.1:{s.port} max_fails=1 fail_timeout=5s;\n" for s in (a, b))
    conf = conf.replace("    least_conn;\n", "    least_conn;\n" + servers)
    tmp = nginx_prefix(conf)
    t = subprocess.run(["nginx", "-t", "-p", tmp, "-c", f"{tmp}/nginx.conf"], capture_output=True)
    check(t.returncode == 0, f"nginx -t: {t.stderr.decode()}")
    proc = subprocess.Popen(["nginx", "-p", tmp, "-c", f"{tmp}/nginx.conf"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                check(time.monotonic() < deadline, "nginx did not listen")
                time.sleep(0.05)
        ws = await connect(a, port)
        await subscribe(ws, ["failover"])
        first = publish_ok(a, "failover", 1)
        check((await recv_json(ws)).get("id") == first, "through nginx")
        # Which node holds it: that one is killed.
        victim = a if metric(a, "wspush_subscriptions") >= 1 else b
        other = b if victim is a else a
        victim.kill()  # SIGKILL by PID
        try:
            await asyncio.wait_for(ws.recv(), scaled(10))
            raise AssertionError("the connection outlived its node")
        except websockets.ConnectionClosed:
            pass
        missed = [publish_ok(other, "failover", k) for k in (2, 3, 4)]
        ws = await connect(other, port)  # through nginx: only the live node answers
        r = await subscribe(ws, ["failover"], since={"failover": first})
        check(r.get("lost") == [], f"resume through nginx: {r}")
        got = [await recv_json(ws) for _ in range(3)]
        check([e.get("id") for e in got] == missed, f"replayed {got}")
        await ws.close()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main(args) -> None:
    rs = RedisServer().start()
    try:
        a = node(args, rs.url)
        b = node(args, rs.url)
        f = Findings()
        f.step("cross-node delivery both ways", lambda: asyncio.run(cross_node(a, b)))
        f.step("a backend publishing straight into Redis", lambda: asyncio.run(straight_into_redis(rs, a, b)))
        f.step("subbed means active in Redis", lambda: asyncio.run(subbed_means_active(rs, a)))
        f.step("a library an older node loaded, without the batch", lambda: asyncio.run(older_library(rs, a)))
        f.step("2,000 mailboxes: batched subscribes, a batch publish", lambda: asyncio.run(many_mailboxes(rs, a, b)))
        f.step("resume on the other node: no gap, no duplicate", lambda: asyncio.run(resume_on_other_node(a, b)))
        f.step("resume from subbed's position before any event", lambda: asyncio.run(resume_from_position(a, b)))
        f.step("a node cut off from Redis catches up its subscribers", lambda: asyncio.run(catch_up_after_cut(rs, a, b)))
        f.step("a publish Redis leaves unanswered is not called refused",
               lambda: asyncio.run(unanswered_publish(rs, a)))
        f.step("the load generator sends a refused publish again", loadgen_resends_refused, args, rs, a, b)
        f.step("Redis killed and restarted", lambda: asyncio.run(redis_restart(rs, a, b)))
        f.step("a node started with Redis unreachable", lambda: asyncio.run(unreachable_at_start(args)))
        f.step("a node whose set-up Redis refused comes up once Redis takes it",
               lambda: asyncio.run(setup_refused_then_accepted(args)))
        f.step("two processes sharing one port", lambda: asyncio.run(sharing_one_port(args, rs)))
        f.step("bad --bus URLs", bad_urls, args)
        f.step("a node killed behind nginx", lambda: asyncio.run(failover_through_nginx(a, b)))
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        check(not rs.crashed(), f"redis-server crashed (exit {rs.proc.returncode})")
        f.done()
    finally:
        rs.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
