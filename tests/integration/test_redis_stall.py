#!/usr/bin/python3
"""The admin listener while Redis stalls: a real redis-server frozen with SIGSTOP under a wspush
node on the Redis bus, and a 200-line `POST /publish/batch` in flight.

- every `/healthz` and `/readyz` probe on a fresh connection is answered at once (within 2 s,
  scaled: a check that stops a hang, not a speed check): the admin listener never waits on Redis;
- the batch is answered once its 5 s wait for Redis has run out: every line `timeout` (handed to
  Redis, it may have been published), not a hang for as long as Redis stays frozen;
- `/readyz` answers 503 `{"status":"bus_stalled"}` once Redis has left a command unanswered longer
  than `--redis-timeout` (checked when the node has that option);
- once Redis resumes, `/readyz` is 200 again and a publish goes through.
The admin listener runs on epoll whatever `--io` says: one run is enough.
Exit 0 pass, 1 fail.
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import ServerProcess, admin_port, arg_parser, check, publish_ok, run_main, scaled  # noqa: E402

LINES = 200
PROBES = 12
PUBLISH_WAIT = 5  # seconds an admin publish waits for Redis before 504 (server/admin/admin_server.hpp)


def get(port: int, path: str, timeout: float) -> "tuple[int, str]":
    """One GET on a fresh connection; (0, why) when no answer came within `timeout`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    except OSError as exc:  # socket.timeout is an OSError
        return 0, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


class Batch(threading.Thread):
    """POST /publish/batch of LINES lines; keeps the answer (status, body) and when it came."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.answer: "tuple[int, str] | None" = None
        self.error = ""
        self.done = threading.Event()
        self.sent_at = 0.0
        self.answered_at = 0.0

    def run(self) -> None:
        body = "\n".join(json.dumps({"topic": f"stall:{k % 7}", "data": {"n": k}}) for k in range(LINES)).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=scaled(60))
        try:
            self.sent_at = time.monotonic()
            conn.request("POST", "/publish/batch", body=body)
            resp = conn.getresponse()
            self.answer = (resp.status, resp.read().decode())
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.answered_at = time.monotonic()
            conn.close()
            self.done.set()


def has_redis_timeout(binary: str) -> bool:
    """Whether the node judges a stall (--redis-timeout): only then can /readyz say bus_stalled."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=scaled(10)).stdout
    return "--redis-timeout" in out


def wait_readyz(port: int, want: int, seconds: float) -> "tuple[int, str]":
    # Poll until /readyz says `want`: the node reconnects (and judges a stall) on its own timers.
    deadline = time.monotonic() + scaled(seconds)
    while True:
        r = get(port, "/readyz", scaled(2))
        if r[0] == want or time.monotonic() >= deadline:
            return r
        time.sleep(0.05)


def stall(args) -> None:
    judges_stall = has_redis_timeout(args.server)
    rs = RedisServer(persistent=False).start()
    node = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", rs.url, "--threads", "1"]).start()
    port = admin_port(node)
    check(wait_readyz(port, 200, 30)[0] == 200, "the node did not become ready\n" + node.log_tail())
    publish_ok(node, "stall:0", "warm")
    batch = Batch(port)
    os.kill(rs.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        batch.start()
        probes = []  # (path, status, body, seconds)
        stalled_seen = False
        # Probe until PROBES probes are in, the batch has its answer and (when the node judges
        # stalls) /readyz has said bus_stalled; at most 20 s (scaled), so a node that hangs fails
        # with the figures rather than the ctest timeout.
        give_up = stopped_at + scaled(20)
        while time.monotonic() < give_up and (len(probes) < PROBES or not batch.done.is_set()
                                              or (judges_stall and not stalled_seen)):
            path = "/healthz" if len(probes) % 2 == 0 else "/readyz"
            t0 = time.monotonic()
            status, body = get(port, path, scaled(2))
            probes.append((path, status, body, time.monotonic() - t0))
            stalled_seen |= path == "/readyz" and status == 503 and "bus_stalled" in body
            if len(probes) >= PROBES:
                # Enough probes for the first check: from here wait on the batch (an event).
                batch.done.wait(0.1)
        frozen_for = time.monotonic() - stopped_at
    finally:
        os.kill(rs.proc.pid, signal.SIGCONT)
    batch.done.wait(scaled(30))
    unanswered = [p for p in probes if p[1] == 0]
    slowest = max(p[3] for p in probes)
    print(f"  Redis frozen {frozen_for:.1f}s: {len(probes)} probes, {len(unanswered)} unanswered within "
          f"{scaled(2):.0f}s, slowest {slowest:.3f}s; batch answered after "
          f"{(batch.answered_at - batch.sent_at) if batch.done.is_set() else float('nan'):.1f}s", flush=True)
    check(len(probes) >= PROBES and not unanswered,
          f"{len(unanswered)} of {len(probes)} /healthz and /readyz probes got no answer within {scaled(2):.0f}s "
          f"while Redis was frozen (first: {unanswered[0] if unanswered else None})")
    for path, status, body, _ in probes:
        if path == "/healthz":
            check(status == 200 and body == '{"status":"ok"}', f"/healthz answered {status} {body}")
        else:
            check(status == 200 or (status == 503 and "bus_stalled" in body), f"/readyz answered {status} {body}")
    # The batch: answered once its wait ran out while Redis was still frozen, every line handed to
    # Redis and unanswered: 504-like `timeout` entries (it may have been published).
    check(batch.done.is_set() and batch.answer is not None, f"the batch got no answer: {batch.error}")
    took = batch.answered_at - batch.sent_at
    check(batch.answered_at < stopped_at + frozen_for + 0.5,
          f"the batch was answered only after Redis resumed ({took:.1f}s)")
    check(took >= PUBLISH_WAIT - 0.5, f"the batch was answered after {took:.1f}s, before its {PUBLISH_WAIT}s wait")
    status, body = batch.answer
    results = json.loads(body).get("results", []) if status in (200, 503, 504) else []
    check(status in (200, 503, 504) and len(results) == LINES,
          f"the batch answered {status} with {len(results)} results: {body[:200]}")
    check(all(r.get("error") == "timeout" for r in results),
          f"batch results while Redis was frozen: {[r for r in results if r.get('error') != 'timeout'][:3]}")
    if judges_stall:
        check(stalled_seen, "/readyz never said 503 bus_stalled while Redis was frozen "
                            f"{frozen_for:.1f}s: {[p for p in probes if p[0] == '/readyz'][-3:]}")
    else:
        print("  (this node has no --redis-timeout: /readyz's bus_stalled is not checked)", flush=True)
    # Redis back: ready again, and publishes go through.
    r = wait_readyz(port, 200, 30)
    check(r[0] == 200, f"/readyz after Redis resumed: {r}")
    publish_ok(node, "stall:1", "after")
    check(node.alive(), "the node exited")
    node.kill()
    rs.close()


def main(args) -> None:
    stall(args)
    print("ok - the admin listener answers while Redis is frozen", flush=True)


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
