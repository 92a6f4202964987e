"""Conformance category 6: UTF-8 in text messages.

Every vector is sent as one frame, as one-byte fragments, and split into two fragments at every
position. Valid vectors must come back unchanged; invalid ones must close with 1007. Vectors whose
prefix is already invalid (not merely unfinished) are also sent as a first fragment that never gets a
continuation: the server must fail fast, with 1007 before the message ends (6.90.x, 6.92.x); the same
inside one frame whose payload is still arriving is reported but not required (6.91.x, NON-STRICT).
Which prefixes are invalid is decided by Python's strict incremental decoder, independently of ours.
"""
import codecs

from casekit import OP_CONT, OP_PING, OP_TEXT, add, close, expect, frame, pong, raw, send

VALID = [
    ("empty", b""),
    ("ASCII and Latin-1 letters", "Hello-µ@ßöäüàá-UTF-8!!".encode()),
    ("Greek 'kosme'", "κόσμε".encode()),
    ("first 1-byte code point U+0000", b"\x00"),
    ("first 2-byte code point U+0080", b"\xc2\x80"),
    ("first 3-byte code point U+0800", b"\xe0\xa0\x80"),
    ("first 4-byte code point U+10000", b"\xf0\x90\x80\x80"),
    ("last 1-byte code point U+007F", b"\x7f"),
    ("last 2-byte code point U+07FF", b"\xdf\xbf"),
    ("last 3-byte code point U+FFFF", b"\xef\xbf\xbf"),
    ("last code point U+10FFFF", b"\xf4\x8f\xbf\xbf"),
    ("U+D7FF, just below the surrogates", b"\xed\x9f\xbf"),
    ("U+E000, just above the surrogates", b"\xee\x80\x80"),
    ("U+FFFD replacement character", b"\xef\xbf\xbd"),
    ("U+FFFE noncharacter (valid UTF-8)", b"\xef\xbf\xbe"),
    ("mixed scripts and emoji", "a é 中文 𝄞 😀 z".encode()),
]

INVALID = [
    ("'kosme' + surrogate U+D800 + 'edited'", "κόσμε".encode() + b"\xed\xa0\x80edited"),
    ("U+110000, past the last code point", b"\xf4\x90\x80\x80"),
    ("F7 BF BF BF, past the last code point", b"\xf7\xbf\xbf\xbf"),
    ("5-byte sequence", b"\xf8\x88\x80\x80\x80"),
    ("6-byte sequence", b"\xfc\x84\x80\x80\x80\x80"),
    ("lone continuation 80", b"\x80"),
    ("lone continuation BF", b"\xbf"),
    ("two continuations 80 BF", b"\x80\xbf"),
    ("three continuations 80 BF 80", b"\x80\xbf\x80"),
    ("all 64 continuation bytes", bytes(range(0x80, 0xC0))),
    ("lone 2-byte starts, each followed by a space", b"".join(bytes([b, 0x20]) for b in range(0xC0, 0xE0))),
    ("lone 3-byte starts, each followed by a space", b"".join(bytes([b, 0x20]) for b in range(0xE0, 0xF0))),
    ("lone 4-byte starts, each followed by a space", b"".join(bytes([b, 0x20]) for b in range(0xF0, 0xF8))),
    ("2-byte sequence missing its last byte", b"\xc2"),
    ("3-byte sequence missing its last byte", b"\xe0\xa0"),
    ("4-byte sequence missing its last byte", b"\xf0\x90\x80"),
    ("valid text ending in a truncated sequence", b"valid then \xef\xbf"),
    ("truncated sequences one after another", b"\xc2\xe0\xa0\xf0\x90\x80\xdf\xef\xbf"),
    ("impossible byte FE", b"\xfe"),
    ("impossible byte FF", b"\xff"),
    ("impossible bytes FE FE FF FF", b"\xfe\xfe\xff\xff"),
    ("overlong '/' in 2 bytes", b"\xc0\xaf"),
    ("overlong '/' in 3 bytes", b"\xe0\x80\xaf"),
    ("overlong '/' in 4 bytes", b"\xf0\x80\x80\xaf"),
    ("largest overlong 2-byte", b"\xc1\xbf"),
    ("largest overlong 3-byte", b"\xe0\x9f\xbf"),
    ("largest overlong 4-byte", b"\xf0\x8f\xbf\xbf"),
    ("overlong NUL in 2 bytes", b"\xc0\x80"),
    ("overlong NUL in 3 bytes", b"\xe0\x80\x80"),
    ("surrogate U+D800", b"\xed\xa0\x80"),
    ("surrogate U+DB7F", b"\xed\xad\xbf"),
    ("surrogate U+DB80", b"\xed\xae\x80"),
    ("surrogate U+DBFF", b"\xed\xaf\xbf"),
    ("surrogate U+DC00", b"\xed\xb0\x80"),
    ("surrogate U+DF80", b"\xed\xbe\x80"),
    ("surrogate U+DFFF", b"\xed\xbf\xbf"),
    ("surrogate pair U+D800 U+DC00", b"\xed\xa0\x80\xed\xb0\x80"),
    ("surrogate pair U+DBFF U+DFFF", b"\xed\xaf\xbf\xed\xbf\xbf"),
    ("valid text, then an invalid byte in the middle", b"abc\xffdef"),
]


def prefix_invalid(data: bytes) -> int:
    """Length of the shortest prefix already known invalid (0 if only the end can make it invalid)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for i in range(len(data)):
        try:
            decoder.decode(data[i:i + 1], final=False)
        except UnicodeDecodeError:
            return i + 1
    return 0


def fragments_at(data: bytes, cut: int) -> tuple:
    return send(OP_TEXT, data[:cut], fin=False), send(OP_CONT, data[cut:])


def one_byte_fragments(data: bytes) -> tuple:
    if len(data) <= 1:
        return (send(OP_TEXT, data),)
    return (send(OP_TEXT, data[:1], fin=False), *[send(OP_CONT, data[i:i + 1], fin=False)
                                                  for i in range(1, len(data) - 1)],
            send(OP_CONT, data[-1:]))


def register() -> None:
    for v, (name, data) in enumerate(VALID, 1):
        outcome = expect(OP_TEXT, data)
        add(f"6.{v}.1", f"valid: {name}, one frame", send(OP_TEXT, data), outcome)
        add(f"6.{v}.2", f"valid: {name}, one-byte fragments", *one_byte_fragments(data), outcome)
        for cut in range(1, len(data)):
            add(f"6.{v}.{cut + 2}", f"valid: {name}, split after byte {cut}", *fragments_at(data, cut), outcome)
    base = len(VALID)
    for v, (name, data) in enumerate(INVALID, base + 1):
        add(f"6.{v}.1", f"invalid: {name}, one frame -> 1007", send(OP_TEXT, data), close(1007))
        add(f"6.{v}.2", f"invalid: {name}, one-byte fragments -> 1007", *one_byte_fragments(data), close(1007))
        for cut in range(1, len(data)):
            add(f"6.{v}.{cut + 2}", f"invalid: {name}, split after byte {cut} -> 1007",
                *fragments_at(data, cut), close(1007))
    fail_fast()


# Vectors for the non-strict mid-frame cases (a server without it waits out each case's timeout).
MID_FRAME_SAMPLES = ("impossible byte FF", "overlong '/' in 2 bytes", "surrogate U+D800",
                     "U+110000, past the last code point")


def fail_fast() -> None:
    """The invalid prefix in a first fragment (or in the arrived part of a frame) is enough for 1007."""
    k = 0
    for name, data in INVALID:
        bad = prefix_invalid(data)
        if not bad:
            continue
        k += 1
        add(f"6.90.{k}", f"fail fast: first fragment holds an invalid prefix ({name}); no continuation is "
            "ever sent -> 1007", send(OP_TEXT, data[:bad], fin=False), close(1007))
    for k, (name, data) in enumerate([(n, d) for n, d in INVALID if n in MID_FRAME_SAMPLES], 1):
        bad = prefix_invalid(data)
        whole = frame(OP_TEXT, data[:bad] + b"x" * 100)
        head_len = len(whole) - (bad + 100)
        add(f"6.91.{k}", f"fail fast inside one frame: the invalid prefix of a 100+ byte payload arrives, "
            f"the rest never does ({name}) -> 1007", raw(whole[:head_len + bad]), close(1007), strict=False,
            timeout=3)
    add("6.92.1", "fail fast across fragments: valid first fragment, second one makes it invalid, message "
        "never ends -> 1007", send(OP_TEXT, "κόσμε".encode(), fin=False),
        send(OP_CONT, b"\xed\xa0\x80edited", fin=False), close(1007))
    add("6.92.2", "not too fast: a first fragment ending mid-character is fine when the next completes it",
        send(OP_TEXT, b"caf\xc3", fin=False), send(OP_PING, b"mid"), pong(b"mid"),
        send(OP_CONT, b"\xa9"), expect(OP_TEXT, "café".encode()))

