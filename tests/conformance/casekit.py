"""The small language the conformance cases are written in.

A case is an id (Autobahn-style, `6.4.2`), a description and a list of steps run against a fresh,
upgraded `RawWebSocket`:
    send(OP_TEXT, b"x", fin=False)  one frame in its own send() call
    raw(b"...", piece=1)            bytes as they are (`piece` bytes per send: dribbling)
    expect(OP_TEXT, b"x")           the next message/control frame from the server must be this
    pong(b"x")                      the next thing must be a pong with this payload
    pongs([b"a", b"b"])             pongs answering these pings: in order, none twice, the last one
                                    answered (a pong may answer only the most recent ping, §5.5.3)
    close(1002)                     the next thing must be a close frame with one of these codes; we
                                    answer it and the server must then close TCP with nothing after
    close_empty()                   ... a close frame without payload
`frames(...)` builds the bytes of several frames to send in one write. Everything a step sees that
it did not expect fails the case with a message naming expected and observed.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from wsp_testlib import (OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT,  # noqa: E402,F401
                         RawWebSocket, TestFailure, check, close_payload, encode_frame)

Step = Callable[[RawWebSocket], None]


class Case(NamedTuple):
    id: str
    description: str
    steps: tuple  # of Step, or a single callable taking (RawWebSocket) when `opens_itself`
    strict: bool = True  # a non-strict case is reported (NON-STRICT) but does not fail the run
    opens_itself: bool = False  # the case does its own upgrade (e.g. byte by byte)
    timeout: float = 10.0


CASES: list[Case] = []


def add(case_id: str, description: str, *steps: Step, strict: bool = True, timeout: float = 10.0) -> None:
    CASES.append(Case(case_id, description, tuple(steps), strict, False, timeout))


def add_custom(case_id: str, description: str, fn: Callable[[RawWebSocket], None], *,
               opens_itself: bool = False, strict: bool = True, timeout: float = 10.0) -> None:
    CASES.append(Case(case_id, description, (fn,), strict, opens_itself, timeout))


def frame(opcode: int, payload: bytes = b"", **kw) -> bytes:
    return encode_frame(opcode, payload, **kw)


def frames(*specs) -> bytes:
    """Concatenates frames given as (opcode, payload[, dict of encode_frame options]) tuples."""
    out = bytearray()
    for spec in specs:
        kw = spec[2] if len(spec) > 2 else {}
        out += encode_frame(spec[0], spec[1], **kw)
    return bytes(out)


def send(opcode: int, payload: bytes = b"", piece: int = 0, **kw) -> Step:
    # Encoded when the step runs, so that registering the big cases costs no memory.
    return lambda c: c.send_raw(encode_frame(opcode, payload, **kw), piece=piece)


def raw(data: bytes, piece: int = 0) -> Step:
    return lambda c: c.send_raw(data, piece=piece)


def send_close(code=None, reason: bytes = b"") -> Step:
    return send(OP_CLOSE, close_payload(code, reason))


def expect(opcode: int, payload: bytes) -> Step:
    return lambda c: c.expect_message(opcode, payload)


def pong(payload: bytes) -> Step:
    return lambda c: c.expect_pong(payload)


def pongs(payloads: "list[bytes]") -> Step:
    """RFC 6455 §5.5.3: a ping still unanswered when the next arrives may be answered by the pong
    to the newest alone (wspush keeps at most one pong waiting). So the pongs must answer the
    pings in order, each at most once, and the last ping must be answered."""
    def step(c) -> None:
        at = 0
        while True:
            event = c.next_event(None)
            if event.opcode != OP_PONG:
                raise TestFailure(f"expected a pong, got {event.describe()}")
            while at < len(payloads) and payloads[at] != event.payload:
                at += 1
            if at == len(payloads):
                raise TestFailure(f"pong {event.payload!r} answers no ping after the last one answered")
            if at == len(payloads) - 1:
                return
            at += 1
    return step


def close(*codes: int) -> Step:
    return lambda c: c.expect_close(codes or None)


def close_empty() -> Step:
    return lambda c: c.expect_close(empty=True)


def text(s) -> bytes:
    return s.encode() if isinstance(s, str) else s
