#!/usr/bin/python3
"""Event streams (SSE) against WebSocket: the same mailboxes on the same node, side by side.

For each round it runs the load generator's `mailboxes` scenario against a fresh node once per
transport, alternating (round 1: ws then sse, round 2: sse then ws, ...): N connections, each
subscribed to its own mailbox (WebSocket: the upgrade and a `sub`; event stream: GET
/sse?topics=MAILBOX), held idle, then E events to every mailbox through the admin API (one per
POST /publish, or --publish-batch of them per POST /publish/batch). Per run it prints:

  - idle memory: the node's VmRSS read here before the load generator starts, and every 0.5 s
    once every connection is subscribed (wspush_subscriptions = N) while they are held idle;
    the growth per connection at the last reading, a second before --hold ends; beside it the
    load generator's own reading (--server-pid, at the end of --hold);
  - CPU per delivery: the node's CPU time (/proc/PID/stat utime+stime, the load generator's
    figure over its publish phase, as bus_vs_embedded.py reads it) divided by the events
    delivered (and how long the node's core was busy with anything else meanwhile: the
    machine is shared); latency p50/p99, what was delivered, lost and doubled.

Then the ratios SSE/WS of both figures, per round and over all rounds. The node is pinned to
--node-cpu with --threads 1, the load generator to --client-cpu. The node pings a silent
connection after --ping-interval; it is set past the run (--ping-interval 600) so that no
keepalive (a ping and its pong, or a comment) falls in the publish window of either transport.

  loadgen/scenarios/sse_vs_ws.py --wspush build/server/wspush
  loadgen/scenarios/sse_vs_ws.py --wspush build/server/wspush --rounds 3 --connections 19000 --events-per-mailbox 3
  loadgen/scenarios/sse_vs_ws.py --wspush build/server/wspush --publish-batch 64   # less of the admin API per event

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

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metric(port: int, name: str) -> float:
    """A metric's value summed over its labels; -1 while the node does not answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def core_busy(cpu: str) -> int:
    """Busy clock ticks of core `cpu` so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                return sum(v) - v[3] - v[4]
    return 0


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def run(a, transport: str) -> dict:
    port, aport = free_port(), free_port()
    srv = subprocess.Popen(["taskset", "-c", a.node_cpu, a.wspush, "--listen", f"127.0.0.1:{port}",
                            "--admin-listen", f"127.0.0.1:{aport}", "--auth=none", "--threads", "1", "--io", a.io,
                            "--ping-interval", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lg = None
    try:
        deadline = time.monotonic() + 30
        while metric(aport, "wspush_subscriptions") < 0:
            if time.monotonic() > deadline or srv.poll() is not None:
                raise RuntimeError("the node did not come up")
            time.sleep(0.05)
        time.sleep(0.5)
        before = rss(srv.pid)
        url = f"ws://127.0.0.1:{port}/ws" if transport == "ws" else f"http://127.0.0.1:{port}/sse"
        events = a.connections * a.events_per_mailbox
        lg = subprocess.Popen(["taskset", "-c", a.client_cpu, a.loadgen, "mailboxes", "--transport", transport,
                               "--url", url, "--admin", f"http://127.0.0.1:{aport}", "--connections",
                               str(a.connections), "--messages", str(events), "--procs", str(a.procs),
                               "--server-pid", str(srv.pid), "--hold", str(a.hold), "--json", "--quiet",
                               "--connect-timeout", "120", "--timeout", "180", "--pipeline", str(a.pipeline),
                               "--publish-batch", str(a.publish_batch)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Idle and subscribed: every connection's sub answered. Then the node's VmRSS every
        # 0.5 s while the load generator holds (/proc only: no scrape falls in the publish
        # window), until a second before its --hold ends.
        samples = []
        streams = -1
        deadline = time.monotonic() + 150
        while lg.poll() is None and time.monotonic() < deadline:
            if metric(aport, "wspush_subscriptions") >= a.connections:
                streams = metric(aport, "wspush_event_streams")
                up = time.monotonic()
                while time.monotonic() - up < a.hold - 1 and lg.poll() is None:
                    time.sleep(0.5)
                    samples.append(rss(srv.pid))
                break
            time.sleep(0.25)
        after = samples[-1] if samples else -1
        busy0, node0 = core_busy(a.node_cpu), cpu_ticks(srv.pid)
        stdout, stderr = lg.communicate(timeout=400)
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        others = ((core_busy(a.node_cpu) - busy0) - (cpu_ticks(srv.pid) - node0)) * tick_ms
    finally:
        if lg is not None and lg.poll() is None:
            os.kill(lg.pid, signal.SIGKILL)
            lg.wait()
        stop(srv)
    try:
        j = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"{transport}: the load generator gave no result: {stderr[-400:]}")
    c = j["counters"]
    return {
        "transport": transport,
        "rss_before": before,
        "rss_idle": after,
        "rss_samples": samples,
        "rss_per_conn": (after - before) / a.connections if after >= 0 else -1,
        "lg_rss_per_conn": j["server"]["rss_per_conn"],
        "event_streams": streams,
        "cpu_per_delivery_us": j["server"]["cpu_per_delivery_us"],
        "others_ms": others,
        "deliveries": c["deliveries"],
        "expected": c["expected"],
        "lost": j["loss"],
        "duplicates": c["duplicates"],
        "told_lost": c["lost_reported"] + c["lost_notices"],
        "connect_s": j["connect_s"],
        "publish_s": j["publish_s"],
        "p50_ms": j["latency_us"]["p50"] / 1000,
        "p99_ms": j["latency_us"]["p99"] / 1000,
        "ok": j["ok"],
        "problems": j["problems"],
    }


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if x > 0 and y > 0 else "n/a"


def show(rnd: int, r: dict) -> None:
    first = r["rss_samples"][0] if r["rss_samples"] else -1
    print(f"round {rnd} {r['transport']:>3}: idle RSS {r['rss_before'] / 2**20:.1f} -> {r['rss_idle'] / 2**20:.1f} MiB "
          f"(0.5 s after all subscribed: {first / 2**20:.1f}), "
          f"{r['rss_per_conn']:.0f} B/connection (load generator: {r['lg_rss_per_conn']:.0f}), event streams "
          f"{r['event_streams']:.0f}; CPU {r['cpu_per_delivery_us']:.2f} us/delivery (the node's core busy "
          f"{r['others_ms']:.0f} ms on other work from the hold to the end); delivered "
          f"{r['deliveries']}/{r['expected']}, lost {r['lost']}, doubled {r['duplicates']}, told lost "
          f"{r['told_lost']}; connect {r['connect_s']:.1f} s, publish {r['publish_s']:.2f} s, p50 {r['p50_ms']:.1f} ms, "
          f"p99 {r['p99_ms']:.1f} ms{'' if r['ok'] else '; FAILED: ' + '; '.join(r['problems'])}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wspush", required=True, help="the wspush binary")
    p.add_argument("--loadgen", default=os.path.join(REPO, "build", "loadgen", "wspush-loadgen"))
    p.add_argument("--connections", type=int, default=19000, help="mailboxes, one connection each")
    p.add_argument("--events-per-mailbox", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--procs", type=int, default=2, help="load generator worker processes")
    p.add_argument("--hold", type=float, default=8, help="seconds held idle before publishing")
    p.add_argument("--io", default="uring", choices=["uring", "epoll"])
    p.add_argument("--pipeline", type=int, default=32, help="admin publish requests in flight (the load generator's)")
    p.add_argument("--publish-batch", type=int, default=1, help="events per admin request (POST /publish/batch above 1)")
    p.add_argument("--node-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--json", help="write every run's figures here")
    a = p.parse_args()
    runs = []
    for rnd in range(1, a.rounds + 1):
        pair = {}
        for transport in ("ws", "sse") if rnd % 2 else ("sse", "ws"):
            r = run(a, transport)
            r["round"] = rnd
            runs.append(r)
            pair[transport] = r
            show(rnd, r)
        ws, sse = pair["ws"], pair["sse"]
        print(f"round {rnd} SSE/WS: idle memory {ratio(sse['rss_per_conn'], ws['rss_per_conn'])}, "
              f"CPU per delivery {ratio(sse['cpu_per_delivery_us'], ws['cpu_per_delivery_us'])}", flush=True)

    def mean(t: str, k: str) -> float:
        v = [r[k] for r in runs if r["transport"] == t]
        return sum(v) / len(v)

    print(f"mean of {a.rounds} rounds: idle memory ws {mean('ws', 'rss_per_conn'):.0f} B, sse "
          f"{mean('sse', 'rss_per_conn'):.0f} B per connection (SSE/WS "
          f"{ratio(mean('sse', 'rss_per_conn'), mean('ws', 'rss_per_conn'))}); CPU ws "
          f"{mean('ws', 'cpu_per_delivery_us'):.2f}, sse {mean('sse', 'cpu_per_delivery_us'):.2f} us per delivery "
          f"(SSE/WS {ratio(mean('sse', 'cpu_per_delivery_us'), mean('ws', 'cpu_per_delivery_us'))})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0 if all(r["ok"] and r["lost"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
