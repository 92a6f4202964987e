"""Ports a test may bind, lose and bind again.

A port the kernel hands out for `bind(0)` lies in its ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), the same range outgoing connections take their source
ports from: a server restarted on such a port can find it taken by some client's connection in
the meantime. `reserve_port()` instead picks a port outside that range, checks that it can be
bound, and records the reservation in a lock file (/tmp/wspush-ports/<port>, holding our PID)
so that tests running in parallel never pick the same one. The reservation ends with the
process; a lock file whose process is gone is taken over.

Only the standard library is used (million.py and the load generator's scenarios use it too).
The Node twin is tests/integration/ports.mjs, with the same lock files.
"""
from __future__ import annotations

import atexit
import errno
import os
import random
import socket

LOCK_DIR = "/tmp/wspush-ports"
_held: "set[int]" = set()


def ephemeral_range() -> "tuple[int, int]":
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _candidates() -> "list[int]":
    low, high = ephemeral_range()
    ports = [p for p in range(10000, 65536) if not low <= p <= high]
    random.shuffle(ports)
    return ports


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def _try_lock(port: int) -> bool:
    path = os.path.join(LOCK_DIR, str(port))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = int(f.read().strip() or "0")
            except (OSError, ValueError):
                return False
            # No PID yet: its owner has created the file and not yet written it. Held.
            if not owner or _pid_alive(owner):
                return False
            try:
                os.unlink(path)  # its process is gone: take it over
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A free 127.0.0.1 port outside the ephemeral range, ours until this process exits (or
    `release_port`): a server may be stopped and started on it again."""
    os.makedirs(LOCK_DIR, mode=0o777, exist_ok=True)
    for port in _candidates():
        if not _try_lock(port):
            continue
        if _bindable(port):
            _held.add(port)
            return port
        os.unlink(os.path.join(LOCK_DIR, str(port)))
    raise OSError("no free port outside the ephemeral range")


def reserve_cluster_port() -> int:
    """A port for a Redis Cluster node: below 55,000, with port + 10000 (its cluster bus) free and
    reserved too, both outside the ephemeral range."""
    os.makedirs(LOCK_DIR, mode=0o777, exist_ok=True)
    low, high = ephemeral_range()
    ports = [p for p in range(10000, 55000) if not low <= p <= high and not low <= p + 10000 <= high]
    random.shuffle(ports)
    for port in ports:
        if not _try_lock(port):
            continue
        if not _try_lock(port + 10000):
            os.unlink(os.path.join(LOCK_DIR, str(port)))
            continue
        if _bindable(port) and _bindable(port + 10000):
            _held.update((port, port + 10000))
            return port
        for p in (port, port + 10000):
            os.unlink(os.path.join(LOCK_DIR, str(p)))
    raise OSError("no free pair of ports (port, port + 10000) outside the ephemeral range")


def release_port(port: int) -> None:
    if port in _held:
        _held.discard(port)
        try:
            os.unlink(os.path.join(LOCK_DIR, str(port)))
        except FileNotFoundError:
            pass


@atexit.register
def _release_all() -> None:
    for port in list(_held):
        release_port(port)
