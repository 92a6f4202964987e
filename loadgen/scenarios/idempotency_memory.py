#!/usr/bin/python3
"""What the embedded bus's idempotency keys cost the node's memory: a fresh wspush (embedded bus,
--history-size 0 so that no event is kept, one thread), N publishes over T topics through
/publish/batch, each with a key of its own (36 bytes, a UUID's length) or none, and the process's
resident memory (VmRSS) before and after, per key remembered (wspush_idempotency_keys).

  loadgen/scenarios/idempotency_memory.py --wspush build/server/wspush
  loadgen/scenarios/idempotency_memory.py --wspush build/server/wspush --keys 131072 --topics 10

Only the process started here is stopped (by PID).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0


def run(binary: str, n: int, topics: int, keyed: bool) -> "tuple[int, float]":
    p = subprocess.Popen([binary, "--auth=none", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                          "--threads", "1", "--io", "epoll", "--history-size", "0"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = 0
        while not port:
            line = p.stderr.readline()
            if not line:
                raise SystemExit("wspush exited")
            m = re.search(r"admin API at [0-9.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
        for _ in range(3):  # warm: the parsers' buffers, the pools
            post(port, 1000, topics, False, 10**9)
        time.sleep(0.5)
        before = rss(p.pid)
        for start in range(0, n, 1000):
            post(port, min(1000, n - start), topics, keyed, start)
        time.sleep(0.5)
        after = rss(p.pid)
        return after - before, metric(port, "wspush_idempotency_keys")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def post(port: int, count: int, topics: int, keyed: bool, start: int) -> None:
    lines = []
    for i in range(start, start + count):
        line = {"topic": f"box:{i % topics}", "data": {"n": i}}
        if keyed:
            line["idempotency_key"] = f"00000001-0000-4000-8000-{i:012x}"
        lines.append(json.dumps(line))
    req = urllib.request.Request(f"http://127.0.0.1:{port}/publish/batch", data="\n".join(lines).encode())
    urllib.request.urlopen(req, timeout=30).read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wspush", required=True)
    ap.add_argument("--keys", type=int, default=100000, help="publishes, each with a key of its own")
    ap.add_argument("--topics", type=int, default=19000)
    a = ap.parse_args()
    plain, _ = run(a.wspush, a.keys, a.topics, False)
    grown, kept = run(a.wspush, a.keys, a.topics, True)
    print(f"{a.keys} publishes over {a.topics} topics: RSS grew {plain / 1e6:.1f} MB without keys, "
          f"{grown / 1e6:.1f} MB with a key each; {kept:.0f} keys remembered, "
          f"{(grown - plain) / max(kept, 1):.0f} bytes each", flush=True)


if __name__ == "__main__":
    sys.exit(main())
