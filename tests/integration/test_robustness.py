#!/usr/bin/python3
"""Misbehaving clients, shutdown and the io_uring fallback.

A client that stops mid-frame or mid-message is closed with 1008 after --message-timeout while another
client keeps echoing; invalid UTF-8 -> 1007; garbage after the upgrade -> 1002; SIGTERM -> every client
(Python `websockets` and raw) sees 1001 and the process exits 0; WSPUSH_TEST_FAIL_URING=1 with
--io=uring -> the `(fallback: ...)` log line and echo still works; --help exits 0.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import (OP_BINARY, OP_TEXT, RawWebSocket, ServerProcess, TestFailure,  # noqa: E402
                         arg_parser, check, decode_frame, encode_frame, run_main, run_step, scaled)


def message_timeout(port: int) -> None:
    """Run with --message-timeout 0.5 --close-timeout 1."""
    stalled_frame = RawWebSocket(port, timeout=15).open()
    stalled_message = RawWebSocket(port, timeout=15).open()
    busy = RawWebSocket(port).open()
    half = encode_frame(OP_BINARY, b"x" * 1000)
    stalled_frame.send_raw(half[:500])  # header and half the payload, then nothing
    stalled_message.send_frame(OP_TEXT, b"first fragment", fin=False)  # a message that never ends
    waiting = {"stalled mid-frame": stalled_frame, "stalled mid-message": stalled_message}
    echoes = 0
    deadline = time.monotonic() + scaled(15)
    while waiting:
        busy.send_frame(OP_TEXT, f"echo {echoes}".encode())
        busy.expect_message(OP_TEXT, f"echo {echoes}".encode())
        echoes += 1
        for name, client in list(waiting.items()):
            client._fill(0.02)  # waits for data, at most 20 ms, before the next echo
            if client.eof or decode_frame(client.rbuf)[0] is not None:
                del waiting[name]
        if time.monotonic() > deadline:
            raise TestFailure(f"{sorted(waiting)} not closed {scaled(15):.0f}s after --message-timeout 0.5")
    for name, client in [("mid-frame", stalled_frame), ("mid-message", stalled_message)]:
        try:
            client.expect_close(1008, reply=False)
        except TestFailure as exc:
            raise TestFailure(f"client stalled {name}: {exc}")
        client.close_socket()
    check(echoes >= 1, "the busy client never echoed")
    busy.send_frame(OP_TEXT, b"after the timeouts")
    busy.expect_message(OP_TEXT, b"after the timeouts")
    busy.close_socket()
    print(f"   ({echoes} echoes on another connection while the stalled ones waited)")


def invalid_utf8(port: int) -> None:
    for parts in ([b"\xce\xba\xff"], [b"valid ", b"\xed\xa0\x80"], [b"\xf4\x90\x80\x80"]):
        with RawWebSocket(port).open() as ws:
            for i, part in enumerate(parts):
                ws.send_frame(OP_TEXT if i == 0 else 0, part, fin=i == len(parts) - 1)
            ws.expect_close(1007)


def garbage_after_upgrade(port: int) -> None:
    for junk in (b"\xff" * 16, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", bytes(range(0x70, 0x80)) * 2):
        with RawWebSocket(port).open() as ws:
            ws.send_raw(junk)
            try:
                ws.expect_close(1002)
            except TestFailure as exc:
                raise TestFailure(f"after sending {junk[:16]!r}: {exc}")


async def sigterm(server: ServerProcess) -> None:
    clients = [await websockets.connect(f"ws://127.0.0.1:{server.port}/ws", ping_interval=None,
                                        close_timeout=scaled(10)) for _ in range(3)]
    raws = [RawWebSocket(server.port).open() for _ in range(3)]
    for ws in clients:
        await ws.send("hello")
        check(await asyncio.wait_for(ws.recv(), scaled(10)) == "hello", "echo before SIGTERM failed")
    server.signal(signal.SIGTERM)
    for raw in raws:
        raw.expect_close(1001)
        raw.close_socket()
    for ws in clients:
        await asyncio.wait_for(ws.wait_closed(), scaled(20))
        check(ws.close_code == 1001, f"websockets client saw close code {ws.close_code} on SIGTERM, expected 1001")
    rc = server.wait_exit(scaled(20))
    check(rc == 0, f"server exited with {rc} after SIGTERM, expected 0\n" + server.log_tail())


def fallback(args) -> None:
    with ServerProcess(args.server, io="uring", mode="echo", env={"WSPUSH_TEST_FAIL_URING": "1"},
                       allow_fallback=True, quiet=not args.verbose) as server:
        check(server.backend == "epoll" and "(fallback:" in server.backend_line,
              f"with WSPUSH_TEST_FAIL_URING=1 and --io=uring expected 'io backend: epoll (fallback: ...)', "
              f"got {server.backend_line!r}")
        with RawWebSocket(server.port).open() as ws:
            ws.send_frame(OP_TEXT, b"echo on the fallback")
            ws.expect_message(OP_TEXT, b"echo on the fallback")


def help_exits_zero(binary: str) -> None:
    cmd = [sys.executable, binary] if binary.endswith(".py") else [binary]
    out = subprocess.run(cmd + ["--help"], capture_output=True, timeout=scaled(20))
    text = (out.stdout + out.stderr).decode("utf-8", "replace")
    check(out.returncode == 0, f"--help exited {out.returncode}")
    for option in ("--listen", "--mode", "--io", "--max-message-bytes", "--message-timeout"):
        check(option in text, f"--help does not mention {option}")


def run(args) -> None:
    quiet = not args.verbose
    extra = ["--message-timeout", "0.5", "--close-timeout", "1"]
    with ServerProcess(args.server, io=args.io, mode="echo", extra=extra, quiet=quiet) as server:
        run_step("stalled clients closed with 1008 while another echoes", message_timeout, server.port)
        run_step("invalid UTF-8 -> 1007", invalid_utf8, server.port)
        # After garbage the server may not find our close frame in the stream: --close-timeout 1 bounds that.
        run_step("garbage after the upgrade -> 1002", garbage_after_upgrade, server.port)
        check(server.alive(), "server exited\n" + server.log_tail())
    with ServerProcess(args.server, io=args.io, mode="echo", quiet=quiet) as server:
        run_step("SIGTERM -> 1001 to every client, exit 0", lambda: asyncio.run(sigterm(server)))
    run_step("WSPUSH_TEST_FAIL_URING=1 -> epoll fallback, echo works", fallback, args)
    run_step("--help exits 0 and lists the options", help_exits_zero, args.server)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
