#!/usr/bin/python3
"""Presence and join/leave on the real binary, with namespaces from a config file: on the embedded
bus, and across two nodes on the Redis bus (one Redis, and a Redis Cluster of three masters).

The file keeps presence and join/leave for `room:`, presence alone for `mailbox:`, neither for the
rest. Then:
- a user's first connection to subscribe to a room is announced `{"op":"join",...}` to the room's
  subscribers once, not once per tab; its last one to leave (an unsub, a close) `{"op":"leave"}`
  once; what a user's other tabs do in between is announced to no one (the next announcement each
  watcher gets is another user's);
- `{"op":"presence"}` lists the users subscribed with their connections, `presence_count` the
  counts only; a topic whose namespace keeps no presence is `not_enabled`, one the token does not
  grant `forbidden`;
- `GET /presence?topic=` on the admin API answers the same (key required), `&count=1` the counts;
- a mailbox (presence without join/leave) announces nothing and answers presence;
- the counts come back to nothing once everyone has gone;
- on the Redis bus the users of both nodes are counted together, and joins and leaves are
  announced once per user across the nodes; a node SIGKILLed drops out of presence within
  --presence-ttl (3 s here).
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_redis import RedisCluster, RedisServer  # noqa: E402
from wsp_testlib import (ServerProcess, admin_port, arg_parser, check, http_request, mint_jwt,  # noqa: E402
                         poll_until, recv_json, run_main, run_step, scaled, scrape_metrics, subscribe)

SECRET = "presence-test-secret"
KEY = "presence-admin-key"
CONFIG = """
# room: keeps presence and announces joins and leaves; mailbox: presence only
[namespace."room:"]
presence = true
join-leave = true

[namespace."mailbox:"]
presence = true
"""


def token(sub: str) -> str:
    return mint_jwt({"sub": sub, "exp": int(time.time() + 3600),
                                "topics": ["room:*", "mailbox:*", "news:*"]}, SECRET)


def keyed_get(server: ServerProcess, path: str, key: str = KEY) -> "tuple[int, dict]":
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", admin_port(server), timeout=scaled(10))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


async def connect(server: ServerProcess, sub: str):
    return await websockets.connect(f"ws://127.0.0.1:{server.port}/ws?token={token(sub)}", max_size=None)


async def expect(ws, want: dict, what: str) -> None:
    got = await recv_json(ws)
    check(got == want, f"{what}: expected {want}, got {got}")


async def ask(ws, op: str, topic: str) -> dict:
    await ws.send(json.dumps({"op": op, "topic": topic}))
    return await recv_json(ws)


async def present(ws, topic: str, want: dict) -> None:
    """Asks `topic`'s presence until its users are `want` (a word on its way from another node)."""
    deadline = time.monotonic() + scaled(10)
    while True:
        p = await ask(ws, "presence", topic)
        if p.get("users") == want or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    check(p.get("users") == want, f"presence of {topic}: expected {want}, got {p}")


async def rooms(a: ServerProcess, b: ServerProcess) -> None:
    """`a` and `b` are two nodes on one bus (the same server on the embedded bus): the watcher
    and alice's first tab on a, her second tab and bob on b."""
    server = a
    room = "room:7"
    join = lambda u: {"op": "join", "topic": room, "user": u}  # noqa: E731
    leave = lambda u: {"op": "leave", "topic": room, "user": u}  # noqa: E731
    watcher = await connect(a, "w")
    await subscribe(watcher, [room])
    await expect(watcher, join("w"), "the watcher's own join")
    a1, a2 = await connect(a, "alice"), await connect(b, "alice")
    await subscribe(a1, [room])
    await expect(watcher, join("alice"), "alice's first tab")
    await expect(a1, join("alice"), "alice's first tab hears its own join")
    await subscribe(a2, [room])  # a second tab: nobody hears of it
    bob = await connect(b, "bob")  # after alice's second tab on the same node: its word went first
    await subscribe(bob, [room])
    await expect(watcher, join("bob"), "bob's join, next after alice's (her second tab announced nothing)")
    await expect(bob, join("bob"), "bob hears his own join")
    await expect(a2, join("bob"), "alice's second tab hears bob's join (and nothing of its own)")

    p = await ask(watcher, "presence", room)
    check(p == {"op": "presence", "topic": room, "users": p.get("users"), "user_count": 3, "connections": 4},
          f"presence answered {p}")
    check(p["users"] == {"w": 1, "alice": 2, "bob": 1}, f"presence users {p['users']}")
    c = await ask(bob, "presence_count", room)
    check(c == {"op": "presence_count", "topic": room, "user_count": 3, "connections": 4}, f"presence_count {c}")

    status, body = keyed_get(server, f"/presence?topic={room}")
    check(status == 200 and body == {"topic": room, "users": {"w": 1, "alice": 2, "bob": 1}, "user_count": 3,
                                     "connections": 4}, f"GET /presence answered {status} {body}")
    status, body = keyed_get(server, "/presence?topic=room%3A7&count=1")
    check(status == 200 and body == {"topic": room, "user_count": 3, "connections": 4},
          f"GET /presence count=1 answered {status} {body}")
    status, _ = keyed_get(server, f"/presence?topic={room}", key="")
    check(status == 401, f"GET /presence without the key answered {status}")
    status, body = keyed_get(server, "/presence?topic=news:1")
    check(status == 404 and body.get("error") == "not_enabled", f"GET /presence of news:1 answered {status} {body}")
    status, body = keyed_get(server, "/presence?topic=no%20spaces")
    check(status == 400, f"GET /presence of a bad topic answered {status} {body}")

    await a1.close()  # alice still has a tab there: no leave
    await present(watcher, room, {"w": 1, "alice": 1, "bob": 1})
    await a2.send(json.dumps({"op": "unsub", "topics": [room]}))
    await expect(a2, {"op": "unsubbed", "topics": [room]}, "alice's unsub")
    await expect(watcher, leave("alice"), "alice's last tab left")
    await bob.close()
    await expect(watcher, leave("bob"), "bob's leave, next after alice's (her first close announced nothing)")
    p = await ask(watcher, "presence", room)
    check(p.get("users") == {"w": 1} and p.get("connections") == 1, f"presence after the leaves: {p}")
    await a2.close()
    await watcher.close()


async def mailboxes(server: ServerProcess, other: ServerProcess) -> None:
    box = "mailbox:42"
    t1, t2 = await connect(server, "u42"), await connect(other, "u42")
    await subscribe(t1, [box])
    await subscribe(t2, [box])
    await present(t1, box, {"u42": 2})  # the first messages after subbed: no join was announced
    p = await ask(t1, "presence", box)
    check(p.get("op") == "presence" and p.get("user_count") == 1 and p.get("connections") == 2,
          f"mailbox presence answered {p}")
    e = await ask(t1, "presence", "news:1")
    check(e == {"op": "error", "code": "not_enabled", "topic": "news:1", "of": "presence"}, f"news presence: {e}")
    e = await ask(t1, "presence_count", "secret:1")
    check(e == {"op": "error", "code": "forbidden", "topic": "secret:1", "of": "presence_count"}, f"secret: {e}")
    await t1.close()
    await t2.close()
    check(poll_until(lambda: keyed_get(server, f"/presence?topic={box}&count=1")[1].get("connections") == 0,
                     scaled(10)), "mailbox presence not back to 0 after both closed")


async def node_dies(a: ServerProcess, b: ServerProcess) -> None:
    """b is SIGKILLed with carol on a room: she drops out of a's presence within --presence-ttl."""
    room = "room:9"
    watcher, carol = await connect(a, "w"), await connect(b, "carol")
    await subscribe(watcher, [room])
    await subscribe(carol, [room])
    await present(watcher, room, {"w": 1, "carol": 1})
    killed = time.monotonic()
    b.kill()
    deadline = killed + scaled(TTL + 10)
    while time.monotonic() < deadline:
        p = await ask(watcher, "presence", room)
        if p.get("op") == "join":
            continue
        if p.get("users") == {"w": 1}:
            break
        await asyncio.sleep(0.2)
    gone = time.monotonic() - killed
    check(p.get("users") == {"w": 1}, f"carol still present {gone:.1f}s after her node died: {p}")
    print(f"  carol left presence {gone:.1f}s after her node was killed (--presence-ttl {TTL})", flush=True)
    await watcher.close()


TTL = 3


def nodes(args, config: str, url: str) -> "list[ServerProcess]":
    out = []
    for _ in range(2):
        s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret=SECRET,
                          extra=["--config", config, "--api-key", KEY, "--bus", url, "--presence-ttl", str(TTL)]).start()
        check(poll_until(lambda: scrape_metrics(admin_port(s)).get("wspush_bus_up") == 1, scaled(30)),
              "the node's bus did not come up")
        out.append(s)
    return out


async def big_room(a: ServerProcess, redis: RedisServer) -> None:
    """A room with 1,500 users (another node's, said straight to Redis): the answers list up to
    their bounds and count them all, and the node's link to Redis holds (one reply of them all)."""
    quads = [x for k in range(1500) for x in ("room:big", f"user{k}", "1", "0")]
    redis.command("FCALL", "wspush_presence", "0", "elsewhere", "60000", *quads)
    ws = await connect(a, "w")
    p = await ask(ws, "presence", "room:big")
    check(p.get("user_count") == 1500 and p.get("connections") == 1500 and len(p.get("users", {})) == 1000
          and p.get("truncated") is True, f"presence of 1,500 users: {str(p)[:300]}")
    c = await ask(ws, "presence_count", "room:big")
    check(c == {"op": "presence_count", "topic": "room:big", "user_count": 1500, "connections": 1500}, f"{c}")
    status, body = await asyncio.to_thread(keyed_get, a, "/presence?topic=room:big")
    check(status == 200 and len(body.get("users", {})) == 1500 and body.get("user_count") == 1500,
          f"GET /presence of 1,500 users answered {status} {str(body)[:300]}")
    check(scrape_metrics(admin_port(a)).get("wspush_bus_protocol_errors_total") == 0,
          "the node dropped its link to Redis reading a big presence")
    await ws.close()


def on_redis(args, config: str, url: str, where: str, redis: "RedisServer | None" = None) -> None:
    a, b = nodes(args, config, url)
    if redis:
        run_step(f"{where}: a room of 1,500 users: listed to the bound, counted in full",
                 lambda: asyncio.run(big_room(a, redis)))
    run_step(f"{where}: join/leave once per user across two nodes; presence counts both",
             lambda: asyncio.run(rooms(a, b)))
    run_step(f"{where}: a mailbox's presence across the nodes", lambda: asyncio.run(mailboxes(a, b)))
    run_step(f"{where}: a node killed drops out of presence within --presence-ttl",
             lambda: asyncio.run(node_dies(a, b)))
    a.kill()


def main(args) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(CONFIG)
    try:
        server = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret=SECRET,
                               extra=["--config", f.name, "--api-key", KEY]).start()
        run_step("join/leave once per user, not per tab; presence and presence_count; GET /presence",
                 lambda: asyncio.run(rooms(server, server)))
        run_step("a namespace with presence alone: no announcements; not_enabled, forbidden",
                 lambda: asyncio.run(mailboxes(server, server)))
        counts = lambda: {k: scrape_metrics(admin_port(server)).get(f'wspush_presence_events_total{{kind="{k}"}}')  # noqa: E731
                          for k in ("join", "leave")}
        check(poll_until(lambda: counts() == {"join": 3, "leave": 3}, scaled(10)),
              f"join/leave counted {counts()}: w, alice and bob joined and left once each")
        check(poll_until(lambda: scrape_metrics(admin_port(server)).get("wspush_presence_users") == 0, scaled(10)),
              "presence entries left behind after every connection closed")
        server.kill()
        redis = RedisServer(persistent=False).start()
        try:
            on_redis(args, f.name, redis.url, "the Redis bus", redis)
        finally:
            redis.close()
        cluster = RedisCluster(masters=3, replicas=0, persistent=False).start()
        try:
            on_redis(args, f.name, cluster.url, "Redis Cluster")
        finally:
            cluster.close()
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__))
