#!/usr/bin/python3
"""The HTTP side of the upgrade, over raw sockets.

Plain GET -> 426, wrong Sec-WebSocket-Version -> 426 with `Sec-WebSocket-Version: 13`, request past
--max-request-bytes -> 431 (and one exactly at the limit is accepted), malformed requests -> 400, the TCP
connection closed after every error answer; an upgrade that never completes is closed after
--upgrade-timeout while an upgraded connection is left alone. Hardening (issue 13): the upgrade only on
--ws-path (any other path 404), a NUL or bare CR in a header the upgrade does not use -> 400, and an
upgrade request followed in the same write by hundreds of KiB of frames -> 101, then every frame read.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, arg_parser, check, encode_frame,  # noqa: E402
                         http_exchange, run_main, run_step, upgrade_request)

MAX_REQUEST = 8192  # the server's default --max-request-bytes
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def expect_status(port: int, request: bytes, status: int, what: str, piece: int = 0):
    response = http_exchange(port, request, piece=piece)
    check(response.status == status,
          f"{what}: expected HTTP {status}, got {response.status} {response.reason!r}\n{response.raw[:300]!r}")
    check(response.closed, f"{what}: HTTP {status} sent but the TCP connection was left open")
    return response


def plain_get(port: int) -> None:
    expect_status(port, b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 426, "GET without Upgrade")
    expect_status(port, b"GET /ws?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n", 426,
                  "GET /ws without Upgrade")
    expect_status(port, b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404, "GET /other (not the WebSocket path)")


def static_files(port: int) -> None:
    """The demo page and the client: Content-Type, Cache-Control and an ETag; a conditional GET
    with that ETag gets 304 and no body; other methods 405."""
    for path, kind, marker in [("/", "text/html", b"<title>wspush"), ("/wspush.mjs", "text/javascript", b"export {"),
                               ("/wspush.js", "text/javascript", b"globalThis.WsPush = WsPush")]:
        r = expect_status(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(), 200, f"GET {path}")
        check(r.headers["content-type"][0].startswith(kind), f"{path}: Content-Type {r.headers['content-type']}")
        check(r.headers["cache-control"] == ["no-cache"], f"{path}: Cache-Control {r.headers.get('cache-control')}")
        etag = r.headers["etag"][0]
        check(etag.startswith('"') and etag.endswith('"') and len(etag) > 4, f"{path}: ETag {etag!r}")
        check(marker in r.body, f"{path}: the body lacks {marker!r}")
        check(int(r.headers["content-length"][0]) == len(r.body), f"{path}: Content-Length does not match")
        again = expect_status(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nIf-None-Match: {etag}\r\n\r\n".encode(),
                              304, f"conditional GET {path}")
        check(again.body == b"" and again.headers["etag"] == [etag], f"{path}: 304 with a body or another ETag")
        expect_status(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nIf-None-Match: \"stale\"\r\n\r\n".encode(),
                      200, f"GET {path} with a stale ETag")
        expect_status(port, f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode(), 405,
                      f"POST {path}")


def only_ws_path(port: int, ws_path: str = "/ws") -> None:
    """The upgrade is accepted on the configured path only (a query is fine); anything else is 404."""
    for path in ["/other", "//ws", "/../../etc/passwd", ws_path + "/", ws_path.upper(), "/", ws_path + "x",
                 "/%77s"]:
        expect_status(port, upgrade_request(path, KEY), 404, f"upgrade on {path!r}")
    for path in [ws_path, ws_path + "?token=x&y=1"]:
        with RawWebSocket(port).open(path=path) as ws:
            ws.send_frame(OP_TEXT, b"on the path")
            ws.expect_message(OP_TEXT, b"on the path")


def unused_header_controls(port: int) -> None:
    """Control bytes are refused in every header, not only in those the upgrade reads."""
    for junk, what in [(b"X-Junk: a\x00b", "NUL"), (b"X-Junk: a\rb", "bare CR"), (b"X-Junk: \x7f", "DEL"),
                       (b"User-Agent: curl\x01", "SOH"), (b"X-Junk: a\x1bb", "ESC")]:
        req = upgrade_request("/ws", KEY).replace(b"\r\n\r\n", b"\r\n" + junk + b"\r\n\r\n")
        expect_status(port, req, 400, f"{what} in an unused header")
    with RawWebSocket(port).open(extra_headers="X-Tabs: a\tb\r\nX-Utf8: caf\u00e9\r\n") as ws:  # HTAB, obs-text: fine
        ws.send_frame(OP_TEXT, b"tabs ok")
        ws.expect_message(OP_TEXT, b"tabs ok")


def frames_behind_request(port: int) -> None:
    """An upgrade request and, in the same write, far more frames than one read takes: the 101 comes,
    then every frame is read and answered in order (echo mode); never a bare EOF."""
    for total in [70_000, 131_072, 262_144, 1_048_576]:
        payloads, frames = [], bytearray()
        while len(frames) < total:
            payloads.append(f"{len(payloads):06d}".encode() * 100)  # 600 bytes each
            frames += encode_frame(OP_TEXT, payloads[-1])
        with RawWebSocket(port, timeout=20).open(trailing=bytes(frames)) as ws:
            for p in payloads:
                ws.expect_message(OP_TEXT, p)


def bad_version(port: int) -> None:
    for version in ["8", "12", "14", "banana"]:
        response = expect_status(port, upgrade_request("/", KEY, version=version), 426, f"version {version}")
        versions = response.headers.get("sec-websocket-version", [])
        check(any("13" in [x.strip() for x in v.split(",")] for v in versions),
              f"426 for version {version} lacks 'Sec-WebSocket-Version: 13' (headers {response.headers})")


def pad_header(total: int) -> str:
    """An X-Pad header that makes an upgrade request (24-character key) exactly `total` bytes long."""
    pad = total - len(upgrade_request("/ws", KEY, extra="X-Pad: \r\n"))
    assert pad >= 0
    return f"X-Pad: {'p' * pad}\r\n"


def oversized(port: int, limit: int = MAX_REQUEST) -> None:
    with RawWebSocket(port).open(extra_headers=pad_header(limit)) as ws:  # at the limit: accepted
        ws.send_frame(OP_TEXT, b"at the limit")
        ws.expect_message(OP_TEXT, b"at the limit")
    over = upgrade_request("/ws", KEY, extra=pad_header(limit + 1))
    expect_status(port, over, 431, f"{len(over)}-byte request")
    # Far past the limit, without ever ending the header block: must not wait for the end.
    endless = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * (4 * limit)
    expect_status(port, endless, 431, "unterminated 32 KiB header", piece=1024)


GARBAGE = [
    (b"GARBAGE\r\n\r\n", "request line without spaces"),
    (b"\x00\x01\x02\x03\xff\xfe\r\n\r\n", "binary junk"),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
     b"This line has no colon\r\n\r\n", "header line without a colon"),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Version: 13\r\n\r\n", "upgrade without Sec-WebSocket-Key"),
    (b"GET / FTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", "not HTTP"),
    (b"GET / HTTP/1.1\r\n: empty-name\r\nUpgrade: websocket\r\n\r\n", "header with an empty name"),
]


def garbage(port: int) -> None:
    for request, what in GARBAGE:
        expect_status(port, request, 400, what)


def upgrade_timeout(port: int) -> None:
    """With --upgrade-timeout 0.5: silent and half-sent upgrades are closed; an upgraded connection is not."""
    upgraded = RawWebSocket(port).open()
    silent = RawWebSocket(port, timeout=15).connect()
    half = RawWebSocket(port, timeout=15).connect()
    half.send_raw(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
    try:
        for client, what in [(silent, "a connection that sent nothing"), (half, "a half-sent upgrade request")]:
            check(client.read_to_eof(client.timeout),
                  f"{what} was not closed within {client.timeout:.1f}s (--upgrade-timeout 0.5)")
            data = bytes(client.rbuf)
            # An error status (408) before the close is fine; anything else is not.
            check(data == b"" or data.startswith(b"HTTP/1.1 4"), f"{what}: got {data[:80]!r} before the close")
        # Both timers have fired by now; the connection upgraded before them must still work.
        upgraded.send_frame(OP_TEXT, b"still here")
        upgraded.expect_message(OP_TEXT, b"still here")
        upgraded.send_close(1000)
        upgraded.expect_close(1000, reply=False)
    finally:
        for client in (silent, half, upgraded):
            client.close_socket()


def run(args) -> None:
    with ServerProcess(args.server, io=args.io, mode="echo", quiet=not args.verbose) as server:
        run_step("plain GET -> 426 on the WebSocket path, 404 elsewhere", plain_get, server.port)
        run_step("the upgrade only on --ws-path", only_ws_path, server.port)
        run_step("static files: Content-Type, Cache-Control, ETag, 304", static_files, server.port)
        run_step("NUL, bare CR, DEL in headers the upgrade does not use -> 400", unused_header_controls, server.port)
        run_step("an upgrade with up to 1 MiB of frames in the same write: 101, then every frame", frames_behind_request,
                 server.port)
        run_step("bad Sec-WebSocket-Version -> 426 + version header", bad_version, server.port)
        run_step("request over --max-request-bytes -> 431", oversized, server.port)
        run_step("malformed requests -> 400", garbage, server.port)
        with RawWebSocket(server.port).open() as ws:
            ws.send_frame(OP_TEXT, b"after the errors")
            ws.expect_message(OP_TEXT, b"after the errors")
        check(server.alive(), "server exited\n" + server.log_tail())
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--ws-path", "/push/v1"],
                       quiet=not args.verbose) as server:
        run_step("--ws-path /push/v1: the upgrade there only", only_ws_path, server.port, "/push/v1")
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--max-request-bytes", "16384"],
                       quiet=not args.verbose) as server:
        run_step("a larger --max-request-bytes is honoured end to end", oversized, server.port, 16384)
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--upgrade-timeout", "0.5"],
                       quiet=not args.verbose) as server:
        run_step("unfinished upgrades closed after --upgrade-timeout", upgrade_timeout, server.port)
        check(server.alive(), "server exited\n" + server.log_tail())


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
