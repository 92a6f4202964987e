#!/usr/bin/python3
"""Backpressure and slow peers against the real binary (DESIGN.md "Delivery and history": the
slow-consumer bound judges the backlog left after the kernel has taken what it could; one slow
client never delays the others and never grows memory without bound, whatever it sends; control
replies count too, and at most one pong waits at a time):

- the bound judges real backlog: with --max-pending-bytes 65536, three Python `websockets`
  readers get all 2,000 events of 1 KiB (20 batches of 100 through POST /publish/batch), in
  order, and stay open; a raw client with a small receive window that never reads is closed with
  1013; exactly one slow-consumer close is counted; the server's RSS stays bounded;
- the same with the default bound (4 MiB) and one batch of 5,000 x 1 KiB (more than the bound
  queued within one loop iteration): readers get everything, the non-reader gets 1013;
- ping flood: a raw client that never reads sends masked 125-byte pings as fast as it can (up
  to 200 MB or 20 s); with --max-pending-bytes 1 MiB the server's RSS grows by less than 64 MiB,
  and once the client is gone a fresh client subscribes and gets an event;
- --message-timeout covers a frame trickled one byte a second, control frame or data frame
  header alike: closed (1008) while the frame, or the header, is still unfinished. A byte a second
  keeps every gap below the timeout of 2 s, so only a deadline that runs from the first unfinished
  byte ends it before its last byte; the keepalive (60 s, and the bytes keep it busy) cannot;
- one event larger than the bound (6 MiB against 1 MiB): ten raw clients with a small receive
  window that never read are each closed with 1013 once the kernel takes no more of it (the
  counter rises by ten; before, nothing judged them until a later event came), while a Python
  `websockets` reader and a raw reader that takes 4 KiB every 2 ms get the event whole and stay
  open.

Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import base64
import json
import os
import select
import socket
import sys
import threading
import time

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (Findings, OP_CLOSE, OP_PING, OP_TEXT, RawWebSocket, ServerProcess,  # noqa: E402
                         accept_key, admin_port, arg_parser, check, no_positions, decode_frame, encode_frame, http_request,
                         parse_close, parse_http_head, recv_some, run_main, scaled, scrape_metrics,
                         upgrade_request, RssPeak)

MiB = 1 << 20
TOPIC = "bp"
SLOW_CLOSES = "wspush_slow_consumer_closes_total"


# ---- helpers -----------------------------------------------------------------------------------


def small_window_socket(rcvbuf: int = 4096, mss: int = 536) -> socket.socket:
    """A client socket whose receive window stays tiny: the options must be set before connect()."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class NonReader:
    """A raw client with a small receive window: upgrades, subscribes, waits for `subbed`, and
    from then on reads nothing until the test asks it to (`read_until_closed`)."""

    def __init__(self, port: int, topic: str):
        self.sock = small_window_socket()
        self.sock.connect(("127.0.0.1", port))
        self.sock.setblocking(False)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(upgrade_request("/ws", key))
        buf = bytearray()
        deadline = time.monotonic() + scaled(10)
        while b"\r\n\r\n" not in buf:
            recv_some(self.sock, buf, deadline, "the upgrade answer")
        end = buf.index(b"\r\n\r\n") + 4
        status, _, headers = parse_http_head(bytes(buf[:end]))
        check(status == 101, f"non-reader's upgrade answered {status}")
        check((headers.get("sec-websocket-accept") or [""])[0] == accept_key(key), "bad Sec-WebSocket-Accept")
        del buf[:end]
        self.sock.sendall(encode_frame(OP_TEXT, json.dumps({"op": "sub", "topics": [topic]}).encode()))
        while True:
            frame, used = decode_frame(buf)
            if frame is None:
                recv_some(self.sock, buf, deadline, "the non-reader's subbed")
                continue
            del buf[:used]
            check(frame.opcode == OP_TEXT, f"non-reader got {frame.describe()} before subbed")
            reply = json.loads(frame.payload)
            check(reply.get("op") == "subbed", f"non-reader's sub answered {reply}")
            break
        self.rbuf = buf

    def read_until_closed(self, timeout: float) -> "tuple[int | None, bool, int]":
        """Reads everything the server sent until a close frame or EOF (or `timeout`).
        Returns (close code or None, eof seen, number of data messages before)."""
        deadline = time.monotonic() + timeout
        messages, eof, pos = 0, False, 0
        buf = self.rbuf
        while True:
            frame, end = decode_frame(buf, pos)
            if frame is not None:
                pos = end
                if frame.opcode == OP_CLOSE:
                    return parse_close(frame.payload)[0], eof, messages
                messages += frame.opcode in (OP_TEXT, 0x2)
                if pos > (1 << 20):
                    del buf[:pos]
                    pos = 0
                continue
            if eof or time.monotonic() >= deadline:
                return None, eof, messages
            ready, _, _ = select.select([self.sock], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
            if ready:
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    chunk = b""
                if not chunk:
                    eof = True
                buf += chunk

    def close(self) -> None:
        self.sock.close()


def payload(seq: int, size: int = 1024) -> dict:
    """The data of event `seq`: a JSON object of exactly `size` bytes carrying its sequence number."""
    base = len(json.dumps({"seq": seq, "pad": ""}))
    return {"seq": seq, "pad": "x" * (size - base)}


def batch_publish(admin: int, items: list) -> "list[str]":
    body = "\n".join(json.dumps({"topic": t, "data": d}) for t, d in items).encode()
    status, text = http_request(admin, "POST", "/publish/batch", body)
    check(status == 200, f"POST /publish/batch answered {status} {text[:200]}")
    results = json.loads(text)["results"]
    check(len(results) == len(items) and all("id" in r for r in results), f"batch had errors: {text[:300]}")
    return [r["id"] for r in results]


def slow_closes(admin: int) -> float:
    return scrape_metrics(admin).get(SLOW_CLOSES, 0.0)


# ---- A.1 / A.2: the bound judges real backlog ----------------------------------------------------

async def readers_and_non_reader(server: ServerProcess, batches: "list[int]", paced: bool,
                                 rss_bound: int, rss_why: str) -> None:
    """Three readers and one non-reader subscribe to TOPIC; `batches` (sizes) of 1 KiB events are
    published from a thread while the readers read. `paced`: a batch is sent only once every
    reader has all of the previous ones (so a reader never has more than one batch outstanding)."""
    admin = admin_port(server)
    url = f"ws://127.0.0.1:{server.port}/ws"
    total = sum(batches)
    readers = [await websockets.connect(url, max_size=None, max_queue=None, ping_interval=None) for _ in range(3)]
    for ws in readers:
        await ws.send(json.dumps({"op": "sub", "topics": [TOPIC]}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(reply.get("op") == "subbed", f"reader's sub answered {reply}")
    slow = await asyncio.to_thread(NonReader, server.port, TOPIC)
    closes_before = slow_closes(admin)

    cond = threading.Condition()
    got = [[] for _ in readers]  # ids received, per reader
    ended = [None] * len(readers)  # why a reader stopped early
    published: "list[str]" = []
    publish_error: list = []

    def publisher() -> None:
        seq = 0
        try:
            for size in batches:
                if paced:
                    with cond:
                        ok = cond.wait_for(lambda: all(len(g) >= seq or e for g, e in zip(got, ended)),
                                           timeout=scaled(20))
                        if any(ended):
                            return  # a reader is gone: the test fails on that below
                        if not ok:
                            publish_error.append(f"readers stalled at {[len(g) for g in got]} of {seq}")
                            return
                ids = batch_publish(admin, [(TOPIC, payload(seq + k)) for k in range(size)])
                with cond:
                    published.extend(ids)
                seq += size
        except Exception as exc:  # reported by the test, not lost in the thread
            publish_error.append(f"{type(exc).__name__}: {exc}")
            with cond:
                cond.notify_all()

    async def read(k: int, ws) -> None:
        while len(got[k]) < total:
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), scaled(20)))
            except asyncio.TimeoutError:
                ended[k] = f"got no event for {scaled(20):.0f}s after {len(got[k])} of {total}"
                break
            except websockets.exceptions.ConnectionClosed:
                ended[k] = (f"closed by the server with code {ws.close_code} after {len(got[k])} of {total} events")
                break
            want = len(got[k])
            if msg.get("topic") != TOPIC or msg.get("data", {}).get("seq") != want:
                ended[k] = f"event {want} out of order or foreign: {str(msg)[:120]}"
                break
            with cond:
                got[k].append(msg["id"])
                cond.notify_all()
        with cond:
            cond.notify_all()

    with RssPeak(server.proc.pid) as rss:
        thread = threading.Thread(target=publisher, daemon=True)
        thread.start()
        await asyncio.gather(*(read(k, ws) for k, ws in enumerate(readers)))
        await asyncio.to_thread(thread.join, scaled(60))
        check(not thread.is_alive(), "the publisher thread did not finish within 60 s")
        # The non-reader: everything the server queued for it, then a close frame with 1013 (or,
        # if the close timeout passed meanwhile, the server closing the socket).
        code, eof, seen = await asyncio.to_thread(slow.read_until_closed, scaled(20))
    problems = []
    for k, why in enumerate(ended):
        if why:
            problems.append(f"reader {k} {why}")
    if not any(ended):
        for k in range(len(readers)):
            if got[k] != published:
                problems.append(f"reader {k}: ids differ from the publish answers "
                                f"({len(got[k])} received, {len(published)} published)")
    if publish_error:
        problems.append(f"publishing failed: {publish_error[0]}")
    # The readers are still open: each can still unsubscribe and gets the answer.
    for k, ws in enumerate(readers):
        if ended[k]:
            continue
        try:
            await ws.send(json.dumps({"op": "unsub", "topics": [TOPIC]}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
            if reply != {"op": "unsubbed", "topics": [TOPIC]}:
                problems.append(f"reader {k}: unsub afterwards answered {reply}")
        except (websockets.exceptions.ConnectionClosed, asyncio.TimeoutError) as exc:
            problems.append(f"reader {k} no longer usable after the publishes: {type(exc).__name__} "
                            f"(close code {ws.close_code})")
    if code is not None:
        if code != 1013:
            problems.append(f"the non-reader was closed with {code}, expected 1013")
    elif not eof:
        problems.append(f"the non-reader was not closed ({seen} events readable, no close frame, "
                        f"no EOF within {scaled(20):.0f}s)")
    closes = slow_closes(admin) - closes_before
    if closes != 1:
        problems.append(f"{SLOW_CLOSES} moved by {closes:.0f}, expected 1 (the non-reader only)")
    if rss.growth_bytes > rss_bound:
        problems.append(f"server RSS grew by {rss.growth_bytes / MiB:.1f} MiB (bound {rss_bound / MiB:.0f} MiB: {rss_why})")
    for ws in readers:
        await ws.close()
    slow.close()
    check(not problems, "; ".join(problems))
    print(f"   (non-reader got {seen} events then close {code}; RSS grew {rss.growth_bytes / MiB:.1f} MiB)")


# ---- A.3: ping flood ------------------------------------------------------------------------------

def ping_flood(server: ServerProcess, pending_bound: int, limit_bytes: int, limit_s: float) -> None:
    rss_bound = pending_bound + 63 * MiB
    sock = small_window_socket()
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(upgrade_request("/ws", key))
    buf = bytearray()
    deadline = time.monotonic() + scaled(10)
    while b"\r\n\r\n" not in buf:
        recv_some(sock, buf, deadline, "the upgrade answer")
    check(parse_http_head(bytes(buf))[0] == 101, "flooder's upgrade refused")
    # 512 masked pings with 125-byte payloads (each with its own key), sent over and over.
    chunk = b"".join(encode_frame(OP_PING, os.urandom(125)) for _ in range(512))
    view = memoryview(chunk)
    sent, pos, why = 0, 0, ""
    started = last_progress = time.monotonic()
    with RssPeak(server.proc.pid) as rss:
        while True:
            now = time.monotonic()
            if sent >= limit_bytes:
                why = f"sent {limit_bytes / MiB:.0f} MiB"
                break
            if now - started >= limit_s:
                why = f"{limit_s:.0f}s passed"
                break
            if now - last_progress >= 3:
                why = "the server stopped reading from us for 3 s (backpressure)"
                break
            if rss.growth_bytes > rss_bound:
                why = "RSS bound exceeded"
                break
            _, writable, _ = select.select([], [sock], [], 0.1)
            if not writable:
                continue
            try:
                n = sock.send(view[pos:])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                why = "the server closed the connection"
                break
            sent += n
            pos = (pos + n) % len(chunk)
            last_progress = time.monotonic()
    sock.close()
    print(f"   (flood: {sent / MiB:.0f} MiB of pings in {time.monotonic() - started:.1f}s, stopped: {why}; "
          f"RSS grew {rss.growth_bytes / MiB:.1f} MiB)")
    check(server.alive(), "the server died under the ping flood\n" + server.log_tail())
    check(rss.growth_bytes <= rss_bound,
          f"server RSS grew by {rss.growth_bytes / MiB:.0f} MiB under a ping flood from one client that never reads "
          f"({sent / MiB:.0f} MiB of pings sent; bound: --max-pending-bytes {pending_bound / MiB:.0f} MiB + 63 MiB "
          "slack; pongs must count against the bound, at most one waiting)")


async def healthy_after(server: ServerProcess) -> None:
    admin = admin_port(server)
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["after"]}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(no_positions(reply) == {"op": "subbed", "topics": ["after"], "lost": []}, f"after the flood, sub answered {reply}")
        status, text = await asyncio.to_thread(http_request, admin, "POST", "/publish",
                                               b'{"topic":"after","data":42}')
        check(status == 200, f"after the flood, publish answered {status} {text}")
        event = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(event.get("topic") == "after" and event.get("data") == 42, f"after the flood, got {event}")


# ---- A.4: trickled frames and --message-timeout ----------------------------------------------------

def _close_code_in(buf) -> "tuple[bool, int | None]":
    """(a close frame is among the frames in `buf`, its code)."""
    pos = 0
    while True:
        seen, pos = decode_frame(buf, pos)
        if seen is None:
            return False, None
        if seen.opcode == OP_CLOSE:
            return True, parse_close(seen.payload)[0]


def trickle(port: int, frame: bytes, message_timeout: float, what: str, whole: int = 0,
            unfinished: int = 0) -> None:
    """Sends `frame` (its first `whole` bytes at once) one byte a second and requires the server to
    close the connection, with a close frame (1008) or at least by closing TCP, before the first
    `unfinished` bytes of it (all of it if 0) have gone out: ordered by the bytes, not timed. The
    wait gives up after a timeout that only stops a hang."""
    hang = scaled(30)
    unfinished = unfinished or len(frame)
    with RawWebSocket(port, timeout=scaled(10)).open("/ws") as ws:
        first = time.monotonic()
        if whole:
            check(ws.send_raw(frame[:whole]), f"{what}: the server closed at the first bytes")
        closed_at, code, sent = None, None, whole

        def closed() -> bool:
            nonlocal code
            got_close, code = _close_code_in(ws.rbuf)
            return got_close or ws.eof or ws.send_failed

        while True:
            ws.read_to_eof(0.1)
            if closed():
                closed_at = time.monotonic()
                break
            check(sent < unfinished,
                  f"{what} trickled one byte a second: its {unfinished} bytes all went out over "
                  f"{time.monotonic() - first:.1f}s and the server had not closed it (--message-timeout "
                  f"{message_timeout:g} must run from the first unfinished byte, not from the latest)")
            check(time.monotonic() - first < hang,
                  f"{what} trickled one byte a second: still open {hang:.0f}s after its first byte "
                  f"({sent} of {len(frame)} bytes sent; --message-timeout {message_timeout:g})")
            if time.monotonic() >= first + (sent - whole):
                check(ws.send_raw(frame[sent:sent + 1]) or closed(), f"{what}: a send failed with no close")
                sent += 1
        check(code in (None, 1008), f"{what} trickled: closed with {code}, expected 1008")
        # How soon after the first byte is a figure for a benchmark, not a check.
        print(f"   ({what}: closed after {sent} of {len(frame)} bytes, {closed_at - first:.1f}s after the first, "
              f"{'close code %s' % code if code else 'TCP closed without a close frame'})")


# ---- A.5: one event larger than the bound ------------------------------------------------------------

def read_paced(client: NonReader, chunk: int, pause: float, hang: float) -> "tuple[bytes | None, str]":
    """Reads at most `chunk` bytes every `pause` seconds until a data message is whole, then asks
    for an unsub and waits for its answer: a reader that takes the bytes steadily, slower than
    the kernel could. Returns (the message's payload, "") or (None, what went wrong)."""
    buf, sock, deadline = client.rbuf, client.sock, time.monotonic() + hang
    want = None
    while time.monotonic() < deadline:
        frame, used = decode_frame(buf)
        if frame is not None:
            del buf[:used]
            if frame.opcode == OP_CLOSE:
                return None, f"closed with {parse_close(frame.payload)[0]}"
            if want is not None:
                if json.loads(frame.payload).get("op") != "unsubbed":
                    return None, f"its unsub answered {frame.describe()}"
                return want, ""
            want = frame.payload
            sock.sendall(encode_frame(OP_TEXT, json.dumps({"op": "unsub", "topics": [TOPIC]}).encode()))
            continue
        ready, _, _ = select.select([sock], [], [], 0.5)
        if not ready:
            continue
        try:
            data = sock.recv(chunk)
        except BlockingIOError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            return None, f"EOF after {len(buf)} bytes"
        buf += data
        time.sleep(pause)
    return None, f"no whole message within {hang:.0f}s ({len(buf)} bytes)"


async def big_event(server: ServerProcess, non_readers: int, size: int, bound: int) -> None:
    """Two readers and `non_readers` raw clients subscribe to TOPIC; one event of `size` bytes
    (more than `bound`) is published, and nothing after it. The bound holds whatever the size of
    the events: every non-reader is closed as a slow consumer on time alone. An event larger than
    the bound is no fault by itself: a `websockets` reader and a raw reader that takes 4 KiB
    every 2 ms through a 4 KiB window (about four seconds for the event, its backlog over the
    bound most of that time) get it whole and stay open."""
    admin = admin_port(server)
    reader = await websockets.connect(f"ws://127.0.0.1:{server.port}/ws", max_size=None, max_queue=None,
                                      ping_interval=None)
    await reader.send(json.dumps({"op": "sub", "topics": [TOPIC]}))
    reply = json.loads(await asyncio.wait_for(reader.recv(), scaled(10)))
    check(reply.get("op") == "subbed", f"reader's sub answered {reply}")
    paced = await asyncio.to_thread(NonReader, server.port, TOPIC)
    slow = [await asyncio.to_thread(NonReader, server.port, TOPIC) for _ in range(non_readers)]
    closes_before = slow_closes(admin)
    data = "y" * size
    paced_read = asyncio.create_task(asyncio.to_thread(
        lambda: (*read_paced(paced, 4096, 0.002, scaled(60)), time.monotonic())))
    status, text = await asyncio.to_thread(http_request, admin, "POST", "/publish",
                                           json.dumps({"topic": TOPIC, "data": data}).encode())
    check(status == 200, f"publishing the {size / MiB:.0f} MiB event answered {status} {text[:200]}")
    published = time.monotonic()
    problems = []
    try:
        event = json.loads(await asyncio.wait_for(reader.recv(), scaled(30)))
        if event.get("topic") != TOPIC or event.get("data") != data:
            problems.append(f"the reader got a different event ({len(event.get('data', ''))} bytes of data)")
    except (asyncio.TimeoutError, websockets.exceptions.ConnectionClosed) as exc:
        problems.append(f"the reader did not get the {size / MiB:.0f} MiB event: {type(exc).__name__} "
                        f"(close code {reader.close_code})")
    # No later event comes: the non-readers are judged by time alone. The wait only stops a hang.
    hang = scaled(20)
    closes = 0.0
    while time.monotonic() - published < hang:
        closes = slow_closes(admin) - closes_before
        if closes >= non_readers:
            break
        await asyncio.sleep(0.05)
    judged = time.monotonic() - published
    got, why, paced_done = await paced_read
    paced_took = paced_done - published
    if got is None:
        problems.append(f"the paced reader: {why}")
    elif json.loads(got).get("data") != data:
        problems.append(f"the paced reader got a different event ({len(got)} bytes)")
    if closes < non_readers:
        problems.append(f"{closes:.0f} of {non_readers} non-readers closed as slow consumers {hang:.0f}s after one "
                        f"{size / MiB:.0f} MiB event (over the {bound / MiB:.0f} MiB bound) that none of them read")
    else:
        # What each was sent (the event, whose first bytes had gone out whole), then 1013.
        results = await asyncio.gather(*(asyncio.to_thread(c.read_until_closed, scaled(30)) for c in slow))
        codes = sorted({code for code, _, _ in results}, key=str)
        if codes != [1013]:
            problems.append(f"the non-readers ended with close codes {codes}, expected 1013 only")
    try:
        await reader.send(json.dumps({"op": "unsub", "topics": [TOPIC]}))
        reply = json.loads(await asyncio.wait_for(reader.recv(), scaled(10)))
        if reply != {"op": "unsubbed", "topics": [TOPIC]}:
            problems.append(f"the reader's unsub afterwards answered {reply}")
    except (websockets.exceptions.ConnectionClosed, asyncio.TimeoutError) as exc:
        problems.append(f"the reader is no longer usable: {type(exc).__name__} (close code {reader.close_code})")
    closes = slow_closes(admin) - closes_before
    if closes > non_readers:
        problems.append(f"{SLOW_CLOSES} moved by {closes:.0f}, expected {non_readers} (the non-readers only)")
    await reader.close()
    for c in [paced, *slow]:
        c.close()
    check(not problems, "; ".join(problems))
    print(f"   ({non_readers} non-readers closed 1013 {judged:.1f}s after the publish; the readers got "
          f"{size / MiB:.0f} MiB whole, the paced one in {paced_took:.1f}s)")


def run(args) -> None:
    quiet = not args.verbose
    findings = Findings()  # every finding is checked and reported, not only the first that fails
    step = findings.step

    def start(*extra):
        return ServerProcess(args.server, io=args.io, mode="pubsub", extra=list(extra), quiet=quiet).start()

    # A.1 The history holds every event (nothing is evicted while the test runs) and stays far
    # below the RSS bound: 2,000 x ~1.1 KiB.
    with start("--max-pending-bytes", "65536", "--history-size", "2000", "--close-timeout", "10") as server:
        step("bound 64 KiB: 2,000 x 1 KiB in batches of 100, readers keep up, non-reader 1013",
                 asyncio.run, readers_and_non_reader(
                     server, [100] * 20, True, 64 * MiB,
                     "4 connections x 64 KiB pending + 2.2 MB history + 100 KiB request bodies, the rest is slack"))
    # A.2 One batch of 5,000 x 1 KiB: more than the 4 MiB bound is queued in one loop iteration.
    with start("--max-body-bytes", str(16 * MiB), "--close-timeout", "10") as server:
        step("default bound 4 MiB: one batch of 5,000 x 1 KiB, readers keep up, non-reader 1013",
                 asyncio.run, readers_and_non_reader(
                     server, [5000], False, 128 * MiB,
                     "5.3 MB request body and its 5,000 shared frames + 4 x 4 MiB pending, the rest is slack"))
    # A.3
    with start("--max-pending-bytes", str(MiB)) as server:
        step("ping flood from a client that never reads: RSS bounded",
                 ping_flood, server, MiB, 200 * MiB, scaled(20))
        step("server healthy after the flood", asyncio.run, healthy_after(server))
    # A.4 A ping with a 125-byte payload, and a text frame with a 64-bit length (14 header bytes,
    # the longest header: the server must close before the last of them).
    with start("--message-timeout", "2", "--ping-interval", "60") as server:
        ping = encode_frame(OP_PING, b"p" * 125)
        text = encode_frame(OP_TEXT, b"t" * 65536)
        # The header whole, then the payload one byte a second: the message timer runs from the
        # header on (the reader is mid-frame). A reference case; it works today too.
        sock_first = encode_frame(OP_TEXT, b"u" * 100)
        step("trickled ping frame closed by --message-timeout", trickle, server.port, ping, 2.0, "a ping frame")
        step("trickled text frame header closed by --message-timeout", trickle, server.port, text, 2.0,
             "a text frame header", 0, 14)
        step("text frame payload trickled after a whole header closed by --message-timeout", trickle,
             server.port, sock_first, 2.0, "a text frame payload", 6)
        check(server.alive(), "server exited\n" + server.log_tail())
    # A.5 One 6 MiB event and a 1 MiB bound: a non-reader's kernel takes about 100 KiB of it (a
    # 4 KiB receive window), and a reader's first write leaves more than the bound behind too
    # (its socket takes at most 4 MiB at once). The close timeout leaves time to read what each
    # non-reader was sent before its close frame.
    with start("--max-pending-bytes", str(MiB), "--max-body-bytes", str(16 * MiB), "--close-timeout", "30") as server:
        step("bound 1 MiB: one 6 MiB event, readers get it whole, 10 non-readers 1013",
             asyncio.run, big_event(server, 10, 6 * MiB, MiB))
    findings.done()


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
