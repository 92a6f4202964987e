#!/usr/bin/python3
"""A million subscribed connections on one machine, each its own mailbox: the whole experiment
from a clean state, torn down at the end.

Open files are limited per process (20,000 here), not per machine, so the experiment runs many
wspush processes sharing the public port (--reuseport), nodes of one Redis bus, and as many load
generator processes spread over source addresses 127.0.0.2-127.0.0.250. For each step (a number of
connections) it starts a fresh Redis and fresh nodes, then:

  mailboxes  every connection subscribes to its own mailbox; once all are up and held, the memory
             per connection (the nodes' user space, the kernel's Slab and sockstat, Redis, the load
             generator); then one publish to every mailbox, through a node of the bus that holds no
             clients: delivered/expected, loss, duplicates, misdeliveries, latency, server CPU per
             event, Redis CPU.
At the largest step also:
  fanout     every connection holds one topic: one publish, latency to the last subscriber.
  capacity   every connection holds its mailbox; the mailbox publish rate rises step by step
             (--capacity-rates, each for --capacity-step-seconds, then a pause so what was sent
             arrives): per rate, events delivered, loss, duplicates, latency p50/p99/max, and the
             CPU of the nodes, the publishing node, Redis and the load generator (cores busy and
             µs per event); the highest rate that held (0 lost, p99 <= --capacity-p99-ms).
  storm      one topic, published at --storm-rate/s; mid-run every node drains (SIGTERM, 1001) and a
             fresh one takes its place; every client resumes with since: time until all are back,
             and loss (0 inside the history window).

It checks the kernel limits it needs and raises what is below them (and says so, and puts them
back at the end), estimates the memory it needs before it starts, and stops everything with a
clear message if the machine's available memory falls below --memory-floor-gib. Every wait is
bounded. Exit status 0 when every phase came up fully and nothing was lost, duplicated or
misdelivered.

  loadgen/scenarios/million.py                                     # 100k, 250k, 500k, 1M
  loadgen/scenarios/million.py --steps 50000 --nodes 3             # the CI smoke version
  loadgen/scenarios/million.py --steps 1000000 --phases capacity     # the capacity curve at a million
  loadgen/scenarios/million.py --steps 1000000 --phases mailboxes --redis-cluster 3 --failover-after 10
                                    # the bus on a 3-master Redis Cluster (3 replicas), a master killed
                                    # 10 s into the publishes to every mailbox
"""
import argparse, json, math, os, re, resource, shutil, signal, subprocess, sys, tempfile
import threading, time, urllib.request

# Every port here comes from outside the ephemeral range, checked free and locked against other
# tests (tests/integration/wsp_ports.py): the load generator's connections take their source ports
# from that range by the hundred thousand, and the public port is bound again by the fresh nodes
# of the storm.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
from wsp_ports import release_port, reserve_cluster_port, reserve_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Stop(Exception):
    """The experiment cannot go on; the message says why."""


# --- what the machine says ----------------------------------------------------------------------

def meminfo():
    out = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


def sockstat():
    """TCP sockets in use and the pages their buffers hold (sockstat's `mem`)."""
    for line in open("/proc/net/sockstat"):
        if line.startswith("TCP:"):
            f = line.split()[1:]
            d = dict(zip(f[0::2], map(int, f[1::2])))
            return d.get("inuse", 0), d.get("mem", 0) * PAGE
    return 0, 0


def machine_busy_s():
    """CPU seconds the whole machine spent not idle (user, system, interrupts, steal), all cores."""
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def rss(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_s(pid):
    """User + system CPU seconds of a process (all its threads)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError):
        return 0.0


def tree(pid):
    """pid and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out


def sysctl_path(name):
    return "/proc/sys/" + name.replace(".", "/")


def read_sysctl(name):
    return open(sysctl_path(name)).read().split()


# --- limits --------------------------------------------------------------------------------------

class Limits:
    """Checks what the experiment needs of the kernel, raises what is below it, and puts back what
    it changed."""

    def __init__(self, n, nodes, lg_procs):
        self.changed = []
        self.n, self.nodes, self.lg_procs = n, nodes, lg_procs

    def need(self, name, minimum, why, index=None, essential=False):
        cur = read_sysctl(name)
        v = int(cur[index if index is not None else 0])
        if v >= minimum:
            log(f"  {name} = {' '.join(cur)}: enough ({why})")
            return
        new = list(cur)
        new[index if index is not None else 0] = str(minimum)
        try:
            open(sysctl_path(name), "w").write(" ".join(new))
        except OSError as e:
            if essential:
                raise Stop(f"{name} is {v}, needs {minimum} ({why}), and cannot be raised: {e}")
            log(f"  {name} = {v}, below {minimum} ({why}), and cannot be raised here ({e}): going on")
            return
        self.changed.append((name, cur))
        log(f"  {name}: raised {' '.join(cur)} -> {' '.join(new)} ({why})")

    def apply(self):
        log("kernel limits:")
        sockets = 2 * self.n + 4 * (self.nodes + self.lg_procs) + 1000
        self.need("fs.file-max", sockets + 100_000, "every socket of both ends is an open file", essential=True)
        self.need("fs.nr_open", 20_000, "the most one process holds", essential=True)
        self.need("net.core.somaxconn", 4096, "accept backlog per listening socket")
        self.need("net.ipv4.tcp_max_syn_backlog", 4096, "half-open connections while connecting fast")
        # An idle socket holds no buffer pages; tcp_mem (pages) bounds what bursts queue at once.
        self.need("net.ipv4.tcp_mem", 3 * self.n // 16 + 65536, "pages of socket buffers in bursts", index=2)
        lo, hi = map(int, read_sysctl("net.ipv4.ip_local_port_range"))
        per_source = math.ceil(self.n / 249)
        if hi - lo + 1 < per_source:
            raise Stop(f"ip_local_port_range {lo}-{hi} leaves {hi - lo + 1} ports per source address; "
                       f"{per_source} needed")
        log(f"  net.ipv4.ip_local_port_range = {lo} {hi}: enough ({per_source} ports per source address)")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log(f"  open files of this process and its children: soft {soft} -> {hard}")
        if hard < 17_000:
            raise Stop(f"the open-files hard limit is {hard}; each process here holds up to ~17,000")

    def restore(self):
        for name, old in reversed(self.changed):
            try:
                open(sysctl_path(name), "w").write(" ".join(old))
                log(f"restored {name} = {' '.join(old)}")
            except OSError as e:
                log(f"could not restore {name} to {' '.join(old)}: {e}")
        self.changed = []


# --- the watchdog --------------------------------------------------------------------------------

class Watchdog(threading.Thread):
    """Watches MemAvailable; below the floor it calls `trip` once, with the reason."""

    def __init__(self, floor, trip):
        super().__init__(daemon=True)
        self.floor, self.trip = floor, trip
        self.lowest = None
        self.done = threading.Event()
        self.reason = None

    def run(self):
        while not self.done.wait(0.25):
            avail = meminfo()["MemAvailable"]
            self.lowest = avail if self.lowest is None else min(self.lowest, avail)
            if avail < self.floor and self.reason is None:
                self.reason = (f"MemAvailable fell to {avail / 2**30:.2f} GiB, below the floor of "
                               f"{self.floor / 2**30:.2f} GiB")
                self.trip(self.reason)


# --- the cluster ---------------------------------------------------------------------------------

def redis_cmd(port, *args):
    """redis-cli -p PORT ARGS...: its output, or "" when it failed."""
    r = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10)
    return r.stdout if r.returncode == 0 and not r.stdout.startswith("Could not connect") else ""


def redis_info(port):
    """INFO of the redis-server on `port`, as a dict of strings (empty when it did not answer)."""
    out = {}
    for line in redis_cmd(port, "INFO").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def start_redis(port, workdir, nice=0):
    """A fresh redis-server on 127.0.0.1:`port` (no persistence; its log and dir in `workdir`),
    answering PING within 10 s, else Stop. The caller stops it (by the Popen returned)."""
    d = os.path.join(workdir, "redis")
    os.makedirs(d, exist_ok=True)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", d, "--stream-node-max-bytes", "512", "--maxclients", "10000"],
        stdout=open(os.path.join(workdir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
    if nice:
        # Here Redis shares two cores with ~120 other processes (the nodes and the load
        # generator), each weighing as much as it with the scheduler; starved, it answered
        # publishes in the million's storm after the nodes' 5 s limit. Deployed, it has
        # cores of its own: a higher priority stands in for that.
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
            log(f"  redis-server at nice {nice} (it shares the cores with every node and the load generator)")
        except OSError as e:
            log(f"  could not set redis-server's nice to {nice} ({e}): it runs at the default")
    deadline = time.monotonic() + 10
    while not redis_cmd(port, "PING"):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            raise Stop(f"redis-server did not start (see {workdir}/redis.log)")
        time.sleep(0.05)
    return proc


class Cluster:
    """A fresh redis-server, `nodes` wspush processes sharing the public port, and one more node
    on the bus, on a port of its own with no clients, that takes the publishes. Its ports are
    reserved (wsp_ports) until stop()."""

    def __init__(self, a, nodes, workdir, drain_seconds=None):
        self.a, self.nodes, self.workdir = a, nodes, workdir
        self.drain_seconds = drain_seconds or a.drain_seconds
        self.reserved = []
        self.rport = self.reserve()
        # --redis-cluster M: M masters and M replicas (their ports and port + 10000, the cluster
        # bus, reserved) in place of the one redis-server.
        self.cports = [reserve_cluster_port() for _ in range(2 * a.redis_cluster)]
        self.reserved += self.cports + [p + 10000 for p in self.cports]
        self.credis = {}         # port -> its redis-server
        self.masters = []        # the ports of the masters, as CLUSTER SLOTS last said
        self.port = self.reserve()        # shared by the serving nodes (--reuseport), fresh ones too
        self.pub_port = self.reserve()
        self.pub_admin = self.reserve()
        self.admins = [self.reserve() for _ in range(nodes)]
        self.redis = None
        self.procs = []          # serving nodes
        self.pub = None          # the publishing node

    def reserve(self):
        port = reserve_port()
        self.reserved.append(port)
        return port

    def admin(self, k):
        """Admin port of serving node k (of the current generation: restart_all() gives the fresh
        nodes their own while the old ones drain)."""
        return self.admins[k]

    def bus_url(self):
        if self.cports:
            return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.cports)
        return f"redis://127.0.0.1:{self.rport}"

    def node_argv(self, k, listen_port, admin):
        return [self.a.server, "--auth=none", "--bus", self.bus_url(),
                "--reuseport", "--threads", "1", "--listen", f"127.0.0.1:{listen_port}",
                "--admin-listen", f"127.0.0.1:{admin}", "--ping-interval", str(self.a.ping_interval),
                "--history-size", "100", "--history-ttl", "600", "--drain-seconds", str(self.drain_seconds)]

    def spawn_node(self, k):
        logf = open(os.path.join(self.workdir, f"node{k}.log"), "ab")
        return subprocess.Popen(self.node_argv(k, self.port, self.admin(k)), stdout=logf, stderr=logf)

    def start_redis_cluster(self):
        for port in self.cports:
            d = os.path.join(self.workdir, f"redis-{port}")
            os.makedirs(d, exist_ok=True)
            self.credis[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", d, "--stream-node-max-bytes", "512", "--maxclients", "10000", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                 "--repl-diskless-sync-delay", "0"],
                stdout=open(os.path.join(self.workdir, f"redis-{port}.log"), "ab"), stderr=subprocess.STDOUT)
            if self.a.redis_nice:
                try:
                    os.setpriority(os.PRIO_PROCESS, self.credis[port].pid, self.a.redis_nice)
                except OSError:
                    pass
        deadline = time.monotonic() + 20
        for port in self.cports:
            while not self.redis_cmd("PING", port=port):
                if time.monotonic() > deadline:
                    raise Stop(f"redis-server on {port} did not start (see {self.workdir})")
                time.sleep(0.05)
        r = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.cports],
                            "--cluster-replicas", "1", "--cluster-yes"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Stop(f"redis-cli --cluster create failed: {r.stdout[-300:]} {r.stderr[-300:]}")
        deadline = time.monotonic() + 60
        while True:
            ok = all("cluster_state:ok" in self.redis_cmd("CLUSTER", "INFO", port=p) for p in self.cports)
            synced = all("role:master" in i or "master_link_status:up" in i
                         for i in (self.redis_cmd("INFO", "replication", port=p) for p in self.cports))
            if ok and synced:
                break
            if time.monotonic() > deadline:
                raise Stop("the Redis Cluster did not come up within 60 s")
            time.sleep(0.2)
        self.find_masters()
        log(f"  Redis Cluster: masters {self.masters}, {len(self.cports) - len(self.masters)} replicas")

    def find_masters(self):
        for port in self.cports:
            if self.credis[port].poll() is not None:
                continue
            out = self.redis_cmd("CLUSTER", "NODES", port=port)
            if out:
                self.masters = sorted(int(line.split()[1].split(":")[1].split("@")[0]) for line in out.splitlines()
                                      if "master" in line.split()[2].split(",") and "fail" not in line.split()[2]
                                      and line.split()[8:])
                return

    def kill_master(self, k=0):
        """SIGKILL a master; its replica takes its slots after the node timeout (2 s)."""
        port = self.masters[k]
        self.credis[port].kill()
        self.credis[port].wait()
        return port

    def start(self):
        if self.cports:
            self.start_redis_cluster()
            self.procs = [self.spawn_node(k) for k in range(self.nodes)]
            logf = open(os.path.join(self.workdir, "pubnode.log"), "ab")
            self.pub = subprocess.Popen(self.node_argv(self.nodes, self.pub_port, self.pub_admin), stdout=logf, stderr=logf)
            self.wait_ready([self.admin(k) for k in range(self.nodes)] + [self.pub_admin], 60)
            return
        self.redis = start_redis(self.rport, self.workdir, self.a.redis_nice)
        self.procs = [self.spawn_node(k) for k in range(self.nodes)]
        logf = open(os.path.join(self.workdir, "pubnode.log"), "ab")
        self.pub = subprocess.Popen(self.node_argv(self.nodes, self.pub_port, self.pub_admin), stdout=logf, stderr=logf)
        self.wait_ready([self.admin(k) for k in range(self.nodes)] + [self.pub_admin])

    def wait_ready(self, ports, seconds=30):
        deadline = time.monotonic() + seconds
        for port in ports:
            while True:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise Stop(f"the node with admin port {port} was not ready within {seconds} s "
                               f"(logs in {self.workdir})")
                time.sleep(0.05)

    def redis_cmd(self, *args, port=None):
        return redis_cmd(port or self.rport, *args)

    def redis_info(self):
        """INFO of the Redis; of a cluster, its masters' memory and CPU summed (each one that
        runs: a master killed takes its figures with it), and its replicas' memory apart."""
        if not self.cports:
            return redis_info(self.rport)
        total = {"used_memory": 0, "used_cpu_user": 0.0, "used_cpu_sys": 0.0, "replica_memory": 0}
        for port, proc in self.credis.items():
            if proc.poll() is not None:
                continue
            info = {}
            for line in self.redis_cmd("INFO", port=port).splitlines():
                if ":" in line:
                    k, v = line.split(":", 1)
                    info[k] = v.strip()
            if info.get("role") == "master":
                total["used_memory"] += int(info.get("used_memory", 0))
                total["used_cpu_user"] += float(info.get("used_cpu_user", 0))
                total["used_cpu_sys"] += float(info.get("used_cpu_sys", 0))
            else:
                total["replica_memory"] += int(info.get("used_memory", 0))
        return total

    def node_pids(self):
        return [p.pid for p in self.procs]

    def sample(self):
        """Memory and CPU of everything, now."""
        info = self.redis_info()
        m = meminfo()
        inuse, sockmem = sockstat()
        return {
            "t": time.monotonic(),
            "node_rss": sum(rss(p) for p in self.node_pids()),
            "node_cpu": sum(cpu_s(p) for p in self.node_pids()),
            "pub_cpu": cpu_s(self.pub.pid) if self.pub else 0.0,
            "redis_mem": int(info.get("used_memory", 0)),
            "redis_replica_mem": int(info.get("replica_memory", 0)),
            "redis_rss": (rss(self.redis.pid) if self.redis else 0) +
                         sum(rss(p.pid) for p in self.credis.values() if p.poll() is None),
            "redis_cpu": float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0)),
            "slab": m["Slab"], "avail": m["MemAvailable"], "tcp_inuse": inuse, "tcp_mem": sockmem,
        }

    def restart_all(self):
        """Every serving node drains (SIGTERM: it stops accepting and closes its connections with
        1001 over --drain-seconds) while a fresh node takes its place on the shared port at once,
        as in a rolling deploy (the fresh ones on the next admin ports: the old ones keep theirs
        while they drain)."""
        old, old_admins = self.procs, self.admins
        for p in old:
            p.send_signal(signal.SIGTERM)
        self.admins = [self.reserve() for _ in range(len(old))]
        t0 = time.monotonic()
        self.procs = [self.spawn_node(k) for k in range(len(old))]
        self.wait_ready([self.admin(k) for k in range(len(self.procs))])
        log(f"  {len(self.procs)} fresh nodes ready in {time.monotonic() - t0:.1f} s")
        for k, p in enumerate(old):
            try:
                p.wait(timeout=self.drain_seconds + 30)
            except subprocess.TimeoutExpired:
                raise Stop(f"node {k} did not finish draining within {self.drain_seconds + 30} s")
        for port in old_admins:
            self.reserved.remove(port)
            release_port(port)

    def stop(self):
        for p in self.procs + ([self.pub] if self.pub else []):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL if self.a.fast_teardown else signal.SIGTERM)
        for p in self.procs + ([self.pub] if self.pub else []):
            try:
                p.wait(timeout=self.drain_seconds + 30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in ([self.redis] if self.redis else []) + list(self.credis.values()):
            if r.poll() is None:
                r.terminate()
                try:
                    r.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    r.kill()
                    r.wait()
        self.procs, self.pub, self.redis, self.credis = [], None, None, {}
        for port in self.reserved:
            release_port(port)
        self.reserved = []


# --- the load generator --------------------------------------------------------------------------

PROGRESS = re.compile(r"\[\s*([\d.]+)s\] open (\d+)/(\d+) ready (\d+) \(([\d.]+)/s\) errors (\d+)([^|]*)\| "
                      r"sent (\d+) delivered (\d+)")


class Loadgen:
    """One wspush-loadgen run; its live line is parsed as it comes."""

    def __init__(self, a, argv, workdir, name):
        self.a = a
        self.ready = 0
        self.errors = 0
        self.causes = ""
        self.sent = 0
        self.delivered = 0
        self.changed = time.monotonic()
        self.errlog = open(os.path.join(workdir, f"loadgen-{name}.log"), "wb")
        self.p = subprocess.Popen([a.loadgen, *argv, "--progress", "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
        self.out = b""
        threading.Thread(target=self._stderr, daemon=True).start()
        self.reader = threading.Thread(target=self._stdout, daemon=True)
        self.reader.start()

    def _stdout(self):
        self.out = self.p.stdout.read()

    def _stderr(self):
        buf = b""
        while True:
            chunk = self.p.stderr.read1(65536)
            if not chunk:
                break
            self.errlog.write(chunk)
            buf += chunk
            *lines, buf = re.split(rb"[\r\n]", buf)
            for line in lines:
                m = PROGRESS.search(line.decode(errors="replace"))
                if m:
                    ready = int(m.group(4))
                    if ready != self.ready or int(m.group(9)) != self.delivered:
                        self.changed = time.monotonic()
                    self.ready, self.errors, self.causes = ready, int(m.group(6)), m.group(7).strip()
                    self.sent, self.delivered = int(m.group(8)), int(m.group(9))

    def pids(self):
        return tree(self.p.pid) if self.p.poll() is None else []

    def rss(self):
        return sum(rss(p) for p in self.pids())

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)

    def result(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.p.wait()
            raise Stop(f"the load generator did not finish within {timeout:.0f} s")
        self.reader.join(10)
        try:
            return json.loads(self.out.decode())
        except ValueError:
            raise Stop(f"the load generator exited {self.p.returncode} without a result "
                       f"(see {self.errlog.name})")


# --- the experiment ------------------------------------------------------------------------------

class Experiment:
    def __init__(self, a):
        self.a = a
        self.workdir = tempfile.mkdtemp(prefix="wspush-million-")
        self.cluster = None
        self.lg = None
        self.tripped = None
        self.results = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                        "machine": machine(), "steps": [], "fanout": None, "capacity": None, "storm": None}

    def trip(self, reason):
        self.tripped = reason
        log(f"STOP: {reason}; stopping everything")
        if self.lg:
            self.lg.kill()
        if self.cluster:
            for p in self.cluster.procs:
                if p.poll() is None:
                    p.kill()

    def check(self):
        if self.tripped:
            raise Stop(self.tripped)

    def sizes(self, n):
        nodes = self.a.nodes or math.ceil(n / self.a.per_node)
        procs = math.ceil(n / self.a.per_loadgen)
        return nodes, procs

    def estimate(self, n):
        """Bytes the step needs: both socket ends in the kernel, the node, Redis and the load
        generator per connection, plus each process's own base."""
        nodes, procs = self.sizes(n)
        per_conn = 8_400 + 400 + 1_100 + 800
        return n * per_conn + nodes * 12 * 2**20 + procs * 16 * 2**20 + 256 * 2**20

    def begin(self, n, drain_seconds=None):
        nodes, procs = self.sizes(n)
        need = self.estimate(n)
        avail = meminfo()["MemAvailable"]
        if need > avail - self.a.memory_floor_gib * 2**30:
            raise Stop(f"{n:,} connections need about {need / 2**30:.1f} GiB; {avail / 2**30:.1f} GiB is available "
                       f"and {self.a.memory_floor_gib} GiB must stay free")
        self.cluster = Cluster(self.a, nodes, self.workdir, drain_seconds)
        self.cluster.start()
        return nodes, procs

    def end(self):
        if self.lg:
            self.lg.kill()
            self.lg = None
        if self.cluster:
            self.cluster.stop()
            self.cluster = None

    def loadgen_argv(self, scenario, n, procs, extra):
        c = self.cluster
        return [scenario, "--url", f"ws://127.0.0.1:{c.port}/ws", "--admin", f"http://127.0.0.1:{c.pub_admin}",
                "--connections", str(n), "--procs", str(procs), "--connect-timeout", str(self.connect_budget(n)),
                "--rate", str(self.a.connect_rate),
                "--timeout", str(self.a.timeout), *extra]

    def connect_budget(self, n):
        """Seconds the connect phase may take: twice what the paced rate needs, and a minute."""
        return math.ceil(2 * n / self.a.connect_rate) + 60

    def await_connected(self, lg, n, what):
        """Until the load generator says all n are up (or nothing has changed for a while)."""
        deadline = time.monotonic() + self.connect_budget(n) + 30
        last_print = 0.0
        t0 = time.monotonic()
        while True:
            self.check()
            now = time.monotonic()
            if now - last_print >= self.a.progress_every:
                last_print = now
                log(f"  {what}: {lg.ready:,}/{n:,} up, {lg.ready / max(now - t0, 1e-9):,.0f}/s"
                    f"{', failures ' + str(lg.errors) + ' ' + lg.causes if lg.errors else ''}, "
                    f"available memory {meminfo()['MemAvailable'] / 2**30:.1f} GiB")
            if lg.ready >= n:
                return now - t0
            if lg.p.poll() is not None:
                return now - t0
            if now > deadline or (lg.ready > 0 and now - lg.changed > 20):
                log(f"  {what}: stopped at {lg.ready:,}/{n:,} up (failures {lg.errors} {lg.causes})")
                return now - t0
            time.sleep(0.2)

    def fail_over(self, lg, out):
        """--failover-after S: S seconds into the publishes, a master is SIGKILLed; how long
        until its replica serves its slots."""
        while lg.sent == 0 and lg.p.poll() is None:
            time.sleep(0.05)
        time.sleep(self.a.failover_after)
        if lg.p.poll() is not None:
            return
        m = len(self.cluster.masters)
        out["sent_before"] = lg.sent
        out["killed"] = self.cluster.kill_master(0)
        t0 = time.monotonic()
        log(f"  failover: master {out['killed']} killed after {lg.sent:,} publishes")
        while time.monotonic() - t0 < 60:
            self.cluster.find_masters()
            if out["killed"] not in self.cluster.masters and len(self.cluster.masters) == m:
                out["takeover_s"] = time.monotonic() - t0
                log(f"  failover: a replica serves its slots {out['takeover_s']:.1f} s after the kill")
                return
            time.sleep(0.2)
        log("  failover: no replica took over within 60 s")

    def mailboxes(self, n):
        nodes, procs = self.begin(n)
        log(f"step {n:,}: {nodes} nodes, {procs} load generator processes (work dir {self.workdir})")
        before = self.cluster.sample()
        self.lg = Loadgen(self.a, self.loadgen_argv("mailboxes", n, procs,
                                                    ["--messages", str(n), "--pipeline", str(self.a.pipeline),
                                                     "--publish-rate", str(self.a.publish_rate),
                                                     "--hold", str(self.a.hold)]), self.workdir, f"mailboxes-{n}")
        connect_s = self.await_connected(self.lg, n, f"{n:,}")
        failover, failer = {}, None
        if self.a.failover_after and self.cluster.cports:
            failer = threading.Thread(target=self.fail_over, args=(self.lg, failover), daemon=True)
            failer.start()
        time.sleep(min(2.0, self.a.hold / 3))   # let the last subscriptions settle
        self.check()
        loaded = self.cluster.sample()
        lg_rss = self.lg.rss()
        time.sleep(max(0.0, self.a.hold - min(2.0, self.a.hold / 3) - 2.5))
        held = self.cluster.sample()      # still holding: the idle CPU rate (pings) to subtract
        r = self.lg.result(self.connect_budget(n) + self.a.timeout + n / self.a.publish_rate + self.a.hold + 60)
        self.lg = None
        if failer:
            failer.join(timeout=120)
        after = self.cluster.sample()
        self.check()
        up = r["counters"]["ready"]
        events = r["counters"]["sent"]
        idle_rate = (held["node_cpu"] - loaded["node_cpu"]) / max(held["t"] - loaded["t"], 1e-9)
        busy = after["node_cpu"] - held["node_cpu"] - idle_rate * (after["t"] - held["t"])
        step = {
            "connections": n, "nodes": nodes, "loadgen_procs": procs, "up": up,
            "connect_s": r["connect_s"], "connect_rate": up / r["connect_s"] if r["connect_s"] else 0,
            "connect_errors": r["connect_errors"],
            "node_rss_per_conn": (loaded["node_rss"] - before["node_rss"]) / max(up, 1),
            "node_rss_total": loaded["node_rss"],
            "slab_per_conn": (loaded["slab"] - before["slab"]) / max(up, 1),
            "tcp_inuse": loaded["tcp_inuse"] - before["tcp_inuse"],
            "tcp_mem_bytes": loaded["tcp_mem"],
            "redis_mem_per_conn": (loaded["redis_mem"] - before["redis_mem"]) / max(up, 1),
            "redis_mem_after_publish_per_conn": (after["redis_mem"] - before["redis_mem"]) / max(up, 1),
            "redis_rss": after["redis_rss"],
            "redis_replica_mem_per_conn": (loaded["redis_replica_mem"] - before["redis_replica_mem"]) / max(up, 1),
            "failover": failover or None,
            "loadgen_rss_per_conn": lg_rss / max(up, 1), "loadgen_rss": lg_rss,
            "events": events, "expected": r["counters"]["expected"], "delivered": r["counters"]["unique"],
            "loss": r["loss"], "duplicates": r["counters"]["duplicates"], "misdelivered": r["counters"]["foreign"],
            "lost_notices": r["counters"].get("lost_notices", 0),
            "untold_loss": r["counters"].get("untold_loss", 0), "publish_unknown": r["counters"].get("publish_unknown", 0),
            "problems": r["problems"],
            "latency_us": r["latency_us"], "publish_s": r["publish_s"],
            "server_cpu_per_event_us": busy / max(events, 1) * 1e6,
            "publish_node_cpu_per_event_us": (after["pub_cpu"] - held["pub_cpu"]) / max(events, 1) * 1e6,
            "redis_cpu_per_event_us": (after["redis_cpu"] - held["redis_cpu"]) / max(events, 1) * 1e6,
            "redis_cpu_s": after["redis_cpu"] - held["redis_cpu"],
            "idle_node_cpu_per_s": idle_rate,
            "connect_rate_asked": self.a.connect_rate, "publish_rate": self.a.publish_rate,
            "lowest_available_gib": None, "ok": r["ok"] and up == n,
            "problems": r["problems"],
        }
        self.end()
        self.results["steps"].append(step)
        print_step(step)
        return step

    def fanout(self, n):
        nodes, procs = self.begin(n)
        log(f"fan-out to all at {n:,}: {nodes} nodes")
        self.lg = Loadgen(self.a, self.loadgen_argv("fanout", n, procs, ["--messages", "1", "--topic", "all"]),
                          self.workdir, f"fanout-{n}")
        self.await_connected(self.lg, n, f"fan-out {n:,}")
        r = self.lg.result(self.connect_budget(n) + self.a.timeout + 60)
        self.lg = None
        self.end()
        f = {"connections": n, "up": r["counters"]["ready"], "delivered": r["counters"]["unique"],
             "expected": r["counters"]["expected"], "loss": r["loss"], "duplicates": r["counters"]["duplicates"],
             "latency_us": r["latency_us"], "ok": r["ok"], "problems": r["problems"]}
        self.results["fanout"] = f
        log(f"fan-out: {f['delivered']:,}/{f['expected']:,} delivered, loss {f['loss']}, p50 "
            f"{f['latency_us']['p50'] / 1000:.1f} ms, p99 {f['latency_us']['p99'] / 1000:.1f} ms, last "
            f"{f['latency_us']['max'] / 1000:.1f} ms")
        return f

    def capacity(self, n):
        """The mailbox publish rate raised step by step with all n connections held."""
        rates = [float(r) for r in self.a.capacity_rates.split(",") if r]
        nodes, procs = self.begin(n)
        log(f"capacity at {n:,}: {nodes} nodes; rates {', '.join(f'{r:,.0f}' for r in rates)}/s, "
            f"{self.a.capacity_step_seconds:.0f} s each")
        self.lg = Loadgen(self.a, self.loadgen_argv(
            "mailboxes", n, procs,
            ["--publish-steps", ",".join(f"{r:g}" for r in rates), "--step-seconds", str(self.a.capacity_step_seconds),
             "--step-pause", str(self.a.capacity_step_pause), "--pipeline", str(self.a.pipeline),
             "--publish-batch", str(self.a.capacity_batch),
             "--hold", str(self.a.hold)]), self.workdir, f"capacity-{n}")
        # CPU of everything, sampled from the start (CLOCK_MONOTONIC, the load generator's clock
        # for its steps' send times): the load generator may start publishing before
        # await_connected gives up on connections that never came.
        samples = []
        done = threading.Event()

        def sampler():
            while not done.is_set():
                c = self.cluster.sample()
                c["lg_cpu"] = sum(cpu_s(p) for p in self.lg.pids())
                c["machine_cpu"] = machine_busy_s()
                c["ready"], c["sent"] = self.lg.ready, self.lg.sent
                samples.append(c)
                done.wait(0.5)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        try:
            self.await_connected(self.lg, n, f"capacity {n:,}")
            last_print = time.monotonic()
            while self.lg.p.poll() is None:
                self.check()
                if time.monotonic() - last_print >= self.a.progress_every:
                    last_print = time.monotonic()
                    log(f"  capacity: {self.lg.sent:,} published, {self.lg.delivered:,} delivered")
                time.sleep(0.2)
        finally:
            done.set()
            th.join(5)
        # All held, nothing published yet: pings and timers only (the connections that came, once
        # no more come), from when the last subscriptions have settled, as the mailboxes phase
        # counts it (before that, the nodes and Redis are still taking the last subs).
        held = max((c["ready"] for c in samples if c["sent"] == 0), default=0)
        idle = [c for c in samples if c["sent"] == 0 and c["ready"] == held]
        idle = [c for c in idle if c["t"] >= idle[0]["t"] + min(2.0, self.a.hold / 3)] if idle else []
        r = self.lg.result(60)
        self.lg = None
        self.end()

        def at(t):
            """The sample nearest before t (or the first)."""
            best = samples[0]
            for c in samples:
                if c["t"] <= t:
                    best = c
            return best

        def idle_rate(key):
            """CPU seconds per second while all were held and nothing published (pings, timers)."""
            if len(idle) < 2:
                return 0.0
            return (idle[-1][key] - idle[0][key]) / max(idle[-1]["t"] - idle[0]["t"], 1e-9)

        # Each side's CPU in a sample; "machine" is everything, the kernel's softirq work for
        # loopback TCP included (charged to no process): what is left of the machine's cores.
        sides = {"nodes": "node_cpu", "pub_node": "pub_cpu", "redis": "redis_cpu", "loadgen": "lg_cpu",
                 "machine": "machine_cpu"}
        base = {key: idle_rate(key) for key in sides.values()}
        out = []
        for k, st in enumerate(r.get("steps", [])):
            # The step's window: its first send until the next step's first send (the pause, when
            # what it sent arrives, included); the last step's until its last send and the pause.
            t0 = st["first_send_s"]
            nxt = r["steps"][k + 1]["first_send_s"] if k + 1 < len(r["steps"]) else 0
            t1 = nxt if nxt > t0 else st["last_send_s"] + self.a.capacity_step_pause
            a, b = at(t0), at(t1)
            dt = max(b["t"] - a["t"], 1e-9)
            ev = max(st["sent"], 1)
            lat = st["latency_us"]
            row = {
                "rate": st["rate"], "achieved_rate": st["sent"] / st["publish_s"] if st["publish_s"] > 0 else 0,
                "sent": st["sent"], "expected": st["expected"], "delivered": st["delivered"], "loss": st["loss"],
                "duplicates": st["duplicates"],
                "p50_ms": lat["p50"] / 1000, "p99_ms": lat["p99"] / 1000, "max_ms": lat["max"] / 1000,
                "window_s": dt,
            }
            for name, key in sides.items():
                used = b[key] - a[key]
                row[f"{name}_cores"] = used / dt
                # Per event: what the step cost above the idle rate (held connections' pings and
                # timers, Redis's own cron), as the mailboxes phase counts it.
                row[f"{name}_us_per_event"] = (used - base[key] * dt) / ev * 1e6
            # Held: everything arrived once, in time, and the rate asked was the rate published
            # (a publisher held back by the answers' latency offers less than asked).
            row["held"] = (row["loss"] == 0 and row["duplicates"] == 0 and row["sent"] == st["messages"]
                           and row["p99_ms"] <= self.a.capacity_p99_ms and row["achieved_rate"] >= 0.95 * row["rate"])
            out.append(row)
            log(f"  {row['rate']:,.0f}/s (achieved {row['achieved_rate']:,.0f}/s): {row['delivered']:,}/{row['expected']:,} "
                f"delivered, loss {row['loss']}, duplicates {row['duplicates']}, p50 {row['p50_ms']:.2f} p99 "
                f"{row['p99_ms']:.2f} max {row['max_ms']:.2f} ms; cores busy: nodes {row['nodes_cores']:.2f} (publishing "
                f"node {row['pub_node_cores']:.2f}), Redis {row['redis_cores']:.2f}, load generator "
                f"{row['loadgen_cores']:.2f}, the machine {row['machine_cores']:.2f}; µs/event: nodes {row['nodes_us_per_event']:.1f}, Redis "
                f"{row['redis_us_per_event']:.1f}, load generator {row['loadgen_us_per_event']:.1f}"
                f"{'' if row['held'] else '  <- did not hold'}")
        held = [x["rate"] for x in out if x["held"]]
        c = {"connections": n, "nodes": nodes, "up": r["counters"]["ready"], "idle_cores": base,
             "step_seconds": self.a.capacity_step_seconds, "p99_bound_ms": self.a.capacity_p99_ms, "steps": out,
             "highest_held": max(held) if held else 0, "loss": r["loss"], "ok": r["ok"], "problems": r["problems"]}
        self.results["capacity"] = c
        log(f"capacity: the highest rate that held (0 lost, p99 <= {self.a.capacity_p99_ms:g} ms): "
            f"{c['highest_held']:,.0f}/s")
        return c

    def storm(self, n):
        drain = self.a.storm_drain_seconds or max(self.a.drain_seconds, math.ceil(n / self.a.connect_rate))
        nodes, procs = self.begin(n, drain)
        seconds = self.a.storm_seconds
        log(f"reconnect storm at {n:,}: {nodes} nodes draining over {drain} s, one topic at {self.a.storm_rate}/s "
            f"for {seconds} s")
        self.lg = Loadgen(self.a, self.loadgen_argv(
            "reconnect-storm", n, procs,
            ["--storm", "server", "--publish-rate", str(self.a.storm_rate), "--seconds", str(seconds),
             "--topic", "storm", "--drain-timeout", "10"]), self.workdir, f"storm-{n}")
        self.await_connected(self.lg, n, f"storm {n:,}")
        deadline = time.monotonic() + 60
        while self.lg.sent < max(2, self.a.storm_rate * 3) and time.monotonic() < deadline:
            self.check()
            time.sleep(0.1)
        log(f"  every node drains (SIGTERM) and a fresh one takes its place; {self.lg.sent} published so far")
        t0 = time.monotonic()
        self.cluster.restart_all()
        log(f"  the old nodes finished draining {time.monotonic() - t0:.1f} s after SIGTERM")
        r = self.lg.result(self.connect_budget(n) + self.a.timeout + seconds + 120)
        self.lg = None
        self.end()
        s = {"connections": n, "nodes": nodes, "drain_seconds": drain, "up": r["counters"]["ready"], "back_s": r["storm_back_s"],
             "left": r["storm_left"], "reconnects": r["counters"]["reconnects"], "events": r["counters"]["sent"],
             "expected": r["counters"]["expected"], "delivered": r["counters"]["unique"], "loss": r["loss"],
             "duplicates": r["counters"]["duplicates"], "lost_reported": r["counters"]["lost_reported"],
             "close_1001": r["counters"]["close_1001"], "ok": r["ok"], "problems": r["problems"],
             "counters": {k: v for k, v in r["counters"].items() if v}, "connect_errors": r["connect_errors"]}
        self.results["storm"] = s
        log(f"storm: {s['reconnects']:,} reconnects, all back in {s['back_s']:.1f} s ({s['left']} left), "
            f"{s['delivered']:,}/{s['expected']:,} delivered, loss {s['loss']}, duplicates {s['duplicates']}")
        return s


def machine():
    cpus = os.cpu_count()
    model = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"cpus": cpus, "model": model, "memory_gib": round(meminfo()["MemTotal"] / 2**30, 1),
            "kernel": os.uname().release}


def print_step(s):
    lat = s["latency_us"]
    log(f"step {s['connections']:,}: {s['up']:,} up in {s['connect_s']:.1f} s ({s['connect_rate']:,.0f}/s); "
        f"per connection: nodes {s['node_rss_per_conn']:.0f} B, kernel Slab {s['slab_per_conn']:.0f} B, "
        f"Redis {s['redis_mem_per_conn']:.0f} B ({s['redis_mem_after_publish_per_conn']:.0f} B with one event), "
        f"load generator {s['loadgen_rss_per_conn']:.0f} B")
    log(f"  one event to every mailbox: {s['delivered']:,}/{s['expected']:,} delivered, loss {s['loss']}, "
        f"duplicates {s['duplicates']}, misdelivered {s['misdelivered']}; latency p50 {lat['p50'] / 1000:.2f} "
        f"p99 {lat['p99'] / 1000:.2f} p99.9 {lat['p999'] / 1000:.2f} max {lat['max'] / 1000:.2f} ms; server CPU "
        f"{s['server_cpu_per_event_us']:.1f} us/event (+ publish node {s['publish_node_cpu_per_event_us']:.1f}), "
        f"Redis {s['redis_cpu_per_event_us']:.1f} us/event")
    if s.get("lost_notices") or s["loss"]:
        log(f"  lost notices in the stream: {s['lost_notices']:,} (a subscriber told its topic may miss events); "
            f"missing on connections never told: {s.get('untold_loss', 0):,} (publishes answered 504 and not sent "
            f"again: {s.get('publish_unknown', 0):,})")
    if s.get("redis_replica_mem_per_conn"):
        log(f"  the cluster's replicas: {s['redis_replica_mem_per_conn']:.0f} B per connection")
    if s.get("failover"):
        f = s["failover"]
        log(f"  failover: master {f.get('killed')} killed after {f.get('sent_before', 0):,} publishes; a replica took "
            f"over {f['takeover_s']:.1f} s later" if "takeover_s" in f else f"  failover: {f}")


def markdown(res):
    out = [f"Machine: {res['machine']['cpus']} cores ({res['machine']['model']}), "
           f"{res['machine']['memory_gib']} GiB, Linux {res['machine']['kernel']}; {res['started_utc']}.", "",
           "| connections | nodes | connect s (rate/s) | nodes B/conn | kernel Slab B/conn | Redis B/conn (subscribed; + one event) "
           "| loadgen B/conn | delivered/expected | loss / dup / misdelivered | p50 / p99 / p99.9 / max ms "
           "| server µs/event | Redis µs/event |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in res["steps"]:
        lat = s["latency_us"]
        out.append(
            f"| {s['up']:,} | {s['nodes']} | {s['connect_s']:.1f} ({s['connect_rate']:,.0f}) | {s['node_rss_per_conn']:.0f} "
            f"| {s['slab_per_conn']:,.0f} | {s['redis_mem_per_conn']:.0f}; {s['redis_mem_after_publish_per_conn']:.0f} "
            f"| {s['loadgen_rss_per_conn']:.0f} | {s['delivered']:,}/{s['expected']:,} "
            f"| {s['loss']} / {s['duplicates']} / {s['misdelivered']} "
            f"| {lat['p50'] / 1000:.2f} / {lat['p99'] / 1000:.2f} / {lat['p999'] / 1000:.2f} / {lat['max'] / 1000:.2f} "
            f"| {s['server_cpu_per_event_us']:.1f} (+{s['publish_node_cpu_per_event_us']:.1f}) "
            f"| {s['redis_cpu_per_event_us']:.1f} |")
    if res["fanout"]:
        f = res["fanout"]
        out += ["", f"Fan-out to all ({f['up']:,} connections, one topic, one publish): {f['delivered']:,}/"
                f"{f['expected']:,} delivered, loss {f['loss']}; p50 {f['latency_us']['p50'] / 1000:.1f} ms, p99 "
                f"{f['latency_us']['p99'] / 1000:.1f} ms, last subscriber {f['latency_us']['max'] / 1000:.1f} ms."]
    if res.get("capacity"):
        c = res["capacity"]
        out += ["", f"Capacity ({c['up']:,} connections held, {c['nodes']} nodes, each rate for {c['step_seconds']:g} s): "
                f"the highest rate that held (0 lost, p99 <= {c['p99_bound_ms']:g} ms) is {c['highest_held']:,.0f} events/s.", "",
                "| rate asked (achieved) /s | delivered/expected | loss / dup | p50 / p99 / max ms | cores busy: nodes (publishing node) / Redis / loadgen / machine "
                "| µs per event: nodes / Redis / loadgen |", "|---|---|---|---|---|---|"]
        for x in c["steps"]:
            out.append(f"| {x['rate']:,.0f} ({x['achieved_rate']:,.0f}) | {x['delivered']:,}/{x['expected']:,} | {x['loss']} / {x['duplicates']} "
                       f"| {x['p50_ms']:.2f} / {x['p99_ms']:.2f} / {x['max_ms']:.2f} "
                       f"| {x['nodes_cores']:.2f} ({x['pub_node_cores']:.2f}) / {x['redis_cores']:.2f} / {x['loadgen_cores']:.2f} / {x['machine_cores']:.2f} "
                       f"| {x['nodes_us_per_event']:.1f} / {x['redis_us_per_event']:.1f} / {x['loadgen_us_per_event']:.1f} |")
    if res["storm"]:
        s = res["storm"]
        out += ["", f"Reconnect storm ({s['up']:,} connections, {s['nodes']} nodes drained over {s['drain_seconds']} s and replaced): "
                f"{s['reconnects']:,} reconnects, all back in {s['back_s']:.1f} s, {s['left']} not back; "
                f"{s['delivered']:,}/{s['expected']:,} delivered, loss {s['loss']}, duplicates {s['duplicates']}, "
                f"lost reported {s['lost_reported']}."]
    if res.get("stopped"):
        out += ["", f"Stopped: {res['stopped']}"]
    return "\n".join(out)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default="100000,250000,500000,1000000",
                   help="connection counts, each a fresh run (default 100000,250000,500000,1000000)")
    p.add_argument("--phases", default="mailboxes,fanout,storm",
                   help="what to run: mailboxes at every step; fanout, capacity and storm at the largest")
    p.add_argument("--nodes", type=int, default=0, help="wspush processes (default: one per --per-node)")
    p.add_argument("--per-node", type=int, default=17_000,
                   help="connections per wspush process; below the 20,000 open files a process may hold, "
                        "with room for the kernel's uneven spread over SO_REUSEPORT sockets")
    p.add_argument("--per-loadgen", type=int, default=16_000, help="connections per load generator process")
    p.add_argument("--server", default="build/server/wspush")
    p.add_argument("--loadgen", default="build/loadgen/wspush-loadgen")
    p.add_argument("--hold", type=float, default=8, help="seconds all connections are held before publishing")
    p.add_argument("--pipeline", type=int, default=128, help="admin publish requests in flight (the node takes 64 of "
                   "one connection at once)")
    p.add_argument("--ping-interval", type=int, default=120,
                   help="the nodes' keepalive interval (default 120: at a million, 30 s is 33,000 pings/s, and "
                        "here the clients answering them share the two cores)")
    p.add_argument("--drain-seconds", type=int, default=5, help="the nodes' drain window")
    p.add_argument("--redis-nice", type=int, default=-10,
                   help="nice value for redis-server (0: leave it); it shares the cores with everything else here")
    p.add_argument("--storm-rate", type=float, default=1, help="storm: publishes per second to the topic all hold")
    p.add_argument("--storm-seconds", type=float, default=30, help="storm: publishing time")
    p.add_argument("--storm-drain-seconds", type=int, default=0,
                   help="storm: the nodes' drain window (default: the connections over --connect-rate, so closes come as fast as the clients reconnect)")
    p.add_argument("--connect-rate", type=float, default=6000,
                   help="connections opened per second (paced: the nodes' upgrade timeout must not fire under "
                        "load); the connect deadline is twice what it needs plus a minute")
    p.add_argument("--publish-rate", type=float, default=5000, help="mailboxes: publishes per second")
    p.add_argument("--capacity-rates", default="5000,10000,15000,20000,25000,30000,35000",
                   help="capacity: the mailbox publish rates, in order")
    p.add_argument("--capacity-step-seconds", type=float, default=10, help="capacity: publishing time per rate")
    p.add_argument("--capacity-step-pause", type=float, default=4,
                   help="capacity: pause after each rate, so what it sent arrives before the next")
    p.add_argument("--capacity-batch", type=int, default=16,
                   help="capacity: events per admin request (POST /publish/batch); a backend publishing tens "
                        "of thousands per second batches, and one connection's pipeline holds 64 requests")
    p.add_argument("--capacity-p99-ms", type=float, default=100, help="capacity: a rate holds with p99 at most this")
    p.add_argument("--timeout", type=float, default=600, help="loadgen: bound on each publishing phase")
    p.add_argument("--memory-floor-gib", type=float, default=1.5,
                   help="stop everything when MemAvailable falls below this")
    p.add_argument("--progress-every", type=float, default=5, help="seconds between progress lines")
    p.add_argument("--redis-cluster", type=int, default=0,
                   help="the bus on a Redis Cluster of this many masters (each with a replica; 3 or more) instead of one Redis")
    p.add_argument("--failover-after", type=float, default=0,
                   help="with --redis-cluster: SIGKILL a master this many seconds into the mailbox publishes")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--keep-logs", action="store_true", help="keep the work directory (logs) after a good run too")
    p.add_argument("--fast-teardown", action="store_true", help="SIGKILL the nodes at the end instead of draining")
    return p.parse_args()


def main():
    a = parse_args()
    # SIGTERM (a CI timeout, a person) tears down like ^C: nothing started is left behind.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            raise SystemExit(f"million: {tool} not found (Debian: apt-get install redis-server)")
    for f in (a.server, a.loadgen):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"million: {f} not found; build first (cmake --build build), or pass --server/--loadgen")
    steps = [int(s.replace("_", "")) for s in a.steps.split(",") if s]
    phases = set(a.phases.split(","))
    top = max(steps)
    exp = Experiment(a)
    nodes, procs = exp.sizes(top)
    limits = Limits(top, nodes + 1, procs)
    watchdog = Watchdog(int(a.memory_floor_gib * 2**30), exp.trip)
    ok = True
    t0 = time.monotonic()
    try:
        limits.apply()
        watchdog.start()
        if "mailboxes" in phases:
            for n in steps:
                s = exp.mailboxes(n)
                s["lowest_available_gib"] = watchdog.lowest / 2**30 if watchdog.lowest else None
                # A master killed (--failover-after): events it took with it are a loss its
                # subscribers were told of (lost notices), connection by connection; what is
                # missing where no notice came is at most the publishes answered 504 and not
                # sent again (maybe never published). A silent gap is what must not happen.
                told = bool(s.get("failover")) and s.get("untold_loss", 0) <= s.get("publish_unknown", 0)
                only_loss = all(p.startswith("loss:") for p in s.get("problems", []))
                ok &= (s["ok"] or (told and only_loss and s["up"] >= n)) and (s["loss"] == 0 or told)
                ok &= s["duplicates"] == 0 and s["misdelivered"] == 0
                if s["up"] < n:
                    raise Stop(f"only {s['up']:,} of {n:,} connections came up (failures: {s['connect_errors']}); "
                               f"the highest complete step is {max([t['connections'] for t in exp.results['steps'] if t['up'] >= t['connections']] or [0]):,}")
        if "fanout" in phases:
            f = exp.fanout(top)
            ok &= f["ok"] and f["loss"] == 0
        if "capacity" in phases:
            c = exp.capacity(top)
            ok &= c["ok"] and c["loss"] == 0
        if "storm" in phases:
            s = exp.storm(top)
            ok &= s["ok"] and s["loss"] == 0 and s["duplicates"] == 0
    except Stop as e:
        ok = False
        exp.results["stopped"] = str(e)
        log(f"million: stopped: {e}")
    except KeyboardInterrupt:
        ok = False
        exp.results["stopped"] = "interrupted"
        log("million: interrupted")
    finally:
        exp.end()
        watchdog.done.set()
        limits.restore()
    exp.results["lowest_available_gib"] = watchdog.lowest / 2**30 if watchdog.lowest else None
    exp.results["seconds"] = time.monotonic() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(exp.results, f, indent=1)
    print()
    print(markdown(exp.results))
    print(f"\nmillion: {'ok' if ok else 'FAILED'} in {exp.results['seconds']:.0f} s "
          f"(lowest available memory {exp.results['lowest_available_gib'] or 0:.1f} GiB; logs in {exp.workdir})")
    if ok and not a.keep_logs:
        shutil.rmtree(exp.workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
