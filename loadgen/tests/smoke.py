#!/usr/bin/python3
"""Smoke run of wspush-loadgen against a freshly started wspush (ctest loadgen_smoke_*).

A few hundred connections for a few seconds; every published message must reach every
connection: loss 0, duplicates 0 (the load generator's exit status says so, and this script
checks its JSON too). Modes:
  broadcast  wspush --mode=broadcast, published over WebSocket (the peer protocol)
  pubsub     wspush --mode=pubsub: fanout and mailboxes through the admin API, and a client-side
             reconnect storm resumed with `since`; fanout with permessage-deflate (every event
             must come compressed), and over wss:// to a TLS server (every connection must have
             done its handshake); the same over event streams (--transport sse: fanout,
             mailboxes, the storm resumed with Last-Event-ID, and over https://), where nothing
             may be lost nor reported lost; skipped (77) while the server has no pubsub mode
  node       the Node `ws` peer (tests/bench/peers/node_ws_broadcast.mjs) with the peer protocol:
             the same tool must measure other servers too; skipped (77) without node or `npm ci`
Only processes started here are stopped, by PID.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading

LISTEN = re.compile(r"listening on ([0-9.]+):(\d+)")
ADMIN = re.compile(r"admin API at ([0-9.]+):(\d+)")
SKIP = 77
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def start_server(wspush, mode, io="uring", extra=()):
    argv = [wspush, f"--mode={mode}", "--auth=none", "--threads", "1", "--listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0", "--io", io, *extra]
    if mode == "pubsub":
        argv.append("--allow-client-publish")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ports, lines, seen = {}, [], threading.Event()

    def reader():
        for line in proc.stderr:
            lines.append(line.rstrip())
            for name, rx in (("ws", LISTEN), ("admin", ADMIN)):
                m = rx.search(line)
                if m and name not in ports:
                    ports[name] = int(m.group(2))
            if len(ports) == 2:
                seen.set()
        seen.set()   # EOF: the server exited
    threading.Thread(target=reader, daemon=True).start()
    seen.wait(timeout=20)   # the server's own log lines are the event we wait for
    if len(ports) < 2:
        stop(proc)
        raise RuntimeError("server did not report its ports:\n" + "\n".join(lines[-10:]))
    return proc, ports


def start_node_peer(node):
    peer = os.path.join(REPO, "tests", "bench", "peers", "node_ws_broadcast.mjs")
    proc = subprocess.Popen([node, peer, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO)
    for line in proc.stdout:   # its "listening on" line is the event we wait for
        m = LISTEN.search(line)
        if m:
            threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()
            return proc, {"ws": int(m.group(2))}
    stop(proc)
    raise RuntimeError("the Node ws peer did not report its port")


def node_smoke(args):
    import shutil
    node = shutil.which("node")
    if not node or not os.path.isdir(os.path.join(REPO, "node_modules", "ws")):
        print("node or node_modules/ws missing (npm ci): skipping")
        return SKIP
    proc, ports = start_node_peer(node)
    try:
        common = ["--url", f"ws://127.0.0.1:{ports['ws']}/", "--connections", str(args.connections), "--procs", "2",
                  "--server-pid", str(proc.pid), "--protocol", "broadcast"]
        ok = run_loadgen(args, ["fanout", "--messages", "50", "--publish-rate", "25"] + common, "node-fanout")
        return 0 if ok else 1
    finally:
        stop(proc)


def stop(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def run_loadgen(args, argv, name, want=None):
    """Runs one scenario; `want(counters)` returns what else is wrong with them (empty: nothing)."""
    report = os.path.join(args.out, f"{name}.html")
    cmd = [args.loadgen] + argv + ["--json", "--quiet", "--report", report, "--connect-timeout", "30",
                                   "--timeout", "60", "--drain-timeout", "3"]
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    sys.stderr.write(done.stderr)
    line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("{")), None)
    if line is None:
        print(f"{name}: no JSON result (exit {done.returncode})\n{done.stdout}")
        return False
    r = json.loads(line)
    c = r["counters"]
    # Publishing starts only once the last connection is up (settle_s is -1 when it started
    # before, or never); how long it then held is the load generator's own figure, reported below.
    settled = r["settle_s"] >= 0
    wrong = want(c) if want else ""
    if "--transport" in argv and r.get("transport") != argv[argv.index("--transport") + 1]:
        wrong = (wrong + "; " if wrong else "") + f"ran over {r.get('transport')}"
    good = (done.returncode == 0 and r["ok"] and r["loss"] == 0 and c["duplicates"] == 0
            and c["unique"] == c["expected"] > 0 and os.path.getsize(report) > 1000 and settled and not wrong)
    print(f"{name}: delivered {c['unique']}/{c['expected']}, loss {r['loss']}, duplicates {c['duplicates']}, "
          f"p99 {r['latency_us']['p99']:.0f} µs, first publish {r['settle_s']:.3f} s after all were up, "
          f"problems {r['problems']}{'; ' + wrong if wrong else ''}: {'ok' if good else 'FAILED'}", flush=True)
    return good


def nothing_lost(c):
    """Event streams: every stream subscribed and nothing was lost, nor reported lost."""
    told = c["lost_reported"] + c["lost_notices"] + c["untold_loss"]
    return "" if told == 0 and c["sub_errors"] == 0 else (
        f"lost reported {c['lost_reported']}, lost notices {c['lost_notices']}, untold {c['untold_loss']}, "
        f"sub errors {c['sub_errors']}")


def deflate_and_tls(args, common, admin):
    """permessage-deflate (events over --compression-min-bytes come compressed to every
    connection) on the running server, then wss:// against a TLS server of its own."""
    n = args.connections
    deflated = lambda c: "" if c["deflate_conns"] == n and c["compressed"] == c["unique"] else (  # noqa: E731
        f"negotiated on {c['deflate_conns']} of {n}, {c['compressed']} of {c['unique']} came compressed")
    ok = run_loadgen(args, ["fanout", "--admin", admin, "--messages", "40", "--publish-rate", "20", "--size", "600",
                            "--compression"] + common, "fanout-deflate", deflated)
    cert, key = os.path.join(args.out, "cert.pem"), os.path.join(args.out, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=30)
    proc, ports = start_server(args.wspush, "pubsub", extra=["--tls-cert", cert, "--tls-key", key])
    try:
        tls = ["--url", f"wss://127.0.0.1:{ports['ws']}/ws", "--connections", str(n), "--procs", "2",
               "--server-pid", str(proc.pid), "--admin", f"http://127.0.0.1:{ports['admin']}"]
        shook = lambda c: "" if c["tls_handshakes"] == n and c["err_tls"] == 0 else (  # noqa: E731
            f"{c['tls_handshakes']} TLS handshakes of {n}, {c['err_tls']} failed")
        ok = run_loadgen(args, ["fanout", "--messages", "40", "--publish-rate", "20", "--size", "600"] + tls,
                         "fanout-wss", shook) and ok
        both = lambda c: shook(c) or deflated(c)  # noqa: E731
        ok = run_loadgen(args, ["mailboxes", "--messages", "600", "--publish-rate", "300", "--size", "600",
                                "--compression"] + tls, "mailboxes-wss-deflate", both) and ok
        tls[1] = f"https://127.0.0.1:{ports['ws']}/sse"
        ok = run_loadgen(args, ["mailboxes", "--transport", "sse", "--messages", "600", "--publish-rate", "300",
                                "--size", "600"] + tls, "mailboxes-sse-https", lambda c: shook(c) or nothing_lost(c)) and ok
    finally:
        stop(proc)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["broadcast", "pubsub", "node"], required=True)
    p.add_argument("--wspush")
    p.add_argument("--loadgen", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--connections", type=int, default=300)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.mode == "node":
        return node_smoke(args)
    if args.mode == "pubsub":
        help_text = subprocess.run([args.wspush, "--help"], capture_output=True, text=True).stdout
        if "pubsub" not in help_text:
            print("wspush has no --mode=pubsub yet: skipping")
            return SKIP
    proc, ports = start_server(args.wspush, args.mode)
    url = f"ws://127.0.0.1:{ports['ws']}/ws"
    admin = f"http://127.0.0.1:{ports['admin']}"
    n = str(args.connections)
    common = ["--url", url, "--connections", n, "--procs", "2", "--server-pid", str(proc.pid)]
    try:
        if args.mode == "broadcast":
            runs = [("fanout", ["fanout", "--protocol", "broadcast", "--messages", "50", "--publish-rate", "25"]),
                    ("slow", ["slow-consumers", "--protocol", "broadcast", "--messages", "40", "--publish-rate", "40"])]
        else:
            runs = [("fanout", ["fanout", "--admin", admin, "--messages", "50", "--publish-rate", "25"]),
                    ("mailboxes", ["mailboxes", "--admin", admin, "--messages", "600", "--publish-rate", "300"]),
                    ("storm", ["reconnect-storm", "--admin", admin, "--messages", "60", "--publish-rate", "30",
                               "--storm-at", "1"]),
                    ("fanout-ws", ["fanout", "--publish-via", "ws", "--messages", "50", "--publish-rate", "25"])]
        ok = all([run_loadgen(args, argv + common, name) for name, argv in runs])
        if args.mode == "pubsub":
            # Event streams: the same accounting, each connection a GET of its topic's stream.
            sse = ["--transport", "sse", "--url", f"http://127.0.0.1:{ports['ws']}/sse", "--admin", admin] + common[2:]
            for name, argv in (("fanout-sse", ["fanout", "--messages", "50", "--publish-rate", "25"]),
                               ("mailboxes-sse", ["mailboxes", "--messages", "600", "--publish-rate", "300"]),
                               ("storm-sse", ["reconnect-storm", "--messages", "60", "--publish-rate", "30",
                                              "--storm-at", "1"])):
                ok = run_loadgen(args, argv + sse, name, nothing_lost) and ok
        if args.mode == "pubsub":
            ok = deflate_and_tls(args, common, admin) and ok
        # Churn on both backends: connections closing abruptly while others stay and receive.
        # (This caught slots released while still on a shard's flush list: the staying
        # connections stopped receiving, with io_uring already at 300 connections.)
        for io in ("uring", "epoll"):
            proc2, ports2 = start_server(args.wspush, args.mode, io=io)
            try:
                c2 = ["--url", f"ws://127.0.0.1:{ports2['ws']}/ws", "--connections", n, "--procs", "2"]
                if args.mode == "broadcast":
                    churn = ["churn", "--protocol", "broadcast"]
                else:
                    churn = ["churn", "--admin", f"http://127.0.0.1:{ports2['admin']}"]
                ok = run_loadgen(args, churn + ["--messages", "40", "--publish-rate", "20", "--churn-rate", "50"] + c2,
                                 f"churn-{io}") and ok
            finally:
                stop(proc2)
        # The failure path must be clear too: a port nobody listens on.
        bad = subprocess.run([args.loadgen, "idle", "--url", "ws://127.0.0.1:1/ws", "--connections", "1"],
                             capture_output=True, text=True, timeout=30)
        clear = bad.returncode == 2 and "unreachable" in bad.stderr
        print(f"unreachable server: exit {bad.returncode}, {bad.stderr.strip()!r}: {'ok' if clear else 'FAILED'}")
        return 0 if ok and clear else 1
    finally:
        stop(proc)


if __name__ == "__main__":
    sys.exit(main())
