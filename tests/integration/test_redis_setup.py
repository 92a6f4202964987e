#!/usr/bin/python3
"""How a node sets itself up on the Redis bus, and what a resume hears once Redis dropped history:
a real redis-server, wspush nodes on loopback, Python `websockets` clients and Debian's `redis`
client for what an operator or a backend does straight into Redis.

- AUTH and SELECT: a node given `redis://:PASSWORD@host:port/3` for a Redis with `requirepass`
  serves end to end, and everything it writes lands in database 3 (none in 0); the password is
  never in its log;
- a wrong password, none for a Redis that wants one, or one for a Redis that has none: the node
  logs Redis's refusal, stays unready (/readyz 503, `wspush_bus_up` 0, subs `unavailable`), keeps
  trying, and comes up by itself once the password is right;
- `lost` after Redis dropped part of a topic's stream: trimmed by count (`--history-size`,
  XTRIM MAXLEN), by id (XTRIM MINID), the key deleted or expired (an operator's PEXPIRE), also
  when a publish then writes it again (within the same millisecond too, and many times over: the
  new stream never issues again an id of the old one, and no key shared by all topics is kept for
  that), trimmed to nothing, or an entry XDELed: a resume from an id older than what the stream
  still holds names the topic in `lost` and still replays what is kept, in order, before what
  comes live;
- the sweep: no stream key has a TTL; with --history-ttl 1 one is deleted once the last id it
  issued is 2 s old and not sooner (also one whose newest entry was XDELed, and one read all the
  while), while one still published to stays, and a resume from a deleted one is `lost`; also
  under an LFU maxmemory-policy, where Redis keeps no idle time;
- a node set up while Redis answers `-LOADING` (reading its data set): unready while it loads,
  then it serves once the load ends, neither restarted nor given up.
- a `since` of the right epoch whose stream id Redis cannot read (`<epoch>:99999999999999999999-0`)
  is the client's error: `bad_request` naming that topic, decided before Redis is asked, and the
  connection goes on; a replay Redis refuses (the topic's stream key holds a string) is answered
  `unavailable`; either way, subs that also resumed 31 topics of 100 × 16 KB events leave nothing
  behind once their connections closed (the node's RSS comes back to within a few MB).
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request

import redis
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, TestFailure, admin_port, arg_parser, check, gauge_sum,  # noqa: E402
                         metric, no_positions, poll_until, publish, publish_ok, recv_json, rss_bounds_checked,
                         run_main, scaled, subscribe, rss_mb)


# ---- helpers --------------------------------------------------------------------------------------

def start_node(args, bus_url: str, extra=()) -> ServerProcess:
    """A pubsub node on the Redis bus, not waited ready (some steps start it against a Redis that
    refuses it)."""
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", bus_url, "--threads", "2", *extra]).start()


def readyz(s: ServerProcess) -> "tuple[int, str]":
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port(s)}/readyz", timeout=scaled(5)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(s: ServerProcess, seconds: float = 30) -> None:
    # The node retries with a backoff of up to 5 s: a generous deadline that only stops a hang.
    deadline = time.monotonic() + scaled(seconds)
    while readyz(s)[0] != 200:
        check(s.alive(), "the node exited while waiting to come up\n" + s.log_tail())
        check(time.monotonic() < deadline, f"/readyz did not become 200 within {scaled(seconds):.0f}s\n"
              + s.log_tail())
        time.sleep(0.05)


async def connect(s: ServerProcess, **options):
    return await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None, **options)


async def serves(s: ServerProcess, topic: str, what: str) -> None:
    """A subscriber of `topic` gets what the node's admin API publishes."""
    ws = await connect(s)
    try:
        await subscribe(ws, [topic])
        eid = publish_ok(s, topic, "hello")
        e = await recv_json(ws)
        check(e == {"topic": topic, "id": eid, "data": "hello"}, f"{what}: got {e}")
    finally:
        await ws.close()


async def refuses_while_unready(s: ServerProcess, what: str) -> None:
    """What a node whose bus is not up answers: /readyz 503 bus_down, bus_up 0, admin publish
    503; a client's sub waits for Redis (held; the connection itself is served). A held
    connection reads nothing until its sub is answered (messages are handled in order), so the
    client does not wait for the close handshake here."""
    status, body = readyz(s)
    doc = json.loads(body)
    # The reason names the Redis and what went wrong with it (refused, unreachable, loading...).
    check(status == 503 and doc.get("status") == "bus_down" and "redis://" in doc.get("reason", ""),
          f"{what}: /readyz answered {status} {body}")
    check(metric(s, "wspush_bus_up") == 0, f"{what}: wspush_bus_up is not 0")
    status, body = publish(s, "refused", 1)
    check(status == 503, f"{what}: an admin publish answered {status} {body}")
    held = metric(s, "wspush_bus_held_subs")
    ws = await connect(s, close_timeout=0.1)
    try:
        await ws.send(json.dumps({"op": "sub", "topics": ["refused"]}))
        check(poll_until(lambda: metric(s, "wspush_bus_held_subs") == held + 1, scaled(10)),
              f"{what}: a sub is not held (wspush_bus_held_subs {metric(s, 'wspush_bus_held_subs')})")
    finally:
        await ws.close()


def refusal_logged(s: ServerProcess, error: str, what: str) -> None:
    """The node logs Redis's own refusal and that it tries again. Which of its two connections
    hears it first decides the wording: the command connection's set-up says "Redis refused the
    set-up: <error>; trying again", the subscriber connection (closed by the node on an error
    nobody asked for) "cannot reach <url> (<error>); retrying"."""
    s.wait_for_log(rf"bus: (Redis refused the set-up: {error}.*; trying again|cannot reach redis://\S+ "
                   rf"\((Redis refused the set-up: )?{error}.*\); retrying)", scaled(15), what=what)


def no_secret_in_log(s: ServerProcess, password: str) -> None:
    leaked = s.log_lines(password)
    check(not leaked, f"the Redis password is in the node's log: {leaked[:2]}")


def auth_failures(rs: RedisServer) -> int:
    """Failed AUTH attempts Redis recorded (ACL LOG groups the same failure and counts it)."""
    total = 0
    for entry in rs.command("ACL", "LOG") or []:
        f = dict(zip(entry[::2], entry[1::2]))
        if f.get("reason") == "auth":
            total += int(f.get("count", 0))
    return total


def resp(password=None, db=0, port=0) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, password=password, db=db, decode_responses=True,
                       socket_timeout=scaled(10))


# ---- AUTH and SELECT ------------------------------------------------------------------------------

async def auth_and_select(args) -> None:
    password = "pw-" + secrets.token_hex(8)
    rs = RedisServer(persistent=False, password=password).start()
    s = start_node(args, f"redis://:{password}@127.0.0.1:{rs.port}/3")
    try:
        wait_ready(s)
        s.wait_for_log(rf"bus: connected to redis://:\*\*\*@127\.0\.0\.1:{rs.port}/3 ", scaled(10),
                       what="the 'bus: connected' line naming database 3, password masked")
        await serves(s, "authed", "a publish through the node")
        # A backend in database 3 reaches the node's subscribers; the node reads its history there.
        r3, r0 = resp(password, 3, rs.port), resp(password, 0, rs.port)
        ws = await connect(s)
        try:
            await subscribe(ws, ["backend"])
            first = r3.fcall("wspush_publish", 0, "backend", '"one"')
            e = await recv_json(ws)
            check(e == {"topic": "backend", "id": first, "data": "one"}, f"a backend publish in db 3 came as {e}")
            second = r3.fcall("wspush_publish", 0, "backend", '"two"')
            check((await recv_json(ws)).get("id") == second, "the second backend publish")
        finally:
            await ws.close()
        ws = await connect(s)
        try:
            r = await subscribe(ws, ["backend"], since={"backend": first})
            check(r.get("lost") == [], f"a resume from db 3's stream: {r}")
            e = await recv_json(ws)
            check(e == {"topic": "backend", "id": second, "data": "two"}, f"replayed from db 3: {e}")
        finally:
            await ws.close()
        # Every key the node and its functions wrote is in database 3, none in 0.
        for key in ("wspush:epoch", "wspush:config", "wspush:stream:authed", "wspush:stream:backend"):
            check(r3.exists(key) == 1, f"{key} is not in database 3")
        check(r0.dbsize() == 0, f"database 0 holds {r0.dbsize()} keys: {r0.keys('*')[:5]}")
        keyspace = r0.info("keyspace")
        check(set(keyspace) == {"db3"}, f"INFO keyspace: {keyspace}")
        check(r3.hget("wspush:config", "maxlen") is not None, "the node's history limits are not in database 3")
        no_secret_in_log(s, password)
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def wrong_password(args) -> None:
    """A wrong password: Redis's refusal is logged, the node stays unready and keeps trying (each
    try an AUTH Redis records), and it comes up by itself once Redis takes that password."""
    right, wrong = "right-" + secrets.token_hex(6), "wrong-" + secrets.token_hex(6)
    rs = RedisServer(persistent=False, password=right).start()
    s = start_node(args, f"redis://:{wrong}@127.0.0.1:{rs.port}")
    try:
        # Both connections read their AUTH's answer: the refusal is WRONGPASS, said plainly (not
        # the NOAUTH the subscriber connection's SUBSCRIBE gets after it).
        refusal_logged(s, r"WRONGPASS invalid username-password pair.*the user name or password is wrong",
                       "the refusal of the wrong password")
        await refuses_while_unready(s, "with a wrong password")
        # It keeps trying: Redis sees AUTH after AUTH (no spin check here: only that it goes on).
        seen = auth_failures(rs)
        check(seen >= 1, "Redis recorded no failed AUTH")
        deadline = time.monotonic() + scaled(30)
        while auth_failures(rs) < seen + 2:
            check(s.alive(), "the node exited after its password was refused\n" + s.log_tail())
            check(time.monotonic() < deadline, f"the node stopped trying: {auth_failures(rs)} failed AUTH "
                                               f"after {seen}\n" + s.log_tail())
            time.sleep(0.1)
        check(readyz(s)[0] == 503, "ready with its password refused")
        # Redis now takes the node's password: it comes up without a restart.
        rs.command("CONFIG", "SET", "requirepass", wrong)
        rs.password = wrong
        wait_ready(s)
        await serves(s, "password-fixed", "served once its password was right")
        no_secret_in_log(s, wrong)
        no_secret_in_log(s, right)
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def password_mismatch(args) -> None:
    """No password for a Redis that wants one, and one for a Redis that has none: refused and
    said so, not up."""
    rs = RedisServer(persistent=False, password="pw-" + secrets.token_hex(6)).start()
    s = start_node(args, rs.url)
    try:
        # Redis refuses an unauthenticated client with NOAUTH, or, when the set-up's function
        # (over 16 KB) arrives in the same read as its first command, with a protocol error on
        # that bulk length: which one depends on how TCP delivered the pipelined set-up.
        refusal_logged(s, r"(NOAUTH Authentication required|ERR Protocol error: unauthenticated bulk length).*"
                          r"Redis wants a password", "the refusal of a node without a password, said plainly")
        await refuses_while_unready(s, "without a password")
    finally:
        s.kill()
        rs.close()
    rs = RedisServer(persistent=False).start()
    password = "pw-" + secrets.token_hex(6)
    s = start_node(args, f"redis://:{password}@127.0.0.1:{rs.port}")
    try:
        refusal_logged(s, r"ERR AUTH <password> called without any password configured",
                       "the refusal of a password Redis has not")
        await refuses_while_unready(s, "with a password Redis has not")
        # Redis runs what follows the refused AUTH (as the default user, which needs no
        # password): the node must not count those answers as a set-up, not even while the link
        # closes. Two tries more (two connections each), and never "connected".
        r = resp(port=rs.port)
        tried = r.info("stats")["total_connections_received"]
        deadline = time.monotonic() + scaled(20)
        while r.info("stats")["total_connections_received"] < tried + 4:
            check(time.monotonic() < deadline and s.alive(), "the node did not try again\n" + s.log_tail())
            await asyncio.sleep(0.05)
        up = s.log_lines("bus: connected to")
        check(not up, f"with a password Redis has not, the bus said it was up: {up[:1]}")
        no_secret_in_log(s, password)
    finally:
        s.kill()
        rs.close()


# ---- lost after Redis dropped history -------------------------------------------------------------

async def resume(s: ServerProcess, topics, since: dict) -> "tuple[websockets.WebSocketClientProtocol, dict]":
    ws = await connect(s)
    return ws, await subscribe(ws, topics, since=since)


async def expect_events(ws, expected: "list[tuple[str, str, object]]", what: str) -> None:
    """The next events are exactly `expected` [(topic, id, data)], in order."""
    got = []
    for _ in expected:
        e = await recv_json(ws)
        got.append((e.get("topic"), e.get("id"), e.get("data")))
    check(got == expected, f"{what}: got {got}, expected {expected}")


async def lost_after_trim(args) -> None:
    rs = RedisServer(persistent=False).start()
    r = resp(port=rs.port)
    s = start_node(args, rs.url, extra=["--history-size", "4"])
    try:
        wait_ready(s)
        stream = "wspush:stream:trim"

        def pub(topic: str, n: int) -> "tuple[str, str, int]":
            return topic, publish_ok(s, topic, n), n

        ev = {n: pub("trim", n) for n in range(1, 7)}   # --history-size 4: the stream keeps 3..6
        check(r.xlen(stream) == 4, f"the stream holds {r.xlen(stream)} entries, 4 expected")
        intact = [pub("intact", n) for n in (1, 2)]

        # Trimmed by count at publish (XADD MAXLEN): 2 was dropped after 1.
        ws, reply = await resume(s, ["trim", "intact"], {"trim": ev[1][1], "intact": intact[0][1]})
        check(reply.get("lost") == ["trim"], f"resume from 1 after MAXLEN kept 3..6: {reply}")
        await expect_events(ws, [ev[3], ev[4], ev[5], ev[6], intact[1]], "replay of what the streams keep")
        ev[7] = pub("trim", 7)   # live, behind the replay
        await expect_events(ws, [ev[7]], "live after the replay")
        await ws.close()
        # The stream keeps 4..7: nothing after 4 was dropped, not lost.
        ws, reply = await resume(s, ["trim"], {"trim": ev[4][1]})
        check(reply.get("lost") == [], f"resume from 4 (kept): {reply}")
        await expect_events(ws, [ev[5], ev[6], ev[7]], "replay from 4")
        await ws.close()

        # XTRIM MAXLEN by hand (an operator, say): of 4..7, 4 and 5 go.
        check(r.xtrim(stream, maxlen=2, approximate=False) == 2, "XTRIM MAXLEN 2 did not remove 2 entries (4, 5 of 4..7)")
        ws, reply = await resume(s, ["trim"], {"trim": ev[4][1]})
        check(reply.get("lost") == ["trim"], f"resume from 4 after XTRIM MAXLEN kept 6..7: {reply}")
        await expect_events(ws, [ev[6], ev[7]], "replay after XTRIM MAXLEN")
        await ws.close()

        # XTRIM MINID: everything older than 7 goes.
        minid = ev[7][1].split(":", 1)[1]
        check(r.xtrim(stream, minid=minid, approximate=False) == 1, "XTRIM MINID removed other than 1 entry (6)")
        ws, reply = await resume(s, ["trim"], {"trim": ev[5][1]})
        check(reply.get("lost") == ["trim"], f"resume from 5 after XTRIM MINID kept 7: {reply}")
        await expect_events(ws, [ev[7]], "replay after XTRIM MINID")
        ev[8] = pub("trim", 8)
        await expect_events(ws, [ev[8]], "live after the replay")
        await ws.close()

        # The key deleted: lost, nothing to replay; the next event is a new publish.
        check(r.delete(stream) == 1, "DEL found no stream")
        ws, reply = await resume(s, ["trim"], {"trim": ev[8][1]})
        check(reply.get("lost") == ["trim"], f"resume after the stream was deleted: {reply}")
        fence = pub("trim", 9)
        await expect_events(ws, [fence], "nothing replayed from a deleted stream")
        await ws.close()

        # The key expired (an operator's PEXPIRE: wspush sets none, its sweep deletes the key).
        exp = [pub("expiring", n) for n in (1, 2, 3)]
        check(r.pexpire("wspush:stream:expiring", 1), "PEXPIRE found no stream")
        deadline = time.monotonic() + scaled(10)
        while r.exists("wspush:stream:expiring"):
            check(time.monotonic() < deadline, "the stream did not expire")
            time.sleep(0.01)
        ws, reply = await resume(s, ["expiring", "intact"], {"expiring": exp[0][1], "intact": intact[1][1]})
        check(reply.get("lost") == ["expiring"], f"resume after the stream expired: {reply}")
        fence = pub("expiring", 4)
        await expect_events(ws, [fence], "nothing replayed from an expired stream")
        await ws.close()
        # ... and written again by that publish: an id of its earlier life is still lost.
        ws, reply = await resume(s, ["expiring"], {"expiring": exp[1][1]})
        check(reply.get("lost") == ["expiring"], f"resume from 2 after the stream expired and 4 wrote it again: {reply}")
        await expect_events(ws, [fence], "the new stream replayed")
        await ws.close()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def on_a_node(args, steps, extra=(), redis_extra=()) -> None:
    """Runs `steps(s, r, pub)` against a fresh Redis (given `redis_extra`) and a node on it
    (--history-size 4, `extra`)."""
    rs = RedisServer(persistent=False, extra=redis_extra).start()
    r = resp(port=rs.port)
    s = start_node(args, rs.url, extra=["--history-size", "4", *extra])
    try:
        wait_ready(s)

        def pub(topic: str, n) -> "tuple[str, str, object]":
            return topic, publish_ok(s, topic, n), n

        await steps(s, r, pub)
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def swept(s: ServerProcess, r: redis.Redis, pub) -> None:
    """--history-ttl 1: no stream key has a TTL; the sweep (a step with each node's mark, about
    once a second) deletes a stream once the last id it issued is 2 s old and not sooner (Redis's
    own clock, read with the keys' existence in one MULTI): one published to once; one whose
    newest entry was XDELed (2 s after the id it issued last, not after the entry it still holds);
    one read every 100 ms (its idle time never grows: a pass in four reads every stream). One
    published to every 100 ms stays. A resume from an id of a swept one is lost."""
    def stream_ms(event_id: str) -> int:
        return int(event_id.split(":", 1)[1].split("-")[0])

    def redis_ms() -> int:
        sec, us = r.time()
        return sec * 1000 + us // 1000

    gone, read, first = pub("swept", 1), pub("read", 1), pub("xdel", 1)
    check(r.pttl("wspush:stream:swept") == -1, f"the stream has a TTL: {r.pttl('wspush:stream:swept')} ms")
    # The XDELed entry 1.2 s after the one kept: swept by the kept one's age, it would go 0.8 s early.
    check(poll_until(lambda: redis_ms() >= stream_ms(first[1]) + 1200, scaled(10)), "Redis's clock stood still")
    deleted = pub("xdel", 2)
    check(r.xdel("wspush:stream:xdel", deleted[1].split(":", 1)[1]) == 1, "XDEL removed no entry")
    last = {"swept": stream_ms(gone[1]), "read": stream_ms(read[1]), "xdel": stream_ms(deleted[1])}
    deadline = time.monotonic() + scaled(30)
    n = 0
    while last:
        n += 1
        pub("kept", n)
        r.xlen("wspush:stream:read")  # read, not written: its idle time starts again
        p = r.pipeline(transaction=True)
        p.time()
        for topic in last:
            p.exists(f"wspush:stream:{topic}")
        (sec, us), *exists = p.execute()
        now_ms = sec * 1000 + us // 1000
        for topic, there in zip(list(last), exists):
            if not there:
                check(now_ms >= last[topic] + 2000,
                      f"{topic}: swept {now_ms - last[topic]} ms after the last id it issued, before 2 x --history-ttl")
                del last[topic]
        check(time.monotonic() < deadline, f"still there: {sorted(last)}")
        await asyncio.sleep(0.1)  # a key's deletion has no event to wait on
    check(r.exists("wspush:stream:kept") == 1, "a stream published to every 100 ms was swept")
    check(r.pttl("wspush:stream:kept") == -1, f"the stream has a TTL: {r.pttl('wspush:stream:kept')} ms")
    ws, reply = await resume(s, ["swept"], {"swept": gone[1]})
    check(reply.get("lost") == ["swept"], f"resume from the swept stream's event: {reply}")
    await ws.close()


async def written_again(s: ServerProcess, r: redis.Redis, pub) -> None:
    """A stream key deleted and then written again by a publish: every id of its earlier life
    is answered lost (its events after that id went with the key), and the new stream's events
    are replayed."""
    ev = {n: pub("again", n) for n in range(1, 6)}
    check(r.delete("wspush:stream:again") == 1, "DEL found no stream")
    ev[6] = pub("again", 6)
    ws, reply = await resume(s, ["again"], {"again": ev[2][1]})
    check(reply.get("lost") == ["again"], f"resume from 2 after DEL and a publish of 6: {reply}")
    ev[7] = pub("again", 7)
    await expect_events(ws, [ev[6], ev[7]], "the new stream replayed, then live")
    await ws.close()
    # Within one millisecond (a backend's transaction): the new life must not issue again an id
    # of the old one, or a resume from that id looks current and hides what followed it.
    p = r.pipeline(transaction=True)
    for n in range(1, 6):
        p.fcall("wspush_publish", 0, "burst", json.dumps(n))
    p.delete("wspush:stream:burst")
    p.fcall("wspush_publish", 0, "burst", json.dumps(6))
    out = p.execute()
    old, six = out[:5], ("burst", out[6], 6)
    check(six[1] not in old, f"the new stream issued again an id of the old one: {out}")
    kept = [six]   # the new stream: 6, then each step's fence (--history-size 4 keeps the last 4)
    for n, since in enumerate(old, 1):
        ws, reply = await resume(s, ["burst"], {"burst": since})
        check(reply.get("lost") == ["burst"], f"resume from {n} of a stream deleted and written again "
                                              f"in one transaction ({out}): {reply}")
        replayed = kept[-4:]
        kept.append(pub("burst", f"fence {n}"))
        await expect_events(ws, replayed + kept[-1:], f"resume from {n}: the new stream replayed, then live")
        await ws.close()
    # Many lives of one key in one transaction (a few milliseconds): each starts above every id
    # of the one before, with no key shared by all topics kept for it (the epoch and the config
    # are the only ones a publish reads; the sweep's cursor is the marks' own).
    p = r.pipeline(transaction=True)
    for life in range(40):
        for n in range(3):
            p.fcall("wspush_publish", 0, "lives", json.dumps(n))
        p.delete("wspush:stream:lives")
    ids = [x.split(":", 1)[1] if isinstance(x, str) else x.decode().split(":", 1)[1]
           for x in p.execute() if not isinstance(x, int)]
    seq = [tuple(int(v) for v in i.split("-")) for i in ids]
    check(seq == sorted(set(seq)) and len(seq) == 120, f"40 lives of one key issued ids not always increasing: {ids}")
    shared = {k.decode() if isinstance(k, bytes) else k for k in r.scan_iter("wspush:*")}
    shared = {k for k in shared if not k.startswith("wspush:stream:")}
    check(shared <= {"wspush:epoch", "wspush:config", "wspush:sweep"}, f"keys shared by all topics: {sorted(shared)}")


async def emptied_and_xdel(s: ServerProcess, r: redis.Redis, pub) -> None:
    """A stream trimmed to nothing (as --history-size 0 keeps it), and one entry removed with
    XDEL: an id before what went is lost, the id of what went last is not."""
    ev = {n: pub("emptied", n) for n in range(1, 4)}
    check(r.xtrim("wspush:stream:emptied", maxlen=0, approximate=False) == 3, "XTRIM MAXLEN 0 did not remove 3")
    ws, reply = await resume(s, ["emptied"], {"emptied": ev[1][1]})
    check(reply.get("lost") == ["emptied"], f"resume from 1 of a stream trimmed to nothing: {reply}")
    ev[4] = pub("emptied", 4)
    await expect_events(ws, [ev[4]], "nothing replayed from an empty stream, then live")
    await ws.close()
    check(r.xtrim("wspush:stream:emptied", maxlen=0, approximate=False) == 1, "XTRIM MAXLEN 0 did not remove 4")
    ws, reply = await resume(s, ["emptied"], {"emptied": ev[4][1]})
    check(reply.get("lost") == [], f"resume from 4, the last issued, of an empty stream: {reply}")
    await ws.close()

    ev = {n: pub("xdel", n) for n in range(1, 5)}
    check(r.xdel("wspush:stream:xdel", ev[3][1].split(":", 1)[1]) == 1, "XDEL removed nothing")
    ws, reply = await resume(s, ["xdel"], {"xdel": ev[1][1]})
    check(reply.get("lost") == ["xdel"], f"resume from 1 after 3 was XDELed: {reply}")
    await expect_events(ws, [ev[2], ev[4]], "what the stream keeps after 1")
    await ws.close()
    ws, reply = await resume(s, ["xdel"], {"xdel": ev[3][1]})
    check(reply.get("lost") == [], f"resume from 3, the one XDELed: {reply}")
    await expect_events(ws, [ev[4]], "what the stream keeps after 3")
    await ws.close()


# ---- LOADING --------------------------------------------------------------------------------------


async def settled_rss(s: ServerProcess, seconds: float = 3) -> float:
    """The node's RSS once every connection is gone (a client's close does not end the node's
    side at once: it may still be writing to it) and it stopped falling (what they held is
    given back)."""
    deadline = time.monotonic() + scaled(60)  # a hang guard: the close timeout ends them all
    while gauge_sum(admin_port(s), "wspush_connections") > 0:
        check(time.monotonic() < deadline, "the node still holds connections its clients closed")
        await asyncio.sleep(0.1)  # polling a gauge: there is no event to wait on
    last = rss_mb(s.proc.pid)
    deadline = time.monotonic() + scaled(seconds)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = rss_mb(s.proc.pid)
        if abs(now - last) < 0.5:
            return now
        last = now
    return last


async def close_quietly(ws) -> None:
    """Closes a client the node may still be writing megabytes to: its close frame may come
    late or never (the node closed it as a slow consumer), which is no failure here."""
    try:
        await ws.close()
    except websockets.ConnectionClosed:
        pass


async def bad_since(args) -> None:
    rs = RedisServer(persistent=False).start()
    r = resp(port=rs.port)
    # A paced replay Redis refuses ends in a 1013 queued behind the megabytes still unsent, and
    # the close timeout runs from then: four Python clients read at once on a loaded machine
    # were seen to need more than the default 5 s to reach it (then the node drops them, and
    # the code is not heard). The close timeout is not what this step checks.
    s = start_node(args, rs.url, extra=["--close-timeout", "60"])
    try:
        wait_ready(s)
        epoch = publish_ok(s, "fence", 0).split(":")[0]
        publish_ok(s, "bad", 0)  # a stream Redis reads the bad id against (none: answered lost)
        topics = [f"big{k}" for k in range(31)]
        blob = json.dumps("x" * 8192)
        pipe = r.pipeline(transaction=False)
        for n in range(25):
            for t in topics:
                pipe.fcall("wspush_publish", 0, t, blob)
        pipe.execute()  # 6 MB per resume of all 31 topics
        far_back = {t: f"{epoch}:1-0" for t in topics}
        bad_id = f"{epoch}:99999999999999999999-0"
        r.set("wspush:stream:refused", "not a stream")  # its replay fails in Redis (WRONGTYPE)

        problems = []  # every finding, so that a failing run still shows the memory figures

        def soft(ok: bool, what: str) -> None:
            if not ok:
                problems.append(what)

        # The bad id: the client's error, for that topic; the connection goes on.
        ws = await connect(s)
        await ws.send(json.dumps({"op": "sub", "topics": ["fence", "bad"], "since": {"fence": f"{epoch}:1-0",
                                                                                      "bad": bad_id}}))
        e = await recv_json(ws)
        soft(e == {"op": "error", "code": "bad_request", "topic": "bad"}, f"a bad since answered {e}")
        # The largest id Redis can hold is well formed, and never issued: lost, nothing replayed.
        top = f"{epoch}:18446744073709551615-18446744073709551615"
        got = await subscribe(ws, ["after", "bad"], {"bad": top})
        soft(no_positions(got) == {"op": "subbed", "topics": ["after", "bad"], "lost": ["bad"]}, f"a sub since {top} answered {got}")
        publish_ok(s, "after", 1)
        e = await recv_json(ws)
        check(e.get("topic") == "after" and e.get("data") == 1, f"the connection after a bad since got {e}")
        await ws.close()

        # Warm-up: 4 good resumes of every topic at once, as the attacks below (the allocator
        # and the pools find their size), closed behind their answer; then the baseline. The
        # client takes in all of its replay (no queue bound), so that its close is answered.
        conns = []
        for _ in range(4):
            ws = await connect(s, max_queue=None)
            await ws.send(json.dumps({"op": "sub", "topics": topics, "since": far_back}))
            conns.append(ws)
        for ws in conns:
            try:
                got = await recv_json(ws, 30)
                check(got.get("op") == "subbed", f"a good resume answered {got}")
            except websockets.ConnectionClosed:
                pass
            await close_quietly(ws)
        before = await settled_rss(s)

        async def attack(bad_topic: str, since: str, code: str) -> None:
            conns = []
            for _ in range(4):
                ws = await connect(s)
                await ws.send(json.dumps({"op": "sub", "topics": topics + [bad_topic],
                                          "since": {**far_back, bad_topic: since}}))
                conns.append(ws)
            async def answer(ws) -> None:
                e = await recv_json(ws, 30)
                if e.get("op") == "subbed" and code == "unavailable":
                    # A replay longer than a page is paced: `subbed` went with its first page, so
                    # a later page Redis refuses closes the connection (1013: resume from what
                    # came). All four read at once, within the node's close timeout.
                    try:
                        while True:
                            await recv_json(ws, 30)
                    except websockets.ConnectionClosed as closed:
                        soft(closed.rcvd is not None and closed.rcvd.code == 1013,
                             f"a paced sub with {bad_topic}={since!r} was closed with {closed.rcvd}")
                    return
                soft(e.get("op") == "error" and e.get("code") == code and e.get("topic") in (bad_topic, topics[0]),
                     f"a sub with {bad_topic}={since!r} answered {e}")

            await asyncio.gather(*(answer(ws) for ws in conns))
            for ws in conns:
                await close_quietly(ws)
            # Nothing of them stays in the bus: every sub under way was answered or withdrawn.
            soft(poll_until(lambda: metric(s, "wspush_bus_pending") == 0, scaled(20)),
                 f"after subs with {bad_topic}={since!r} the bus still works on "
                 f"{metric(s, 'wspush_bus_pending')} subs whose connections closed")

        await attack("bad", bad_id, "bad_request")
        after_bad = await settled_rss(s)
        await attack("refused", f"{epoch}:1-0", "unavailable")
        after_refused = await settled_rss(s)
        print(f"  RSS {before:.1f} MB before, {after_bad:.1f} MB after 4 bad ids, "
              f"{after_refused:.1f} MB after 4 replays Redis refused", file=sys.stderr)
        # Before the fix each round kept the other topics' replayed events: 4 x 6 MB, never
        # given back (and the bus's pending count stayed at 4).
        soft(not rss_bounds_checked() or after_bad - before < 12, f"4 subs with a bad since kept {after_bad - before:.1f} MB "
              f"({before:.1f} -> {after_bad:.1f} MB) after their connections closed")
        soft(not rss_bounds_checked() or after_refused - before < 12, f"4 subs whose replay Redis refused kept {after_refused - before:.1f} MB "
              f"({before:.1f} -> {after_refused:.1f} MB) after their connections closed")
        await serves(s, "still", "the node after the bad subs")
        check(not s.crashed(), "the node crashed")
        check(not problems, "; ".join(problems))
    finally:
        s.kill()
        rs.close()


def wait_loading(rs: RedisServer, seconds: float = 30) -> None:
    """Until redis-server answers -LOADING (it refuses connections before it listens)."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        check(rs.proc.poll() is None, f"redis-server exited with {rs.proc.returncode}")
        try:
            answer = rs.command("PING")
            raise TestFailure(f"redis-server answered PING with {answer!r} instead of -LOADING")
        except OSError:
            pass
        except RuntimeError as exc:
            if str(exc).startswith("LOADING"):
                return
            raise TestFailure(f"redis-server answered PING with -{exc}") from None
        check(time.monotonic() < deadline, "redis-server did not start loading")
        time.sleep(0.05)  # nothing to await: it prints nothing at --loglevel warning


async def set_up_while_loading(args) -> None:
    """Redis restarted with a data set it reads slowly (key-load-delay: microseconds per key, and
    it answers clients between keys), so it says -LOADING for minutes unless told to go on: the
    node starts then, and the load is ended by the test, not by a clock."""
    rs = RedisServer(persistent=False).start()
    s = None
    try:
        r = resp(port=rs.port)
        pipe = r.pipeline(transaction=False)
        keys = 10000
        for k in range(keys):
            pipe.set(f"filler:{k}", os.urandom(512).hex())   # incompressible: about one key per read
        pipe.execute()
        check(r.save(), "SAVE failed")
        r.close()
        rs.kill()
        rs.extra = ["--key-load-delay", "20000", "--loading-process-events-interval-bytes", "1024"]
        rs.start(wait=False)
        wait_loading(rs)
        s = start_node(args, rs.url)
        refusal_logged(s, r"LOADING Redis is loading the dataset", "the node's set-up refused with LOADING")
        check(rs.command("INFO", "persistence").count("loading:1") == 1, "Redis is no longer loading")
        await refuses_while_unready(s, "while Redis loads")
        rs.command("CONFIG", "SET", "key-load-delay", "0")
        rs.wait_ready(scaled(60))
        wait_ready(s)
        await serves(s, "after-loading", "served once Redis had loaded")
        check(resp(port=rs.port).dbsize() >= keys, "Redis lost its data set")
        check(not s.crashed(), "the node crashed")
        check(metric(s, "wspush_bus_reconnects_total") == 0, "its first connection is counted as a reconnect")
    finally:
        if s is not None:
            s.kill()
        rs.close()


async def lost_after_empty_restart(args) -> None:
    """Redis restarts without its data (a new epoch): the subscribers that stayed hear
    {"op":"lost"} for every topic, the one with events and the one without, then live events."""
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs.url)
    try:
        wait_ready(s)
        ws = await connect(s)
        await subscribe(ws, ["gone", "quiet"])
        eid = publish_ok(s, "gone", 1)
        check(await recv_json(ws) == {"topic": "gone", "id": eid, "data": 1}, "before the restart")
        rs.kill()
        rs.start()
        wait_ready(s)
        got = [await recv_json(ws, 20) for _ in range(2)]
        check(sorted(got, key=lambda e: e["topics"]) == [{"op": "lost", "topics": ["gone"]},
                                                        {"op": "lost", "topics": ["quiet"]}],
              f"after Redis restarted empty the subscriber got {got}")
        check(metric(s, "wspush_bus_lost_notices_total") == 2, "the notices are not counted")
        eid = publish_ok(s, "quiet", 2)
        e = await recv_json(ws)
        check(e == {"topic": "quiet", "id": eid, "data": 2}, f"after the notices: {e}")
        await ws.close()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def held_sub_times_out(args) -> None:
    """A sub made while Redis is away waits for it, and hears `unavailable` only when the stated
    wait (10 s) runs out; the connection stays and its next sub is held again."""
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs.url)
    try:
        wait_ready(s)
        rs.kill()
        deadline = time.monotonic() + scaled(20)
        while readyz(s)[0] == 200:
            check(time.monotonic() < deadline, "the node did not notice Redis was gone")
            time.sleep(0.05)
        ws = await connect(s)
        await ws.send(json.dumps({"op": "sub", "topics": ["later"]}))
        e = await recv_json(ws, 30)  # the wait is 10 s; the deadline only stops a hang
        check(e == {"op": "error", "code": "unavailable", "topic": "later"}, f"a held sub ended with {e}")
        # The gauges are the bus thread's and the answer the shard's: the gauges are read until
        # they say so (bounded), not at the instant the answer arrives.
        check(poll_until(lambda: metric(s, "wspush_bus_held_subs") == 0, scaled(5)), "a sub refused is still held")
        check(poll_until(lambda: metric(s, "wspush_bus_pending") == 0, scaled(5)), "a sub refused is still under way")
        await ws.send(json.dumps({"op": "sub", "topics": ["later"]}))
        check(poll_until(lambda: metric(s, "wspush_bus_held_subs") == 1, scaled(10)), "the next sub is not held")
        rs.start()
        e = await recv_json(ws, 30)
        check(no_positions(e) == {"op": "subbed", "topics": ["later"], "lost": []}, f"the sub held until Redis came back: {e}")
        await ws.close()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


def main(args) -> None:
    f = Findings()
    f.step("AUTH and SELECT: requirepass, database 3", lambda: asyncio.run(auth_and_select(args)))
    f.step("a wrong password: refused, tried again, up once right", lambda: asyncio.run(wrong_password(args)))
    f.step("no password, or one Redis has not: refused", lambda: asyncio.run(password_mismatch(args)))
    f.step("lost after the stream was trimmed, deleted or expired", lambda: asyncio.run(lost_after_trim(args)))
    f.step("lost after the stream was deleted and written again",
           lambda: asyncio.run(on_a_node(args, written_again)))
    f.step("lost after the stream was trimmed to nothing or an entry XDELed",
           lambda: asyncio.run(on_a_node(args, emptied_and_xdel)))
    f.step("the sweep: a stream goes 2 x --history-ttl after the last id it issued, not sooner",
           lambda: asyncio.run(on_a_node(args, swept, extra=["--history-ttl", "1"])))
    f.step("the sweep under an LFU maxmemory-policy (Redis keeps no idle time)",
           lambda: asyncio.run(on_a_node(args, swept, extra=["--history-ttl", "1"],
                                         redis_extra=["--maxmemory-policy", "allkeys-lfu"])))
    f.step("a node set up while Redis is LOADING", lambda: asyncio.run(set_up_while_loading(args)))
    f.step("a since Redis cannot read, a replay Redis refuses: nothing kept", lambda: asyncio.run(bad_since(args)))
    f.step("Redis restarted empty: its subscribers hear lost", lambda: asyncio.run(lost_after_empty_restart(args)))
    f.step("a sub held while Redis is away: unavailable after the wait", lambda: asyncio.run(held_sub_times_out(args)))
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
