"""Shared helpers for wspush's integration tests and RFC 6455 conformance suite.

Everything here talks to the real `wspush` binary over 127.0.0.1:
- `ServerProcess` starts it with port 0, waits for the `listening on` log line (never sleeps), and makes
  sure the process dies with the test (SIGKILL by PID on exit, plus PR_SET_PDEATHSIG if the test is killed).
- `run_main` gives every script the same exit codes: 0 pass, 1 fail (with a clear message), 77 skipped
  because `--io uring` was asked for but the server fell back to epoll.
- Re-exported from `wsp_wire`: `http_exchange` (raw HTTP), `encode_frame` / `decode_frame` (RFC 6455
  with masking) and `RawWebSocket` (a raw-socket client that can send anything, byte by byte).

Only the standard library is used, so the conformance suite runs wherever Python 3.9+ does.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import ctypes
import hashlib
import hmac
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from typing import Optional

from wsp_wire import *  # noqa: F401,F403  (one import for the test scripts)
from wsp_wire import Skip, TestFailure, check, scaled

SKIP_EXIT = 77
LISTEN_RE = re.compile(r"listening on ([0-9.]+):(\d+)")
BACKEND_RE = re.compile(r"wspush: io backend: (uring|epoll)(.*)")

# --------------------------------------------------------------------------------------------------
# Server process
# --------------------------------------------------------------------------------------------------

_live_servers: "set[ServerProcess]" = set()
_started_servers: "list[ServerProcess]" = []
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test process is killed (CTest timeout), the
    # kernel sends SIGKILL to the server too, so no stray server outlives its test.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - best effort only
        pass


def _kill_all_servers() -> None:
    for server in list(_live_servers):
        server.kill()


atexit.register(_kill_all_servers)


class ServerProcess:
    """One wspush process on 127.0.0.1 with an OS-chosen port.

    Use as a context manager; `kill()` is also registered at exit, so the server is killed by its PID
    however the test ends.
    """

    def __init__(self, binary: str, io: str = "epoll", mode: str = "echo", extra=(), env=None,
                 allow_fallback: bool = False, quiet: bool = True, jwt_secret: Optional[str] = None):
        self.binary = binary
        self.jwt_secret = jwt_secret  # None: --auth=none; "": the caller passes auth options in `extra`
        self.io = io
        self.mode = mode
        self.extra = [str(x) for x in extra]
        self.env = env
        self.allow_fallback = allow_fallback
        self.quiet = quiet
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.backend = ""
        self.backend_line = ""
        self.log: list[str] = []
        self._cond = threading.Condition()
        self._reader: Optional[threading.Thread] = None
        self._stopped = False
        self._died = False

    def command(self) -> list[str]:
        cmd = [self.binary]
        if self.binary.endswith(".py"):
            cmd = [sys.executable, self.binary]
        auth = (["--auth=none"] if self.jwt_secret is None else
                ["--jwt-secret", self.jwt_secret] if self.jwt_secret else [])
        # The admin listener on a free port too: tests run in parallel.
        return cmd + ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", f"--mode={self.mode}",
                      f"--io={self.io}", *auth, *self.extra]

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        # Options also come from WSPUSH_* variables: only the test's own may reach the server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("WSPUSH_")}
        env.update(self.env or {})
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=_die_with_parent)
        _live_servers.add(self)
        _started_servers.append(self)
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        match = self.wait_for_log(LISTEN_RE, scaled(timeout), what="the 'listening on' line")
        self.port = int(match.group(2))
        self._check_backend()
        return self

    def _check_backend(self) -> None:
        with self._cond:
            lines = [l for l in self.log if BACKEND_RE.search(l)]
        check(bool(lines), "server printed no 'wspush: io backend: ...' line before 'listening on'")
        self.backend_line = lines[-1]
        self.backend = BACKEND_RE.search(self.backend_line).group(1)
        if self.io == "uring" and self.backend != "uring" and not self.allow_fallback:
            raise Skip(f"asked for --io=uring but the server fell back: {self.backend_line.strip()}")
        if self.io == "epoll":
            check(self.backend == "epoll", f"asked for --io=epoll, server says: {self.backend_line.strip()}")

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not self.quiet:
                print(f"[server] {line}", file=sys.stderr, flush=True)
            with self._cond:
                self.log.append(line)
                self._cond.notify_all()
        with self._cond:
            self.log.append("<stderr closed>")
            self._cond.notify_all()

    def wait_for_log(self, pattern, timeout: float, what: str = "", start: int = 0):
        """Waits for a log line matching `pattern` (searched from line `start`); returns the match."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = start
        with self._cond:
            while True:
                for line in self.log[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.log)
                if self.log and self.log[-1] == "<stderr closed>":
                    raise TestFailure(f"server exited (rc={self.proc.poll()}) before {what or pattern}\n"
                                      + self.log_tail())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TestFailure(f"timed out after {timeout:.1f}s waiting for {what or pattern}\n"
                                      + self.log_tail())
                self._cond.wait(min(left, 0.5))

    def log_lines(self, text: str) -> "list[str]":
        """The lines of the log so far that contain `text`."""
        with self._cond:
            return [line for line in self.log if text in line]

    def log_tail(self, n: int = 30) -> str:
        with self._cond:
            lines = self.log[-n:]
        return "server log (last lines):\n" + "\n".join("  | " + l for l in lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self._stopped = True
        if self.alive():
            os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        """Waits for the process to exit by itself; returns its exit status (negative: killed by signal)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"server did not exit within {timeout:.1f}s\n" + self.log_tail())
        _live_servers.discard(self)
        return rc

    def crashed(self) -> bool:
        """The process ended without the test asking it to (no SIGTERM sent, not killed by us)."""
        return self._died or (self.proc is not None and self.proc.poll() is not None and not self._stopped)

    def kill(self) -> None:
        if self.proc is None:
            return
        self._died = self.crashed()
        self._stopped = True
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _live_servers.discard(self)

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.kill()


# --------------------------------------------------------------------------------------------------
# The admin listener
# --------------------------------------------------------------------------------------------------

PROMETHEUS_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$')


async def recv_json(ws, seconds: float = 10) -> dict:
    """The next message of a `websockets` client, read as JSON, within `seconds` (scaled)."""
    return json.loads(await asyncio.wait_for(ws.recv(), scaled(seconds)))


def no_positions(reply: dict) -> dict:
    """A `subbed` reply without its positions (`at`), for comparing the rest of it."""
    return {k: v for k, v in reply.items() if k != "at"}


async def subscribe(ws, topics, since=None) -> dict:
    """Sends a `sub` over a `websockets` client; returns the `subbed` reply, which must name the
    topics and carry `lost`."""
    msg = {"op": "sub", "topics": topics}
    if since:
        msg["since"] = since
    await ws.send(json.dumps(msg))
    reply = await recv_json(ws)
    check(reply.get("op") == "subbed" and reply.get("topics") == topics, f"sub {topics} answered {reply}")
    check(reply.get("lost") is not None, f"subbed without lost: {reply}")
    return reply


def mint_jwt(claims: dict, secret: str) -> str:
    """An HS256 token of `claims` signed with `secret`, as a backend mints them."""
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = enc(json.dumps(claims).encode())
    return f"{head}.{body}.{enc(hmac.new(secret.encode(), f'{head}.{body}'.encode(), hashlib.sha256).digest())}"


def admin_port(server: ServerProcess) -> int:
    return int(server.wait_for_log(r"admin API at [0-9.]+:(\d+)", scaled(10)).group(1))


def http_request(port: int, method: str, path: str, body: bytes = b"") -> "tuple[int, str]":
    """One HTTP/1.1 request to 127.0.0.1:port; returns (status, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(30))
    try:
        conn.request(method, path, body=body or None)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def publish(server: "ServerProcess", topic: str, data) -> "tuple[int, dict]":
    """POST /publish to the server's admin listener; (status, JSON body). HTTP errors are
    answers too: the status says which."""
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port(server)}/publish",
                                 data=json.dumps({"topic": topic, "data": data}).encode())
    try:
        with urllib.request.urlopen(req, timeout=scaled(10)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def publish_ok(server: "ServerProcess", topic: str, data) -> str:
    """A publish that must be accepted; returns its id."""
    status, body = publish(server, topic, data)
    check(status == 200, f"publish to {topic} answered {status} {body}")
    return body["id"]


def metric(server: "ServerProcess", name: str) -> float:
    """One series of the server's /metrics (0 when absent)."""
    return scrape_metrics(admin_port(server)).get(name, 0)


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise TestFailure(f"no VmRSS in /proc/{pid}/status")


def rss_mb(pid: int) -> float:
    return rss_bytes(pid) / (1 << 20)


class RssPeak:
    """The largest VmRSS a process reaches while watched: a thread samples it every `every`
    seconds from start() to stop() (or through a `with` block), so memory the process takes and
    gives back between two of the test's own steps is still seen, and an asyncio test's loop
    need not yield for it. `base_bytes` is the RSS at start(); `peak_bytes` includes it and a
    last sample at stop(). A process that is gone ends the sampling (the test sees that itself)."""

    def __init__(self, pid: int, every: float = 0.02):
        self.pid, self.every = pid, every
        self.base_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> bool:
        try:
            self.peak_bytes = max(self.peak_bytes, rss_bytes(self.pid))
            return True
        except (OSError, TestFailure):
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.every) and self._sample():
            pass

    def start(self) -> "RssPeak":
        self.base_bytes = self.peak_bytes = rss_bytes(self.pid)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(scaled(5))
        self._thread = None
        self._sample()

    def __enter__(self) -> "RssPeak":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / (1 << 20)

    @property
    def base_mb(self) -> float:
        return self.base_bytes / (1 << 20)

    @property
    def growth_bytes(self) -> int:
        return self.peak_bytes - self.base_bytes


def rss_bounds_checked() -> bool:
    """Whether the server's RSS says what it holds: not in a sanitizer build (WSPUSH_SANITIZED,
    set by CMake), where AddressSanitizer replaces the allocator and keeps freed memory in its
    quarantine. Tests still run every step there, and check what does not depend on RSS."""
    if os.environ.get("WSPUSH_SANITIZED"):
        print("  (a sanitizer build: RSS bounds are not checked)", file=sys.stderr, flush=True)
        return False
    return True


def poll_until(cond, seconds: float, interval: float = 0.05) -> bool:
    """Whether `cond()` came true within `seconds` (for a state with no event to await, such as
    a gauge going back to 0); the deadline only stops a hang."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def gauge_sum(admin: int, name: str) -> float:
    """The sum of every series of gauge `name` (each state of wspush_connections, say)."""
    return sum(v for k, v in scrape_metrics(admin).items() if k == name or k.startswith(name + "{"))


def wait_gauge(admin: int, name: str, want: float, what: str, seconds: float = 10) -> None:
    """Until gauge_sum(name) is `want` (within a scaled `seconds`)."""
    if not poll_until(lambda: gauge_sum(admin, name) == want, scaled(seconds), interval=0.02):
        check(False, f"{name} stayed at {gauge_sum(admin, name):g}, expected {want:g} ({what})")


def scrape_metrics(port: int) -> dict:
    """GET /metrics, parsed strictly enough for the tests: every line a comment or a sample.
    Keys are the series as written (`name{labels}`)."""
    status, text = http_request(port, "GET", "/metrics")
    check(status == 200, f"/metrics answered {status}")
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = PROMETHEUS_SAMPLE.match(line)
        check(m is not None, f"not a Prometheus sample line: {line!r}")
        values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


# --------------------------------------------------------------------------------------------------
# Command line and exit codes shared by every script
# --------------------------------------------------------------------------------------------------

def arg_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--server", required=True, help="path of the wspush binary")
    parser.add_argument("--io", choices=["uring", "epoll"], default="epoll", help="io backend to ask for")
    parser.add_argument("--verbose", action="store_true", help="echo the server's log")
    return parser


def run_main(body, parser: argparse.ArgumentParser) -> None:
    """Parses the arguments, runs `body(args)`, kills every server, exits 0 / 1 / 77."""
    args = parser.parse_args()
    code = 0
    try:
        body(args)
        print("PASS")
    except Skip as exc:
        print(f"SKIP: {exc}")
        code = SKIP_EXIT
    except (TestFailure, AssertionError) as exc:
        print(f"FAIL: {exc}")
        code = 1
    except Exception:
        print("FAIL: unexpected exception")
        traceback.print_exc(file=sys.stdout)
        code = 1
    finally:
        for server in _started_servers:
            if code == 1 and server.crashed():
                print(f"server pid {server.proc.pid} exited by itself with {server.proc.returncode}\n"
                      + server.log_tail(60))
        _kill_all_servers()
    sys.stdout.flush()
    sys.exit(code)


def run_step(name: str, fn, *args, **kwargs):
    """Runs one named step; a failure message is prefixed with the step name."""
    started = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except TestFailure as exc:
        raise TestFailure(f"[{name}] {exc}") from None
    print(f"ok - {name} ({time.monotonic() - started:.1f}s)", flush=True)
    return result


class Findings:
    """Runs named steps that check independent findings and records every failure instead of
    stopping at the first; done() then fails once, naming them all."""

    def __init__(self) -> None:
        self.failures: "list[str]" = []

    def step(self, name: str, fn, *args) -> None:
        try:
            run_step(name, fn, *args)
        except TestFailure as exc:
            print(f"not ok - {exc}", flush=True)
            self.failures.append(str(exc))

    def done(self) -> None:
        check(not self.failures, f"{len(self.failures)} check(s) failed:\n  " + "\n  ".join(self.failures))


def recv_some(s, buf: bytearray, deadline: float, what: str) -> None:
    """Appends what a raw socket has to `buf`, waiting until `deadline` (monotonic) at most;
    fails naming `what` on the deadline or when the server closes first."""
    ready, _, _ = select.select([s], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise TestFailure(f"timed out waiting for {what}; got {bytes(buf[:200])!r}")
    chunk = s.recv(65536)
    if not chunk:
        raise TestFailure(f"server closed while we waited for {what}; got {bytes(buf[:200])!r}")
    buf += chunk


# --------------------------------------------------------------------------------------------------
