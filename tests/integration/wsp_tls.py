"""TLS helpers for the tests: certificates made in the test (the `openssl` command), client
contexts that verify them, a real ClientHello, and a relay that lets the plain-socket suites
(the conformance cases) run over TLS.

`TlsRelay` listens on a plain 127.0.0.1 port and carries each connection's bytes, as they come, to
the server over TLS (verifying its certificate): every small write of a byte-by-byte case becomes
its own TLS record, and an end or a reset on either side is passed on.
"""
from __future__ import annotations

import os
import select
import socket
import ssl
import subprocess
import threading
from typing import Optional

from wsp_wire import TestFailure


def make_cert(directory: str, name: str = "server", cn: str = "localhost") -> "tuple[str, str]":
    """A self-signed P-256 certificate for localhost and 127.0.0.1; returns (cert path, key path)."""
    cert, key = os.path.join(directory, name + ".crt"), os.path.join(directory, name + ".key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={cn}",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise TestFailure(f"openssl req failed: {r.stderr.decode()}")
    return cert, key


def tls_args(cert: str, key: str) -> list:
    return ["--tls-cert", cert, "--tls-key", key]


def client_context(cafile: str, alpn: bool = True, max_version: Optional[ssl.TLSVersion] = None) -> ssl.SSLContext:
    """Verifies the server's certificate against `cafile` (the test's own self-signed one)."""
    ctx = ssl.create_default_context(cafile=cafile)
    if alpn:
        ctx.set_alpn_protocols(["http/1.1"])
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def client_hello(ctx: Optional[ssl.SSLContext] = None) -> bytes:
    """The bytes of a real ClientHello (made with memory BIOs; nothing is sent)."""
    ctx = ctx or ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


class MemoryClient:
    """A TLS client over a raw socket whose records the test handles itself: after the
    handshake, `records(data)` gives the ciphertext of `data` to send (whole, cut, or altered)."""

    def __init__(self, port: int, cafile: str, timeout: float, max_version: Optional[ssl.TLSVersion] = None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        ctx = client_context(cafile, max_version=max_version)
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = self.sock.recv(65536)
                if not data:
                    raise TestFailure("the server closed during the handshake")
                self.incoming.write(data)
        self._flush()

    def _flush(self) -> None:
        out = self.outgoing.read()
        if out:
            self.sock.sendall(out)

    def records(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def close(self) -> None:
        self.sock.close()


class TlsRelay:
    """Plain 127.0.0.1:port -> TLS to 127.0.0.1:target (certificate verified with `cafile`)."""

    def __init__(self, target: int, cafile: str):
        self.target = target
        self.ctx = client_context(cafile)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.errors: list = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                plain, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(plain,), daemon=True).start()

    def _carry(self, plain: socket.socket) -> None:
        try:
            raw = socket.create_connection(("127.0.0.1", self.target))
            tls = self.ctx.wrap_socket(raw, server_hostname="localhost")
        except (OSError, ssl.SSLError) as exc:
            self.errors.append(f"relay could not reach the server over TLS: {exc}")
            plain.close()
            return
        for s in (plain, tls):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls.setblocking(False)
        plain_open, tls_open = True, True
        try:
            while plain_open or tls_open:
                # Buffered plaintext inside the SSL object is not visible to select.
                ready = [tls] if tls_open and tls.pending() else []
                if not ready:
                    wanted = ([plain] if plain_open else []) + ([tls] if tls_open else [])
                    ready, _, _ = select.select(wanted, [], [], 1.0)
                for s in ready:
                    if s is plain:
                        try:
                            data = plain.recv(65536)
                        except OSError:
                            data = b""
                        if data:
                            self._send_all(tls, data)
                        else:  # the client ended: so does our side towards the server (a TCP end)
                            plain_open = False
                            end = socket.fromfd(tls.fileno(), socket.AF_INET, socket.SOCK_STREAM)
                            try:
                                end.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass
                            end.close()
                    else:
                        try:
                            data = tls.recv(65536)
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                            continue
                        except (OSError, ssl.SSLError):
                            data = b""
                        if data:
                            plain.sendall(data)
                        else:  # the server ended: the client sees the end after what came
                            tls_open = False
                            try:
                                plain.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass
                            plain_open = self._wait_client_end(plain)
        finally:
            for s in (plain, tls):
                try:
                    s.close()
                except OSError:
                    pass

    @staticmethod
    def _send_all(tls: ssl.SSLSocket, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = tls.send(view)
                view = view[n:]
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                select.select([], [tls], [], 1.0)

    @staticmethod
    def _wait_client_end(plain: socket.socket) -> bool:
        # After the server's end, what the client still sends has nowhere to go; read it away
        # until the client closes too (a close test may wait for the TCP end).
        plain.settimeout(5.0)
        try:
            while plain.recv(65536):
                pass
        except OSError:
            pass
        return False
