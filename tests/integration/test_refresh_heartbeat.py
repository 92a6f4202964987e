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

No check here depends on how fast the machine is: the waits are generous timeouts that only stop
a hang, and what a duration would suggest is proven by order instead (after a ping, the server's
next step is another ping only if the answer counted; without one it is the close).
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
from wsp_testlib import (OP_PING, OP_PONG, Findings, RawWebSocket, ServerProcess, TestFailure,  # noqa: E402
                         admin_port, arg_parser, check, http_request, recv_json, run_main, scaled, scrape_metrics)

SECRET = "refresh-test-secret"
ANSWERED_HEARTBEATS = 4  # pings answered in a row by a client that keeps answering
# The keepalive under test. An answered ping is followed by the next one when --pong-timeout has
# passed, so the timeout sets the pace; it is long enough for a busy machine's late answer (an
# answer later than that is taken for silence, and the test fails).
PING_INTERVAL, PONG_TIMEOUT = 0.5, scaled(5)


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


# Seconds a short token is valid. The set-up (connecting, subscribing, the auth messages) must
# finish before its exp; on a machine too busy for that the server rightly closes at exp, and the
# test tries again with a longer token instead of failing. A refusal or a close while the token
# is still valid fails at once.
WINDOWS = (3, 10, 30)
SETUP_ERRORS = (websockets.InvalidStatusCode, websockets.ConnectionClosed)


async def connect(server: ServerProcess, token: str):
    return await websockets.connect(f"ws://127.0.0.1:{server.port}/ws?token={token}", ping_interval=None)


async def close_all(*conns) -> None:
    """Closes what is open and waits for the closing handshakes, so that the server is done with
    these connections (and has counted any expiry) before the next metric read."""
    for ws in conns:
        if ws is not None:
            await ws.close()


async def wait_closed(ws, exp: int) -> int:
    """The close code the server sent `ws`; the wait is a timeout that only stops a hang."""
    limit = max(0.0, exp - time.time()) + scaled(60)
    try:
        while True:
            await asyncio.wait_for(ws.recv(), limit)
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None
    except asyncio.TimeoutError:
        raise TestFailure(f"still open {limit:.0f}s after a message, past the token's exp") from None


async def refresh_replaces_grants(server: ServerProcess) -> None:
    admin = admin_port(server)
    new_exp = int(time.time()) + 3600
    for window in WINDOWS:
        expired_before = scrape_metrics(admin).get("wspush_token_expired_closes_total", 0)
        old_exp = int(time.time()) + window
        token = mint({"sub": "u", "exp": old_exp, "topics": ["mailbox:42", "team:*"]})
        ws = control = None
        try:
            # The control holds the same token and never refreshes: the server closes it at the
            # token's exp, and once it has, the first token is good nowhere.
            control = await connect(server, token)
            ws = await connect(server, token)
            r = await request(ws, {"op": "sub", "topics": ["mailbox:42", "team:a", "team:b"]})
            check(r["op"] == "subbed", f"sub answered {r}")
            r = await request(ws, {"op": "auth", "token": mint({"sub": "u", "exp": new_exp, "topics": ["team:*"]})})
            break
        except SETUP_ERRORS:
            await close_all(ws, control)
            if time.time() < old_exp:
                raise  # refused or closed while the token was still valid
    else:
        raise TestFailure(f"the machine never finished connecting and refreshing within a token's {WINDOWS[-1]}s")
    try:
        check(r.get("op") == "authed" and r.get("exp") == new_exp, f"auth answered {r}")
        check(r.get("unsubbed") == ["mailbox:42"], f"unsubbed {r.get('unsubbed')}, expected ['mailbox:42']")
        r = await request(ws, {"op": "sub", "topics": ["mailbox:42"]})
        check(r == {"op": "error", "code": "forbidden", "topic": "mailbox:42"}, f"a sub the new token forbids: {r}")
        # Events reach only what is still subscribed: mailbox:42 is gone, team:a stays.
        publish(admin, "mailbox:42", 1)
        publish(admin, "team:a", 2)
        e = await recv_json(ws)
        check(e.get("topic") == "team:a" and e.get("data") == 2, f"expected the team:a event, got {e}")
        # The old token's exp has passed once the control is closed for it (one reactor, so the
        # same timer wheel would have closed the refreshed connection too); then it still serves.
        code = await wait_closed(control, old_exp)
        check(code == 1008, f"the control closed with {code}, expected 1008 at the old token's exp")
        publish(admin, "team:b", 3)
        e = await recv_json(ws)
        check(e.get("topic") == "team:b" and e.get("data") == 3, f"after the old exp: {e}")
        r = await request(ws, {"op": "sub", "topics": ["team:c"]})
        check(r.get("op") == "subbed", f"a sub after the old exp answered {r}")
    except websockets.ConnectionClosed as closed:
        raise TestFailure(f"the refreshed connection was closed: {closed}") from None
    finally:
        await close_all(ws, control)
    check(ws.close_code == 1000, f"the refreshed connection ended with {ws.close_code}, not with our close (1000)")
    expired = scrape_metrics(admin).get("wspush_token_expired_closes_total", 0) - expired_before
    check(expired == 1, f"wspush_token_expired_closes_total went up by {expired:g}, expected 1 (the control only)")


async def refused_token_changes_nothing(server: ServerProcess) -> None:
    admin = admin_port(server)
    for window in WINDOWS:
        expired_before = scrape_metrics(admin).get("wspush_token_expired_closes_total", 0)
        exp = int(time.time()) + window
        ws = None
        try:
            ws = await connect(server, mint({"exp": exp, "topics": ["mailbox:1"]}))
            check((await request(ws, {"op": "sub", "topics": ["mailbox:1"]}))["op"] == "subbed", "sub refused")
            for name, bad in [("forged", mint({"exp": exp + 3600, "topics": ["*"]}, "other secret")),
                              ("expired", mint({"exp": int(time.time()) - 1, "topics": ["*"]})),
                              ("nbf 500 s ahead",
                               mint({"exp": exp + 3600, "nbf": int(time.time()) + 500, "topics": ["*"]})),
                              ("not a token", "abc")]:
                r = await request(ws, {"op": "auth", "token": bad})
                check(r == {"op": "error", "code": "unauthorized"}, f"{name} token: {r}")
            r = await request(ws, {"op": "sub", "topics": ["other"]})
            check(r.get("code") == "forbidden", f"the old grants no longer hold: {r}")
            break
        except SETUP_ERRORS:
            await close_all(ws)
            if time.time() < exp:
                raise  # refused or closed while the token was still valid
    else:
        raise TestFailure(f"the machine never finished the refused auths within a token's {WINDOWS[-1]}s")
    # The old token still ends the connection at its exp: closed with 1008 and counted as an
    # expiry (a refused token, had it been taken, would have kept it open for an hour more).
    try:
        code = await wait_closed(ws, exp)
        closed_at = time.time()
    finally:
        await close_all(ws)
    check(code == 1008, f"closed with {code}, expected 1008 at the old token's exp")
    # Order, not speed: the server closes at its clock's exp, and a busy machine only makes the
    # close later; a close seen before exp was not the token's doing.
    check(closed_at >= exp, f"closed {exp - closed_at:.2f}s before the old token's exp")
    expired = scrape_metrics(admin).get("wspush_token_expired_closes_total", 0) - expired_before
    check(expired == 1, f"wspush_token_expired_closes_total went up by {expired:g}, expected 1 (this connection)")


async def auth_without_tokens(server: ServerProcess) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws", ping_interval=None) as ws:
        r = await request(ws, {"op": "auth", "token": "a.b.c"})
        check(r == {"op": "error", "code": "bad_request"}, f"auth with --auth=none: {r}")


async def heartbeat(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws?heartbeat=1"
    # A client that answers: the pings keep coming. After a ping the server's next step is either
    # another ping (the answer counted) or the close (--pong-timeout passed with no answer), so
    # every ping after the first proves the answer before it was taken, whatever the machine's speed.
    async with websockets.connect(url, ping_interval=None) as ws:
        for k in range(ANSWERED_HEARTBEATS):
            try:
                m = await recv_json(ws, 30)  # a timeout that only stops a hang
            except websockets.ConnectionClosed as closed:
                raise TestFailure(f"closed after {k} answered heartbeats ({closed})") from None
            check(m == {"op": "ping"}, f"expected the heartbeat, got {m}")
            await ws.send(json.dumps({"op": "pong"}))
        r = await request(ws, {"op": "sub", "topics": ["t"]})  # no error for the pongs before
        check(r.get("op") == "subbed", f"after the pongs: {r}")
    # A client that stops answering: closed once --pong-timeout has passed after a ping, and never
    # pinged again first.
    async with websockets.connect(url, ping_interval=None) as ws:
        check(await recv_json(ws, 30) == {"op": "ping"}, "no heartbeat")
        try:
            m = await recv_json(ws, 60)  # a timeout that only stops a hang
            raise TestFailure(f"an unanswered heartbeat was followed by {m}, not by the close")
        except websockets.ConnectionClosed:
            pass
        except asyncio.TimeoutError:
            raise TestFailure(f"still open {scaled(60):.0f}s after an unanswered heartbeat") from None
    # Without ?heartbeat=1 the keepalive is a ping frame (a raw client sees its opcode): keepalive
    # after keepalive, answered with pong frames, and never the text heartbeat, which comes only
    # to a client that asks for it.
    ws = RawWebSocket(server.port).open()
    try:
        for k in range(3):
            event = ws.next_event(scaled(30))
            check(event.opcode == OP_PING,
                  f"without ?heartbeat=1, keepalive {k + 1} was {event.describe()}, expected a ping frame")
            check(ws.send_frame(OP_PONG, event.payload), "the server closed before our pong")
    finally:
        ws.close_socket()


def run(args) -> None:
    findings = Findings()
    # One reactor: the refresh test's control and refreshed connection share one timer wheel.
    with ServerProcess(args.server, io=args.io, mode="pubsub", jwt_secret=SECRET, quiet=not args.verbose,
                       extra=["--threads", "1"]) as server:
        findings.step("auth replaces grants and exp, unsubscribes what they forbid; outlives the old exp",
                      asyncio.run, refresh_replaces_grants(server))
        findings.step("a forged, expired or nbf-ahead token is unauthorized and changes nothing",
                      asyncio.run, refused_token_changes_nothing(server))
    with ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                       extra=["--ping-interval", f"{PING_INTERVAL:g}",
                              "--pong-timeout", f"{PONG_TIMEOUT:g}"]) as server:
        findings.step("auth with --auth=none is a bad request", asyncio.run, auth_without_tokens(server))
        findings.step("?heartbeat=1: text pings, answered or closed; ping frames otherwise", asyncio.run,
                      heartbeat(server))
    findings.done()


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
