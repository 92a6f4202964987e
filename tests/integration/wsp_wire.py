"""Wire-level helpers for wspush's tests: raw HTTP, RFC 6455 frame encode/decode with masking, and
`RawWebSocket`, a client over a raw socket that can send anything (bad RSV bits, unmasked frames,
one byte per send) and checks everything the server sends. Re-exported by `wsp_testlib`.
Standard library only.
"""
from __future__ import annotations

import base64
import hashlib
import os
import select
import socket
import time
import zlib
from typing import NamedTuple, Optional

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA


class TestFailure(Exception):
    """A test expectation did not hold; the message says what was expected and what was seen."""


class Skip(Exception):
    """The test cannot run here (io_uring unavailable); exits with SKIP_EXIT."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise TestFailure(message)


def timeout_scale() -> float:
    """Multiplier for every per-step timeout (ASan servers are ~3x slower): WSPUSH_TEST_TIMEOUT_SCALE."""
    try:
        return max(1.0, float(os.environ.get("WSPUSH_TEST_TIMEOUT_SCALE", "1")))
    except ValueError:
        return 1.0


def scaled(seconds: float) -> float:
    return seconds * timeout_scale()


# Raw HTTP
# --------------------------------------------------------------------------------------------------

class HttpResponse(NamedTuple):
    status: int
    reason: str
    headers: dict  # lower-case name -> list of values
    raw: bytes
    closed: bool  # the server closed the TCP connection (EOF or reset) after answering

    def header(self, name: str) -> Optional[str]:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    @property
    def body(self) -> bytes:
        return self.raw.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in self.raw else b""


def parse_http_head(data: bytes) -> tuple[int, str, dict]:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TestFailure(f"not an HTTP status line: {lines[0]!r}")
    headers: dict = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def connect(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=scaled(timeout))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def http_exchange(port: int, request: bytes, timeout: float = 10.0, piece: int = 0) -> HttpResponse:
    """Sends `request` (`piece` bytes per send if > 0) while reading, then reads the answer until the
    server closes the connection. Sending stops quietly if the server answers and closes early."""
    client = RawWebSocket(port, timeout)
    try:
        client.connect()
        client.send_raw(request, piece=piece)
        closed = client.read_to_eof(scaled(timeout))
        data = bytes(client.rbuf)
    finally:
        client.close_socket()
    check(b"\r\n\r\n" in data, f"no complete HTTP response (got {data[:200]!r}, closed={closed})")
    status, reason, headers = parse_http_head(data)
    return HttpResponse(status, reason, headers, data, closed)


def upgrade_request(path: str = "/ws", key: Optional[str] = None, version: str = "13", extra: str = "") -> bytes:
    key = key or base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: {version}\r\n{extra}\r\n").encode()


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


# --------------------------------------------------------------------------------------------------
# RFC 6455 frames
# --------------------------------------------------------------------------------------------------

class Frame(NamedTuple):
    fin: bool
    rsv: int
    opcode: int
    payload: bytes
    masked: bool

    def describe(self) -> str:
        body = self.payload[:40]
        more = f"...(+{len(self.payload) - 40})" if len(self.payload) > 40 else ""
        if self.opcode == OP_CLOSE:
            code, reason = parse_close(self.payload)
            return f"close(code={code}, reason={reason[:40]!r})"
        names = {0: "cont", 1: "text", 2: "binary", 9: "ping", 10: "pong"}
        return (f"{names.get(self.opcode, hex(self.opcode))}(fin={int(self.fin)}, rsv={self.rsv}, "
                f"len={len(self.payload)}, {bytes(body)!r}{more})")


def mask_bytes(data: bytes, key: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return b""
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


def encode_frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0, mask: bool = True,
                 key: Optional[bytes] = None, length_form: Optional[int] = None) -> bytes:
    """One frame. `length_form` forces the 7-bit (0), 16-bit (126) or 64-bit (127) length encoding."""
    n = len(payload)
    head = bytearray([(0x80 if fin else 0) | ((rsv & 7) << 4) | (opcode & 0xF)])
    form = length_form if length_form is not None else (0 if n <= 125 else 126 if n <= 0xFFFF else 127)
    mbit = 0x80 if mask else 0
    if form == 0:
        head.append(mbit | n)
    elif form == 126:
        head.append(mbit | 126)
        head += n.to_bytes(2, "big")
    else:
        head.append(mbit | 127)
        head += n.to_bytes(8, "big")
    if not mask:
        return bytes(head) + payload
    key = key if key is not None else os.urandom(4)
    return bytes(head) + key + mask_bytes(payload, key)


def close_payload(code: Optional[int] = None, reason: bytes = b"") -> bytes:
    if code is None:
        return b""
    return code.to_bytes(2, "big") + reason


def parse_close(payload: bytes) -> tuple[Optional[int], bytes]:
    if len(payload) < 2:
        return None, bytes(payload)
    return int.from_bytes(payload[:2], "big"), bytes(payload[2:])


def decode_frame(buf, pos: int = 0) -> tuple[Optional[Frame], int]:
    """Decodes one frame from `buf[pos:]`; returns (None, pos) while it is incomplete."""
    avail = len(buf) - pos
    if avail < 2:
        return None, pos
    b0, b1 = buf[pos], buf[pos + 1]
    n = b1 & 0x7F
    off = pos + 2
    if n == 126:
        if avail < 4:
            return None, pos
        n = int.from_bytes(buf[off:off + 2], "big")
        off += 2
    elif n == 127:
        if avail < 10:
            return None, pos
        n = int.from_bytes(buf[off:off + 8], "big")
        off += 8
    masked = bool(b1 & 0x80)
    key = b""
    if masked:
        if len(buf) < off + 4:
            return None, pos
        key = bytes(buf[off:off + 4])
        off += 4
    if len(buf) < off + n:
        return None, pos
    payload = bytes(buf[off:off + n])
    if masked:
        payload = mask_bytes(payload, key)
    return Frame(bool(b0 & 0x80), (b0 >> 4) & 7, b0 & 0xF, payload, masked), off + n


# --------------------------------------------------------------------------------------------------
# A raw WebSocket client: sends anything, checks everything the server sends
# --------------------------------------------------------------------------------------------------

def deflate_message(data: bytes, level: int = -1, mem_level: int = 8) -> bytes:
    """A message's payload as a browser compresses it for permessage-deflate without context
    takeover: raw deflate, sync-flushed, the trailing 00 00 ff ff taken off (RFC 7692 §7.2.1)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15, mem_level)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    check(out.endswith(b"\x00\x00\xff\xff"), "zlib's sync flush did not end with 00 00 ff ff")
    return out[:-4]


def inflate_message(payload: bytes) -> bytes:
    """A permessage-deflate message read as browsers read it (00 00 ff ff put back, a fresh
    stream: the server never takes context over); a stream that ends with a final block may
    have bytes after it (RFC 7692 §7.2.3.4)."""
    d = zlib.decompressobj(-15)
    try:
        return d.decompress(payload + b"\x00\x00\xff\xff")
    except zlib.error as exc:
        raise TestFailure(f"a compressed message from the server does not inflate: {exc}")


class Event(NamedTuple):
    """What the server sent: a whole (reassembled) data message, or one control frame."""
    opcode: int  # OP_TEXT / OP_BINARY for messages, OP_PING / OP_PONG / OP_CLOSE for control frames
    payload: bytes

    def describe(self) -> str:
        return Frame(True, 0, self.opcode, self.payload, False).describe()


class RawWebSocket:
    """A blocking client over a raw socket. Sends are interleaved with reads (select), so a 16 MiB
    frame can never deadlock against the server's echo of it, and a close the server sends while we
    are still sending is seen. Every frame from the server is checked: unmasked, RSV bits clear
    (RSV1 allowed on a message's first frame once permessage-deflate was negotiated; such a
    message is inflated as a browser does, and `last_compressed` says it came compressed)."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.port = port
        self.timeout = scaled(timeout)
        self.sock: Optional[socket.socket] = None
        self.rbuf = bytearray()
        self.eof = False
        self.send_failed = False
        self._frag_op: Optional[int] = None
        self._frag = bytearray()
        self._frag_compressed = False
        self.extensions: Optional[str] = None  # the 101's Sec-WebSocket-Extensions
        self.deflate = False
        self.last_compressed = False  # the last message next_event returned came with RSV1

    # -- connection ---------------------------------------------------------------------------------

    def open(self, path: str = "/ws", piece: int = 0, extra_headers: str = "", trailing: bytes = b"") -> "RawWebSocket":
        """Connects and upgrades; `piece` > 0 sends the request `piece` bytes per send; `trailing`
        bytes (frames) go out in the same write as the request."""
        self.connect()
        key = base64.b64encode(os.urandom(16)).decode()
        self.send_raw(upgrade_request(path, key, extra=extra_headers) + trailing, piece=piece)
        deadline = time.monotonic() + self.timeout
        while b"\r\n\r\n" not in self.rbuf:
            if self.eof:
                raise TestFailure(f"server closed during the upgrade; got {bytes(self.rbuf[:200])!r}")
            if not self._fill(deadline - time.monotonic()):
                raise TestFailure(f"no upgrade response within {self.timeout:.1f}s")
        end = self.rbuf.index(b"\r\n\r\n") + 4
        status, _, headers = parse_http_head(bytes(self.rbuf[:end]))
        del self.rbuf[:end]
        check(status == 101, f"upgrade answered {status}, expected 101")
        got = (headers.get("sec-websocket-accept") or [""])[0]
        check(got == accept_key(key), f"Sec-WebSocket-Accept {got!r}, expected {accept_key(key)!r}")
        check("websocket" in ",".join(headers.get("upgrade", [])).lower(), "101 without Upgrade: websocket")
        check("upgrade" in ",".join(headers.get("connection", [])).lower(), "101 without Connection: Upgrade")
        self.extensions = ", ".join(headers["sec-websocket-extensions"]) if "sec-websocket-extensions" in headers else None
        self.deflate = bool(self.extensions) and self.extensions.startswith("permessage-deflate")
        return self

    def connect(self) -> "RawWebSocket":
        self.sock = connect(self.port)
        self.sock.setblocking(False)
        return self

    def read_to_eof(self, timeout: float) -> bool:
        """Reads into `rbuf` until the server closes (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._fill(deadline - time.monotonic())
        return self.eof

    def close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self) -> "RawWebSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close_socket()

    # -- bytes --------------------------------------------------------------------------------------

    def _fill(self, timeout: float) -> bool:
        """Reads what is there (waiting up to `timeout`); False on timeout. Sets `eof` on EOF/reset."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return True
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        if not chunk:
            self.eof = True
        self.rbuf += chunk
        return True

    def send_raw(self, data: bytes, piece: int = 0) -> bool:
        """Sends `data` (`piece` bytes per send call if > 0) while reading whatever arrives.
        Returns False if the server closed or reset the connection before everything was sent."""
        view = memoryview(data)
        pos, step = 0, (piece if piece > 0 else 1 << 20)
        deadline = time.monotonic() + self.timeout
        while pos < len(view):
            if self.send_failed:
                return False
            readable, writable, _ = select.select([self.sock] if not self.eof else [], [self.sock], [],
                                                  max(0.0, deadline - time.monotonic()))
            if readable:
                self._fill(0)
            if writable:
                try:
                    pos += self.sock.send(view[pos:pos + step])
                    deadline = time.monotonic() + self.timeout  # progress: reset the stall timer
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    self.send_failed = True
                    return False
            elif not readable and time.monotonic() >= deadline:
                raise TestFailure(f"server stopped reading: {len(view) - pos} of {len(view)} bytes unsent "
                                  f"after {self.timeout:.1f}s")
        return True

    def send_frame(self, opcode: int, payload: bytes = b"", piece: int = 0, **kw) -> bool:
        return self.send_raw(encode_frame(opcode, payload, **kw), piece=piece)

    def send_close(self, code: Optional[int] = None, reason: bytes = b"") -> bool:
        return self.send_frame(OP_CLOSE, close_payload(code, reason))

    # -- frames and events --------------------------------------------------------------------------

    def recv_frame(self, timeout: Optional[float] = None) -> Frame:
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            frame, end = decode_frame(self.rbuf)
            if frame is not None:
                del self.rbuf[:end]
                check(not frame.masked, f"server sent a masked frame: {frame.describe()}")
                rsv1_ok = self.deflate and frame.rsv == 4 and frame.opcode in (OP_TEXT, OP_BINARY)
                check(frame.rsv == 0 or rsv1_ok, f"server sent RSV bits it may not: {frame.describe()}")
                return frame
            if self.eof:
                raise TestFailure("server closed the TCP connection without a close frame"
                                  + (f" (partial frame bytes: {bytes(self.rbuf[:20])!r})" if self.rbuf else ""))
            left = deadline - time.monotonic()
            if left <= 0:
                waited = timeout if timeout is not None else self.timeout
                partial = f" (partial frame bytes: {bytes(self.rbuf[:20])!r})" if self.rbuf else ""
                raise TestFailure(f"no frame from the server within {waited:.1f}s{partial}")
            self._fill(left)

    def next_event(self, timeout: Optional[float] = None) -> Event:
        """The next whole message (fragments reassembled) or control frame from the server."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            frame = self.recv_frame(max(0.0, deadline - time.monotonic()))
            if frame.opcode >= 8:
                check(frame.fin and len(frame.payload) <= 125, f"server sent a bad control frame: {frame.describe()}")
                return Event(frame.opcode, frame.payload)
            if frame.opcode == OP_CONT:
                check(self._frag_op is not None, f"server sent a continuation with no message: {frame.describe()}")
                self._frag += frame.payload
            else:
                check(frame.opcode in (OP_TEXT, OP_BINARY), f"server sent reserved opcode: {frame.describe()}")
                check(self._frag_op is None, f"server started a message inside another: {frame.describe()}")
                self._frag_op, self._frag = frame.opcode, bytearray(frame.payload)
                self._frag_compressed = frame.rsv == 4
            if frame.fin:
                payload = bytes(self._frag)
                if self._frag_compressed:
                    payload = inflate_message(payload)
                event = Event(self._frag_op, payload)
                self.last_compressed = self._frag_compressed
                self._frag_op, self._frag, self._frag_compressed = None, bytearray(), False
                return event

    def expect_message(self, opcode: int, payload: bytes, timeout: Optional[float] = None) -> None:
        event = self.next_event(timeout)
        want = Event(opcode, payload)
        if event != want:
            raise TestFailure(f"expected {want.describe()}, got {event.describe()}")

    def expect_pong(self, payload: bytes) -> None:
        self.expect_message(OP_PONG, payload)

    def expect_close(self, codes=None, empty: bool = False, reply: bool = True,
                     timeout: Optional[float] = None) -> Optional[int]:
        """The next event must be a close frame (with a code in `codes`, or no payload if `empty`).
        Then answers it (if `reply`) and requires the server to close TCP. Returns the code."""
        event = self.next_event(timeout)
        if event.opcode != OP_CLOSE:
            raise TestFailure(f"expected a close frame{self._codes_text(codes, empty)}, got {event.describe()}")
        code, reason = parse_close(event.payload)
        check(len(event.payload) != 1, "server sent a close frame with a 1-byte payload")
        if empty:
            check(event.payload == b"", f"expected an empty close payload, got {event.describe()}")
        elif codes is not None:
            codes = (codes,) if isinstance(codes, int) else tuple(codes)
            check(code in codes, f"expected close code {' or '.join(map(str, codes))}, got {event.describe()}")
        if reply and not self.eof and not self.send_failed:
            self.send_close(code if code not in (None, 1005, 1006, 1015) else None)
        self.expect_tcp_close()
        return code

    @staticmethod
    def _codes_text(codes, empty: bool) -> str:
        if empty:
            return " (empty)"
        if codes is None:
            return ""
        codes = (codes,) if isinstance(codes, int) else tuple(codes)
        return " with code " + " or ".join(map(str, codes))

    def expect_tcp_close(self, timeout: Optional[float] = None) -> None:
        """The server must close the TCP connection; nothing but stray bytes may come before EOF."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TestFailure(f"server did not close the TCP connection within "
                                  f"{timeout if timeout is not None else self.timeout:.1f}s")
            self._fill(left)
        frame, _ = decode_frame(self.rbuf)
        if frame is not None:
            raise TestFailure(f"server sent a frame after its close frame: {frame.describe()}")
