#!/usr/bin/python3
"""In-band token refresh and the heartbeat a page can see, against the real binary (Python
`websockets` and raw sockets).

`{"op":"auth","token":...}`: a good token replaces the connection's grants and expiry (reply
`authed` with the new exp and the subscriptions it no longer allows, which are removed); the
connection then outlives the old token's exp. A forged, expired or not-yet-valid (`nbf`) token is
answered `unauthorized` and changes nothing: the old token still ends the connection at its exp
(1008). With --auth=none, `auth` is a bad_request.

`?heartbeat=1`: the keepalive comes as the text `{"op":"ping"}`; a client that answers
`{"op":"pong"}` stays, one that stops answering is closed after --pong-timeout; without the
parameter the keepalive stays a ping frame. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import base64
import hashlib
import hmac
import json
import os
import sys
import time

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (OP_PING, OP_TEXT, Findings, RawWebSocket, ServerProcess, admin_port,  # noqa: E402
                         arg_parser, check, http_request, recv_json, run_main, scaled, scrape_metrics)

SECRET = "refresh-test-secret"


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(claims: dict, secret: str = SECRET) -> str:
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + b64url(json.dumps(claims).encode())
    sig = hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest()
    return head + "." + b64url(sig)


async def request(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return await recv_json(ws)


def publish(admin: int, topic: str, data) -> None:
    status, body = http_request(admin, "POST", "/publish", json.dumps({"topic": topic, "data": data}).encode())
    check(status == 200, f"publish answered {status} {body}")


async def refresh_replaces_grants(server: ServerProcess) -> None:
    admin = admin_port(server)
    old_exp = int(time.time()) + 3
    token = mint({"sub": "u", "exp": old_exp, "topics": ["mailbox:42", "team:*"]})
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws?token={token}", ping_interval=None) as ws:
        r = await request(ws, {"op": "sub", "topics": ["mailbox:42", "team:a", "team:b"]})
        check(r["op"] == "subbed", f"sub answered {r}")
        new_exp = int(time.time()) + 3600
        r = await request(ws, {"op": "auth", "token": mint({"sub": "u", "exp": new_exp, "topics": ["team:*"]})})
        check(r.get("op") == "authed" and r.get("exp") == new_exp, f"auth answered {r}")
        check(r.get("unsubbed") == ["mailbox:42"], f"unsubbed {r.get('unsubbed')}, expected ['mailbox:42']")
        r = await request(ws, {"op": "sub", "topics": ["mailbox:42"]})
        check(r == {"op": "error", "code": "forbidden", "topic": "mailbox:42"}, f"a sub the new token forbids: {r}")
        # Events reach only what is still subscribed: mailbox:42 is gone, team:a stays.
        publish(admin, "mailbox:42", 1)
        publish(admin, "team:a", 2)
        e = await recv_json(ws)
        check(e.get("topic") == "team:a" and e.get("data") == 2, f"expected the team:a event, got {e}")
        # Past the first token's exp (3 s; a deadline, not a synchronisation) the connection is open.
        while time.time() < old_exp + 1.5:
            await asyncio.sleep(0.25)
        publish(admin, "team:b", 3)
        e = await recv_json(ws)
        check(e.get("data") == 3, f"after the old exp: {e}")
    check(scrape_metrics(admin).get("wspush_token_expired_closes_total", 0) == 0, "a refreshed connection was closed")


async def refused_token_changes_nothing(server: ServerProcess) -> None:
    exp = int(time.time()) + 3
    token = mint({"exp": exp, "topics": ["mailbox:1"]})
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws?token={token}", ping_interval=None) as ws:
        check((await request(ws, {"op": "sub", "topics": ["mailbox:1"]}))["op"] == "subbed", "sub refused")
        for name, bad in [("forged", mint({"exp": exp + 3600, "topics": ["*"]}, "other secret")),
                          ("expired", mint({"exp": int(time.time()) - 1, "topics": ["*"]})),
                          ("nbf 500 s ahead", mint({"exp": exp + 3600, "nbf": int(time.time()) + 500, "topics": ["*"]})),
                          ("not a token", "abc")]:
            r = await request(ws, {"op": "auth", "token": bad})
            check(r == {"op": "error", "code": "unauthorized"}, f"{name} token: {r}")
        r = await request(ws, {"op": "sub", "topics": ["other"]})
        check(r.get("code") == "forbidden", f"the old grants no longer hold: {r}")
        # The old token still ends the connection at its exp.
        try:
            while True:
                await asyncio.wait_for(ws.recv(), scaled(6))
        except websockets.ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            check(code == 1008, f"closed with {code}, expected 1008 at the old token's exp")
            check(time.time() >= exp - 0.1, f"closed {exp - time.time():.1f}s before the old exp")


async def auth_without_tokens(server: ServerProcess) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws", ping_interval=None) as ws:
        r = await request(ws, {"op": "auth", "token": "a.b.c"})
        check(r == {"op": "error", "code": "bad_request"}, f"auth with --auth=none: {r}")


async def heartbeat(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws?heartbeat=1"
    # A client that answers: pings keep coming, it stays open over several timeouts.
    async with websockets.connect(url, ping_interval=None) as ws:
        pings, started = 0, time.time()
        while time.time() - started < 3:
            m = await recv_json(ws, 3)
            check(m == {"op": "ping"}, f"expected the heartbeat, got {m}")
            pings += 1
            await ws.send(json.dumps({"op": "pong"}))
        check(pings >= 4, f"{pings} heartbeats in 3 s with --ping-interval 0.5")
        r = await request(ws, {"op": "sub", "topics": ["t"]})  # no error for the pongs before
        check(r.get("op") == "subbed", f"after the pongs: {r}")
    # A client that stops answering: closed once --pong-timeout has passed after a ping.
    async with websockets.connect(url, ping_interval=None) as ws:
        check(await recv_json(ws, 3) == {"op": "ping"}, "no heartbeat")
        started = time.time()
        try:
            while True:
                m = await recv_json(ws, 5)
                check(m == {"op": "ping"}, f"unexpected {m}")
        except websockets.ConnectionClosed:
            took = time.time() - started
            check(took < scaled(3), f"closed {took:.1f}s after an unanswered heartbeat (--pong-timeout 0.5)")
    # Without ?heartbeat=1 the keepalive is a ping frame (a raw client sees its opcode).
    ws = RawWebSocket(server.port).open()
    try:
        event = ws.next_event(scaled(3))
        check(event.opcode == OP_PING, f"without ?heartbeat=1 expected a ping frame, got {event.describe()}")
        check(event.opcode != OP_TEXT, "a text heartbeat without asking for one")
    finally:
        ws.close_socket()


def run(args) -> None:
    findings = Findings()
    with ServerProcess(args.server, io=args.io, mode="pubsub", jwt_secret=SECRET, quiet=not args.verbose) as server:
        findings.step("auth replaces grants and exp, unsubscribes what they forbid; outlives the old exp",
                      asyncio.run, refresh_replaces_grants(server))
        findings.step("a forged, expired or nbf-ahead token is unauthorized and changes nothing",
                      asyncio.run, refused_token_changes_nothing(server))
    with ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                       extra=["--ping-interval", "0.5", "--pong-timeout", "0.5"]) as server:
        findings.step("auth with --auth=none is a bad request", asyncio.run, auth_without_tokens(server))
        findings.step("?heartbeat=1: text pings, answered or closed; ping frames otherwise", asyncio.run,
                      heartbeat(server))
    findings.done()


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
