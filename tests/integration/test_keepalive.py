#!/usr/bin/python3
"""Keepalive and draining.

With --ping-interval 0.3 --pong-timeout 0.3: a raw client that never answers is pinged and then
closed; a raw client that answers every ping, and a Python `websockets` client (it answers pings by
itself), stay open across several ping intervals and still echo. SIGTERM with --drain-seconds:
every client sees 1001, the closes come in several batches rather than all at once (after a
client's close has arrived, others are still served), and the process exits 0. Exit 0 pass, 1
fail, 77 io_uring unavailable.
"""
import asyncio
import os
import select
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import (OP_CLOSE, OP_PING, OP_TEXT, RawWebSocket, ServerProcess, TestFailure,  # noqa: E402
                         arg_parser, check, encode_frame, parse_close, run_main, run_step, scaled)

OP_PONG = 0xA


def silent_client_is_closed(port: int) -> None:
    with RawWebSocket(port, timeout=scaled(10)).open() as ws:
        event = ws.next_event(scaled(10))
        check(event.opcode == OP_PING, f"expected a keepalive ping, got {event.describe()}")
        ws.expect_tcp_close(scaled(10))  # no answer: the server gives up on us


def answer_pings(port: int, count: int) -> None:
    with RawWebSocket(port, timeout=scaled(10)).open() as raw:
        for _ in range(count):  # `count` ping intervals pass, each answered
            event = raw.next_event(scaled(10))
            check(event.opcode == OP_PING, f"expected a keepalive ping, got {event.describe()}")
            raw.send_frame(OP_PONG, event.payload)
        raw.send_frame(OP_TEXT, b"still here")
        raw.expect_message(OP_TEXT, b"still here")


async def answering_clients_stay(port: int) -> None:
    # The raw client blocks on its socket: it runs in a thread so that the event loop keeps
    # serving the websockets client (which answers the server's pings by itself) meanwhile.
    lib = await websockets.connect(f"ws://127.0.0.1:{port}/ws", ping_interval=None)
    await asyncio.to_thread(answer_pings, port, 4)
    await lib.send("still here too")
    check(await asyncio.wait_for(lib.recv(), scaled(10)) == "still here too",
          "the websockets client (which answers pings) was not kept open")
    await lib.close()


# The drain window: long enough that the test, however slowly it is scheduled, sees a few of the
# server's batches go out while others are still to come; only a stall of about this long could
# merge them all.
DRAIN_SECONDS = round(scaled(5))


def next_from_server(ws: RawWebSocket):
    """The next message or close frame (a keepalive ping is answered and skipped)."""
    while True:
        event = ws.next_event(scaled(30))
        if event.opcode != OP_PING:
            return event
        ws.send_frame(OP_PONG, event.payload)


def finish_close(ws: RawWebSocket, event, who: str) -> None:
    """`event` must be the server's close with 1001: answer it, and the server must end TCP."""
    check(event.opcode == OP_CLOSE, f"{who}: expected a close frame with 1001, got {event.describe()}")
    code, _ = parse_close(event.payload)
    check(code == 1001, f"{who}: closed with {code} while draining, expected 1001")
    if not ws.eof and not ws.send_failed:
        ws.send_close(1001)
    ws.expect_tcp_close(scaled(30))


def drain_spreads_closes(server: ServerProcess, n: int) -> None:
    clients = [RawWebSocket(server.port, timeout=scaled(20)).open() for _ in range(n)]
    for k, ws in enumerate(clients):  # every connection is open before the signal
        ws.send_frame(OP_TEXT, f"hi {k}".encode())
        ws.expect_message(OP_TEXT, f"hi {k}".encode())
    server.signal(signal.SIGTERM)
    waiting = dict(enumerate(clients))  # not closed yet
    batches = 0  # times some had been closed while others still answered
    while waiting:
        # Whatever arrives now on a connection that is not being probed is its close.
        ready, _, _ = select.select([ws.sock for ws in waiting.values()], [], [], scaled(30))
        check(ready, f"{len(waiting)} of {n} clients got no 1001 within {scaled(30):.0f}s of SIGTERM "
                     f"(--drain-seconds {DRAIN_SECONDS})\n" + server.log_tail())
        for k, ws in list(waiting.items()):
            if ws.sock in ready:
                finish_close(ws, next_from_server(ws), f"client {k}")
                del waiting[k]
        # Some are closed: each of the others is either still served (echoes a probe) or its close
        # crossed the probe. Were every close sent at once, each probe would meet a close.
        for k, ws in waiting.items():
            ws.send_frame(OP_TEXT, f"still {k}".encode())
        served = 0
        for k, ws in list(waiting.items()):
            event = next_from_server(ws)
            if event.opcode == OP_TEXT:
                check(event.payload == f"still {k}".encode(), f"client {k}: echoed {event.describe()}")
                served += 1
            else:
                finish_close(ws, event, f"client {k}")
                del waiting[k]
        batches += served > 0
    rc = server.wait_exit(scaled(30) + DRAIN_SECONDS)
    check(rc == 0, f"server exited with {rc} after SIGTERM, expected 0\n" + server.log_tail())
    # At least three batches: a first, one that came while others were still served, and more
    # after that (the server closes a share of them every tick of --drain-seconds).
    check(batches >= 2, f"the {n} closes came in {batches + 1} batch(es), expected them spread over "
                        f"--drain-seconds {DRAIN_SECONDS}")
    print(f"   ({n} closes seen in at least {batches + 1} batches)")


def run(args) -> None:
    quiet = not args.verbose
    extra = ["--ping-interval", "0.3", "--pong-timeout", "0.3"]
    with ServerProcess(args.server, io=args.io, mode="echo", extra=extra, quiet=quiet) as server:
        run_step("a client that never answers pings is closed", silent_client_is_closed, server.port)
        run_step("clients that answer pings stay open", lambda: asyncio.run(answering_clients_stay(server.port)))
        check(server.alive(), "server exited\n" + server.log_tail())
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--drain-seconds", str(DRAIN_SECONDS)],
                       quiet=quiet) as server:
        run_step("SIGTERM spreads 1001 over --drain-seconds, exit 0", drain_spreads_closes, server, 40)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
