#!/usr/bin/python3
"""permessage-deflate side by side: bytes on the wire and server CPU, with and without it.

For each event size it runs, each on a fresh server pinned to one core with wspush-loadgen on
the other (run_standard.py's way):
  fanout     N subscribers of one topic, a burst of --messages events (wspush-pubsub through the
             admin API; wspush-broadcast and any --peer-cmd through a WebSocket client);
  mailboxes  N connections, one topic each, one event per mailbox (wspush-pubsub);
once with clients that do not offer the extension and once with clients that do (loadgen
--compression, as browsers do). wspush's server stays at its defaults (--compression on): with
no client that negotiated, it compresses nothing.

Reported per run: server CPU per delivery and per published event (the server's CPU time over
the run, from /proc, divided), how many events wspush compressed and their payload before and
after, wire bytes per delivery (wspush: its bytes_out over its messages_out, which also counts
each connection's 101 and sub reply: in mailboxes, one event per connection, those weigh as much
as the event), and latency. The latency is the load generator's as much as the server's: with
--compression it inflates every message it checks on its one core.

  loadgen/scenarios/compression.py                      # 19,000 connections, 100 B, 300 B, 1 KiB
  loadgen/scenarios/compression.py --quick
  loadgen/scenarios/compression.py --peer-cmd 'uws=/opt/peers/uws_broadcast {port}' \\
      --peer-cmd 'uws-z=/opt/peers/uws_broadcast_z {port}'   # peers built outside the repository
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_standard as rs  # noqa: E402


def metrics(server):
    if "admin" not in server.ports:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['admin']}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(wspush_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def run(name, scenario, size, compressed, args):
    server = rs.Server(name, args)
    try:
        kind = name.split("=")[0].split(":")[-1]
        pubsub = kind.startswith("wspush-pubsub")
        messages = args.messages if scenario == "fanout" else args.connections
        argv = [args.loadgen, scenario, "--url", f"ws://{server.host}:{server.ports['ws']}/ws",
                "--connections", str(args.connections), "--messages", str(messages), "--size", str(size),
                "--json", "--quiet", "--connect-timeout", "120", "--timeout", "300", "--drain-timeout", "60",
                "--server-pid", str(server.pid)]
        if scenario == "mailboxes":
            argv += ["--publish-rate", str(args.mailbox_rate)]
        argv += (["--admin", f"http://127.0.0.1:{server.ports['admin']}", "--jwt-secret", rs.SECRET] if pubsub
                 else ["--protocol", "broadcast"])
        if compressed:
            argv += ["--compression"]
        pin = ["taskset", "-c", str(args.client_cpu)] if args.client_cpu is not None else []
        print("+ " + " ".join(argv[1:]), file=sys.stderr, flush=True)
        before = metrics(server)
        done = subprocess.run(pin + argv, capture_output=True, text=True, timeout=900)
        after = metrics(server)
        line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("{")), None)
        if not line:
            raise RuntimeError(f"no result (exit {done.returncode}): {done.stderr[-500:]}")
        r = json.loads(line)
        c = r["counters"]
        cpu_us = r["server"].get("cpu_per_delivery_us", -1)
        deliveries = c["unique"]
        d = lambda k: after.get(k, 0) - before.get(k, 0)  # noqa: E731
        sent = d("wspush_messages_out_total")
        return {
            "server": kind, "scenario": scenario, "size": size, "compressed": compressed, "ok": r["ok"],
            "deliveries": deliveries, "expected": c["expected"], "messages": messages,
            "negotiated": c.get("deflate_conns", 0), "came_compressed": c.get("compressed", 0),
            "cpu_per_delivery_us": cpu_us,
            "cpu_per_event_us": cpu_us * deliveries / messages if cpu_us >= 0 else -1,
            "wire_bytes": d("wspush_bytes_out_total") / sent if sent else None,
            "events_compressed": d("wspush_compressed_events_total") if after else None,
            "payload_before": d('wspush_compression_bytes_total{stage="before"}'),
            "payload_after": d('wspush_compression_bytes_total{stage="after"}'),
            "p50_ms": r["latency_us"]["p50"] / 1000, "p99_ms": r["latency_us"]["p99"] / 1000,
        }
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(rs.REPO, "build"))
    p.add_argument("--servers", default="wspush-pubsub,wspush-broadcast")
    p.add_argument("--peer-cmd", action="append", default=[], help="NAME=COMMAND of a broadcast peer ({port})")
    p.add_argument("--sizes", default="100,300,1024")
    p.add_argument("--scenarios", default="fanout,mailboxes")
    p.add_argument("--connections", type=int, default=19000)
    p.add_argument("--messages", type=int, default=200, help="fanout: events in the burst")
    p.add_argument("--mailbox-rate", type=float, default=2000)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2,000 connections, 50 events")
    p.add_argument("--json-out")
    args = p.parse_args()
    args.wspush = os.path.join(args.build_dir, "server", "wspush")
    args.loadgen = os.path.join(args.build_dir, "loadgen", "wspush-loadgen")
    args.node = "node"
    if args.quick:
        args.connections, args.messages = 2000, 50
    names = [s for s in args.servers.split(",") if s] + [f"cmd:{c}" for c in args.peer_cmd]
    print(f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node()}, "
          f"{os.cpu_count()} cores; servers on CPU {args.server_cpu}, wspush-loadgen on CPU {args.client_cpu}.\n")
    print(f"Command: `{' '.join([os.path.relpath(sys.argv[0], rs.REPO)] + sys.argv[1:])}`\n")
    rows = []
    for scenario in args.scenarios.split(","):
        for size in [int(s) for s in args.sizes.split(",")]:
            for name in names:
                if scenario == "mailboxes" and not name.startswith("wspush-pubsub"):
                    continue
                for compressed in (False, True):
                    try:
                        rows.append(run(name, scenario, size, compressed, args))
                        print("= " + json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each as it ends
                    except Exception as e:  # one failing run must not hide the others
                        print(f"{scenario} {size} B on {name} ({'deflate' if compressed else 'plain'}): {e}",
                              file=sys.stderr, flush=True)
    print("| scenario | server | event B | clients | negotiated | came compressed | compressed once (payload B before → after) | "
          "wire B per delivery | CPU µs per delivery | CPU µs per event | p50 ms | p99 ms | delivered | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        wire = f"{r['wire_bytes']:.0f}" if r["wire_bytes"] else "–"
        n = r["events_compressed"]
        once = (f"{n:,.0f} ({r['payload_before'] / n:.0f} → {r['payload_after'] / n:.0f})" if n
                else "0" if n is not None else "–")
        print(f"| {r['scenario']} | {r['server']} | {r['size']} | {'deflate' if r['compressed'] else 'plain'} | "
              f"{r['negotiated']:,} | {r['came_compressed']:,} | {once} | {wire} | {r['cpu_per_delivery_us']:.3f} | "
              f"{r['cpu_per_event_us']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['deliveries']:,} / {r['expected']:,} | {'ok' if r['ok'] else 'FAIL'} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
