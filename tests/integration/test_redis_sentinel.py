#!/usr/bin/python3
"""The Redis bus behind Sentinel: a real redis-server master and its replica, three Sentinels
(quorum 2, `redis-server --sentinel`), two wspush nodes on redis-sentinel://.../mymaster, Python
`websockets` clients.

- the nodes find the master through the Sentinels: a subscriber on node A gets what node B
  publishes;
- the master SIGKILLed while a publisher runs through node B, sending every publish again on
  503, 504 or a broken connection until it is answered 200: the Sentinels promote the replica,
  the nodes follow (+switch-master, and asking again), publishes are answered 200 again; the
  subscriber that stayed on node A has every acknowledged event of each topic, or was told that
  topic was lost; a resume on node B from the first event of each topic gets every acknowledged
  event after it, or the topic in `lost`. Never a silent gap;
- a Sentinel that is down is passed over (the one the nodes asked first, and watch, is killed
  before the failover); the epoch is made again by the new master (the guard);
- rediss-sentinel://: a Sentinel and a master that listen only on TLS ports (certificates made
  here with `openssl`, client certificates required): a node finds the master and delivers.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, readyz  # noqa: E402
from wsp_redis import Pki, RedisServer, _encode, _read_resp, free_port  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, _die_with_parent, admin_port, arg_parser, check, metric,  # noqa: E402
                         poll_until, publish_ok, recv_json, run_main, scaled, subscribe)

NAME = "mymaster"
TOPICS = [f"mailbox:sentinel:{k}" for k in range(8)]


def command(port: int, *args: str):
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(5)) as s:
        s.sendall(_encode(*args))
        return _read_resp(s.makefile("rb"))


class Sentinel:
    """`redis-server <conf> --sentinel` on 127.0.0.1:port, watching `NAME` at the master."""

    def __init__(self, master_port: int, quorum: int = 2, pki: "Pki | None" = None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="wspush-sentinel-")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        # Over TLS: its own port TLS only, and TLS to the master (tls-replication).
        tls = (f"port 0\ntls-port {self.port}\ntls-cert-file {pki.server[1]}\ntls-key-file {pki.server[0]}\n"
               f"tls-ca-cert-file {pki.ca[1]}\ntls-replication yes\n") if pki else f"port {self.port}\n"
        with open(self.conf, "w") as f:
            f.write(f"{tls}bind 127.0.0.1\ndir {self.dir}\n"
                    f"sentinel monitor {NAME} 127.0.0.1 {master_port} {quorum}\n"
                    f"sentinel down-after-milliseconds {NAME} 1000\n"
                    f"sentinel failover-timeout {NAME} 10000\n")
        self.proc = subprocess.Popen(["redis-server", self.conf, "--sentinel", "--loglevel", "warning"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)

    def ask(self, *args: str):
        try:
            return command(self.port, *args)
        except (OSError, RuntimeError):
            return None

    def master_port(self) -> int:
        a = self.ask("SENTINEL", "get-master-addr-by-name", NAME)
        return int(a[1]) if isinstance(a, list) and len(a) == 2 else 0

    def knows_everyone(self) -> bool:
        replicas = self.ask("SENTINEL", "replicas", NAME)
        others = self.ask("SENTINEL", "sentinels", NAME)
        return isinstance(replicas, list) and len(replicas) == 1 and isinstance(others, list) and len(others) == 2

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def node(args, sentinels: "list[Sentinel]") -> ServerProcess:
    url = "redis-sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in sentinels) + "/" + NAME
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", url, "--threads", "2", "--history-size", "10000", "--redis-timeout", "2"]).start()
    check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(20)),
          "a node did not come up through the Sentinels\n" + s.log_tail())
    return s


class Publisher:
    """Publishes 0, 1, 2, ... through a node, topic n % len(TOPICS), each sent again on 503, 504
    and broken connections until answered 200 (the id kept), for as long as it runs."""

    def __init__(self, s: ServerProcess):
        self.url = f"http://127.0.0.1:{admin_port(s)}/publish"
        self.acked: "dict[int, str]" = {}
        self.acked_at: "dict[int, float]" = {}
        self.retries = 0
        self.stop = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        while not self.stop:
            body = json.dumps({"topic": TOPICS[n % len(TOPICS)], "data": n}).encode()
            deadline = time.monotonic() + scaled(60)
            while not self.stop and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(urllib.request.Request(self.url, data=body), timeout=scaled(10)) as r:
                        eid = json.loads(r.read())["id"]
                    with self.lock:
                        self.acked[n] = eid
                        self.acked_at[n] = time.monotonic()
                    break
                except (urllib.error.URLError, OSError, ValueError):
                    self.retries += 1
                    time.sleep(0.02)  # a paced retry, as a backend's would be
            n += 1

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


async def failover(args, master: RedisServer, replica: RedisServer, sentinels: "list[Sentinel]",
                   a: ServerProcess, b: ServerProcess) -> None:
    w = await connect(a)
    got: "dict[str, set[int]]" = {t: set() for t in TOPICS}
    first: "dict[str, str]" = {}
    told: "set[str]" = set()
    pub = Publisher(b)

    async def listen() -> None:
        while True:
            m = await recv_json(w, 60)
            if m.get("op") == "lost":
                told.update(m.get("topics", []))
            elif "topic" in m:
                got[m["topic"]].add(m["data"])
                first.setdefault(m["topic"], m["id"])

    epoch_before = master.command("GET", "wspush:epoch")
    try:
        await subscribe(w, TOPICS)
        listener = asyncio.create_task(listen())
        pub.thread.start()
        check(await asyncio.to_thread(poll_until, lambda: pub.count() >= 100, scaled(30)), "the publisher did not start")
        sentinels[0].kill()  # the one the nodes asked and watch: they turn to the others
        master.kill()
        killed_at = time.monotonic()
        check(await asyncio.to_thread(poll_until, lambda: sentinels[1].master_port() == replica.port, scaled(30)),
              "the Sentinels did not promote the replica")
        promoted_at = time.monotonic()
        before = pub.count()
        check(await asyncio.to_thread(poll_until, lambda: pub.count() >= before + 100, scaled(30)),
              f"publishes were not answered 200 again after the failover ({pub.count() - before} since)\n"
              + b.log_tail())
        back_at = time.monotonic()
        pub.stop = True
        await asyncio.to_thread(pub.thread.join, scaled(30))
        # Every acknowledged event reaches the subscriber that stayed, or its topic was told lost.
        acked = dict(pub.acked)
        # Acknowledged after the promotion: on the new master's watch, so delivered, told or not.
        after = {n for n in acked if pub.acked_at[n] > promoted_at}
        check(len(after) >= 100, f"only {len(after)} publishes acknowledged after the promotion")

        def missing(t: str) -> "set[int]":
            return {n for n in acked if TOPICS[n % len(TOPICS)] == t and (t not in told or n in after)} - got[t]

        check(await asyncio.to_thread(poll_until, lambda: not any(missing(t) for t in TOPICS), scaled(20)),
              "a silent gap on the connection that stayed: " +
              "; ".join(f"{t}: missing {sorted(missing(t))[:5]} (told lost: {t in told})" for t in TOPICS if missing(t)))
        listener.cancel()
        print(f"    the master killed: promoted after {promoted_at - killed_at:.1f} s, publishes answered again "
              f"after {back_at - killed_at:.1f} s; {len(acked)} acknowledged, {pub.retries} retries; "
              f"topics told lost on the connection that stayed: {len(told)} of {len(TOPICS)}", flush=True)
    finally:
        pub.stop = True
        await w.close()
    # A resume on the other node from the first event of each topic: every acknowledged event
    # after it, or the topic lost.
    wb = await connect(b)
    try:
        r = await subscribe(wb, TOPICS, since={t: first[t] for t in TOPICS if t in first})
        lost = set(r.get("lost", []))
        heard: "dict[str, set[int]]" = {t: set() for t in TOPICS}
        want = {t: {n for n in acked if TOPICS[n % len(TOPICS)] == t and acked[n] != first.get(t)} for t in TOPICS}

        async def drain() -> None:
            while not all(t in lost or want[t] <= heard[t] for t in TOPICS):
                m = await recv_json(wb, 20)
                if m.get("op") == "lost":
                    lost.update(m.get("topics", []))
                elif "topic" in m:
                    heard[m["topic"]].add(m["data"])

        await drain()
        print(f"    the resume on node B: {len(lost)} of {len(TOPICS)} topics lost, the others whole", flush=True)
    finally:
        await wb.close()
    check(readyz(a) == 200 and readyz(b) == 200, "a node is not ready after the failover")
    # The guard did it: the epoch was made again, and the new master is its writer.
    info = replica.command("INFO", "replication")
    replid = info.split("master_replid:")[1].split()[0]
    check(replica.command("GET", "wspush:epoch:writer") == replid, "the new master is not the epoch's writer")
    check(replica.command("GET", "wspush:epoch") != epoch_before, "the epoch did not change with the failover")
    for s in (a, b):
        check(s.log_lines("moved from") or s.log_lines("names 127.0.0.1:" + str(replica.port)),
              "a node did not say it follows the new master\n" + s.log_tail())


async def delivery(a: ServerProcess, b: ServerProcess) -> None:
    w = await connect(a)
    try:
        await subscribe(w, ["mailbox:sentinel:first"])
        eid = publish_ok(b, "mailbox:sentinel:first", "hello")
        e = await recv_json(w)
        check(e == {"topic": "mailbox:sentinel:first", "id": eid, "data": "hello"}, f"through the Sentinels' master: {e}")
    finally:
        await w.close()


def over_tls(args) -> None:
    pki = Pki()
    port = free_port()
    master = RedisServer(extra=("--port", "0", "--tls-port", str(port), "--tls-cert-file", pki.server[1],
                                "--tls-key-file", pki.server[0], "--tls-ca-cert-file", pki.ca[1]))
    master.start(wait=False)
    sentinel = Sentinel(port, quorum=1, pki=pki)
    s = None
    try:
        url = f"rediss-sentinel://127.0.0.1:{sentinel.port}/{NAME}"
        s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                          extra=["--bus", url, "--threads", "2", "--redis-tls-ca", pki.ca[1],
                                 "--redis-tls-cert", pki.client[1], "--redis-tls-key", pki.client[0]]).start()
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(30)),
              "a node did not find the master through a TLS Sentinel\n" + s.log_tail())
        s.wait_for_log(rf"names 127\.0\.0\.1:{port} as master", scaled(5), "the master named by the TLS Sentinel")
        asyncio.run(delivery(s, s))
    finally:
        if s is not None:
            s.kill()
        sentinel.close()
        master.close()
        pki.close()


def main(args) -> None:
    master = RedisServer().start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(master.port))).start()
    sentinels: "list[Sentinel]" = []
    try:
        check(poll_until(lambda: "state=online" in master.command("INFO", "replication"), scaled(20)),
              "the replica did not sync")
        sentinels = [Sentinel(master.port) for _ in range(3)]
        check(poll_until(lambda: all(s.knows_everyone() for s in sentinels), scaled(30)),
              "the Sentinels did not find the replica and each other")
        a, b = node(args, sentinels), node(args, sentinels)
        f = Findings()
        f.step("the master found through the Sentinels", lambda: asyncio.run(delivery(a, b)))
        f.step("the master killed under load: followed, no silent gap",
               lambda: asyncio.run(failover(args, master, replica, sentinels, a, b)))
        f.step("rediss-sentinel://: the Sentinel and the master over TLS", over_tls, args)
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        f.done()
    finally:
        for s in sentinels:
            s.close()
        replica.close()
        master.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
