#!/usr/bin/python3
"""The standard benchmark set of wspush-loadgen, against freshly started servers.

For every scenario and server it starts a new server process pinned to one core (taskset),
runs wspush-loadgen pinned to the other, reads its JSON, stops the server (by PID, SIGTERM), and
prints markdown tables in docs/PERFORMANCE.md's format, with ratios against Node `ws` where the
scenario applies to it (plain broadcast: idle, fanout, churn, slow-consumers).

  loadgen/scenarios/run_standard.py                       # 19,000 connections, every scenario
  loadgen/scenarios/run_standard.py --quick               # 2,000 connections
  loadgen/scenarios/run_standard.py --scenarios idle,fanout --servers wspush-pubsub,node-ws
  loadgen/scenarios/run_standard.py --peer uws=127.0.0.1:9001   # also drive a server you started
  loadgen/scenarios/run_standard.py --peer-cmd 'uws=/opt/peers/uws_broadcast {port}'   # or one it starts

drain-storm (wspush-pubsub): the server is sent SIGTERM mid-run (it drains) and a fresh one starts
on the same ports; it measures how long until every client is back. The embedded bus keeps no
history across a restart, so the clients' resumes come back with their topics in `lost`.

Servers: wspush-pubsub (--mode=pubsub, JWT per connection, publishes through the admin API),
wspush-broadcast (--mode=broadcast, the peer protocol), either with an -epoll suffix for the
epoll backend (io_uring otherwise), node-ws (tests/bench/peers), and any
`--peer NAME=HOST:PORT` speaking plain broadcast (e.g. a uWebSockets build of your own; never
committed). Only processes started here are stopped.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from wsp_ports import release_port, reserve_port  # noqa: E402
PEER = os.path.join(REPO, "tests", "bench", "peers", "node_ws_broadcast.mjs")
LISTEN = re.compile(r"listening on ([0-9.]+):(\d+)")
ADMIN = re.compile(r"admin API at ([0-9.]+):(\d+)")
SECRET = "loadgen-benchmark-secret"

# scenario -> servers it applies to (pubsub-only scenarios need topics and resume)
APPLIES = {
    "idle": ["wspush-pubsub", "wspush-broadcast", "node-ws", "peer"],
    "fanout-burst": ["wspush-pubsub", "wspush-broadcast", "node-ws", "peer"],
    "fanout-rate": ["wspush-pubsub", "wspush-broadcast", "node-ws", "peer"],
    "mailboxes": ["wspush-pubsub"],
    "churn": ["wspush-pubsub", "wspush-broadcast", "node-ws", "peer"],
    "reconnect-storm": ["wspush-pubsub"],
    "drain-storm": ["wspush-pubsub"],
    "slow-consumers": ["wspush-pubsub", "wspush-broadcast", "node-ws", "peer"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, args, ports=None):
        self.name, self.proc, self.lines, self.ports = name, None, [], {}
        if name.startswith("peer:"):
            host_port = name.split("=", 1)[1]
            self.ports["ws"] = int(host_port.rsplit(":", 1)[1])
            self.host = host_port.rsplit(":", 1)[0]
            return
        self.host = "127.0.0.1"
        pin = ["taskset", "-c", str(args.server_cpu)] if args.server_cpu is not None else []
        if name == "node-ws":
            argv = pin + [args.node, PEER, "--port", "0"]
        elif name.startswith("cmd:"):   # --peer-cmd NAME=COMMAND: started here, on a free port
            port = free_port()
            argv = pin + shlex.split(name.split("=", 1)[1].replace("{port}", str(port)))
        else:
            mode = name.split("-")[1]
            ws_port, admin_port = (ports["ws"], ports["admin"]) if ports else (0, 0)
            argv = pin + [args.wspush, f"--mode={mode}", "--threads", "1", "--listen", f"127.0.0.1:{ws_port}",
                          "--admin-listen", f"127.0.0.1:{admin_port}", "--drain-seconds", "2"]
            argv += ["--jwt-secret", SECRET] if mode == "pubsub" else ["--auth=none"]
            if name.endswith("-epoll"):
                argv += ["--io=epoll"]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()
        want = 1 if name == "node-ws" or name.startswith("cmd:") else 2

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                for key, rx in (("ws", LISTEN), ("admin", ADMIN)):
                    m = rx.search(line)
                    if m and key not in self.ports:
                        self.ports[key] = int(m.group(2))
                if len(self.ports) >= want:
                    ready.set()
            ready.set()
        threading.Thread(target=pump, daemon=True).start()
        ready.wait(30)
        if len(self.ports) < want:
            self.stop()
            raise RuntimeError(f"{name} did not start:\n" + "\n".join(self.lines[-10:]))

    def open_connections(self):
        """wspush's own count of open WebSocket connections (its /metrics)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['admin']}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0
        m = re.search(r'^wspush_connections\{state="open"\} (\d+)', text, re.M)
        return int(m.group(1)) if m else 0

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def loadgen_argv(scenario, server, args):
    n = args.connections
    kind = server.name.split("=")[0].split(":")[0]
    pubsub = kind.startswith("wspush-pubsub")
    verb = "reconnect-storm" if scenario == "drain-storm" else scenario.split("-rate")[0].split("-burst")[0]
    argv = [args.loadgen, verb,
            "--url", f"ws://{server.host}:{server.ports['ws']}/ws", "--connections", str(n),
            "--json", "--quiet", "--connect-timeout", "120", "--timeout", "300"]
    if args.procs:
        argv += ["--procs", str(args.procs)]
    if args.rate:
        argv += ["--rate", str(args.rate)]
    if server.pid:
        argv += ["--server-pid", str(server.pid)]
    if pubsub:
        argv += ["--admin", f"http://127.0.0.1:{server.ports['admin']}", "--jwt-secret", SECRET]
    else:
        argv += ["--protocol", "broadcast"]
    extra = {
        "idle": ["--hold", str(args.hold)],
        "fanout-burst": ["--messages", str(args.burst), "--size", "64"],
        "fanout-rate": ["--messages", str(int(2 * args.seconds)), "--publish-rate", "2", "--size", "64"],
        "mailboxes": ["--messages", str(n), "--publish-rate", str(args.mailbox_rate), "--size", "64"],
        "churn": ["--messages", str(int(2 * args.seconds)), "--publish-rate", "2", "--churn-rate",
                  str(args.churn_rate), "--churn-fraction", "0.1"],
        "reconnect-storm": ["--messages", str(int(4 * args.seconds)), "--publish-rate", "4", "--storm", "client"],
        "drain-storm": ["--messages", str(int(4 * args.seconds)), "--publish-rate", "4", "--storm", "server"],
        "slow-consumers": ["--messages", str(int(10 * args.seconds)), "--publish-rate", "10", "--size", "1024",
                           "--slow-fraction", "0.1"],
    }[scenario]
    if args.reports:
        os.makedirs(args.reports, exist_ok=True)
        extra += ["--report", os.path.join(args.reports, f"{scenario}-{kind}.html")]
    pin = ["taskset", "-c", str(args.client_cpu)] if args.client_cpu is not None else []
    return pin + argv + extra


def drain_and_restart(server, name, args, loadgen):
    """drain-storm: once the load generator has been publishing for half its time, SIGTERM the
    server (it drains: 1001 closes over 2 s, then exits) and start a fresh one on the same ports.
    The new process has a new history epoch, so every resume is answered with the topic in
    `lost`: the embedded bus keeps no history across a restart (the Redis bus will)."""
    deadline = time.monotonic() + 120 + args.connections / 1000
    while loadgen.poll() is None and time.monotonic() < deadline:  # wait until everyone is connected
        if server.open_connections() >= args.connections:
            break
        time.sleep(0.2)
    time.sleep(args.seconds / 2)
    server.stop()
    return Server(name, args, ports=server.ports)


def run_one(scenario, name, args):
    # drain-storm starts a fresh server on the ports of the one it drained: ports outside the
    # ephemeral range, checked free, that no client's connection can take in between.
    reserved = {"ws": reserve_port(), "admin": reserve_port()} if scenario == "drain-storm" else None
    try:
        return run_on(scenario, name, args, reserved)
    finally:
        for port in (reserved or {}).values():
            release_port(port)


def run_on(scenario, name, args, ports):
    server = Server(name, args, ports=ports)
    try:
        argv = loadgen_argv(scenario, server, args)
        print("+ " + " ".join(argv[argv.index(args.loadgen):]), file=sys.stderr, flush=True)
        if scenario == "drain-storm":
            loadgen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            server = drain_and_restart(server, name, args, loadgen)
            out, err = loadgen.communicate(timeout=900)
            done = subprocess.CompletedProcess(argv, loadgen.returncode, out, err)
        else:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("{")), None)
        if not line:
            raise RuntimeError(f"{scenario} on {name}: no result (exit {done.returncode}): {done.stderr[-500:]}")
        result = json.loads(line)
        if scenario == "drain-storm":
            # The restarted server has no history: a miss is honest when the client was told (its
            # resume answered with the topic in `lost`), a failure only when it was silent.
            c = result["counters"]
            told = c["lost_reported"] >= args.connections
            result["ok"] = c["duplicates"] == 0 and (result["loss"] == 0 or told)
            if told:
                result["problems"] = [f"{result['loss']:,} missed while down, every client told (lost)"]
        result["exit_code"] = done.returncode
        result["server_name"] = name.split("=")[0].split(":", 1)[1] if name.startswith(("cmd:", "peer:")) else name
        result["command"] = " ".join(argv)
        return result
    finally:
        server.stop()


def ratio(v, base):
    return f" ({v / base:.2f}x)" if base and v is not None and v >= 0 else ""


def ms(us):
    return f"{us / 1000:.2f}"


def table(scenario, results, args):
    base = next((r for r in results if r["server_name"] == "node-ws"), None)
    out = [f"#### {scenario}, N = {args.connections:,}", ""]
    if scenario == "idle":
        out += ["| server | connected | server RSS Δ per conn (vs node-ws) | kernel slab Δ per conn | connect p99 ms | ok |",
                "|---|---|---|---|---|---|"]
        for r in results:
            s = r["server"]
            b = base["server"]["rss_per_conn"] if base else None
            out.append(f"| {r['server_name']} | {r['counters']['connected']:,} | {s['rss_per_conn']:.0f} B{ratio(s['rss_per_conn'], b)} "
                       f"| {s['slab_per_conn']:.0f} B | {ms(r['connect_us']['p99'])} | {'ok' if r['ok'] else 'FAILED'} |")
        return "\n".join(out) + "\n"
    out += ["| server | deliveries/s (vs node-ws) | p50 ms | p90 ms | p99 ms (vs node-ws) | p99.9 ms | max ms "
            "| delivered / expected | loss | dups | server CPU µs/delivery | notes | ok |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lat, c = r["latency_us"], r["counters"]
        bl = base["latency_us"] if base else {}
        cpu = r["server"]["cpu_per_delivery_us"]
        notes = []
        if scenario in ("reconnect-storm", "drain-storm"):
            notes.append(f"all back in {r['storm_back_s']:.2f} s, lost topics {c['lost_reported']}")
        if scenario == "slow-consumers":
            notes.append(f"1013 closes seen {c['close_1013']}")
        if scenario == "churn":
            notes.append(f"reconnects {c['reconnects']:,}")
        if r["problems"]:
            notes.append("; ".join(r["problems"]))
        out.append(
            f"| {r['server_name']} | {r['deliveries_per_s']:,.0f}{ratio(r['deliveries_per_s'], base and base['deliveries_per_s'])} "
            f"| {ms(lat['p50'])} | {ms(lat['p90'])} | {ms(lat['p99'])}{ratio(lat['p99'], bl.get('p99'))} | {ms(lat['p999'])} "
            f"| {ms(lat['max'])} | {c['unique']:,} / {c['expected']:,} | {r['loss']:,} | {c['duplicates']:,} "
            f"| {cpu:.2f}{ratio(cpu, base and base['server']['cpu_per_delivery_us'])} | {', '.join(notes)} "
            f"| {'ok' if r['ok'] else 'FAILED'} |")
    return "\n".join(out) + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--wspush")
    p.add_argument("--loadgen")
    p.add_argument("--node", default=shutil.which("node") or "node")
    p.add_argument("--servers", default="wspush-pubsub,wspush-broadcast,node-ws")
    p.add_argument("--peer", action="append", default=[], help="NAME=HOST:PORT of a broadcast server you run")
    p.add_argument("--peer-cmd", action="append", default=[],
                   help="NAME=COMMAND of a broadcast server to start fresh per scenario, like the others "
                        "(pinned, memory and CPU measured); {port} in COMMAND is replaced by a free port, "
                        "and it must print 'listening on HOST:PORT'")
    p.add_argument("--scenarios", default=",".join(APPLIES))
    p.add_argument("--connections", type=int, default=19000)
    p.add_argument("--procs", type=int, default=0)
    p.add_argument("--rate", type=float, default=0, help="connections/s (default: unpaced)")
    p.add_argument("--hold", type=float, default=10)
    p.add_argument("--burst", type=int, default=200)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--mailbox-rate", type=float, default=2000)
    p.add_argument("--churn-rate", type=float, default=200)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2,000 connections, 5 s runs")
    p.add_argument("--reports", help="write each run's HTML report into this directory")
    p.add_argument("--json-out", help="write every raw result to this file")
    args = p.parse_args()
    args.wspush = args.wspush or os.path.join(args.build_dir, "server", "wspush")
    args.loadgen = args.loadgen or os.path.join(args.build_dir, "loadgen", "wspush-loadgen")
    if args.quick:
        args.connections, args.seconds, args.hold = 2000, 5, 5
    if (os.cpu_count() or 1) < 2:
        args.server_cpu = args.client_cpu = None
    return args


def main():
    args = parse_args()
    servers = ([s for s in args.servers.split(",") if s] + [f"peer:{p}" for p in args.peer]
               + [f"cmd:{p}" for p in args.peer_cmd])
    print(f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node()}, "
          f"{os.cpu_count()} cores, kernel {platform.release()}; servers pinned to CPU {args.server_cpu}, "
          f"wspush-loadgen to CPU {args.client_cpu}.\n")
    print(f"Command: `{' '.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])}`\n", flush=True)
    raw = []
    for scenario in [s for s in args.scenarios.split(",") if s]:
        results = []
        for name in servers:
            kind = "peer" if name.startswith(("peer:", "cmd:")) else name.removesuffix("-epoll")
            if kind not in APPLIES[scenario]:
                continue
            try:
                results.append(run_one(scenario, name, args))
            except Exception as e:   # one server failing must not hide the others' results
                print(f"{scenario} on {name}: {e}", file=sys.stderr, flush=True)
        raw += results
        if results:
            print(table(scenario, results, args), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(raw, f, indent=1)
    return 0 if raw and all(r["ok"] for r in raw) else 1


if __name__ == "__main__":
    sys.exit(main())
