"""A real redis-server for the tests: on a free 127.0.0.1 port, in a temporary directory, killed
by PID with the test; it can be killed with SIGKILL and started again on the same port (with
its append-only file, so what it had written survives, or without)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

from wsp_testlib import _die_with_parent, _live_servers, check, scaled


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`redis-server` on 127.0.0.1:port. persistent: appendonly with fsync always, so a SIGKILL
    loses nothing it acknowledged."""

    def __init__(self, port: int = 0, persistent: bool = True):
        if shutil.which("redis-server") is None:
            raise AssertionError("redis-server is needed (Debian package redis-server)")
        self.port = port or free_port()
        self.persistent = persistent
        self.dir = tempfile.mkdtemp(prefix="wspush-redis-")
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> "RedisServer":
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
                "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always",
                "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        _live_servers.add(self)
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            try:
                if self.command("PING") == "PONG":
                    return self
            except OSError:
                pass
            check(self.proc.poll() is None, f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise AssertionError("redis-server did not answer PING")

    def kill(self) -> None:
        """SIGKILL by PID (what it had appended with fsync stays on disk)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _live_servers.discard(self)

    def crashed(self) -> bool:
        return False

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str):
        """One command over a raw socket (RESP); returns a str, int, list or None."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=scaled(5)) as s:
            out = f"*{len(args)}\r\n".encode()
            for a in args:
                b = a.encode() if isinstance(a, str) else a
                out += f"${len(b)}\r\n".encode() + b + b"\r\n"
            s.sendall(out)
            f = s.makefile("rb")
            return _read_resp(f)


def _read_resp(f):
    line = f.readline()
    if not line:
        raise OSError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:-2]
        return data.decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_resp(f) for _ in range(n)]
    raise OSError(f"unexpected RESP {line!r}")
