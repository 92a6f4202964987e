"""Conformance categories 7 (close handling), 9 (limits) and 10 (a whole connection byte by byte)."""
from casekit import (OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_TEXT, add, add_custom,  # noqa: F401
                     close, close_empty, expect, frame, frames, pong, pongs, raw, send, send_close)
from wsp_testlib import close_payload

VALID_CODES = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999]
INVALID_CODES = [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535]
LIMIT = 16 * 1024 * 1024  # the server's default --max-frame-bytes and --max-message-bytes
MiB = 1024 * 1024


def category_7() -> None:
    add("7.1.1", "message, then close 1000: echo, then close 1000",
        send(OP_TEXT, b"hello"), send_close(1000), expect(OP_TEXT, b"hello"), close(1000))
    add("7.1.2", "close twice: one close back, then TCP closed", raw(frames((OP_CLOSE, close_payload(1000)),
                                                                         (OP_CLOSE, close_payload(1000)))),
        close(1000))
    add("7.1.3", "close, then a ping: no pong after the close", raw(frames((OP_CLOSE, close_payload(1000)),
                                                                         (OP_PING, b"late"))), close(1000))
    add("7.1.4", "close, then a text message: ignored", raw(frames((OP_CLOSE, close_payload(1000)),
                                                                  (OP_TEXT, b"after close"))), close(1000))
    add("7.1.5", "text fragment, close, continuation: close answered, no echo",
        raw(frames((OP_TEXT, b"frag", {"fin": False}), (OP_CLOSE, close_payload(1000)), (OP_CONT, b"ment"))),
        close(1000))
    big = b"*" * 262144
    add("7.1.6", "256 KiB message, ping and close in one write: echo, pong, close",
        raw(frames((OP_TEXT, big), (OP_PING, b"p"), (OP_CLOSE, close_payload(1000)))),
        expect(OP_TEXT, big), pong(b"p"), close(1000))
    add("7.3.1", "close without payload: close without payload back", send_close(), close_empty())
    add("7.3.2", "close with a 1-byte payload -> 1002", send(OP_CLOSE, b"\x03"), close(1002))
    add("7.3.3", "close 1000 without reason", send_close(1000), close(1000))
    add("7.3.4", "close 1000 with a short reason", send_close(1000, b"Hello World!"), close(1000))
    add("7.3.5", "close 1000 with a 123-byte reason (the most that fits)", send_close(1000, b"*" * 123),
        close(1000))
    add("7.3.6", "close 1000 with a 124-byte reason (payload 126) -> 1002", send_close(1000, b"*" * 124),
        close(1002))
    add("7.5.1", "close with an invalid UTF-8 reason -> 1007",
        send_close(1000, "κόσμε".encode() + b"\xed\xa0\x80edited"), close(1007))
    add("7.5.2", "close with a truncated UTF-8 reason -> 1007", send_close(1000, b"ok\xe2\x82"), close(1007))
    add("7.5.3", "close with a valid multi-byte UTF-8 reason", send_close(1000, "bye 😀 κόσμε".encode()),
        close(1000))
    for k, code in enumerate(VALID_CODES, 1):
        add(f"7.7.{k}", f"close with valid code {code}: echoed", send_close(code, b"reason"), close(code))
    for k, code in enumerate(INVALID_CODES, 1):
        add(f"7.9.{k}", f"close with invalid code {code} -> 1002", send_close(code), close(1002))
    add("7.9.20", "close code 1000 sent one byte per send", send(OP_CLOSE, close_payload(1000, b"slow"), piece=1),
        close(1000))


def category_9() -> None:
    sizes = [65536, 262144, MiB, 4 * MiB, LIMIT]
    for k, n in enumerate(sizes, 1):
        t = 10 + 40 * n / LIMIT
        payload = bytes(i % 95 + 32 for i in range(n)) if n < MiB else b"x" * n
        add(f"9.1.{k}", f"text message of {n} bytes in one frame", send(OP_TEXT, payload),
            expect(OP_TEXT, payload), timeout=t)
        add(f"9.2.{k}", f"binary message of {n} bytes in one frame", send(OP_BINARY, payload),
            expect(OP_BINARY, payload), timeout=t)
    add("9.1.6", f"text frame of {LIMIT + 1} bytes -> 1009", send(OP_TEXT, b"y" * (LIMIT + 1)), close(1009),
        timeout=50)
    add("9.2.6", f"binary frame of {LIMIT + 1} bytes -> 1009", send(OP_BINARY, b"y" * (LIMIT + 1)), close(1009),
        timeout=50)
    message = bytes(i % 251 for i in range(MiB))
    for k, size in enumerate([64, 256, 1024, 4096, 65536, MiB], 1):
        for cat, op in ((3, OP_TEXT), (4, OP_BINARY)):
            payload = message if op == OP_BINARY else bytes(b % 95 + 32 for b in message)
            parts = [payload[i:i + size] for i in range(0, len(payload), size)]
            specs = [(op if i == 0 else OP_CONT, p, {"fin": i == len(parts) - 1}) for i, p in enumerate(parts)]
            add(f"9.{cat}.{k}", f"{'text' if op == OP_TEXT else 'binary'} message of 1 MiB in {size}-byte frames",
                raw(frames(*specs)), expect(op, payload), timeout=30)
    small = [(OP_TEXT, f"message {i:04d}".encode()) for i in range(1000)]
    add("9.5.1", "1000 small messages in one write: all echoed in order", raw(frames(*small)),
        *[expect(op, p) for op, p in small], timeout=30)
    chunk = b"z" * MiB
    add("9.6.1", f"fragmented message of exactly {LIMIT} bytes (16 x 1 MiB)",
        *[send(OP_BINARY if i == 0 else OP_CONT, chunk, fin=i == 15) for i in range(16)],
        expect(OP_BINARY, chunk * 16), timeout=60)
    add("9.6.2", f"fragmented message of {LIMIT + 1} bytes -> 1009",
        *[send(OP_BINARY if i == 0 else OP_CONT, chunk, fin=False) for i in range(16)],
        send(OP_CONT, b"!"), close(1009), timeout=60)
    add("9.6.3", f"frame header announcing {LIMIT + 1} bytes: 1009 without waiting for the payload",
        raw(bytes([0x82, 0xFF]) + (LIMIT + 1).to_bytes(8, "big") + b"\x00\x00\x00\x00"), close(1009))
    add("9.6.4", "frame header announcing 2^62 bytes -> 1009", raw(bytes([0x82, 0xFF]) + (1 << 62).to_bytes(8, "big")
                                                                  + b"\x00\x00\x00\x00"), close(1009))
    add("9.6.5", f"text fragments adding up to {LIMIT + 1} bytes, the last frame's header says so -> 1009",
        send(OP_TEXT, b"a" * LIMIT, fin=False), raw(bytes([0x80, 0x81]) + b"\x00\x00\x00\x00"), close(1009),
        timeout=60)


def category_10() -> None:
    def dribble_everything(c) -> None:
        c.open(piece=1)  # the upgrade request, one byte per send
        stream = frames((OP_TEXT, "dribbled κόσμε".encode()), (OP_BINARY, bytes(range(256))), (OP_PING, b"p"),
                        (OP_TEXT, b"frag", {"fin": False}), (OP_PING, b"q"), (OP_CONT, b"ment"))
        c.send_raw(stream, piece=1)
        c.expect_message(OP_TEXT, "dribbled κόσμε".encode())
        c.expect_message(OP_BINARY, bytes(range(256)))
        pongs([b"p", b"q"])(c)  # bytes dribbled faster than we write may join: a pong may answer both
        c.expect_message(OP_TEXT, b"fragment")
        c.send_raw(frame(OP_CLOSE, close_payload(1000, b"done")), piece=1)
        c.expect_close((1000,), reply=False)

    add_custom("10.1.1", "whole connection one byte per send: upgrade, text, binary, pings, fragments, close",
               dribble_everything, opens_itself=True, timeout=30)

    def frames_behind_request(c) -> None:
        c.open(trailing=frames((OP_TEXT, b"right behind the request"), (OP_PING, b"early")))
        c.expect_message(OP_TEXT, b"right behind the request")
        c.expect_pong(b"early")
        c.send_close(1000)
        c.expect_close((1000,), reply=False)

    add_custom("10.1.2", "frames in the same write as the upgrade request", frames_behind_request,
               opens_itself=True)


def register() -> None:
    category_7()
    category_9()
    category_10()
