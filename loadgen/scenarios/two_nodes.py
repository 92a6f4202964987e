#!/usr/bin/python3
"""One topic, 19,000 subscribers, 200 x 64 B published through the admin API: one embedded node,
or two nodes on the Redis bus sharing the port (--reuseport), side by side. Nodes on core 0,
loadgen and Redis on core 1. Server CPU per delivery = the nodes' run time (schedstat, every
thread) from the last moment nothing had been delivered (the delivery counters are sampled every
20 ms) to the end of the run, over the deliveries.
Usage, from the repository root after a build: loadgen/scenarios/two_nodes.py [--rounds N]"""
import subprocess, time, urllib.request, re, os, sys, threading
import argparse
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--server", default="build/server/wspush")
ap.add_argument("--loadgen", default="build/loadgen/wspush-loadgen")
ap.add_argument("--rounds", type=int, default=2)
args = ap.parse_args()
W, LG = args.server, args.loadgen
RPORT = 16460
def cpu(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try: total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except OSError: pass
    return total / 1e9
def deliveries(admin):
    t = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
    m = re.search(r"^wspush_fanout_deliveries_total (\S+)", t, re.M)
    return float(m.group(1)) if m else 0.0
def ready(admin):
    for _ in range(100):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz").status == 200: return
        except Exception: pass
        time.sleep(0.1)
    raise SystemExit("not ready")
def run(kind):
    procs = []
    redis = None
    if kind == "redis":
        redis = subprocess.Popen(["taskset","-c","1","redis-server","--port",str(RPORT),"--save","","--appendonly","no","--stream-node-max-bytes","512"], stdout=subprocess.DEVNULL)
        time.sleep(0.3)
    port = 9801
    n = 2 if kind == "redis" else 1
    admins = [9811 + k for k in range(n)]
    for k in range(n):
        extra = ["--bus", f"redis://127.0.0.1:{RPORT}", "--reuseport"] if kind == "redis" else []
        procs.append(subprocess.Popen(["taskset","-c","0",W,"--listen",f"127.0.0.1:{port}","--admin-listen",f"127.0.0.1:{admins[k]}","--auth=none","--threads","1",*extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for a in admins: ready(a)
    samples = []
    stop = threading.Event()
    def sampler():
        while not stop.is_set():
            samples.append((time.monotonic(), sum(deliveries(a) for a in admins), sum(cpu(p.pid) for p in procs)))
            time.sleep(0.02)
    t = threading.Thread(target=sampler); t.start()
    out = subprocess.run(["taskset","-c","1",LG,"fanout","--url",f"ws://127.0.0.1:{port}/ws","--admin",f"http://127.0.0.1:{admins[0]}","--connections","19000","--messages","200","--procs","2","--quiet","--drain-timeout","1"], capture_output=True, text=True).stdout
    stop.set(); t.join()
    after = (time.monotonic(), sum(deliveries(a) for a in admins), sum(cpu(p.pid) for p in procs))
    # From the last moment nothing had been delivered yet to the end of the run.
    start = max(i for i, s in enumerate(samples) if s[1] == samples[0][1])
    c = after[2] - samples[start][2]
    d = after[1] - samples[start][1]
    samples.append(after); end = len(samples) - 1
    lat = [l for l in out.splitlines() if "latency" in l or "delivered" in l]
    print(f"{kind}: nodes {n}, deliveries {d:.0f}, nodes' CPU {c:.2f} s over {samples[end][0]-samples[start][0]:.2f} s -> {c/d*1e6:.3f} µs per delivery")
    for l in lat: print("   ", l.strip())
    for p in procs: p.terminate(); p.wait()
    if redis: redis.terminate(); redis.wait()
for r in range(args.rounds):
    for kind in ("embedded", "redis"):
        run(kind)
