#!/usr/bin/python3
"""Keepalive and draining.

With --ping-interval 0.3 --pong-timeout 0.3: a raw client that never answers is pinged and then
closed; a raw client that answers every ping, and a Python `websockets` client (it answers pings by
itself), stay open across several ping intervals and still echo. SIGTERM with --drain-seconds 1:
every client sees 1001, the closes are spread over the window rather than sent at once, and the
process exits 0. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import (OP_PING, OP_TEXT, RawWebSocket, ServerProcess, TestFailure,  # noqa: E402
                         arg_parser, check, encode_frame, run_main, run_step, scaled)

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


def drain_spreads_closes(server: ServerProcess, n: int) -> None:
    clients = [RawWebSocket(server.port, timeout=scaled(20)).open() for _ in range(n)]
    for k, ws in enumerate(clients):  # every connection is open before the signal
        ws.send_frame(OP_TEXT, f"hi {k}".encode())
        ws.expect_message(OP_TEXT, f"hi {k}".encode())
    server.signal(signal.SIGTERM)
    arrivals = []
    for ws in clients:  # closes arrive in any order; each read waits for its own
        ws.expect_close(1001)
        arrivals.append(time.monotonic())
    spread = max(arrivals) - min(arrivals)
    rc = server.wait_exit(scaled(20))
    check(rc == 0, f"server exited with {rc} after SIGTERM, expected 0\n" + server.log_tail())
    # All at once would be a spread of a few ms; spread over a 1 s window it is most of it.
    check(spread >= 0.4, f"{n} closes arrived within {spread * 1000:.0f} ms of each other, "
                         "expected them spread over --drain-seconds 1")
    print(f"   ({n} closes spread over {spread * 1000:.0f} ms)")


def run(args) -> None:
    quiet = not args.verbose
    extra = ["--ping-interval", "0.3", "--pong-timeout", "0.3"]
    with ServerProcess(args.server, io=args.io, mode="echo", extra=extra, quiet=quiet) as server:
        run_step("a client that never answers pings is closed", silent_client_is_closed, server.port)
        run_step("clients that answer pings stay open", lambda: asyncio.run(answering_clients_stay(server.port)))
        check(server.alive(), "server exited\n" + server.log_tail())
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--drain-seconds", "1"], quiet=quiet) as server:
        run_step("SIGTERM spreads 1001 over --drain-seconds, exit 0", drain_spreads_closes, server, 40)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
