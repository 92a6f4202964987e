#!/usr/bin/python3
"""The admin listener of the real binary: /healthz and /readyz answer 200; /metrics is valid
Prometheus text whose counters match what the test did (connections by state, upgrades by result,
messages and bytes in and out, pool series); the publish endpoints answer 503 in echo mode (no
pub/sub); on SIGTERM /readyz turns 503 while the connections drain, and the process exits 0; an
admin address already taken stops the start with exit 1 and says so (no abort).
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import os
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, arg_parser, check, http_exchange,  # noqa: E402
                         http_request, run_main, run_step, scaled, upgrade_request)
from wsp_testlib import scrape_metrics as metrics  # noqa: E402

def get(port: int, path: str, method: str = "GET", body: bytes = b"") -> tuple[int, str]:
    return http_request(port, method, path, body)


def counters_match_traffic(server: ServerProcess, admin: int) -> None:
    check(get(admin, "/healthz")[0] == 200, "/healthz is not 200")
    check(get(admin, "/readyz")[0] == 200, "/readyz is not 200 while serving")
    before = metrics(admin)
    clients = [RawWebSocket(server.port).open() for _ in range(3)]
    for ws in clients:
        for k in range(5):
            ws.send_frame(OP_TEXT, f"message {k}".encode())
            ws.expect_message(OP_TEXT, f"message {k}".encode())
    bad = http_exchange(server.port, upgrade_request("/ws", version="8"))
    check(bad.status == 426, f"a bad upgrade got {bad.status}")
    after = metrics(admin)
    delta = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
    expect = {
        'wspush_connections{state="open"}': 3,
        'wspush_upgrades_total{result="ok"}': 3,
        'wspush_upgrades_total{result="bad_request"}': 1,
        "wspush_messages_in_total": 15,
        "wspush_messages_out_total": 15,
        "wspush_connections_accepted_total": 4,
    }
    for name, want in expect.items():
        check(delta(name) == want, f"{name} moved by {delta(name)}, expected {want}")
    check(delta("wspush_bytes_in_total") >= 15 * (6 + 9), "bytes in did not count the frames")
    check(after.get("wspush_pool_workers", 0) >= 1, "no pool workers reported")
    check('wspush_pool_task_duration_seconds_bucket{le="+Inf"}' in after, "no pool task histogram")
    status, body = get(admin, "/publish", "POST", b'{"topic":"mailbox:1","data":{}}')
    check(status == 503 and "unavailable" in body, f"publish in echo mode answered {status} {body!r}")
    for ws in clients:
        ws.close_socket()


def readyz_while_draining(server: ServerProcess, admin: int) -> None:
    held = RawWebSocket(server.port, timeout=scaled(20)).open()
    server.signal(signal.SIGTERM)
    server.wait_for_log("SIGTERM", scaled(10))
    check(get(admin, "/readyz")[0] == 503, "/readyz is not 503 while draining")
    check(get(admin, "/healthz")[0] == 200, "/healthz stopped answering while draining")
    held.expect_close(1001)
    rc = server.wait_exit(scaled(20))
    check(rc == 0, f"server exited with {rc}\n" + server.log_tail())


def admin_port_taken(args) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        r = subprocess.run([args.server, "--auth=none", f"--io={args.io}", "--listen", "127.0.0.1:0",
                            "--admin-listen", f"127.0.0.1:{port}"], capture_output=True, text=True,
                           timeout=scaled(30), env={k: v for k, v in os.environ.items() if not k.startswith("WSPUSH_")})
    finally:
        taken.close()
    check(r.returncode == 1, f"exit {r.returncode} with the admin port taken (want 1)\n{r.stderr[-800:]}")
    check(f"cannot start the admin listener on 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr,
          f"no clear error for the taken admin port:\n{r.stderr[-800:]}")


def run(args) -> None:
    quiet = not args.verbose
    with ServerProcess(args.server, io=args.io, mode="echo", quiet=quiet) as server:
        admin = int(server.wait_for_log(r"admin API at [0-9.]+:(\d+)", scaled(10)).group(1))
        run_step("/healthz, /readyz, /metrics counters match the traffic, publish 503", counters_match_traffic,
                 server, admin)
    with ServerProcess(args.server, io=args.io, mode="echo", extra=["--drain-seconds", "2"], quiet=quiet) as server:
        admin = int(server.wait_for_log(r"admin API at [0-9.]+:(\d+)", scaled(10)).group(1))
        run_step("SIGTERM: /readyz 503 while draining, exit 0", readyz_while_draining, server, admin)
    run_step("the admin address taken: exit 1 with the reason", admin_port_taken, args)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
