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
  XTRIM MAXLEN), by id (XTRIM MINID), the key deleted or expired: a resume from an id older than
  what the stream still holds names the topic in `lost` and still replays what is kept, in order,
  before what comes live;
- a node set up while Redis answers `-LOADING` (reading its data set): unready while it loads,
  then it serves once the load ends, neither restarted nor given up.
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
from wsp_testlib import (Findings, ServerProcess, TestFailure, admin_port, arg_parser, check,  # noqa: E402
                         metric, publish, publish_ok, recv_json, run_main, scaled, subscribe)


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








async def connect(s: ServerProcess):
    return await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None)


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
    503, a client's sub `unavailable` (the connection itself is served)."""
    status, body = readyz(s)
    check(status == 503 and json.loads(body) == {"status": "bus_down"}, f"{what}: /readyz answered {status} {body}")
    check(metric(s, "wspush_bus_up") == 0, f"{what}: wspush_bus_up is not 0")
    status, body = publish(s, "refused", 1)
    check(status == 503, f"{what}: an admin publish answered {status} {body}")
    ws = await connect(s)
    try:
        await ws.send(json.dumps({"op": "sub", "topics": ["refused"]}))
        e = await recv_json(ws)
        check(e == {"op": "error", "code": "unavailable", "topic": "refused"}, f"{what}: a sub answered {e}")
    finally:
        await ws.close()


def refusal_logged(s: ServerProcess, error: str, what: str) -> None:
    """The node logs Redis's own refusal and that it tries again. Which of its two connections
    hears it first decides the wording: the command connection's set-up says "Redis refused the
    set-up: <error>; trying again", the subscriber connection (closed by hiredis on an error
    nobody asked for) "cannot reach <url> (<error>); retrying"."""
    s.wait_for_log(rf"bus: (Redis refused the set-up: {error}.*; trying again|cannot reach redis://\S+ "
                   rf"\((Redis refused the set-up: )?{error}.*\); retrying)", scaled(15), what=what)


def no_secret_in_log(s: ServerProcess, password: str) -> None:
    with s._cond:
        leaked = [l for l in s.log if password in l]
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
        # The subscriber connection's AUTH is sent without reading its answer (redis_bus.cpp,
        # setup_subscriber_link): when the NOAUTH its SUBSCRIBE then gets closes that connection
        # before the command connection's AUTH is answered, the node logs NOAUTH, not WRONGPASS.
        refusal_logged(s, r"(WRONGPASS invalid username-password pair|NOAUTH Authentication required)",
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
        refusal_logged(s, r"NOAUTH Authentication required", "the refusal of a node without a password")
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

        # The key expired (as it does 2 x --history-ttl after its last publish).
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
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


# ---- LOADING --------------------------------------------------------------------------------------

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


def main(args) -> None:
    f = Findings()
    f.step("AUTH and SELECT: requirepass, database 3", lambda: asyncio.run(auth_and_select(args)))
    f.step("a wrong password: refused, tried again, up once right", lambda: asyncio.run(wrong_password(args)))
    f.step("no password, or one Redis has not: refused", lambda: asyncio.run(password_mismatch(args)))
    f.step("lost after the stream was trimmed, deleted or expired", lambda: asyncio.run(lost_after_trim(args)))
    f.step("a node set up while Redis is LOADING", lambda: asyncio.run(set_up_while_loading(args)))
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
