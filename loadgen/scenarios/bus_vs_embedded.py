#!/usr/bin/python3
"""Mailbox events on the embedded bus and on the Redis bus, side by side.

For each wspush binary given (two builds to compare, or one), and for each round, it runs the
loadgen `mailboxes` scenario against a fresh node on the embedded bus, then on the Redis bus
(a fresh redis-server), alternating, and prints per run: the node's CPU per event (the load
generator's figure over its publish phase), latency p50/p99, what was delivered, lost and
doubled; on the Redis bus also Redis's CPU per publish over the whole run and over the
publish window (INFO cpu), the FCALLs it ran, and the context switches of each node thread in
the publish window (/proc). The node is pinned to --node-cpu with --threads 1; the load
generator and Redis share --client-cpu (or Redis gets --redis-cpu). With --shards N the Redis
bus spans N isolated shards (N redis-servers in one --bus list); give several to compare: each
Redis's CPU per publish is printed, their sum and the busiest one's (the bus carries about
1 / busiest events per second of one core when Redis is what limits it). With --cluster N, a Redis
Cluster of N masters (no replicas, N >= 3) instead. With --replicas each isolated shard has a
replica, and --wait N (repeat to compare, 0 included) runs the node with --redis-wait-replicas N:
the replicas' CPU per publish is printed apart from the masters'. With --tls each Redis run is
made twice, side by side: the node over redis:// and over rediss:// (Redis listens on both; the
certificates are made with `openssl` for the run).

  loadgen/scenarios/bus_vs_embedded.py --wspush build/server/wspush
  loadgen/scenarios/bus_vs_embedded.py --wspush /path/to/before/wspush --wspush build/server/wspush --rounds 2
  loadgen/scenarios/bus_vs_embedded.py --wspush build/server/wspush --events-per-mailbox 1 --node-bytes 512
  loadgen/scenarios/bus_vs_embedded.py --wspush build/server/wspush --shards 1 --shards 3 --shards 6 --no-embedded
  loadgen/scenarios/bus_vs_embedded.py --wspush build/server/wspush --no-embedded --replicas --wait 0 --wait 1
  loadgen/scenarios/bus_vs_embedded.py --wspush build/server/wspush --no-embedded --tls --rounds 2

Only processes started here are stopped (by PID).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import redis

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from wsp_redis import Pki, RedisCluster, RedisServer  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metric(port: int, name: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0


def threads(pid: int) -> "dict[str, tuple[int, int]]":
    """Per thread of `pid`: voluntary and involuntary context switches so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = open(f"/proc/{pid}/task/{tid}/status").read()
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        except OSError:
            continue
        v = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        nv = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[f"{tid} ({comm})"] = (v, nv)
    return out


def one_cpu(r: redis.Redis) -> float:
    i = r.info("cpu")
    return float(i["used_cpu_sys"]) + float(i["used_cpu_user"])


class Shards:
    """The Redis of a bus, read as one: CPU and command stats summed, CPU kept per Redis too."""

    def __init__(self, clients: "list[redis.Redis]"):
        self.clients = clients

    def cpus(self) -> "list[float]":
        return [one_cpu(r) for r in self.clients]

    def info(self, section: str) -> dict:
        out: dict = {}
        for r in self.clients:
            for k, v in r.info(section).items():
                if isinstance(v, dict):
                    d = out.setdefault(k, {"calls": 0, "usec": 0})
                    d["calls"] += v.get("calls", 0)
                    d["usec"] += v.get("usec", 0)
        return out


def redis_cpu(r) -> float:
    return sum(r.cpus())


def run(a, binary: str, shards: int, cluster: int = 0, wait: int = 0, pki: "Pki | None" = None) -> None:
    bus = shards > 0 or cluster > 0
    servers = []
    replicas = []
    r = None
    extra = []
    c = None
    try:
        if cluster:
            c = RedisCluster(masters=cluster, replicas=0, persistent=False, cpu=a.redis_cpu or a.client_cpu,
                             extra=("--stream-node-max-bytes", str(a.node_bytes))).start()
            r = Shards([redis.Redis(port=n.port) for n in c.nodes])
            extra = ["--bus", c.url]
            shards = cluster
        elif bus:
            urls = []
            for _ in range(shards):
                tls = ()
                if pki:
                    # A TLS port beside the plain one (which this script reads Redis's figures on).
                    tls_port = free_port()
                    tls = ("--tls-port", str(tls_port), "--tls-cert-file", pki.server[1], "--tls-key-file",
                           pki.server[0], "--tls-ca-cert-file", pki.ca[1], "--tls-auth-clients", "no")
                servers.append(RedisServer(persistent=False, cpu=a.redis_cpu or a.client_cpu,
                                           extra=("--stream-node-max-bytes", str(a.node_bytes)) + tls).start())
                urls.append(f"rediss://127.0.0.1:{tls_port}" if pki else servers[-1].url)
            r = Shards([redis.Redis(port=rs.port) for rs in servers])
            extra = ["--bus", ",".join(urls)] + (["--redis-tls-ca", pki.ca[1]] if pki else [])
            if a.replicas:
                for rs in servers:
                    replicas.append(RedisServer(persistent=False, cpu=a.redis_cpu or a.client_cpu,
                                                extra=("--replicaof", "127.0.0.1", str(rs.port))).start())
                deadline = time.monotonic() + 30
                while not all("state=online" in (rs.command("INFO", "replication") or "") for rs in servers):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the replicas did not sync")
                    time.sleep(0.05)
                extra += ["--redis-wait-replicas", str(wait)]
        rr = Shards([redis.Redis(port=rs.port) for rs in replicas]) if replicas else None
        port, aport = free_port(), free_port()
        srv = subprocess.Popen(["taskset", "-c", a.node_cpu, binary, "--listen", f"127.0.0.1:{port}",
                                "--admin-listen", f"127.0.0.1:{aport}", "--auth=none", "--threads", "1",
                                "--history-size", "100"] + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while metric(aport, "wspush_connections") < 0 or (bus and metric(aport, "wspush_bus_up") != 1):
                if time.monotonic() > deadline:
                    raise RuntimeError("the node did not come up")
                time.sleep(0.05)
            events = a.mailboxes * a.events_per_mailbox
            each0 = r.cpus() if r else []
            rep0 = redis_cpu(rr) if rr else 0.0
            c0, t0 = sum(each0), time.monotonic()
            stats0 = r.info("commandstats") if r else {}
            lg = subprocess.Popen(["taskset", "-c", a.client_cpu, a.loadgen, "mailboxes", "--url", f"ws://127.0.0.1:{port}/ws",
                                   "--admin", f"http://127.0.0.1:{aport}", "--connections", str(a.mailboxes),
                                   "--messages", str(events), "--procs", "2", "--server-pid", str(srv.pid), "--json",
                                   "--quiet", "--connect-timeout", "120", "--timeout", "300",
                                   "--pipeline", str(a.pipeline), "--publish-batch", str(a.publish_batch)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # The publish window: from the first delivery to the last, sampled every 10 ms.
            first = last = None
            while lg.poll() is None:
                d = metric(aport, "wspush_fanout_deliveries_total")
                if first is None and d > 0:
                    first = (redis_cpu(r) if r else 0.0, threads(srv.pid), time.monotonic(),
                             r.info("commandstats") if r else {})
                if first is not None and d >= events:
                    last = (redis_cpu(r) if r else 0.0, threads(srv.pid), time.monotonic())
                    break
                time.sleep(0.01)
            stdout, stderr = lg.communicate()
            each1 = r.cpus() if r else []
            rep1 = redis_cpu(rr) if rr else 0.0
            c1, t1 = sum(each1), time.monotonic()
            stats1 = r.info("commandstats") if r else {}
            calls = stats1.get("cmdstat_fcall", {}).get("calls", 0) if r else 0
        finally:
            srv.send_signal(signal.SIGTERM)
            srv.wait(timeout=60)
        try:
            j = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"{binary}: the load generator gave no result: {stderr[-300:]}", flush=True)
            return
        what = (f'cluster x{cluster}' if cluster else f'redis x{shards}') if bus else 'embedded'
        if replicas:
            what += f" with replicas, wait {wait}"
        if pki:
            what += " over TLS"
        line = (f"{binary} {what}: node {j['server']['cpu_per_delivery_us']:.1f} us/event, "
                f"p50 {j['latency_us']['p50'] / 1000:.2f} ms, p99 {j['latency_us']['p99'] / 1000:.2f} ms, "
                f"delivered {j['counters']['deliveries']}, lost {j['loss']}, doubled {j['counters']['duplicates']}")
        if bus:
            line += f"; Redis {1e6 * (c1 - c0) / events:.1f} us/publish over the run ({t1 - t0:.1f} s)"
            if first and last:
                line += (f", {1e6 * (last[0] - first[0]) / events:.1f} in the publish window ({last[2] - first[2]:.2f} s),"
                         f" {1e6 * (first[0] - c0) / events:.1f} before it ({first[2] - t0:.1f} s)")
            line += f", {calls} FCALLs"
            if rr:
                line += f"; replicas {1e6 * (rep1 - rep0) / events:.1f} us/publish over the run"
            if shards > 1:
                per = [1e6 * (y - x) / events for x, y in zip(each0, each1)]
                line += (f"; per Redis over the run: " + ", ".join(f"{v:.1f}" for v in per) +
                         f" us/publish of all events (busiest {max(per):.1f})")
        print(line, flush=True)
        if bus:
            # Where Redis's time went, by command (INFO commandstats; the commands a function runs
            # are counted on their own too, and inside FCALL's time): over the run, and before the
            # publish window.
            for what, a0, a1 in (("Redis commands", stats0, stats1), ("before the window", stats0, first[3] if first else {})):
                spent = []
                for k, v in a1.items():
                    before = a0.get(k, {})
                    dc, du = v["calls"] - before.get("calls", 0), v["usec"] - before.get("usec", 0)
                    if dc:
                        spent.append((du, k.removeprefix("cmdstat_"), dc))
                print(f"    {what}: " + ", ".join(f"{name} {n} calls {du / events:.2f} us/publish" for du, name, n
                                                  in sorted(spent, reverse=True)[:8]), flush=True)
        if first and last:
            for t, (v, nv) in sorted(last[1].items()):
                if t in first[1] and (v - first[1][t][0] or nv - first[1][t][1]):
                    print(f"    thread {t}: {v - first[1][t][0]} voluntary, {nv - first[1][t][1]} involuntary context "
                          "switches in the publish window", flush=True)
    finally:
        for rs in replicas + servers:
            rs.close()
        if c:
            c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wspush", action="append", required=True, help="a wspush binary (give two to compare builds)")
    p.add_argument("--loadgen", default=os.path.join(REPO, "build", "loadgen", "wspush-loadgen"))
    p.add_argument("--mailboxes", type=int, default=19000)
    p.add_argument("--events-per-mailbox", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--node-bytes", type=int, default=4096, help="Redis's stream-node-max-bytes")
    p.add_argument("--node-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--redis-cpu", default="", help="where redis-server runs (default: --client-cpu)")
    p.add_argument("--shards", type=int, action="append", help="Redis shards of the bus (repeat to compare; default 1)")
    p.add_argument("--no-embedded", action="store_true", help="only the Redis bus")
    p.add_argument("--cluster", type=int, action="append", default=[], help="masters of a Redis Cluster (repeat to compare)")
    p.add_argument("--pipeline", type=int, default=32, help="admin publish requests in flight (the load generator's)")
    p.add_argument("--publish-batch", type=int, default=1, help="events per admin request (POST /publish/batch above 1)")
    p.add_argument("--replicas", action="store_true", help="each isolated shard gets a replica")
    p.add_argument("--wait", type=int, action="append", help="with --replicas: --redis-wait-replicas (repeat to compare)")
    p.add_argument("--tls", action="store_true", help="each Redis run also over rediss:// (isolated shards)")
    a = p.parse_args()
    pki = Pki() if a.tls else None
    try:
        for _ in range(a.rounds):
            for binary in a.wspush:
                if not a.no_embedded:
                    run(a, binary, 0)
                for n in a.shards or ([] if a.cluster else [1]):
                    for w in (a.wait or [0]) if a.replicas else [0]:
                        run(a, binary, n, 0, w)
                        if pki:
                            run(a, binary, n, 0, w, pki)
                for n in a.cluster:
                    run(a, binary, 0, n)
    finally:
        if pki:
            pki.close()


if __name__ == "__main__":
    main()
