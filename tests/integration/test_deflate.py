#!/usr/bin/python3
"""permessage-deflate (RFC 7692) in pub/sub mode, from raw frames and Python `websockets`.

- Negotiation: the offers browsers and libraries make are answered with no context takeover
  either way; offers the server cannot honour or that are invalid are passed over, and the
  upgrade goes on without the extension; with --compression off nothing is negotiated.
- Events: subscribers that negotiated and subscribers that did not hear the same events in the
  same order; one of at least --compression-min-bytes comes compressed (RSV1), a smaller one
  plain, a burst (joined into one write per subscriber) and a history replay likewise.
- Client messages: compressed pubs, whole and fragmented (RSV1 on the first frame only), reach
  everyone.
- Hostile: a message that inflates past --max-message-bytes closes with 1009; RSV1 on a control
  frame, on a continuation, or without the extension is 1002; data that does not inflate, or
  inflates to text that is not UTF-8, is 1007. The server keeps serving.
- On the Redis bus: live events and replays from the stream come compressed as well.
- The compression cases of the Autobahn test suite, written from their descriptions: 12.x's text
  and binary messages of 16 B to 128 KiB, whole and fragmented, compressed by the client, under
  each of 13.x's offers, echoed (echo mode) and read back by websockets' own inflater.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402  (Debian's python3-websockets)
from wsp_testlib import (ServerProcess, admin_port, arg_parser, check, http_request, publish_ok, recv_json,  # noqa: E402
                         poll_until, run_main, run_step, scaled, scrape_metrics, subscribe, wait_gauge)
from wsp_wire import (OP_BINARY, OP_CONT, OP_PING, OP_TEXT, RawWebSocket, deflate_message,  # noqa: E402
                      encode_frame)

DEFLATE = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
TOPIC = "mailbox:42"
MIN_BYTES = 256  # the default --compression-min-bytes


def raw(port: int, offer: "str | None" = "permessage-deflate") -> RawWebSocket:
    extra = f"Sec-WebSocket-Extensions: {offer}\r\n" if offer is not None else ""
    return RawWebSocket(port, timeout=10).open(extra_headers=extra)


def raw_json(ws: RawWebSocket) -> dict:
    event = ws.next_event()
    check(event.opcode == OP_TEXT, f"expected a text message, got {event.describe()}")
    return json.loads(event.payload)


def raw_sub(ws: RawWebSocket, topics, since=None) -> dict:
    msg = {"op": "sub", "topics": topics}
    if since:
        msg["since"] = since
    ws.send_frame(OP_TEXT, json.dumps(msg).encode())
    reply = raw_json(ws)
    check(reply.get("op") == "subbed", f"sub answered {reply}")
    return reply


def seqs(ws: RawWebSocket, n: int) -> list:
    """The next n events' (data seq, came compressed)."""
    out = []
    for _ in range(n):
        event = json.loads(ws.next_event().payload)
        out.append((event["data"]["seq"], ws.last_compressed))
    return out


def mail(n: int, size: int) -> dict:
    """A mailbox notification of about `size` bytes of JSON."""
    base = {"kind": "mail", "seq": n, "from": "alice@example.com", "subject": ""}
    base["subject"] = ("Re: quarterly report " * 40)[:max(0, size - len(json.dumps(base)))]
    return base


# ---- negotiation --------------------------------------------------------------------------------

NEGOTIATION = [
    ("permessage-deflate", DEFLATE),
    ("permessage-deflate; client_max_window_bits", DEFLATE),  # what Chromium and Firefox offer
    ("permessage-deflate; client_max_window_bits=9; server_max_window_bits=15", DEFLATE + "; server_max_window_bits=15"),
    ("permessage-deflate; server_no_context_takeover; client_no_context_takeover", DEFLATE),
    ("x-webkit-deflate-frame, permessage-deflate", DEFLATE),
    # The server compresses with a 32 KiB window: it cannot honour a smaller one.
    ("permessage-deflate; server_max_window_bits=10", None),
    ("permessage-deflate; server_max_window_bits=10, permessage-deflate", DEFLATE),
    ("permessage-deflate; server_max_window_bits=16", None),
    ("permessage-deflate; client_max_window_bits=7", None),
    ("permessage-deflate; x-unknown=1", None),
    ("permessage-deflate; server_no_context_takeover; server_no_context_takeover", None),
    ('permessage-deflate; server_max_window_bits="15', None),  # unterminated quote
    ("x-webkit-deflate-frame", None),
    (None, None),
]


def negotiation(port: int) -> None:
    for offer, want in NEGOTIATION:
        ws = raw(port, offer)
        check(ws.extensions == want, f"offer {offer!r} answered with {ws.extensions!r}, expected {want!r}")
        raw_sub(ws, ["neg"])  # the connection works either way
        ws.close_socket()
    # The header repeated: its values are one list, in order.
    ws = RawWebSocket(port).open(extra_headers="Sec-WebSocket-Extensions: foo\r\n"
                                               "Sec-WebSocket-Extensions: permessage-deflate\r\n")
    check(ws.extensions == DEFLATE, f"an offer in a second header was answered {ws.extensions!r}")
    ws.close_socket()


def compression_off(binary: str, io: str) -> None:
    with ServerProcess(binary, io=io, mode="pubsub", extra=["--compression=off"]) as s:
        ws = raw(s.port)
        check(ws.extensions is None, f"--compression=off negotiated {ws.extensions!r}")
        ws.send_frame(OP_TEXT, deflate_message(b'{"op":"sub","topics":["x"]}'), rsv=4)
        ws.expect_close(1002)


# ---- events -------------------------------------------------------------------------------------

async def same_events(s: ServerProcess) -> None:
    admin = admin_port(s)
    r = raw(s.port)
    q = raw(s.port, None)
    raw_sub(r, [TOPIC])
    raw_sub(q, [TOPIC])
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws", compression="deflate") as w, \
            websockets.connect(f"ws://127.0.0.1:{s.port}/ws", compression=None) as p:
        check(w.response_headers.get("Sec-WebSocket-Extensions") == DEFLATE, "websockets did not negotiate")
        await subscribe(w, [TOPIC])
        await subscribe(p, [TOPIC])
        check(scrape_metrics(admin).get("wspush_compression_connections") == 2,
              "wspush_compression_connections is not 2 (one raw, one websockets)")
        before = scrape_metrics(admin).get("wspush_compressed_events_total", 0)

        # One small, one large, then a burst of 20 large ones in one batch (a run, joined).
        sizes = [40, 1000] + [300 + 50 * k for k in range(20)]
        publish_ok(s, TOPIC, mail(0, sizes[0]))
        publish_ok(s, TOPIC, mail(1, sizes[1]))
        body = "\n".join(json.dumps({"topic": TOPIC, "data": mail(2 + k, sizes[2 + k])}) for k in range(20))
        status, text = http_request(admin, "POST", "/publish/batch", body.encode())
        check(status == 200, f"POST /publish/batch answered {status} {text[:200]}")

        for n, size in enumerate(sizes):
            from_r, from_q = r.next_event(), q.next_event()
            compressed = r.last_compressed
            check(not q.last_compressed, "a connection without the extension got a compressed frame")
            from_w, from_p = await asyncio.wait_for(w.recv(), scaled(10)), await asyncio.wait_for(p.recv(), scaled(10))
            check(from_r.payload == from_q.payload == from_w.encode() == from_p.encode(),
                  f"event {n}: the four subscribers heard different things:\n{from_r.payload[:80]!r}\n"
                  f"{from_q.payload[:80]!r}\n{from_w[:80]!r}\n{from_p[:80]!r}")
            check(json.loads(from_q.payload)["data"]["seq"] == n, f"event {n} out of order: {from_q.payload[:80]!r}")
            payload_len = len(from_q.payload)
            check(compressed == (payload_len >= MIN_BYTES),
                  f"event {n} of {payload_len} B came {'compressed' if compressed else 'plain'} "
                  f"(--compression-min-bytes {MIN_BYTES})")
        m = scrape_metrics(admin)
        made = m.get("wspush_compressed_events_total", 0) - before
        check(made == 21, f"{made} events compressed, expected 21: once each, not once per subscriber")
        check(m.get('wspush_compression_bytes_total{stage="after"}', 0) < m.get('wspush_compression_bytes_total{stage="before"}', 0) / 2,
              "the compressed events did not shrink by half")
    r.close_socket()
    q.close_socket()


def replay(s: ServerProcess) -> None:
    # An event is compressed when it is published, and only while some connection that
    # negotiated the extension is open (none: no work for nobody); the history keeps it as made.
    wait_gauge(admin_port(s), "wspush_compression_connections", 0, "the last step's connections are not all gone")
    first = publish_ok(s, "replay:1", mail(99, 600))
    publish_ok(s, "replay:1", mail(100, 600))
    holder = raw(s.port)
    raw_sub(holder, ["elsewhere"])
    publish_ok(s, "replay:1", mail(101, 20))
    publish_ok(s, "replay:1", mail(102, 2000))
    ws = raw(s.port)
    raw_sub(ws, ["replay:1"], since={"replay:1": first})
    got = seqs(ws, 3)
    check(got == [(100, False), (101, False), (102, True)], f"the replay after the first event came as {got}")
    ws.close_socket()
    holder.close_socket()


async def client_messages(s: ServerProcess) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws", compression=None) as p, \
            websockets.connect(f"ws://127.0.0.1:{s.port}/ws", compression="deflate") as w:
        await subscribe(p, ["pubs"])
        # websockets compresses what it sends once negotiated.
        await w.send(json.dumps({"op": "pub", "topic": "pubs", "data": mail(1, 3000)}))
        got = await recv_json(p)
        check(got.get("data") == mail(1, 3000), f"a compressed pub from websockets arrived as {str(got)[:120]}")
        # Raw: one compressed frame, then the same stream cut into three frames.
        ws = raw(s.port)
        for n, cuts in [(2, []), (3, [5, 40])]:
            packed = deflate_message(json.dumps({"op": "pub", "topic": "pubs", "data": mail(n, 1500)}).encode())
            pieces = [packed[a:b] for a, b in zip([0] + cuts, cuts + [len(packed)])]
            wire = b"".join(encode_frame(OP_TEXT if k == 0 else OP_CONT, piece, fin=k == len(pieces) - 1,
                                         rsv=4 if k == 0 else 0) for k, piece in enumerate(pieces))
            ws.send_raw(wire)
            got = await recv_json(p)
            check(got.get("data") == mail(n, 1500), f"a compressed pub in {len(pieces)} frame(s) arrived as {str(got)[:120]}")
        m = scrape_metrics(admin_port(s))
        check(m.get("wspush_messages_in_compressed_total", 0) >= 3, "wspush_messages_in_compressed_total did not count them")
        ws.close_socket()


# ---- hostile ------------------------------------------------------------------------------------

def hostile(s: ServerProcess) -> None:
    limit = 64 * 1024  # --max-message-bytes in pub/sub mode
    bomb = deflate_message(b'{"op":"pub","topic":"pubs","data":"' + b"0" * (4 << 20) + b'"}', level=9)
    check(len(bomb) < 8192, f"the bomb is {len(bomb)} B")
    cases = [
        ("a message that inflates to 4 MiB", lambda ws: ws.send_frame(OP_TEXT, bomb, rsv=4), 1009),
        ("one that inflates one byte past the limit",
         lambda ws: ws.send_frame(OP_BINARY, deflate_message(b"a" * (limit + 1)), rsv=4), 1009),
        ("RSV1 on a ping", lambda ws: ws.send_frame(OP_PING, b"", rsv=4), 1002),
        ("RSV1 on a continuation",
         lambda ws: ws.send_raw(encode_frame(OP_TEXT, b"ab", fin=False, rsv=4) + encode_frame(OP_CONT, b"cd", rsv=4)), 1002),
        ("RSV2", lambda ws: ws.send_frame(OP_TEXT, b"x", rsv=2), 1002),
        ("data that does not inflate", lambda ws: ws.send_frame(OP_TEXT, b"\xff\xff\xff", rsv=4), 1007),
        ("text that inflates to bytes that are not UTF-8",
         lambda ws: ws.send_frame(OP_TEXT, deflate_message(b'{"op":"\xff"}'), rsv=4), 1007),
    ]
    for name, send, code in cases:
        ws = raw(s.port)
        send(ws)
        try:
            ws.expect_close(code)
        except Exception as exc:
            raise type(exc)(f"{name}: {exc}") from None
    ws = raw(s.port, None)
    ws.send_frame(OP_TEXT, deflate_message(b'{"op":"sub","topics":["x"]}'), rsv=4)
    ws.expect_close(1002)
    # Exactly the limit inflates and is read whole: the session then refuses binary (1003, not 1009).
    ws = raw(s.port)
    ws.send_frame(OP_BINARY, deflate_message(b"a" * limit), rsv=4)
    ws.expect_close(1003)
    # Still serving.
    ws = raw(s.port)
    raw_sub(ws, ["after"])
    ws.close_socket()


# ---- the compression cases of the Autobahn test suite (12.x, 13.x), written from their descriptions

# 13.x: the offers a client makes (server_no_context_takeover, client_no_context_takeover,
# server_max_window_bits, client_max_window_bits), each with the messages of 12.x; an offer this
# server cannot honour (a server window under 15) is declined and the echo goes on plain.
AUTOBAHN_OFFERS = [
    (False, False, None, True), (True, False, None, True), (False, True, None, True), (True, True, None, True),
    (False, False, None, 9), (False, False, None, 15), (True, True, None, 9), (True, True, None, 15),
    (False, False, 9, True), (False, False, 15, True), (True, True, 9, 9), (True, True, 15, 15),
]
AUTOBAHN_SIZES = [16, 64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072]
TEXT = ("Hello, this is a message of the compression test cases: it says a few things and says them "
        "again, mail for mailbox 42, a subject, a preview, names and numbers 1234567890. ")


async def autobahn(binary: str, io: str) -> None:
    from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
    with ServerProcess(binary, io=io, mode="echo") as s:
        for snct, cnct, smwb, cmwb in AUTOBAHN_OFFERS:
            factory = ClientPerMessageDeflateFactory(server_no_context_takeover=snct, client_no_context_takeover=cnct,
                                                     server_max_window_bits=smwb, client_max_window_bits=cmwb)
            async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws", extensions=[factory], compression=None,
                                          max_size=None, ping_interval=None) as ws:
                ext = ws.response_headers.get("Sec-WebSocket-Extensions")
                want = (None if smwb is not None and smwb < 15 else
                        DEFLATE + "; server_max_window_bits=15" if smwb == 15 else DEFLATE)
                check(ext == want, f"offer {(snct, cnct, smwb, cmwb)} answered {ext!r}, expected {want!r}")
                rng = random.Random(f"{snct}{cnct}{smwb}{cmwb}")
                for size in AUTOBAHN_SIZES:
                    for kind in ("text", "binary"):
                        for k in range(4):
                            if kind == "text":
                                msg = (TEXT * (size // len(TEXT) + 1))[:size]
                            else:
                                msg = bytes(rng.getrandbits(8) for _ in range(size)) if k % 2 else (TEXT.encode() * (size // len(TEXT) + 1))[:size]
                            # 12.x auto-fragments at 0 (none), 256, 1024 and 4096 bytes.
                            chunk = [0, 256, 1024, 4096][k]
                            if chunk and size > chunk:
                                await asyncio.wait_for(ws.send([msg[i:i + chunk] for i in range(0, size, chunk)]), scaled(10))
                            else:
                                await asyncio.wait_for(ws.send(msg), scaled(10))
                            got = await asyncio.wait_for(ws.recv(), scaled(10))
                            check(got == msg, f"offer {(snct, cnct, smwb, cmwb)}: a {size} B {kind} message "
                                              f"(fragments of {chunk or 'none'}) came back different")


def redis_bus(binary: str, io: str) -> None:
    """On the Redis bus the node frames an event it hears from Redis once, and compresses it
    once: live events and replays from the stream come compressed too."""
    from wsp_redis import RedisServer
    rs = RedisServer(persistent=False).start()
    try:
        with ServerProcess(binary, io=io, mode="pubsub", extra=["--bus", rs.url]) as s:
            check(poll_until(lambda: scrape_metrics(admin_port(s)).get("wspush_bus_up") == 1, scaled(30)),
                  "the node's bus did not come up")
            holder = raw(s.port)  # a connection that negotiated: events are compressed from here on
            raw_sub(holder, ["elsewhere"])
            first = publish_ok(s, "rb:1", mail(1, 600))
            ws = raw(s.port)
            raw_sub(ws, ["rb:1"])
            publish_ok(s, "rb:1", mail(2, 600))
            publish_ok(s, "rb:1", mail(3, 20))
            live = seqs(ws, 2)
            check(live == [(2, True), (3, False)], f"live events on the Redis bus came as {live}")
            again = raw(s.port)
            raw_sub(again, ["rb:1"], since={"rb:1": first})
            replayed = seqs(again, 2)
            check(replayed == [(2, True), (3, False)], f"the replay from the Redis stream came as {replayed}")
            for c in (holder, ws, again):
                c.close_socket()
    finally:
        rs.close()


def run(args) -> None:
    with ServerProcess(args.server, io=args.io, mode="pubsub", extra=["--allow-client-publish"],
                       quiet=not args.verbose) as s:
        run_step("negotiation: what can be honoured is taken, the rest passed over", negotiation, s.port)
        run_step("compressed and plain subscribers hear the same events", lambda: asyncio.run(same_events(s)))
        run_step("a history replay comes compressed too", replay, s)
        run_step("compressed pubs, whole and fragmented", lambda: asyncio.run(client_messages(s)))
        run_step("bombs, RSV misuse and bad data close the connection, the server serves on", hostile, s)
        check(s.alive(), "server exited during the test\n" + s.log_tail())
    run_step("--compression=off negotiates nothing", compression_off, args.server, args.io)
    run_step("the Autobahn compression cases (12.x messages under each 13.x offer), echoed",
             lambda: asyncio.run(autobahn(args.server, args.io)))
    run_step("on the Redis bus, live events and replays come compressed", redis_bus, args.server, args.io)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
