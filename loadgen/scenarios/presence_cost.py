#!/usr/bin/python3
"""What presence costs a node: memory per subscribed connection and CPU per subscribe, with
presence off, on (--presence) and with join/leave announcements (--join-leave), in one run.

N connections, each subscribed to its own mailbox (`mailbox:<k>`) with a token of its own user
(sub `u<k>`, wspush-loadgen --own-topics --own-users): every connection is one user present on
one topic, the presence table's most common shape and its largest per connection. Open files are
limited per process, so the connections are spread over as many wspush processes as
--per-node needs, sharing the port (--reuseport), each with its embedded bus (presence is kept
per node; a mailbox's only subscriber is on one node). For each variant, fresh nodes:

  before   the nodes' RSS and CPU seconds, ready and idle
  loaded   once every connection is subscribed (and a settle): RSS and CPU again
  check    with presence, GET /presence?count=1 of some mailboxes on every node: one user each

and per variant: RSS delta per connection, node CPU per subscribe (connect, upgrade, token check,
sub and, with presence, its entry; with join/leave, the join event the subscriber hears too).
Presence's cost is the difference to "off". The variants run --rounds times, interleaved, so
that drift of the machine shows as spread.

  loadgen/scenarios/presence_cost.py                          # 100,000 connections
  loadgen/scenarios/presence_cost.py --connections 1000000    # a million (about 60 nodes)
  loadgen/scenarios/presence_cost.py --bus redis --rounds 1 --variants off,presence

--bus redis: the nodes on a fresh redis-server per variant (--bus redis://127.0.0.1:PORT, started
as million.py starts it), each waited for until its /metrics says wspush_bus_up 1. Presence is
then kept in Redis too (FCALL wspush_presence, batched), so per variant also: Redis's
used_memory growth per connection (INFO memory) and Redis CPU per subscribe (INFO cpu, user +
sys, over the load), and after the load an idle window (--idle, default --presence-ttl) in which
only the refresh runs (every node says all its presence again every --presence-ttl/3): Redis's
and the nodes' CPU seconds per second. "off" is the baseline of each (its Redis holds the nodes'
subscriptions and the bus's own keys, no presence).

Uses million.py's helpers (limits, watchdog, load generator, /proc readers). Every wait is
bounded; everything started is stopped at the end (by PID). Exit 0 when every variant came fully
up and presence counted every user.
"""
import argparse, json, math, os, shutil, signal, subprocess, sys, tempfile, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
from million import (Limits, Loadgen, Stop, Watchdog, cpu_s, log, machine, meminfo, redis_cmd,  # noqa: E402
                     redis_info, rss, start_redis)
from wsp_ports import release_port, reserve_port  # noqa: E402

SECRET = "presence-cost-secret"
API_KEY = "presence-cost-key"
VARIANTS = {"off": [], "presence": ["--presence"], "join-leave": ["--presence", "--join-leave"]}


class Nodes:
    """`count` wspush processes on one port (--reuseport), tokens required; on the embedded bus,
    or with `bus` (redis://...) on that Redis, each waited for until its /metrics says
    wspush_bus_up 1."""

    def __init__(self, a, count, flags, workdir, name, bus=None):
        self.a, self.workdir, self.bus = a, workdir, bus
        if bus:
            flags = [*flags, "--bus", bus, "--presence-ttl", str(a.presence_ttl)]
        self.ports = [reserve_port() for _ in range(count + 1)]
        self.port, self.admins = self.ports[0], self.ports[1:]
        self.procs = []
        for k, admin in enumerate(self.admins):
            logf = open(os.path.join(workdir, f"{name}-node{k}.log"), "ab")
            self.procs.append(subprocess.Popen(
                [a.server, "--jwt-secret", SECRET, "--api-key", API_KEY, "--reuseport", "--threads", "1",
                 "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{admin}",
                 "--ping-interval", "120", "--max-connections", "0", *flags], stdout=logf, stderr=logf))
        deadline = time.monotonic() + 30
        for admin in self.admins:
            while not self.ready(admin):
                if time.monotonic() > deadline:
                    raise Stop(f"the node with admin port {admin} was not ready within 30 s (logs in {workdir})")
                time.sleep(0.05)
        while bus and not all(self.bus_up(admin) for admin in self.admins):
            if time.monotonic() > deadline:
                raise Stop(f"a node was not on the bus (wspush_bus_up 1) within 30 s (logs in {workdir})")
            time.sleep(0.1)

    @staticmethod
    def bus_up(admin):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{admin}/metrics",
                                         headers={"Authorization": f"Bearer {API_KEY}"})
            body = urllib.request.urlopen(req, timeout=2).read().decode()
        except Exception:
            return False
        return any(line.split()[:2] == ["wspush_bus_up", "1"] for line in body.splitlines())

    @staticmethod
    def ready(admin):
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200
        except Exception:
            return False

    def sample(self):
        pids = [p.pid for p in self.procs]
        return {"t": time.monotonic(), "rss": sum(rss(p) for p in pids), "cpu": sum(cpu_s(p) for p in pids)}

    def presence_count(self, topic):
        """Users and connections on `topic` over every node (each keeps its own); on Redis, as any
        node answers (Redis adds the nodes up)."""
        users = conns = 0
        for admin in (self.admins[:1] if self.bus else self.admins):
            req = urllib.request.Request(f"http://127.0.0.1:{admin}/presence?topic={topic}&count=1",
                                         headers={"Authorization": f"Bearer {API_KEY}"})
            body = json.loads(urllib.request.urlopen(req, timeout=5).read())
            users += body["user_count"]
            conns += body["connections"]
        return users, conns

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs = []
        for port in self.ports:
            release_port(port)
        self.ports = []


def redis_sample(port):
    info = redis_info(port)
    return {"mem": int(info.get("used_memory", 0)),
            "cpu": float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))}


def run_variant(a, name, n, nodes, procs, workdir, tag, watchdog):
    redis = cluster = lg = None
    rport = None
    try:
        if a.bus == "redis":
            rport = reserve_port()
            rdir = os.path.join(workdir, f"{tag}-redis")
            os.makedirs(rdir, exist_ok=True)
            redis = start_redis(rport, rdir)
        cluster = Nodes(a, nodes, VARIANTS[name], workdir, tag, f"redis://127.0.0.1:{rport}" if redis else None)
        time.sleep(1)
        before = cluster.sample()
        rbefore = redis_sample(rport) if redis else None
        budget = math.ceil(2 * n / a.connect_rate) + 60
        lg = Loadgen(a, ["idle", "--url", f"ws://127.0.0.1:{cluster.port}/ws", "--connections", str(n),
                         "--procs", str(procs), "--rate", str(a.connect_rate), "--connect-timeout", str(budget),
                         "--hold", str(budget + a.settle + 120), "--own-topics", "--own-users",
                         "--topic-prefix", "mailbox:", "--jwt-secret", SECRET], workdir, tag)
        t0 = time.monotonic()
        last = 0.0
        while lg.ready < n:
            if watchdog.reason:
                raise Stop(watchdog.reason)
            now = time.monotonic()
            if lg.p.poll() is not None or now - t0 > budget + 30 or (lg.ready and now - lg.changed > 20):
                raise Stop(f"{name}: {lg.ready:,}/{n:,} up (failures {lg.errors} {lg.causes}; logs in {workdir})")
            if now - last >= a.progress_every:
                last = now
                log(f"  {name}: {lg.ready:,}/{n:,} subscribed, available memory "
                    f"{meminfo()['MemAvailable'] / 2**30:.1f} GiB")
            time.sleep(0.2)
        connect_s = time.monotonic() - t0
        time.sleep(a.settle)
        if redis:
            # The nodes tell Redis in batches: the load is over when its key count stops moving.
            last, quiet_since, stop_at = None, time.monotonic(), time.monotonic() + 60
            while time.monotonic() < stop_at:
                keys = redis_cmd(rport, "DBSIZE").strip()
                if keys != last:
                    last, quiet_since = keys, time.monotonic()
                elif time.monotonic() - quiet_since >= 2:
                    break
                time.sleep(0.25)
            else:
                raise Stop(f"{name}: Redis's key count still moving 60 s after the load")
        loaded = cluster.sample()
        rloaded = redis_sample(rport) if redis else None
        checked = None
        if name != "off":
            picks = sorted({0, n - 1, *range(0, n, max(1, n // a.checks))})
            counts = [cluster.presence_count(f"mailbox:{k}") for k in picks]
            checked = {"topics": len(picks), "one_user_each": all(c == (1, 1) for c in counts)}
        out = {"variant": name, "connections": n, "nodes": nodes, "loadgen_procs": procs, "connect_s": connect_s,
               "rss_per_conn": (loaded["rss"] - before["rss"]) / n,
               "cpu_us_per_subscribe": (loaded["cpu"] - before["cpu"]) / n * 1e6,
               "node_rss_total": loaded["rss"], "presence_check": checked}
        if redis:
            out["redis_mem_per_conn"] = (rloaded["mem"] - rbefore["mem"]) / n
            out["redis_cpu_us_per_subscribe"] = (rloaded["cpu"] - rbefore["cpu"]) / n * 1e6
            out["redis_used_memory_loaded"] = rloaded["mem"]
        if a.idle > 0:
            # The steady cost: nothing happens but the refresh (every --presence-ttl/3 each node
            # says its presence again; with presence off, the bus's own keepalive).
            i0, r0 = cluster.sample(), (redis_sample(rport) if redis else None)
            end = time.monotonic() + a.idle
            while time.monotonic() < end:
                if watchdog.reason:
                    raise Stop(watchdog.reason)
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            i1, r1 = cluster.sample(), (redis_sample(rport) if redis else None)
            dt = i1["t"] - i0["t"]
            out["idle_s"] = dt
            out["idle_node_cpu_per_s"] = (i1["cpu"] - i0["cpu"]) / dt
            if redis:
                out["idle_redis_cpu_per_s"] = (r1["cpu"] - r0["cpu"]) / dt
                out["idle_redis_mem_delta"] = r1["mem"] - r0["mem"]
        log(f"  {name}: {n:,} up in {connect_s:.1f} s; nodes +{out['rss_per_conn']:.0f} B/connection, "
            f"{out['cpu_us_per_subscribe']:.1f} µs CPU per subscribe"
            + (f"; presence of {checked['topics']} mailboxes: {'one user each' if checked['one_user_each'] else 'WRONG'}"
               if checked else "")
            + (f"; Redis +{out['redis_mem_per_conn']:.0f} B/connection, {out['redis_cpu_us_per_subscribe']:.1f} µs CPU "
               f"per subscribe" if redis else "")
            + (f"; idle {out['idle_s']:.0f} s: nodes {out['idle_node_cpu_per_s'] * 1e3:.2f} ms CPU/s"
               + (f", Redis {out['idle_redis_cpu_per_s'] * 1e3:.2f} ms CPU/s" if redis else "")
               if a.idle > 0 else ""))
        return out
    finally:
        if lg:
            lg.kill()
        if cluster:
            cluster.stop()
        if redis:
            redis.kill()
            redis.wait()
        if rport:
            release_port(rport)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=100_000)
    p.add_argument("--variants", default="off,presence,join-leave", help="of: " + ", ".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=2, help="each variant this many times, interleaved")
    p.add_argument("--per-node", type=int, default=17_000, help="connections per wspush process")
    p.add_argument("--per-loadgen", type=int, default=16_000, help="connections per load generator process")
    p.add_argument("--connect-rate", type=float, default=6000, help="connections per second")
    p.add_argument("--settle", type=float, default=3, help="seconds after the last subscribe before sampling")
    p.add_argument("--bus", choices=["embedded", "redis"], default="embedded",
                   help="redis: a fresh redis-server per variant, the nodes on it (--bus redis://...)")
    p.add_argument("--presence-ttl", type=int, default=30, help="the nodes' --presence-ttl (with --bus redis)")
    p.add_argument("--idle", type=float, help="seconds of idle after the load, to measure the steady refresh cost "
                   "(default: --presence-ttl with --bus redis, else 0)")
    p.add_argument("--checks", type=int, default=50, help="mailboxes whose presence is checked per variant")
    p.add_argument("--server", default="build/server/wspush")
    p.add_argument("--loadgen", default="build/loadgen/wspush-loadgen")
    p.add_argument("--memory-floor-gib", type=float, default=1.5)
    p.add_argument("--progress-every", type=float, default=5)
    p.add_argument("--json", help="write every figure to this file")
    a = p.parse_args()
    if a.idle is None:
        a.idle = a.presence_ttl if a.bus == "redis" else 0
    return a


def main():
    a = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"presence_cost: unknown variant {v}")
    n = a.connections
    t0 = time.monotonic()
    nodes, procs = math.ceil(n / a.per_node), math.ceil(n / a.per_loadgen)
    workdir = tempfile.mkdtemp(prefix="wspush-presence-cost-")
    res = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(),
           "connections": n, "nodes": nodes, "runs": []}
    limits = Limits(n, nodes, procs)
    ok = True
    watchdog = Watchdog(int(a.memory_floor_gib * 2**30), lambda why: None)
    try:
        limits.apply()
        watchdog.start()
        log(f"{n:,} connections, {nodes} nodes, {procs} load generator processes (work dir {workdir})")
        for r in range(a.rounds):
            for v in variants:
                out = run_variant(a, v, n, nodes, procs, workdir, f"{v}-{r}", watchdog)
                res["runs"].append(out)
                ok &= out["presence_check"] is None or out["presence_check"]["one_user_each"]
    except Stop as e:
        ok = False
        res["stopped"] = str(e)
        log(f"presence_cost: stopped: {e}")
    except KeyboardInterrupt:
        ok = False
        res["stopped"] = "interrupted"
    finally:
        watchdog.done.set()
        limits.restore()
    print(f"\nMachine: {res['machine']['cpus']} cores ({res['machine']['model']}), {res['machine']['memory_gib']} GiB, "
          f"Linux {res['machine']['kernel']}; {res['started_utc']}; {n:,} connections on {nodes} nodes.\n")
    print("| variant | runs | node RSS B/connection | node CPU µs/subscribe | vs off: B/connection | vs off: µs/subscribe |")
    print("|---|---|---|---|---|---|")
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    by = {v: [x for x in res["runs"] if x["variant"] == v] for v in variants}
    base_m = mean([x["rss_per_conn"] for x in by.get("off", [])])
    base_c = mean([x["cpu_us_per_subscribe"] for x in by.get("off", [])])
    for v, xs in by.items():
        if not xs:
            continue
        m, c = [x["rss_per_conn"] for x in xs], [x["cpu_us_per_subscribe"] for x in xs]
        print(f"| {v} | {len(xs)} | {mean(m):.0f} ({', '.join(f'{x:.0f}' for x in m)}) "
              f"| {mean(c):.1f} ({', '.join(f'{x:.1f}' for x in c)}) | {mean(m) - base_m:+.0f} | {mean(c) - base_c:+.1f} |")
    if a.bus == "redis" or a.idle > 0:
        print("\n| variant | runs | Redis B/connection | Redis CPU µs/subscribe | idle: Redis CPU ms/s | idle: nodes' CPU ms/s "
              "| vs off: Redis B/connection | vs off: Redis µs/subscribe | vs off: idle Redis ms/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        g = lambda xs, k: mean([x[k] for x in xs if k in x])  # noqa: E731
        off = by.get("off", [])
        for v, xs in by.items():
            if not xs:
                continue
            print(f"| {v} | {len(xs)} | {g(xs, 'redis_mem_per_conn'):.0f} | {g(xs, 'redis_cpu_us_per_subscribe'):.1f} "
                  f"| {g(xs, 'idle_redis_cpu_per_s') * 1e3:.2f} | {g(xs, 'idle_node_cpu_per_s') * 1e3:.2f} "
                  f"| {g(xs, 'redis_mem_per_conn') - g(off, 'redis_mem_per_conn'):+.0f} "
                  f"| {g(xs, 'redis_cpu_us_per_subscribe') - g(off, 'redis_cpu_us_per_subscribe'):+.1f} "
                  f"| {(g(xs, 'idle_redis_cpu_per_s') - g(off, 'idle_redis_cpu_per_s')) * 1e3:+.2f} |")
    res["bus"], res["presence_ttl"], res["idle"] = a.bus, a.presence_ttl, a.idle
    res["seconds"] = round(time.monotonic() - t0, 1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"\npresence_cost: {'ok' if ok else 'FAILED'}" + (f" ({res['stopped']})" if res.get("stopped") else ""))
    if ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs in {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
