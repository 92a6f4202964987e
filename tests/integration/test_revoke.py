#!/usr/bin/python3
"""Revoking a user (POST /disconnect) on the real binary.

Embedded bus: a revoke closes every connection of the user (several WebSocket tabs with 4403
"revoked", an event stream with a `refused` event of code `revoked`, then its end) and leaves
another user's connections open and served; it answers `{"disconnected":N}`. From then on a token
of the user issued no later than the revoke (or without `iat`) is refused at the upgrade (401,
counted as `revoked`) and in an in-band `auth` (`unauthorized`), while one issued after the revoke
is accepted. `--max-revocations` bounds the list (the oldest revoke is forgotten first); the
API key is required; bad bodies get 400; a user with no connection is revoked all the same (0).

Redis bus (real redis-server, two nodes): a revoke on node A closes the user's connections on
node B, and a node started after the revoke refuses the revoked token (it reads the list kept in
Redis). The same on a Redis Cluster of three masters. Exit 0 pass, 1 fail, 77 io_uring
unavailable.
"""
import asyncio
import base64
import hashlib
import hmac
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from test_sse import Stream, q  # noqa: E402
from wsp_bus import readyz  # noqa: E402
from wsp_testlib import (ServerProcess, admin_port, arg_parser, check, http_request, metric, poll_until,  # noqa: E402
                         publish_ok, recv_json, run_main, run_step, scaled, subscribe)

SECRET = "revoke-test-secret"
KEY = "revoke-test-key"


def token(sub: str, iat=None, exp_in: float = 3600) -> str:
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    claims = {"sub": sub, "exp": int(time.time() + exp_in), "topics": ["mailbox:*"]}
    if iat is not None:
        claims["iat"] = int(iat)
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = enc(json.dumps(claims).encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{enc(sig)}"


def disconnect(server: ServerProcess, body, key: str = KEY) -> "tuple[int, dict]":
    """POST /disconnect with the API key (none: without it); (status, JSON body)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", admin_port(server), timeout=scaled(30))
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        conn.request("POST", "/disconnect", body=body if isinstance(body, bytes) else json.dumps(body).encode(),
                     headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read().decode() or "{}")
    finally:
        conn.close()


async def expect_revoked(ws) -> None:
    """The server closes `ws` with 4403 "revoked" (whatever it sent before)."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), scaled(10))
    except websockets.ConnectionClosed as e:
        check(e.rcvd is not None and e.rcvd.code == 4403 and e.rcvd.reason == "revoked",
              f"closed with {e.rcvd}, not 4403 revoked")


async def upgrade_status(port: int, tok: str) -> int:
    """The status an upgrade with `tok` gets: 101, or the refusal's."""
    try:
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws?token={tok}", ping_interval=None)
    except websockets.exceptions.InvalidStatusCode as e:
        return e.status_code
    await ws.close()
    return 101


def embedded_server(args, extra=(), keyed: bool = True) -> ServerProcess:
    """Keyed: with --api-key (publish_ok, which sends none, then cannot be used)."""
    key = ["--api-key", KEY] if keyed else []
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret=SECRET,
                         extra=["--threads", "2", *key, *extra]).start()


async def revoke_closes(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    before = int(time.time()) - 5
    tabs = [await websockets.connect(f"{url}?token={token('u42', iat=before)}", ping_interval=None) for _ in range(3)]
    others = [await websockets.connect(f"{url}?token={token('u7', iat=before)}", ping_interval=None) for _ in range(2)]
    for ws in tabs + others:
        await subscribe(ws, ["mailbox:1"])
    stream = Stream(server.port, q(["mailbox:1"], token=token("u42", iat=before)))
    check(stream.status == 200, f"the stream answered {stream.status}")
    stream.expect("subbed")
    status, body = await asyncio.to_thread(disconnect, server, {"sub": "u42"}, "")
    check(status == 200 and body == {"disconnected": 4}, f"/disconnect answered {status} {body}")
    for ws in tabs:
        await expect_revoked(ws)
    refused, _ = stream.expect("refused")
    check(refused == {"op": "error", "code": "revoked"}, f"the stream was told {refused}")
    stream.expect_end()
    # The other user's connections stay open and served.
    sent = publish_ok(server, "mailbox:1", {"after": 1})
    for ws in others:
        m = await recv_json(ws)
        check(m.get("id") == sent, f"another user's connection got {m}")
    check(metric(server, "wspush_revoked_connections_total") == 4, "revoked closes not counted")
    check(metric(server, "wspush_revocations") == 1, "the revocation list does not hold the user")
    # The revoked token, and one without iat, are refused at the upgrade; one issued after the revoke is not.
    check(await upgrade_status(server.port, token("u42", iat=before)) == 401, "a revoked token was accepted")
    check(await upgrade_status(server.port, token("u42")) == 401, "a token without iat was accepted")
    check(Stream(server.port, q(["mailbox:1"], token=token("u42", iat=before))).status == 401,
          "a revoked token opened a stream")
    check(metric(server, 'wspush_upgrades_total{result="revoked"}') == 3, "revoked upgrades not counted as such")
    fresh = token("u42", iat=time.time() + 1)
    ws = await websockets.connect(f"{url}?token={fresh}", ping_interval=None)
    await subscribe(ws, ["mailbox:2"])
    # In-band: the revoked token is refused, a fresh one taken.
    await ws.send(json.dumps({"op": "auth", "token": token("u42", iat=before)}))
    m = await recv_json(ws)
    check(m == {"op": "error", "code": "unauthorized"}, f"an auth with a revoked token was answered {m}")
    await ws.send(json.dumps({"op": "auth", "token": token("u42", iat=time.time() + 1)}))
    m = await recv_json(ws)
    check(m.get("op") == "authed", f"an auth with a fresh token was answered {m}")
    for c in others + [ws]:
        await c.close()


def api_step(args) -> None:
    server = embedded_server(args)
    check(disconnect(server, {"sub": "u1"}, key="")[0] == 401, "/disconnect without the API key was served")
    check(disconnect(server, {"sub": "u1"}, key="wrong")[0] == 401, "/disconnect with a wrong key was served")
    for body, why in [(b"{", "malformed JSON"), (b"[1]", "body is not a JSON object"), ({}, "sub missing"),
                      ({"sub": 5}, "sub is not a string"), ({"sub": ""}, "sub must be a string of 1 to 1024 bytes"),
                      ({"sub": "x" * 1025}, "sub must be a string of 1 to 1024 bytes")]:
        status, answer = disconnect(server, body)
        check(status == 400 and answer == {"error": "bad_request", "reason": why}, f"{body!r}: {status} {answer}")
    status, _ = http_request(admin_port(server), "GET", "/disconnect")
    check(status == 405, f"GET /disconnect answered {status}")
    check(disconnect(server, {"sub": "nobody-here"}) == (200, {"disconnected": 0}), "an unknown user")
    check(metric(server, "wspush_revocations") == 1, "an unknown user was not recorded")
    check(asyncio.run(upgrade_status(server.port, token("nobody-here", iat=time.time() - 5))) == 401,
          "an unknown user's old token was accepted after its revoke")
    server.kill()


def bound_step(args) -> None:
    server = embedded_server(args, ["--max-revocations", "2"])
    old = time.time() - 5
    for sub in ("a", "b", "c"):
        check(disconnect(server, {"sub": sub})[0] == 200, f"revoking {sub}")
    check(metric(server, "wspush_revocations") == 2, "the list is not held to --max-revocations")
    statuses = {sub: asyncio.run(upgrade_status(server.port, token(sub, iat=old))) for sub in ("a", "b", "c")}
    check(statuses == {"a": 101, "b": 401, "c": 401}, f"after three revokes in a list of two: {statuses}")
    server.kill()


def off_step(args) -> None:
    """--revocation-ttl 0: a revoke closes, and no list refuses the token afterwards."""
    server = embedded_server(args, ["--revocation-ttl", "0"])

    async def body():
        ws = await websockets.connect(f"ws://127.0.0.1:{server.port}/ws?token={token('z')}", ping_interval=None)
        status, answer = await asyncio.to_thread(disconnect, server, {"sub": "z"})
        check((status, answer) == (200, {"disconnected": 1}), f"{status} {answer}")
        await expect_revoked(ws)
        check(await upgrade_status(server.port, token("z")) == 101, "refused with the list off")
    asyncio.run(body())
    check(metric(server, "wspush_revocations") == 0, "entries with the list off")
    server.kill()


def bus_node(args, url: str) -> ServerProcess:
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose, jwt_secret=SECRET,
                      extra=["--bus", url, "--threads", "2"]).start()
    check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(20)),
          "a node did not come up on the bus\n" + s.log_tail())
    return s


def shared_list(args, url: str, holder) -> None:
    """Two nodes on the bus at `url`: a revoke on node a closes the user's connections on node b;
    the list is in Redis (`holder`: the Redis that keeps it); a node started later reads it."""
    a, b = bus_node(args, url), bus_node(args, url)
    before = time.time() - 5

    async def body():
        on_b = [await websockets.connect(f"ws://127.0.0.1:{b.port}/ws?token={token('r1', iat=before)}",
                                         ping_interval=None) for _ in range(2)]
        other = await websockets.connect(f"ws://127.0.0.1:{b.port}/ws?token={token('r2', iat=before)}",
                                         ping_interval=None)
        await subscribe(other, ["mailbox:9"])
        status, answer = await asyncio.to_thread(disconnect, a, {"sub": "r1"}, "")
        # Node A has none of them: it counts its own only.
        check((status, answer) == (200, {"disconnected": 0}), f"node a answered {status} {answer}")
        for ws in on_b:
            await expect_revoked(ws)
        sent = publish_ok(b, "mailbox:9", {"k": 1})
        check((await recv_json(other)).get("id") == sent, "another user's connection on node b")
        await other.close()
        check(await upgrade_status(b.port, token("r1", iat=before)) == 401, "node b took the revoked token")
    asyncio.run(body())
    check(metric(b, "wspush_revoked_connections_total") == 2, "node b did not count its closes")
    check(holder().command("ZSCORE", "wspush:revocations", "r1") is not None, "the list in Redis lacks r1")
    # A node that starts after the revoke reads the list, however long: 1,200 more users revoked
    # by others (read in pages: one reply of them all would pass the bound on a reply).
    now = int(time.time())
    bulk = [x for k in range(1200) for x in (str(now), f"bulk{k}")]
    holder().command("ZADD", "wspush:revocations", *bulk)
    c = bus_node(args, url)
    check(poll_until(lambda: metric(c, "wspush_revocations") == 1201, scaled(10)),
          f"node c read {metric(c, 'wspush_revocations')} of the list's 1201 users")
    check(metric(c, "wspush_bus_protocol_errors_total") == 0 and metric(c, "wspush_bus_reconnects_total") == 0,
          "node c dropped its link to Redis reading the list\n" + c.log_tail())
    check(asyncio.run(upgrade_status(c.port, token("r1", iat=before))) == 401, "node c took the revoked token")
    check(asyncio.run(upgrade_status(c.port, token("r1", iat=time.time() + 1))) == 101,
          "node c refused a token issued after the revoke")
    for s in (a, b, c):
        s.kill()


def redis_step(args) -> None:
    if not shutil.which("redis-server"):
        print("  (redis-server not installed: step skipped)")
        return
    from wsp_redis import RedisServer
    redis = RedisServer(persistent=False).start()
    try:
        shared_list(args, redis.url, lambda: redis)
    finally:
        redis.close()


def cluster_step(args) -> None:
    """The same on a Redis Cluster of three masters: the list is kept by the master of its key's
    slot, the revoke reaches the other node through a plain PUBLISH (cluster-wide)."""
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        print("  (redis-server or redis-cli not installed: step skipped)")
        return
    from wsp_bus import slot_of
    from wsp_redis import RedisCluster
    cluster = RedisCluster(masters=3, replicas=0, persistent=False).start()
    try:
        shared_list(args, cluster.url, lambda: cluster.node_of(slot_of("wspush:revocations")))
    finally:
        cluster.close()


def main(args) -> None:
    server = embedded_server(args, keyed=False)
    run_step("a revoke closes the user's tabs (4403) and stream, not others; old tokens refused, new ones not",
             lambda: asyncio.run(revoke_closes(server)))
    server.kill()
    run_step("the API key, bad bodies, an unknown user", api_step, args)
    run_step("--max-revocations: the oldest revoke forgotten first", bound_step, args)
    run_step("--revocation-ttl 0: closes, refuses nothing later", off_step, args)
    run_step("Redis bus: a revoke on node a closes on node b; a node started later reads the list", redis_step, args)
    run_step("Redis Cluster: a revoke on node a closes on node b; a node started later reads the list", cluster_step,
             args)


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__))
