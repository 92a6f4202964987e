"""Conformance categories 1-5: framing, pings and pongs, reserved bits, opcodes, fragmentation.

Modelled on the Autobahn testsuite's categories of the same numbers (our own cases and ids).
"""
from casekit import (OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, add, add_custom,  # noqa: F401
                     close, expect, frame, frames, pong, pongs, raw, send, send_close)

LENGTHS = [0, 1, 125, 126, 127, 128, 65535, 65536]


def category_1() -> None:
    """Framing: every length form, pipelined frames, frames split across reads, unmasked frames."""
    for k, n in enumerate(LENGTHS, 1):
        add(f"1.1.{k}", f"text message, payload {n} bytes", send(OP_TEXT, b"*" * n), expect(OP_TEXT, b"*" * n))
        payload = bytes(i % 256 for i in range(n))
        add(f"1.2.{k}", f"binary message, payload {n} bytes", send(OP_BINARY, payload),
            expect(OP_BINARY, payload))
    big = b"#" * 65536
    add("1.1.9", "text, 65536 bytes sent in chops of 997 bytes", send(OP_TEXT, big, piece=997),
        expect(OP_TEXT, big))
    add("1.2.9", "binary, 65535 bytes sent in chops of 997 bytes", send(OP_BINARY, big[:65535], piece=997),
        expect(OP_BINARY, big[:65535]))
    messages = [(OP_TEXT if n % 2 else OP_BINARY, bytes([65 + i]) * n) for i, n in enumerate(LENGTHS)]
    add("1.3.1", "eight messages of every length form in one write: echoed in order",
        raw(frames(*messages)), *[expect(op, p) for op, p in messages])
    payload = bytes(range(200))
    data = frame(OP_BINARY, payload)
    for cut in range(1, len(data)):
        add(f"1.4.{cut}", f"a 200-byte binary frame split into two sends after byte {cut}",
            raw(data[:cut]), raw(data[cut:]), expect(OP_BINARY, payload))
    add("1.5.1", "unmasked text frame -> 1002", send(OP_TEXT, b"unmasked", mask=False), close(1002))
    add("1.5.2", "unmasked ping -> 1002", send(OP_PING, b"x", mask=False), close(1002))
    add("1.5.3", "64-bit length with the most significant bit set -> 1002 (or 1009)",
        raw(bytes([0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1]) + b"\x00" * 4), close(1002, 1009))


def category_2() -> None:
    """Pings and pongs."""
    add("2.1", "ping without payload", send(OP_PING), pong(b""))
    add("2.2", "ping with a small text payload", send(OP_PING, b"Hello, world!"), pong(b"Hello, world!"))
    add("2.3", "ping with a small binary payload", send(OP_PING, b"\x00\xff\xfe\xfd\xfc\xfb\x00\xff"),
        pong(b"\x00\xff\xfe\xfd\xfc\xfb\x00\xff"))
    add("2.4", "ping with a 125-byte binary payload", send(OP_PING, b"\xfe" * 125), pong(b"\xfe" * 125))
    add("2.5", "ping with a 126-byte payload -> 1002", send(OP_PING, b"\xfe" * 126), close(1002))
    add("2.6", "ping with a 125-byte payload sent one byte per send", send(OP_PING, b"\xfe" * 125, piece=1),
        pong(b"\xfe" * 125))
    add("2.7", "unsolicited empty pong is ignored", send(OP_PONG), send(OP_TEXT, b"after pong"),
        expect(OP_TEXT, b"after pong"))
    add("2.8", "unsolicited pong with payload is ignored", send(OP_PONG, b"unsolicited"),
        send(OP_TEXT, b"after pong"), expect(OP_TEXT, b"after pong"))
    add("2.9", "unsolicited pong, then ping: one pong, for the ping", send(OP_PONG, b"unsolicited"),
        send(OP_PING, b"solicited"), pong(b"solicited"))
    tens = [f"ping {i}".encode() for i in range(10)]
    add("2.10", "10 pings sent one by one: pongs in order, the last one answered",
        *[send(OP_PING, p) for p in tens], pongs(tens))
    add("2.11", "10 pings in one write: pongs in order, the last one answered",
        raw(frames(*[(OP_PING, p) for p in tens])), pongs(tens))
    every = [bytes((i + j) % 256 for j in range(n)) for i, n in enumerate(range(126))]
    add("2.12", "pings with every payload length 0..125 (binary payloads): pongs in order, the last answered",
        *[send(OP_PING, p) for p in every], pongs(every))

    def one_at_a_time(c) -> None:  # each ping answered before the next is sent: one pong each
        for p in every:
            c.send_raw(frame(OP_PING, p))
            c.expect_pong(p)

    add_custom("2.13", "pings with every payload length 0..125, each awaited: every one answered", one_at_a_time)


def category_3() -> None:
    """Reserved bits: no extension is negotiated, so any RSV bit is a protocol error."""
    for rsv in range(1, 8):
        add(f"3.1.{rsv}", f"text frame with RSV={rsv}, after a valid message, then a ping -> 1002",
            send(OP_TEXT, b"valid"), send(OP_TEXT, b"rsv", rsv=rsv), send(OP_PING),
            expect(OP_TEXT, b"valid"), close(1002))
        add(f"3.2.{rsv}", f"binary frame with RSV={rsv} -> 1002", send(OP_BINARY, b"\x00\xff", rsv=rsv),
            close(1002))
        add(f"3.3.{rsv}", f"ping with RSV={rsv} -> 1002", send(OP_PING, b"p", rsv=rsv), close(1002))
        add(f"3.4.{rsv}", f"close frame with RSV={rsv} -> 1002", send(OP_CLOSE, b"\x03\xe8", rsv=rsv),
            close(1002))
        add(f"3.5.{rsv}", f"continuation with RSV={rsv} -> 1002", send(OP_TEXT, b"part", fin=False),
            send(OP_CONT, b"rest", rsv=rsv), close(1002))
    add("3.6.1", "RSV1 text frame sent one byte per send -> 1002", send(OP_TEXT, b"dribbled", rsv=4, piece=1),
        close(1002))


def category_4() -> None:
    """Reserved opcodes."""
    for k, op in enumerate([3, 4, 5, 6, 7], 1):
        add(f"4.1.{k}", f"reserved data opcode {op}, after a valid message, then a ping -> 1002",
            send(OP_TEXT, b"valid"), send(op), send(OP_PING), expect(OP_TEXT, b"valid"), close(1002))
        add(f"4.1.{k + 5}", f"reserved data opcode {op} with payload -> 1002", send(op, b"reserved payload"),
            close(1002))
    for k, op in enumerate([11, 12, 13, 14, 15], 1):
        add(f"4.2.{k}", f"reserved control opcode {op}, after a valid message, then a ping -> 1002",
            send(OP_TEXT, b"valid"), send(op), send(OP_PING), expect(OP_TEXT, b"valid"), close(1002))
        add(f"4.2.{k + 5}", f"reserved control opcode {op} with payload -> 1002", send(op, b"reserved payload"),
            close(1002))


def category_5() -> None:
    """Fragmentation."""
    fragmented_control_frames()
    fragmented_messages(0, OP_TEXT, "text")
    fragmented_messages(1, OP_BINARY, "binary")
    orphan_continuations()


def fragmented_control_frames() -> None:
    add("5.1", "ping in 2 fragments -> 1002", send(OP_PING, b"frag", fin=False), send(OP_CONT, b"ment"),
        close(1002))
    add("5.2", "pong in 2 fragments -> 1002", send(OP_PONG, b"frag", fin=False), send(OP_CONT, b"ment"),
        close(1002))
    add("5.3", "close in 2 fragments -> 1002", send(OP_CLOSE, b"\x03\xe8", fin=False), send(OP_CONT, b"x"),
        close(1002))


def fragmented_messages(k: int, op: int, name: str) -> None:
    base = 4 + 10 * k
    add(f"5.{base}", f"{name} in 2 fragments, one write",
        raw(frames((op, b"frag", {"fin": False}), (OP_CONT, b"ment"))), expect(op, b"fragment"))
    add(f"5.{base + 1}", f"{name} in 2 fragments, separate writes",
        send(op, b"frag", fin=False), send(OP_CONT, b"ment"), expect(op, b"fragment"))
    add(f"5.{base + 2}", f"{name} in 2 fragments with a ping between (one write)",
        raw(frames((op, b"frag", {"fin": False}), (OP_PING, b"between"), (OP_CONT, b"ment"))),
        pong(b"between"), expect(op, b"fragment"))
    add(f"5.{base + 3}", f"{name} in 2 fragments with a ping between, separate writes",
        send(op, b"frag", fin=False), send(OP_PING, b"between"), pong(b"between"), send(OP_CONT, b"ment"),
        expect(op, b"fragment"))
    add(f"5.{base + 4}", f"{name} in 2 fragments with a ping between, one byte per send",
        raw(frames((op, b"frag", {"fin": False}), (OP_PING, b"between"), (OP_CONT, b"ment")), piece=1),
        pong(b"between"), expect(op, b"fragment"))
    parts = [b"f", b"", b"ragm", b"", b"ent", b""]
    add(f"5.{base + 5}", f"{name} in 6 fragments, some empty, pings and a pong between them",
        send(op, parts[0], fin=False), send(OP_CONT, parts[1], fin=False), send(OP_PING, b"1"),
        send(OP_CONT, parts[2], fin=False), send(OP_PONG, b"x"), send(OP_CONT, parts[3], fin=False),
        send(OP_PING, b"2"), send(OP_CONT, parts[4], fin=False), send(OP_CONT, parts[5]),
        pongs([b"1", b"2"]), expect(op, b"fragment"))
    chunks = [bytes([48 + i % 10]) for i in range(100)]
    add(f"5.{base + 6}", f"{name} of 100 one-byte fragments",
        send(op, chunks[0], fin=False), *[send(OP_CONT, c, fin=False) for c in chunks[1:-1]],
        send(OP_CONT, chunks[-1]), expect(op, b"".join(chunks)))
    add(f"5.{base + 7}", f"{name} fragment, then a new {name} message inside it -> 1002",
        send(op, b"first", fin=False), send(op, b"second"), close(1002))
    other = OP_BINARY if op == OP_TEXT else OP_TEXT
    add(f"5.{base + 8}", f"{name} fragment, then a data frame of the other type -> 1002",
        send(op, b"first", fin=False), send(other, b"second", fin=False), close(1002))
    add(f"5.{base + 9}", f"{name} in 2 fragments, then the same again on the connection",
        send(op, b"frag", fin=False), send(OP_CONT, b"ment"), send(op, b"again", fin=False),
        send(OP_CONT, b"!"), expect(op, b"fragment"), expect(op, b"again!"))


def orphan_continuations() -> None:
    add("5.24", "continuation (fin) with nothing to continue -> 1002", send(OP_CONT, b"orphan"), close(1002))
    add("5.25", "continuation (not fin) with nothing to continue -> 1002", send(OP_CONT, b"orphan", fin=False),
        close(1002))
    add("5.26", "orphan continuation, sent one byte per send -> 1002", send(OP_CONT, b"orphan", piece=1),
        close(1002))
    add("5.27", "complete message, then an orphan continuation -> 1002",
        send(OP_TEXT, b"whole"), send(OP_CONT, b"orphan"), expect(OP_TEXT, b"whole"), close(1002))
    add("5.28", "orphan continuation (not fin), then a text frame -> 1002",
        send(OP_CONT, b"orphan", fin=False), send(OP_TEXT, b"text"), close(1002))
    add("5.29", "text fragment, then close: close answered, no echo",
        send(OP_TEXT, b"never", fin=False), send_close(1000), close(1000))


def register() -> None:
    category_1()
    category_2()
    category_3()
    category_4()
    category_5()
