#!/usr/bin/python3
"""Whole-system benchmarks of wspush against its peer (Node `ws`), issue 2.

Starts each server in broadcast mode pinned to one core, drives it with ws_bench_client pinned
to another, and prints a markdown table with ratios against node-ws:

  idle   server memory per idle connection (VmRSS, smaps_rollup Rss / Private_Dirty deltas / N)
         and the kernel side (/proc/meminfo Slab delta / N; both socket ends, system wide)
  burst  one client sends B x SIZE-byte messages; deliveries/s, latency p50/p99, loss
  rate   M messages/s for S seconds; latency p50/p99, server CPU (utime+stime) per delivery

Every server gets a fresh process per scenario. Only processes started here are stopped, by
PID, always. Run with /usr/bin/python3 from anywhere; see --help.

  tests/bench/system_bench.py --servers wspush-uring,wspush-epoll,node-ws
  tests/bench/system_bench.py --quick            # N = 2,000, short rate run
  tests/bench/system_bench.py --smoke --servers node-ws   # ctest: a tiny fan-out must be lossless
"""

import argparse
import datetime
import json
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEER = os.path.join(REPO, "tests", "bench", "peers", "node_ws_broadcast.mjs")
LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
SKIP = 77


class Proc:
    """A child process whose output lines are collected by a thread (so pipes never fill)."""

    def __init__(self, argv, cwd=None, stdin=None, merge_stderr=True):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else None, text=True, bufsize=1)
        self.pid = self.popen.pid
        self.lines = []
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self):
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_line(self, pattern, timeout):
        """Next line matching pattern (a compiled regex); None on EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            m = pattern.search(line)
            if m:
                return m

    def finish(self, timeout):
        """Wait for exit; returns the exit code (kills our own process if it overstays)."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._thread.join(timeout=5)
        return self.popen.returncode

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after timeout; only this process, by PID."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return self.finish(timeout)

    def tail(self, n=15):
        return "\n".join(self.lines[-n:])


def pin(core):
    return ["taskset", "-c", str(core)] if core is not None else []


def server_argv(name, args):
    if name == "node-ws":
        return pin(args.server_cpu) + [args.node, PEER, "--port", "0"]
    io = name.split("-", 1)[1]
    return pin(args.server_cpu) + [args.wspush, "--mode=broadcast", "--auth=none", "--admin-listen", "127.0.0.1:0", "--threads", "1",
                                   "--io", io, "--listen", "127.0.0.1:0"]


def start_server(name, args):
    """Starts one server and waits for its `listening on` line. Returns (Proc, port, notes)."""
    proc = Proc(server_argv(name, args), cwd=REPO)
    m = proc.wait_line(LISTENING, 30)
    if not m:
        proc.stop()
        raise RuntimeError(f"{name} did not report listening:\n{proc.tail()}")
    notes = []
    if name == "wspush-uring" and not any("io backend: uring" in line for line in proc.lines):
        notes.append("fell back to epoll")
    return proc, int(m.group(2)), notes


def run_client(args, mode, port, extra, stdin=None):
    argv = pin(args.client_cpu) + [args.client, mode, "--url", f"ws://127.0.0.1:{port}/",
                                   "--connections", str(args.connections), "--procs", str(args.procs),
                                   "--json"] + [str(x) for x in extra]
    return Proc(argv, stdin=stdin, merge_stderr=False)


def client_result(client, timeout):
    code = client.finish(timeout)
    for line in reversed(client.lines):
        if line.startswith("{"):
            result = json.loads(line)
            result["exit_code"] = code
            return result
    raise RuntimeError(f"client printed no result (exit {code}):\n{client.tail()}")


# ---------------------------------------------------------------------------------------------
# /proc readings

def rss_of(pid):
    """VmRSS, and Rss / Private_Dirty from smaps_rollup, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["vmrss"] = int(line.split()[1]) * 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Private_Dirty"):
                    out[key.lower()] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def slab_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Slab:"):
                return int(line.split()[1]) * 1024
    return 0


def settled_rss(pid, max_wait):
    """Samples RSS until two readings 0.5 s apart differ by < 0.5% (or max_wait passes).
    A benchmark measurement, not a test: the server has no 'memory settled' event to await."""
    prev = rss_of(pid)
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        time.sleep(0.5)
        cur = rss_of(pid)
        if abs(cur["vmrss"] - prev["vmrss"]) <= 0.005 * max(prev["vmrss"], 1):
            return cur
        prev = cur
    return prev


# ---------------------------------------------------------------------------------------------
# Scenarios

def scenario_idle(name, args):
    server, port, notes = start_server(name, args)
    try:
        time.sleep(1.0)   # let start-up allocations finish before the baseline
        before, slab_before = rss_of(server.pid), slab_bytes()
        client = run_client(args, "hold", port, [], stdin=subprocess.PIPE)
        try:
            m = client.wait_line(re.compile(r"^(connected|connect_failed) "), args.connect_timeout)
            if not m or m.group(1) != "connected":
                raise RuntimeError(f"{name}: connections did not come up:\n{client.tail()}")
            after = settled_rss(server.pid, args.settle_seconds)
            slab_after = slab_bytes()
        finally:
            client.popen.stdin.close()
        result = client_result(client, 120)
        n = args.connections
        per = {k: (after[k] - before[k]) / n for k in after if k in before}
        return {"server": name, "notes": notes, "before": before, "after": after,
                "per_conn": per, "slab_per_conn": (slab_after - slab_before) / n, "client": result}
    finally:
        server.stop()


def scenario_fanout(name, args, mode):
    server, port, notes = start_server(name, args)
    try:
        if mode == "burst":
            extra = ["--burst", args.burst, "--size", args.size]
            mode_arg, limit = "fanout", args.run_timeout
        else:
            extra = ["--rate", args.rate, "--seconds", args.seconds, "--size", args.size]
            mode_arg, limit = "rate", args.run_timeout + args.seconds
        extra += ["--server-pid", server.pid, "--timeout", limit, "--connect-timeout", args.connect_timeout]
        client = run_client(args, mode_arg, port, extra)
        result = client_result(client, args.connect_timeout + limit + 60)
        return {"server": name, "notes": notes, "client": result}
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Report

def fmt_ratio(value, base, lower_is_better=True):
    if not base or value is None:
        return ""
    return f" ({value / base:.2f}x)"


def table(title, header, rows):
    out = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def idle_table(results, args):
    base = next((r for r in results if r["server"] == "node-ws"), None)
    rows = []
    for r in results:
        p, b = r["per_conn"], base["per_conn"] if base else {}
        c = r["client"]
        errs = ", ".join(f"{k}={v}" for k, v in c["connect_errors"].items()) or "none"
        rows.append([r["server"] + (" (" + ", ".join(r["notes"]) + ")" if r["notes"] else ""),
                     f"{p['vmrss']:.0f} B" + fmt_ratio(p["vmrss"], b.get("vmrss")),
                     f"{p.get('rss', 0):.0f} B", f"{p.get('private_dirty', 0):.0f} B",
                     f"{r['slab_per_conn']:.0f} B",
                     f"{r['before']['vmrss'] / 1048576:.1f} → {r['after']['vmrss'] / 1048576:.1f} MiB",
                     f"{c['connected']}/{args.connections}, errors: {errs}"])
    return table(f"idle: memory per connection, N = {args.connections}",
                 ["server", "VmRSS Δ/N (vs node-ws)", "Rss Δ/N", "Private_Dirty Δ/N",
                  "kernel Slab Δ/N (both ends)", "VmRSS before → after", "connected"], rows)


def run_table(results, args, mode):
    base = next((r["client"] for r in results if r["server"] == "node-ws"), None)
    rows = []
    for r in results:
        c = r["client"]
        lat = c["latency_us"]
        cpu = c.get("server_cpu_per_delivery_us")
        rows.append([
            r["server"] + (" (" + ", ".join(r["notes"]) + ")" if r["notes"] else ""),
            f"{c['deliveries_per_s']:,.0f}" + fmt_ratio(c["deliveries_per_s"], base and base["deliveries_per_s"]),
            f"{lat['p50'] / 1000:.1f}" + fmt_ratio(lat["p50"], base and base["latency_us"]["p50"]),
            f"{lat['p99'] / 1000:.1f}" + fmt_ratio(lat["p99"], base and base["latency_us"]["p99"]),
            f"{cpu:.2f}" + fmt_ratio(cpu, base and base.get("server_cpu_per_delivery_us")) if cpu is not None else "n/a",
            f"{c['unique']:,}/{c['expected']:,}", f"{c['loss']:,}",
            "ok" if c["ok"] else "FAILED"])
    if mode == "burst":
        title = f"burst: {args.burst} x {args.size} B to N = {args.connections}"
    else:
        title = f"rate: {args.rate} msg/s for {args.seconds} s to N = {args.connections}"
    return table(title, ["server", "deliveries/s", "p50 ms", "p99 ms", "server CPU µs/delivery",
                         "delivered", "loss", "run"], rows)


def machine_info():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg_at_start": load}


# ---------------------------------------------------------------------------------------------
# Main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="wspush-uring,wspush-epoll,node-ws",
                   help="comma list of wspush-uring, wspush-epoll, node-ws")
    p.add_argument("--scenarios", default="idle,burst,rate", help="comma list of idle, burst, rate")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build-bench"))
    p.add_argument("--wspush", help="server binary (default BUILD/server/wspush)")
    p.add_argument("--client", help="ws_bench_client (default BUILD/tests/bench/ws_bench_client)")
    p.add_argument("--node", default=shutil.which("node") or "node")
    p.add_argument("--connections", type=int, default=19000)
    p.add_argument("--procs", type=int, default=0, help="client processes (default: 1 per 4,750)")
    p.add_argument("--burst", type=int, default=200)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--rate", type=float, default=2)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--connect-timeout", type=float, default=120)
    p.add_argument("--run-timeout", type=float, default=180)
    p.add_argument("--settle-seconds", type=float, default=10)
    p.add_argument("--quick", action="store_true", help="N = 2,000 and a 5 s rate run")
    p.add_argument("--smoke", action="store_true", help="tiny lossless fan-out per server (ctest)")
    p.add_argument("--json-out", help="also write all raw results to this file")
    args = p.parse_args(argv)
    args.wspush = args.wspush or os.path.join(args.build_dir, "server", "wspush")
    args.client = args.client or os.path.join(args.build_dir, "tests", "bench", "ws_bench_client")
    if args.quick:
        args.connections, args.seconds = 2000, 5
    if args.smoke:
        args.connections, args.burst, args.seconds, args.rate = 40, 20, 1, 5
    args.procs = args.procs or max(1, -(-args.connections // 4750))
    if (os.cpu_count() or 1) < 2:
        args.server_cpu = args.client_cpu = None   # nothing to pin apart
    return args


def available(name, args):
    """Why a server cannot run here, or None."""
    if name == "node-ws":
        if not shutil.which(args.node) and not os.path.exists(args.node):
            return "node not found"
        if not os.path.isdir(os.path.join(REPO, "node_modules", "ws")):
            return "node_modules/ws missing (run npm ci)"
        return None
    if name in ("wspush-uring", "wspush-epoll"):
        return None if os.access(args.wspush, os.X_OK) else f"{args.wspush} not built"
    return "unknown server"


def smoke(args, servers):
    """Each server must deliver every message of a small burst and a short rate run."""
    failures = 0
    for name in servers:
        for mode in ("burst", "rate"):
            r = scenario_fanout(name, args, mode)["client"]
            good = r["ok"] and r["loss"] == 0 and r["unique"] == r["expected"] > 0
            print(f"{name} {mode}: delivered {r['unique']}/{r['expected']}, loss {r['loss']}, "
                  f"duplicates {r['duplicates']}, exit {r['exit_code']}: {'ok' if good else 'FAILED'}")
            failures += 0 if good else 1
    return 1 if failures else 0


def main(argv):
    args = parse_args(argv)
    wanted = [s for s in args.servers.split(",") if s]
    servers = []
    for name in wanted:
        why = available(name, args)
        if why:
            print(f"skipping {name}: {why}", file=sys.stderr)
        else:
            servers.append(name)
    if not servers:
        return SKIP
    if not os.access(args.client, os.X_OK):
        print(f"{args.client} not built", file=sys.stderr)
        return SKIP if args.smoke else 2
    if args.smoke:
        return smoke(args, servers)
    info = machine_info()
    print(f"command: {shlex.join([sys.executable, sys.argv[0]] + argv)}  (cwd {os.getcwd()})")
    print(f"machine: nproc {info['nproc']}, kernel {info['kernel']}, CPU {info['cpu']}, "
          f"load at start {info['loadavg_at_start']}, {info['date']}")
    print(f"servers pinned to CPU {args.server_cpu}, client ({args.procs} procs) to CPU {args.client_cpu}\n",
          flush=True)
    raw = {"command": argv, "machine": info, "results": {}}
    for scenario in [s for s in args.scenarios.split(",") if s]:
        results = []
        for name in servers:
            print(f"... {scenario} on {name}", file=sys.stderr, flush=True)
            if scenario == "idle":
                results.append(scenario_idle(name, args))
            else:
                results.append(scenario_fanout(name, args, scenario))
        raw["results"][scenario] = results
        print(idle_table(results, args) if scenario == "idle" else run_table(results, args, scenario), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
