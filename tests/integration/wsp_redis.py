"""A real redis-server for the tests: on a reserved 127.0.0.1 port (outside the ephemeral range,
wsp_ports.py), in a temporary directory, killed by PID with the test; it can be killed with
SIGKILL and started again on the same port (with its append-only file, so what it had written
survives, or without). A start returns once the server answers PING with PONG: a restarted
server answers -LOADING while it reads its append-only file, and that is waited out."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

from wsp_ports import reserve_cluster_port, reserve_port
from wsp_testlib import _die_with_parent, _live_servers, check, scaled


def free_port() -> int:
    """A port that is free now and stays ours: a server may be (re)started on it later."""
    return reserve_port()


class RedisServer:
    """`redis-server` on 127.0.0.1:port. persistent: appendonly with fsync always, so a SIGKILL
    loses nothing it acknowledged."""

    def __init__(self, port: int = 0, persistent: bool = True, password: Optional[str] = None,
                 extra: "tuple[str, ...]" = (), cpu: Optional[str] = None):
        if shutil.which("redis-server") is None:
            raise AssertionError("redis-server is needed (Debian package redis-server)")
        self.port = port or free_port()
        self.persistent = persistent
        self.password = password  # requirepass: command() authenticates with it
        self.extra = [str(x) for x in extra]  # more redis-server options ("--maxmemory", "1mb", ...)
        self.cpu = cpu  # pinned to these CPUs (taskset -c), for benchmarks
        self.dir = tempfile.mkdtemp(prefix="wspush-redis-")
        self.proc: Optional[subprocess.Popen] = None
        self._killed = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> "RedisServer":
        """Starts redis-server; with wait=False returns at once (it may still refuse connections,
        or answer -LOADING), for a test that watches it load."""
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
                "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always",
                "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        if self.cpu is not None:
            args = ["taskset", "-c", self.cpu] + args
        self.proc = subprocess.Popen(args + self.extra, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self._killed = False
        _live_servers.add(self)
        if wait:
            self.wait_ready(scaled(30))
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until the server answers PING with PONG: refused connections (not listening yet) and
        -LOADING (reading its append-only file) are waited out; anything else fails."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            check(self.proc.poll() is None, f"redis-server exited with {self.proc.returncode}")
            try:
                if self.command("PING") == "PONG":
                    return
            except OSError as exc:
                last = f"{exc}"
            except RuntimeError as exc:
                if not str(exc).startswith("LOADING"):
                    raise AssertionError(f"redis-server answered PING with -{exc}") from None
                last = f"-{exc}"
            # Polling is the only way to learn that redis-server is up: it prints nothing we could
            # wait on with --loglevel warning, and a connection refused has no event to await.
            time.sleep(0.05)
        raise AssertionError(f"redis-server did not answer PING within {timeout:.0f}s (last: {last})")

    def kill(self) -> None:
        """SIGKILL by PID (what it had appended with fsync stays on disk)."""
        self._killed = True
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _live_servers.discard(self)

    def crashed(self) -> bool:
        """The process ended without the test killing it."""
        return self.proc is not None and not self._killed and self.proc.poll() is not None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str):
        """One command over a raw socket (RESP); returns a str, int, list or None."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=scaled(5)) as s:
            f = s.makefile("rb")
            if self.password is not None:
                s.sendall(_encode("AUTH", self.password))
                check(_read_resp(f) == "OK", "AUTH refused")
            s.sendall(_encode(*args))
            return _read_resp(f)


class RedisCluster:
    """A Redis Cluster on loopback made with `redis-cli --cluster create`: `masters` masters with
    `replicas` replicas each, every node a RedisServer (append-only, on a port below 55,000
    whose port + 10000, the cluster bus, is free). A start returns once every node says
    cluster_state:ok and every slot is served."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000, persistent: bool = True,
                 extra: "tuple[str, ...]" = (), cpu: Optional[str] = None, pki: "Optional[Pki]" = None):
        if shutil.which("redis-cli") is None:
            raise AssertionError("redis-cli is needed (Debian package redis-tools)")
        self.replicas = replicas
        self.nodes = []
        self.tls_ports: "list[int]" = []
        for _ in range(masters * (1 + replicas)):
            port = reserve_cluster_port()
            tls = ()
            if pki is not None:
                # A TLS port beside the plain one (which the test reads the cluster on), the
                # cluster bus and replication over TLS: CLUSTER SLOTS answers a TLS client with
                # the TLS ports.
                self.tls_ports.append(free_port())
                tls = ("--tls-port", str(self.tls_ports[-1]), "--tls-cert-file", pki.server[1],
                       "--tls-key-file", pki.server[0], "--tls-ca-cert-file", pki.ca[1], "--tls-auth-clients", "no",
                       "--tls-cluster", "yes", "--tls-replication", "yes", "--cluster-port", str(port + 10000))
            self.nodes.append(RedisServer(port=port, persistent=persistent, cpu=cpu,
                                          extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                                 "--cluster-node-timeout", str(node_timeout_ms),
                                                 "--repl-diskless-sync-delay", "0", *tls, *extra)))

    @property
    def tls_url(self) -> str:
        """Every node's TLS port as a seed (pki given)."""
        return "rediss-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.tls_ports)

    @property
    def url(self) -> str:
        """Every node as a seed."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> "RedisCluster":
        for n in self.nodes:
            n.start()
        done = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
                               "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(60))
        check(done.returncode == 0, f"redis-cli --cluster create failed: {done.stdout[-500:]} {done.stderr[-500:]}")
        self.wait_ok(scaled(30))
        self.wait_replicas(scaled(30))
        return self

    def wait_replicas(self, timeout: float) -> None:
        """Until every running replica has synced with its master (master_link_status:up): a
        replica that never synced does not take over."""
        deadline = time.monotonic() + timeout
        while True:
            down = []
            for n in self.running():
                info = n.command("INFO", "replication")
                if "role:slave" in info and "master_link_status:up" not in info:
                    down.append(n.port)
            if not down:
                return
            check(time.monotonic() < deadline, f"replicas {down} did not sync within {timeout:.0f}s")
            time.sleep(0.1)

    def running(self) -> "list[RedisServer]":
        """The nodes whose process runs (a test may have killed some)."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float) -> None:
        """Until every running node says cluster_state:ok (polled: the cluster announces it to
        no one)."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for n in self.running():
                try:
                    states.append("cluster_state:ok" in n.command("CLUSTER", "INFO"))
                except (OSError, RuntimeError):
                    states.append(False)
            if states and all(states):
                return
            check(time.monotonic() < deadline, f"the cluster is not ok within {timeout:.0f}s")
            time.sleep(0.1)

    def slots(self) -> "list[tuple[int, int, int, list[int]]]":
        """CLUSTER SLOTS as (first, last, master port, [replica ports]), from a running node."""
        for n in self.running():
            return [(int(r[0]), int(r[1]), int(r[2][1]), [int(x[1]) for x in r[3:]]) for r in n.command("CLUSTER", "SLOTS")]
        raise AssertionError("no cluster node is running")

    def node_of(self, slot: int) -> RedisServer:
        """The master serving `slot`."""
        for first, last, port, _ in self.slots():
            if first <= slot <= last:
                return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"no master serves slot {slot}")

    def masters(self) -> "list[RedisServer]":
        ports = {port for _, _, port, _ in self.slots()}
        return [n for n in self.nodes if n.port in ports]

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def openssl(*args: str) -> None:
    out = subprocess.run(["openssl", *args], capture_output=True, timeout=scaled(30))
    check(out.returncode == 0, f"openssl {' '.join(args[:2])} failed: {out.stderr[-300:]!r}")


def make_ca(d: str, name: str) -> "tuple[str, str]":
    key, crt = os.path.join(d, f"{name}.key"), os.path.join(d, f"{name}.crt")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt, "-days", "2",
            "-subj", f"/CN=wspush test {name}")
    return key, crt


def make_cert(d: str, name: str, ca: "tuple[str, str]", san: str) -> "tuple[str, str]":
    key, csr, crt = (os.path.join(d, f"{name}.{x}") for x in ("key", "csr", "crt"))
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", csr, "-CA", ca[1], "-CAkey", ca[0], "-CAcreateserial", "-out", crt, "-days", "2",
            "-extfile", ext)
    return key, crt


class Pki:
    """Certificates for Redis over TLS, made with `openssl` in a temporary folder: a CA, Redis's
    certificate for 127.0.0.1 and localhost, a client certificate, another CA that signed
    neither; and a password file."""

    def __init__(self, password: str = "pw"):
        self.dir = tempfile.mkdtemp(prefix="wspush-tls-")
        self.ca = make_ca(self.dir, "ca")
        self.other_ca = make_ca(self.dir, "other-ca")
        self.server = make_cert(self.dir, "redis", self.ca, "IP:127.0.0.1,DNS:localhost")
        self.client = make_cert(self.dir, "node", self.ca, "DNS:wspush-node")
        self.password_file = os.path.join(self.dir, "redis-password")
        with open(self.password_file, "w") as f:
            f.write(password + "\n")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _encode(*args) -> bytes:
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out += f"${len(b)}\r\n".encode() + b + b"\r\n"
    return out


def _read_resp(f, top: bool = True):
    """One RESP value. An error is raised (RuntimeError) at the top; within an array it is
    returned as a RuntimeError, so that the rest of the array is read."""
    line = f.readline()
    if not line:
        raise OSError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        if top:
            raise RuntimeError(rest.decode())
        return RuntimeError(rest.decode())
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
        return None if n < 0 else [_read_resp(f, False) for _ in range(n)]
    raise OSError(f"unexpected RESP {line!r}")
