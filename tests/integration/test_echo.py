#!/usr/bin/python3
"""Echo mode driven by Python `websockets` (a client nobody here wrote).

Text and binary at every length form up to the 16 MiB limit (inclusive) and one byte past it (1009),
with permessage-deflate both ways and without it, a compressed message that inflates past the limit,
fragmented messages from async iterators, ping/pong, the close handshake with codes, and a server that
keeps serving after each of those. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402  (Debian's python3-websockets, 10.x)
from wsp_testlib import ServerProcess, TestFailure, arg_parser, check, run_main, scaled  # noqa: E402

LIMIT = 16 * 1024 * 1024
SIZES = [0, 1, 125, 126, 127, 65535, 65536, 1 << 20, LIMIT]


def text_of_size(n: int) -> str:
    """A str whose UTF-8 encoding is exactly n bytes, with 2-, 3- and 4-byte characters in it."""
    unit = "aé€😀"  # 1 + 2 + 3 + 4 = 10 bytes
    text = unit * (n // 10)
    return text + "z" * (n - len(text.encode()))


def connect(port: int, **kw):
    kw.setdefault("max_size", None)
    kw.setdefault("ping_interval", None)
    kw.setdefault("open_timeout", scaled(20))
    kw.setdefault("close_timeout", scaled(20))
    return websockets.connect(f"ws://127.0.0.1:{port}/ws", **kw)


async def roundtrip(ws, message, timeout: float = 20.0):
    kind = f"{len(message)}-unit {type(message).__name__}"
    try:
        await asyncio.wait_for(ws.send(message), scaled(timeout))
        got = await asyncio.wait_for(ws.recv(), scaled(timeout))
    except asyncio.TimeoutError:
        raise TestFailure(f"no echo of a {kind} within {scaled(timeout):.0f}s")
    except websockets.ConnectionClosed as exc:
        raise TestFailure(f"connection closed while echoing a {kind}: {exc} "
                          "(a close 'sent' by us means the client rejected what the server sent)")
    check(type(got) is type(message), f"sent {type(message).__name__}, echo came back as {type(got).__name__}")
    if got != message:
        raise TestFailure(f"echo differs: sent {len(message)} {type(message).__name__} units, "
                          f"got {len(got)}; first 40 sent {message[:40]!r}, got {got[:40]!r}")


DEFLATE = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"


async def echo_sizes(port: int, compression) -> None:
    # The default client offers permessage-deflate and compresses what it sends; the server
    # inflates it, and compresses its echo of at least --compression-min-bytes (the client
    # would fail the connection on a compressed frame it cannot read).
    async with connect(port, compression=compression) as ws:
        ext = ws.response_headers.get("Sec-WebSocket-Extensions")
        want = DEFLATE if compression else None
        check(ext == want, f"server answered extensions {ext!r}, expected {want!r}")
        for n in SIZES:
            timeout = 20 + 60 * n / LIMIT
            await roundtrip(ws, text_of_size(n), timeout)
            await roundtrip(ws, os.urandom(n), timeout)
            print(f"ok - echo text and binary of {n} bytes ({compression or 'plain'})", flush=True)


async def over_limit(port: int, kind: str, compression=None) -> None:
    message = os.urandom(LIMIT + 1) if kind == "binary" else "x" * (LIMIT + 1)
    async with connect(port, compression=compression) as ws:
        try:
            await asyncio.wait_for(ws.send(message), scaled(80))
            got = await asyncio.wait_for(ws.recv(), scaled(80))
            raise TestFailure(f"{kind} message of {LIMIT + 1} bytes was answered with a "
                              f"{len(got)}-unit message instead of close 1009")
        except websockets.ConnectionClosed:
            pass
        await asyncio.wait_for(ws.wait_closed(), scaled(20))
        check(ws.close_code == 1009, f"{kind} of {LIMIT + 1} bytes: close code {ws.close_code}, expected 1009")
    print(f"ok - {kind} of {LIMIT + 1} bytes closed with 1009", flush=True)


async def fragments(parts):
    for part in parts:
        yield part


async def fragmented(port: int) -> None:
    cases = [
        ["Hello, ", "fragmented ", "wörld 😀"],
        ["", "a", "", "b" * 70000, ""],
        [b"\x00\x01", b"", os.urandom(130000), b"\xff"],
        ["x"] * 200,
    ]
    async with connect(port, compression=None) as ws:
        for parts in cases:
            await asyncio.wait_for(ws.send(fragments(parts)), scaled(20))
            got = await asyncio.wait_for(ws.recv(), scaled(20))
            want = parts[0][:0].join(parts)
            check(got == want, f"fragmented message of {len(parts)} parts: echo {got[:40]!r} != {want[:40]!r}")
            # The same fragments from a plain iterable too (websockets sends them as continuations).
            await roundtrip(ws, want)
    print("ok - fragmented text and binary messages echoed whole", flush=True)


async def ping_pong(port: int) -> None:
    async with connect(port, compression=None) as ws:
        for payload in [b"", b"p", os.urandom(125), "ping-text"]:
            waiter = await ws.ping(payload)
            await asyncio.wait_for(waiter, scaled(10))
        waiters = [await ws.ping(f"many-{i}") for i in range(20)]
        await asyncio.wait_for(asyncio.gather(*waiters), scaled(10))
        await roundtrip(ws, "after pings")
    print("ok - pings answered with pongs", flush=True)


async def close_handshake(port: int) -> None:
    for code, reason in [(1000, ""), (1001, "going"), (4000, "bye"), (3999, "x" * 120)]:
        async with connect(port, compression=None) as ws:
            await roundtrip(ws, "before close")
            await asyncio.wait_for(ws.close(code=code, reason=reason), scaled(10))
            check(ws.close_code == code, f"closed with {code}: server answered {ws.close_code}, expected {code}")
        async with connect(port, compression=None) as ws:
            await roundtrip(ws, f"still serving after close {code}")
    print("ok - close handshake echoes the code; server keeps serving", flush=True)


async def run(args) -> None:
    try:
        await run_steps(args)
    except websockets.ConnectionClosed as exc:
        raise TestFailure(f"a connection closed unexpectedly: {exc}")


async def run_steps(args) -> None:
    with ServerProcess(args.server, io=args.io, mode="echo", quiet=not args.verbose) as server:
        await echo_sizes(server.port, "deflate")
        await echo_sizes(server.port, None)
        await over_limit(server.port, "binary")
        await over_limit(server.port, "text")
        # 16 MiB + 1 of one letter compresses to about 16 KiB: inflating stops at the limit.
        await over_limit(server.port, "text", compression="deflate")
        await fragmented(server.port)
        await ping_pong(server.port)
        await close_handshake(server.port)
        async with connect(server.port) as ws:
            await roundtrip(ws, "server still alive at the end")
        check(server.alive(), "server exited during the test\n" + server.log_tail())


if __name__ == "__main__":
    run_main(lambda args: asyncio.run(run(args)), arg_parser(__doc__.splitlines()[0]))
