#!/usr/bin/python3
"""Connection limit: with --max-connections 3, three clients upgrade; a fourth gets 503 with
Retry-After and its TCP connection closed, without disturbing the others; once one leaves, a new
client gets in. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, admin_port, arg_parser, check,  # noqa: E402
                         http_exchange, run_main, run_step, upgrade_request, wait_gauge)


def over_capacity(port: int, admin: int) -> None:
    held = [RawWebSocket(port).open() for _ in range(3)]
    for k, ws in enumerate(held):
        ws.send_frame(OP_TEXT, f"in {k}".encode())
        ws.expect_message(OP_TEXT, f"in {k}".encode())
    resp = http_exchange(port, upgrade_request("/ws"))
    check(resp.status == 503, f"a fourth connection got {resp.status} {resp.reason}, expected 503")
    check(resp.header("retry-after") is not None, "503 without Retry-After")
    check(resp.closed, "the server kept the refused TCP connection open")
    for k, ws in enumerate(held):  # the three still work
        ws.send_frame(OP_TEXT, f"still {k}".encode())
        ws.expect_message(OP_TEXT, f"still {k}".encode())
    held[0].send_close(1000)
    held[0].expect_close(1000, reply=False)
    held[0].close_socket()
    # The server answered the close and shut its side (the EOF expect_close saw), then waits for
    # ours: the slot is free once it has read that, which the gauge shows.
    wait_gauge(admin, "wspush_connections", 2, "two held connections after one left")
    with RawWebSocket(port).open() as newcomer:
        newcomer.send_frame(OP_TEXT, b"new")
        newcomer.expect_message(OP_TEXT, b"new")
    for ws in held[1:]:
        ws.close_socket()


def run(args) -> None:
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--max-connections", "3"],
                       quiet=not args.verbose) as server:
        run_step("over --max-connections -> 503 with Retry-After", over_capacity, server.port, admin_port(server))
        check(server.alive(), "server exited\n" + server.log_tail())


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
