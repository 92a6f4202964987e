#!/usr/bin/env python3
"""The Redis bus under floods: a client's pubs and an event larger than the bound.

Against the real binary and a real redis-server:
- one connection sending 60 KB pubs as fast as it can, for a bounded time, with Redis healthy
  and with Redis frozen (SIGSTOP): the node's memory stays within its bounds (16 pubs in flight
  per connection, then it reads no further: TCP slows the client), every pub is answered
  (published or refused), and the node goes on once Redis does;
- a `sub` held while Redis is frozen, with MBs of pubs pipelined behind it: the node reads at
  most one read's worth past the held message (the rest waits in the kernel, TCP slows the
  client), not up to the socket's backlog (io_uring's multishot recv took it all and closed the
  polite client 1008 past 1 MiB kept); once Redis is back, every pub behind the sub is published;
- an event straight into Redis larger than the nodes' bound (the larger of --max-body-bytes and
  --max-message-bytes, written into Redis by the nodes): wspush_publish refuses it with a clear
  error; one at the bound is published and delivered.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sys
import time

import redis
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (OP_CLOSE, OP_TEXT, Findings, RawWebSocket, ServerProcess, admin_port,  # noqa: E402
                         arg_parser, check, encode_frame, metric, poll_until, publish_ok, recv_json,
                         rss_bounds_checked, run_main, scaled, subscribe, rss_mb, RssPeak, wait_gauge)

FLOOD_SECONDS = 3.0
PUB_BYTES = 60_000
PUBS_BEHIND_SUB = 64         # about 3.8 MB pipelined behind a held sub
MAX_KEPT = 256 << 10         # what a held connection may take past its held message


def start_node(args, rs: RedisServer) -> ServerProcess:
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", rs.url, "--threads", "2", "--allow-client-publish",
                                "--max-message-bytes", str(128 << 10)]).start()


def wait_up(s: ServerProcess) -> None:
    check(poll_until(lambda: metric(s, "wspush_bus_up") == 1, scaled(30)), "the node's bus did not come up")


async def flood(s: ServerProcess, seconds: float, compression=None) -> "tuple[int, float]":
    """Sends pubs of PUB_BYTES for `seconds` (a send that does not complete in that time, the
    node holding the connection, ends it too); returns how many were sent and the node's peak
    RSS meanwhile. Plain by default: the bound on what the kernel takes is in wire bytes. With
    compression="deflate" each pub is a few hundred bytes on the wire and 60 KB inflated."""
    message = '{"op":"pub","topic":"flood","data":' + json.dumps("x" * PUB_BYTES) + "}"
    sent = 0
    ws = await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None, close_timeout=1,
                                  max_size=None, write_limit=2 ** 16, compression=compression)
    rss = RssPeak(s.proc.pid).start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                await asyncio.wait_for(ws.send(message), max(0.01, end - time.monotonic()))
            except asyncio.TimeoutError:
                break
            sent += 1
    finally:
        rss.stop()
        ws.transport.abort()
        await ws.wait_closed()  # the socket closes on the loop's next turn, not in abort()
    return sent, rss.peak_mb


async def pub_flood(args) -> None:
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs)
    try:
        wait_up(s)
        # Warm-up: a short flood, so the pools and the allocator find their size; then the base.
        await flood(s, 0.5)
        wait_gauge(admin_port(s), "wspush_connections", 0, "the warm-up connection stayed", seconds=20)
        base = rss_mb(s.proc.pid)
        sent, peak = await flood(s, FLOOD_SECONDS)
        print(f"  Redis healthy: {sent} pubs of {PUB_BYTES} B in {FLOOD_SECONDS:.0f} s; node RSS {base:.1f} -> "
              f"peak {peak:.1f} MB", file=sys.stderr)
        check(sent > 0, "the flood sent nothing")
        # Unbounded, it grew by gigabytes in seconds: the bounds allow 16 pubs per connection
        # (about 1 MB here), plus what the kernel and the pools hold.
        check(not rss_bounds_checked() or peak - base < 64, f"a pub flood grew the node {base:.1f} -> {peak:.1f} MB")

        # Redis frozen: the flood is held back by TCP once 16 pubs wait, not queued.
        rs.proc.send_signal(signal.SIGSTOP)
        try:
            base = rss_mb(s.proc.pid)
            sent, peak = await flood(s, FLOOD_SECONDS)
            print(f"  Redis frozen: {sent} pubs sent in {FLOOD_SECONDS:.0f} s; node RSS {base:.1f} -> peak {peak:.1f} MB",
                  file=sys.stderr)
            check(not rss_bounds_checked() or peak - base < 64, f"a pub flood with Redis frozen grew the node {base:.1f} -> {peak:.1f} MB")
            # 16 wait for Redis; the rest is in the kernel's buffers (a few MB) or never sent.
            check(sent < 400, f"{sent} pubs of {PUB_BYTES} B were taken from a client while Redis was frozen")
            # Compressed, the kernel's buffers take thousands of them; the node inflates one
            # at a time as it hands them over, and still holds at most 16 waiting.
            # (The plain flood's connection stays held until Redis answers: it counts in the base.)
            base = rss_mb(s.proc.pid)
            sent, peak = await flood(s, FLOOD_SECONDS, compression="deflate")
            print(f"  Redis frozen, compressed pubs: {sent} sent in {FLOOD_SECONDS:.0f} s; node RSS {base:.1f} -> "
                  f"peak {peak:.1f} MB", file=sys.stderr)
            check(not rss_bounds_checked() or peak - base < 64,
                  f"a compressed pub flood with Redis frozen grew the node {base:.1f} -> {peak:.1f} MB")
        finally:
            rs.proc.send_signal(signal.SIGCONT)
        wait_up(s)
        # Every pub taken was answered: the node serves on.
        ws = await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None)
        await subscribe(ws, ["after"])
        eid = publish_ok(s, "after", 1)
        e = await recv_json(ws, 30)
        check(e == {"topic": "after", "id": eid, "data": 1}, f"after the floods: {e}")
        await ws.close()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


def push_until_stalled(ws: RawWebSocket, data: bytes) -> int:
    """Writes `data` until the kernel takes none of it for half a second (the node reads no
    more) or all went; returns how much went. A close or reset from the node ends it too."""
    sent = 0
    while sent < len(data) and not ws.eof:
        readable, writable, _ = select.select([ws.sock], [ws.sock], [], 0.5)
        if readable:
            ws._fill(0)
        if writable:
            try:
                sent += ws.sock.send(data[sent:sent + (1 << 20)])
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                ws.eof = True
        elif not readable:
            break
    return sent


def held_sub_backlog(args) -> None:
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs)
    try:
        wait_up(s)
        pub = encode_frame(OP_TEXT, json.dumps({"op": "pub", "topic": "behind", "data": "x" * PUB_BYTES}).encode())
        backlog = encode_frame(OP_TEXT, b'{"op":"sub","topics":["held"]}') + pub * PUBS_BEHIND_SUB
        ws = RawWebSocket(s.port).open()
        try:
            kept0 = metric(s, "wspush_held_input_bytes_total")
            rs.proc.send_signal(signal.SIGSTOP)  # the sub waits for Redis: the connection is held
            try:
                sent = push_until_stalled(ws, backlog)
                kept = metric(s, "wspush_held_input_bytes_total") - kept0
                print(f"  held sub: the client pipelined {sent} of {len(backlog)} B before the kernel stopped "
                      f"taking them; the node kept {kept:.0f} B", file=sys.stderr)
                closed = ws.eof or (ws.rbuf and ws.recv_frame(1).opcode == OP_CLOSE)
                check(not closed, f"the node closed a client that pipelined {sent} B behind a held sub")
                check(kept < MAX_KEPT, f"the node read and kept {kept:.0f} B of a held connection (bound {MAX_KEPT})")
            finally:
                rs.proc.send_signal(signal.SIGCONT)
            check(ws.send_raw(backlog[sent:]), "the node closed the connection once Redis was back")
            e = json.loads(ws.next_event(scaled(30)).payload)
            check(e.get("op") == "subbed", f"the held sub was answered {e}")
            ok = 'wspush_publishes_total{source="client",result="ok"}'
            open_ = 'wspush_connections{state="open"}'
            poll_until(lambda: metric(s, ok) == PUBS_BEHIND_SUB or metric(s, open_) == 0, scaled(30))
            check(metric(s, open_) == 1, f"the node closed the connection after {metric(s, ok):.0f} of the pubs "
                                         f"behind the held sub (it kept {metric(s, 'wspush_held_input_bytes_total'):.0f} B)")
            check(metric(s, ok) == PUBS_BEHIND_SUB, "the pubs pipelined behind the held sub were not all published")
            check(metric(s, "wspush_client_errors_total") == 0, "a pub behind the held sub was refused")
        finally:
            ws.close_socket()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def event_bound(args) -> None:
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs)
    r = redis.Redis(host="127.0.0.1", port=rs.port)
    try:
        wait_up(s)
        bound = int(r.hget("wspush:config", "max_event_bytes"))
        check(bound == 1 << 20, f"the node wrote max_event_bytes {bound}, not the larger of its bounds (1 MiB)")
        try:
            r.fcall("wspush_publish", 0, "big", json.dumps("x" * bound))  # bound + 2 quotes
            check(False, "wspush_publish took data larger than max_event_bytes")
        except redis.ResponseError as e:
            check("larger than max_event_bytes" in str(e), f"the refusal says {e}")
        check(r.exists("wspush:stream:big") == 0, "the refused event was written")
        ws = await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None, max_size=None)
        await subscribe(ws, ["big"])
        data = "x" * (bound - 2)
        eid = r.fcall("wspush_publish", 0, "big", json.dumps(data)).decode()
        e = await recv_json(ws, 30)
        check(e.get("id") == eid and e.get("data") == data, "the event at the bound did not arrive whole")
        await ws.close()
        check(not s.crashed(), "the node crashed")
    finally:
        r.close()
        s.kill()
        rs.close()


def main(args) -> None:
    f = Findings()
    f.step("a client's pub flood, Redis healthy and frozen", lambda: asyncio.run(pub_flood(args)))
    f.step("MBs pipelined behind a held sub stay in the kernel", lambda: held_sub_backlog(args))
    f.step("an event larger than the bound, straight into Redis", lambda: asyncio.run(event_bound(args)))
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
