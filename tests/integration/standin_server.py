"""A slow, simple model of the wspush server contract (echo and broadcast modes), in Python.

Not a product and not used by CTest: it exists so that the integration tests and the conformance suite
can be checked against an independent implementation of the same contract (same command line, same
log lines, same close codes), e.g.
    /usr/bin/python3 tests/conformance/conformance.py --server tests/integration/standin_server.py
When the real server and this model disagree, one of them (or the test) is wrong: look closer.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import codecs
import hashlib
import os
import signal
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
VALID_CLOSE = set(range(1000, 1004)) | set(range(1007, 1015)) | set(range(3000, 5000))


class ProtocolClose(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="0.0.0.0:8080")
    p.add_argument("--admin-listen", default="")  # accepted for the real binary's command line; unused
    p.add_argument("--mode", default="echo", choices=["echo", "broadcast"])
    p.add_argument("--io", default="uring", choices=["uring", "epoll"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--auth", default="")
    p.add_argument("--max-frame-bytes", type=int, default=16777216)
    p.add_argument("--max-message-bytes", type=int, default=16777216)
    p.add_argument("--max-request-bytes", type=int, default=8192)
    p.add_argument("--upgrade-timeout", type=float, default=5)
    p.add_argument("--close-timeout", type=float, default=5)
    p.add_argument("--message-timeout", type=float, default=30)
    p.add_argument("--max-pending-bytes", type=int, default=4194304)
    return p.parse_args()


def frame(opcode: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    if n <= 125:
        head = bytes([0x80 | opcode, n])
    elif n <= 0xFFFF:
        head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, "big")
    return head + payload


def unmask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


class Server:
    def __init__(self, opts: argparse.Namespace):
        self.o = opts
        self.conns: set[Conn] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(self, reader, writer)
        try:
            await conn.run()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self.conns.discard(conn)
            writer.close()


class Conn:
    def __init__(self, server: Server, reader, writer):
        self.s, self.o, self.r, self.w = server, server.o, reader, writer
        self.buf = bytearray()
        self.msg_op: int | None = None
        self.msg = bytearray()
        self.utf8 = None
        self.deadline: float | None = None
        self.closing = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            ok = await asyncio.wait_for(self.upgrade(), self.o.upgrade_timeout)
        except asyncio.TimeoutError:
            return
        if not ok:
            return
        self.s.conns.add(self)
        try:
            await self.consume()  # frames that came in the same read as the request
            while True:
                await self.read_more(loop)
                await self.consume()
        except ProtocolClose as exc:
            await self.fail(exc.code)

    async def upgrade(self) -> bool:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > self.o.max_request_bytes:
                return await self.http_error(431, "Request Header Fields Too Large")
            chunk = await self.r.read(65536)
            if not chunk:
                return False
            self.buf += chunk
        end = self.buf.index(b"\r\n\r\n") + 4
        if end > self.o.max_request_bytes:
            return await self.http_error(431, "Request Header Fields Too Large")
        head, self.buf = bytes(self.buf[:end - 4]), self.buf[end:]
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or parts[0] != b"GET":
            return await self.http_error(400, "Bad Request")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                return await self.http_error(400, "Bad Request")
            headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
        if "websocket" not in headers.get("upgrade", "").lower():
            return await self.http_error(426, "Upgrade Required")
        if headers.get("sec-websocket-version") != "13":
            return await self.http_error(426, "Upgrade Required", "Sec-WebSocket-Version: 13\r\n")
        key = headers.get("sec-websocket-key", "")
        if len(key) != 24:
            return await self.http_error(400, "Bad Request")
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
        self.w.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
        return True

    async def http_error(self, status: int, reason: str, extra: str = "") -> bool:
        self.w.write(f"HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await self.w.drain()
        return False

    async def read_more(self, loop) -> None:
        timeout = None if self.deadline is None else max(0.0, self.deadline - loop.time())
        try:
            chunk = await asyncio.wait_for(self.r.read(1 << 20), timeout)
        except asyncio.TimeoutError:
            raise ProtocolClose(1008)
        if not chunk:
            raise ConnectionError("eof")
        if self.deadline is None:
            self.deadline = loop.time() + self.o.message_timeout
        self.buf += chunk

    async def consume(self) -> None:
        while True:
            parsed = self.parse_frame()
            if parsed is None:
                return
            await self.on_frame(*parsed)
            if self.msg_op is None and not self.buf:
                self.deadline = None

    def parse_frame(self):
        b = self.buf
        if len(b) < 2:
            return None
        fin, rsv, op, masked, n = b[0] >> 7, (b[0] >> 4) & 7, b[0] & 15, b[1] >> 7, b[1] & 127
        if rsv or op in (3, 4, 5, 6, 7) or op > 10 or not masked:
            raise ProtocolClose(1002)
        if op >= 8 and (not fin or n > 125):
            raise ProtocolClose(1002)
        off = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, off = int.from_bytes(b[2:4], "big"), 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, off = int.from_bytes(b[2:10], "big"), 10
            if n >> 63:
                raise ProtocolClose(1002)
        if n > self.o.max_frame_bytes:
            raise ProtocolClose(1009)
        if op < 8:
            self.check_data_frame(op, n)
        if len(b) < off + 4 + n:
            return None
        payload = unmask(bytes(b[off + 4:off + 4 + n]), bytes(b[off:off + 4]))
        del b[:off + 4 + n]
        return bool(fin), op, payload

    def check_data_frame(self, op: int, n: int) -> None:
        if op == 0 and self.msg_op is None:
            raise ProtocolClose(1002)
        if op != 0 and self.msg_op is not None:
            raise ProtocolClose(1002)
        if (len(self.msg) if op == 0 else 0) + n > self.o.max_message_bytes:
            raise ProtocolClose(1009)

    async def on_frame(self, fin: bool, op: int, payload: bytes) -> None:
        if op == 8:
            return await self.on_close(payload)
        if op == 9:
            return self.send(frame(10, payload))
        if op == 10:
            return
        if op != 0:
            self.msg_op, self.msg = op, bytearray()
            self.utf8 = codecs.getincrementaldecoder("utf-8")() if op == 1 else None
        self.msg += payload
        if self.utf8 is not None:
            try:
                self.utf8.decode(payload, final=fin)
            except UnicodeDecodeError:
                raise ProtocolClose(1007)
        if fin:
            op, data, self.msg_op, self.msg = self.msg_op, bytes(self.msg), None, bytearray()
            self.deliver(op, data)

    def deliver(self, op: int, data: bytes) -> None:
        if self.o.mode == "echo":
            return self.send(frame(op, data))
        if op == 1:
            encoded = frame(1, data)
            for conn in list(self.s.conns):
                conn.send(encoded)

    def send(self, data: bytes) -> None:
        if self.closing:
            return
        # A single message bigger than the bound is still sent; only output queued behind
        # unsent output past the bound closes the connection.
        if self.w.transport.get_write_buffer_size() > self.o.max_pending_bytes:
            self.closing = True
            self.w.write(frame(8, (1013).to_bytes(2, "big")))
            self.w.transport.abort()
            return
        self.w.write(data)

    async def on_close(self, payload: bytes) -> None:
        if len(payload) == 1:
            raise ProtocolClose(1002)
        if payload:
            code = int.from_bytes(payload[:2], "big")
            if code not in VALID_CLOSE:
                raise ProtocolClose(1002)
            try:
                payload[2:].decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolClose(1007)
        self.send(frame(8, payload[:2]))
        self.closing = True
        await self.w.drain()
        raise ConnectionError("closed")

    async def fail(self, code: int) -> None:
        """Sends close(code), then waits (discarding input) for the peer's close or the close timeout."""
        self.send(frame(8, code.to_bytes(2, "big")))
        self.closing = True
        self.s.conns.discard(self)
        try:
            await asyncio.wait_for(self.wait_peer_close(), self.o.close_timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass

    async def wait_peer_close(self) -> None:
        while True:
            while len(self.buf) >= 2:
                n, off = self.buf[1] & 127, 2
                if n == 126:
                    n, off = int.from_bytes(self.buf[2:4], "big"), 4
                elif n == 127:
                    n, off = int.from_bytes(self.buf[2:10], "big") & ((1 << 63) - 1), 10
                off += 4 if self.buf[1] & 128 else 0
                if len(self.buf) < off + n:
                    break
                if self.buf[0] & 15 == 8:
                    return
                del self.buf[:off + n]
            chunk = await self.r.read(1 << 20)
            if not chunk:
                return
            self.buf += chunk


async def main() -> None:
    opts = parse_args()
    host, _, port = opts.listen.rpartition(":")
    backend = opts.io
    note = ""
    if opts.io == "uring" and os.environ.get("WSPUSH_TEST_FAIL_URING") == "1":
        backend, note = "epoll", " (fallback: io_uring_queue_init: Operation not permitted)"
    print(f"wspush: io backend: {backend}{note}", file=sys.stderr, flush=True)
    server = Server(opts)
    listener = await asyncio.start_server(server.handle, host, int(port), limit=1 << 22, backlog=4096)
    addr = listener.sockets[0].getsockname()
    print(f"wspush: listening on {addr[0]}:{addr[1]} (stand-in, {opts.mode})", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()
    for conn in list(server.conns):
        conn.send(frame(8, (1001).to_bytes(2, "big")))
        conn.closing = True
        await conn.w.drain()
        conn.w.close()


if __name__ == "__main__":
    asyncio.run(main())
