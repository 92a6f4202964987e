#!/usr/bin/python3
"""--config FILE on the real binary: options from a TOML file, under the environment and the
command line.

- A server whose command line is only `--config FILE --io X` listens where the file says, in the
  file's mode, with the file's --max-connections (the next upgrade gets 503);
- WSPUSH_MAX_CONNECTIONS wins over the file, --max-connections over both;
- a bad file (unknown key, bad value, wrong TOML type, TOML syntax; in a namespace table too, an
  empty or bad prefix, a table given twice) is refused at start: exit 2,
  its name, line, column and key on stderr, nothing listening;
- SIGHUP reads the file again: --max-connections, --api-key (rotation: the old key gets 401 from
  then on, the new one is taken), --upgrade-rate (upgrades past it get 503), --client-message-rate
  and --client-message-burst, and --log-level (debug lines appear, and go again) change at once,
  each logged "FILE:LINE: NAME changed (OLD -> NEW): in effect now" (the key without its value);
  any other option changed there is logged as needing a restart and keeps its running value, and so
  is a namespace table added or changed; a file that no longer parses is logged with its line and
  changes nothing; the server serves throughout.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_ports import release_port, reserve_port  # noqa: E402
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, admin_port, arg_parser, check,  # noqa: E402
                         http_exchange, http_request, metric, run_main, run_step, scaled, upgrade_request,
                         wait_gauge)


class ConfigServer(ServerProcess):
    """A server whose command line is --config FILE, --io and `args`: everything else from the file."""

    def __init__(self, binary: str, io: str, config: str, args=(), env=None, quiet: bool = True):
        super().__init__(binary, io=io, env=env, quiet=quiet)
        self.config = config
        self.args = [str(a) for a in args]

    def command(self) -> "list[str]":
        return [self.binary, "--config", self.config, f"--io={self.io}", *self.args]


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def base_file(max_connections: int, listen: str = "127.0.0.1:0") -> str:
    return (f'# written by test_config_file.py\n'
            f'listen = "{listen}"\n'
            f'admin-listen = "127.0.0.1:0"\n'
            f'auth = "none"\n'
            f'mode = "echo"\n'
            f'max-connections = {max_connections}\n')


def echo(ws: RawWebSocket, text: str) -> None:
    ws.send_frame(OP_TEXT, text.encode())
    ws.expect_message(OP_TEXT, text.encode())


def capacity_is(server: ServerProcess, n: int, held=()) -> None:
    """With `held` connections already open, n in all get in and the next upgrade gets 503."""
    admin = admin_port(server)
    opened = [RawWebSocket(server.port).open() for _ in range(n - len(held))]
    try:
        for k, ws in enumerate([*held, *opened]):
            echo(ws, f"in {k}")
        resp = http_exchange(server.port, upgrade_request("/ws"))
        check(resp.status == 503, f"upgrade {n + 1} got {resp.status} {resp.reason}, expected 503 (--max-connections {n})")
    finally:
        for ws in opened:
            ws.close_socket()
    wait_gauge(admin, "wspush_connections", len(held), "after the capacity check")


def from_file(args, tmp: str) -> None:
    path = os.path.join(tmp, "wspush.toml")
    port = reserve_port()
    try:
        write(path, base_file(2, f"127.0.0.1:{port}"))
        with ConfigServer(args.server, args.io, path, quiet=not args.verbose) as server:
            check(server.port == port, f"listening on {server.port}, the file says {port}")
            check(server.log_lines("mode=echo"), "the file's mode = \"echo\" did not take effect\n" + server.log_tail())
            capacity_is(server, 2)
    finally:
        release_port(port)


def precedence(args, tmp: str) -> None:
    path = os.path.join(tmp, "wspush.toml")
    write(path, base_file(2))
    env = {"WSPUSH_MAX_CONNECTIONS": "3"}
    with ConfigServer(args.server, args.io, path, env=env, quiet=not args.verbose) as server:
        capacity_is(server, 3)  # the environment over the file
    with ConfigServer(args.server, args.io, path, args=["--max-connections", "1"], env=env,
                      quiet=not args.verbose) as server:
        capacity_is(server, 1)  # the command line over the environment


BAD_FILES = [
    # (what, file text, the message expected on stderr after "FILE:")
    ("unknown key", base_file(2) + "max-conections = 5\n", '7:1: unknown option "max-conections"'),
    ("bad value", base_file(2).replace("max-connections = 2", 'max-connections = "abc"'),
     "6:19: max-connections: 'abc' is not a whole number"),
    ("wrong TOML type", base_file(2) + "reuseport = \"yes\"\n", "7:13: reuseport: expected true or false, got a string"),
    ("TOML syntax", base_file(2) + "history-size = 1 2\n", "7:18: "),
    ("config in the file", 'config = "/etc/wspush/wspush.toml"\n' + base_file(2), "1:1: config: "),
    # [namespace."<prefix>"] tables: the one table the file may hold.
    ("namespace: unknown key", base_file(2) + '[namespace."mailbox:"]\nhistory-sise = 3\n',
     '8:1: namespace "mailbox:": unknown key "history-sise"'),
    ("namespace: bad value", base_file(2) + '[namespace."mailbox:"]\nhistory-ttl = -1\n',
     "8:15: namespace \"mailbox:\": history-ttl: '-1' is not a number of seconds"),
    ("namespace: wrong TOML type", base_file(2) + '[namespace."mailbox:"]\nclient-publish = "no"\n',
     '8:18: namespace "mailbox:": client-publish: expected true or false, got a string'),
    ("namespace: empty prefix", base_file(2) + '[namespace.""]\npresence = true\n', '7:12: namespace "": the prefix is empty'),
    ("namespace: not a topic prefix", base_file(2) + '[namespace."mail box:"]\n',
     '7:12: namespace "mail box:": not a topic prefix'),
    ("namespace: given twice", base_file(2) + '[namespace."a:"]\npresence = true\n[namespace."a:"]\n',
     '9:1: the table [namespace."a:"] is given twice'),
    ("another table", base_file(2) + "[redis]\ntimeout = 3\n", '7:2: unknown option "redis"'),
]


def refused_at_start(args, tmp: str) -> None:
    path = os.path.join(tmp, "bad.toml")
    for what, text, expected in BAD_FILES:
        write(path, text)
        run = subprocess.run([args.server, "--config", path, f"--io={args.io}"], capture_output=True, text=True,
                             timeout=scaled(30))
        check(run.returncode == 2, f"{what}: exit {run.returncode}, expected 2; stderr: {run.stderr!r}")
        check(f"wspush: error: {path}:{expected}" in run.stderr, f"{what}: stderr {run.stderr!r} lacks {path}:{expected}")
        check("listening on" not in run.stderr, f"{what}: the server started: {run.stderr!r}")


def sighup(args, tmp: str) -> None:
    path = os.path.join(tmp, "wspush.toml")
    write(path, base_file(2))
    with ConfigServer(args.server, args.io, path, quiet=not args.verbose) as server:
        held = RawWebSocket(server.port).open()
        echo(held, "before")

        def hup(pattern: str, what: str) -> str:
            mark = len(server.log)
            os.kill(server.proc.pid, signal.SIGHUP)
            line = server.wait_for_log(pattern, scaled(10), what=what, start=mark).group(0)
            check(server.alive(), "the server exited on SIGHUP\n" + server.log_tail())
            echo(held, f"after {what}")
            return line

        hup(re.escape(f"SIGHUP: {path} read again: no option changed"), "the file unchanged")
        # A restart-only option changed: one line, the running value stays.
        write(path, base_file(2) + "ping-interval = 7\n")
        hup(re.escape(f"wspush: warning: SIGHUP: {path}:7: ping-interval changed (30 -> 7): it needs a restart; "
                      "30 stays in effect until then"), "ping-interval changed")
        check(len(server.log_lines("changed (")) == 1, "more than the one changed option logged\n" + server.log_tail())
        capacity_is(server, 2, [held])
        # --max-connections reloads: raised, one more gets in; lowered again, the next is refused.
        write(path, base_file(3))
        hup(re.escape(f"wspush: SIGHUP: {path}:6: max-connections changed (2 -> 3): in effect now"),
            "max-connections raised")
        check(len(server.log_lines("ping-interval changed")) == 1,
              "ping-interval, back to its running value, reported again\n" + server.log_tail())
        capacity_is(server, 3, [held])
        write(path, base_file(2))
        hup(re.escape(f"{path}:6: max-connections changed (3 -> 2): in effect now"), "max-connections lowered")
        capacity_is(server, 2, [held])
        # A file that no longer parses: logged with its line, nothing changes.
        write(path, base_file(2) + "max-conections = 5\n")
        hup(re.escape(f"wspush: error: SIGHUP: configuration NOT reloaded, the running one stays: {path}:7:1: "
                      'unknown option "max-conections"'), "an unknown key")
        write(path, base_file(2) + "history-size = [\n")
        hup(re.escape(f"SIGHUP: configuration NOT reloaded, the running one stays: {path}:7:"), "a syntax error")
        write(path, base_file(2).replace("max-connections = 2", "max-connections = -1"))
        hup(re.escape(f"SIGHUP: configuration NOT reloaded, the running one stays: {path}:6:19: max-connections: "
                      "'-1' is not a whole number"), "a bad value")
        capacity_is(server, 2, [held])
        # A namespace added, then changed: each needs a restart.
        write(path, base_file(2) + '[namespace."mailbox:"]\nhistory-size = 20\n')
        hup(re.escape(f'SIGHUP: {path}:7: namespace "mailbox:" added: it needs a restart'), "a namespace added")
        with ConfigServer(args.server, args.io, path, quiet=not args.verbose) as other:
            mark = len(other.log)
            write(path, base_file(2) + '[namespace."mailbox:"]\nhistory-size = 30\n')
            os.kill(other.proc.pid, signal.SIGHUP)
            other.wait_for_log(re.escape(f'SIGHUP: {path}:7: namespace "mailbox:" changed: it needs a restart; the '
                                         "running one stays in effect until then"), scaled(10),
                               what="a namespace changed", start=mark)
        with RawWebSocket(server.port).open() as newcomer:
            echo(newcomer, "new after the reloads")
        held.close_socket()


def keyed_publish(admin: int, key: str) -> int:
    """POST /publish with `key` as the bearer: the status."""
    req = urllib.request.Request(f"http://127.0.0.1:{admin}/publish",
                                 data=json.dumps({"topic": "news", "data": 1}).encode(),
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=scaled(10)) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def upgrade_head(port: int) -> bytes:
    """One upgrade on a raw socket: the head of the answer (the socket is closed after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(10)) as s:
        s.sendall(upgrade_request("/ws"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def pubsub_file(**options) -> str:
    text = 'listen = "127.0.0.1:0"\nadmin-listen = "127.0.0.1:0"\nauth = "none"\nmode = "pubsub"\n'
    return text + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())


def sighup_reloads(args, tmp: str) -> None:
    path = os.path.join(tmp, "reload.toml")
    write(path, pubsub_file(**{"api-key": "old-key"}))
    with ConfigServer(args.server, args.io, path, quiet=not args.verbose) as server:
        admin = admin_port(server)

        def hup(pattern: str, what: str) -> str:
            mark = len(server.log)
            os.kill(server.proc.pid, signal.SIGHUP)
            line = server.wait_for_log(pattern, scaled(10), what=what, start=mark).group(0)
            check(server.alive(), "the server exited on SIGHUP\n" + server.log_tail())
            return line

        # --api-key: rotated by the file, the old one refused at once, the new one taken.
        check(keyed_publish(admin, "old-key") == 200, "the starting key was refused")
        check(keyed_publish(admin, "new-key") == 401, "a key not yet given was taken")
        write(path, pubsub_file(**{"api-key": "new-key"}))
        line = hup(re.escape(f"wspush: SIGHUP: {path}:5: api-key changed: in effect now"), "api-key rotated")
        check("key" not in line.split("api-key")[1], f"the key's value logged: {line!r}")
        check(not server.log_lines("new-key") and not server.log_lines("old-key"), "a key's value is in the log")
        check(keyed_publish(admin, "old-key") == 401, "the old key still works after the rotation")
        check(keyed_publish(admin, "new-key") == 200, "the new key is refused after the rotation")
        # --client-message-rate and --client-message-burst: a connection open before takes them too.
        talker = RawWebSocket(server.port).open()
        sub = json.dumps({"op": "sub", "topics": ["news"]}).encode()

        def answers(n: int) -> "list[str]":
            for _ in range(n):
                talker.send_frame(OP_TEXT, sub)
            replies = [json.loads(talker.next_event().payload) for _ in range(n)]
            return [r.get("code", r.get("op")) for r in replies]

        check(answers(6) == ["subbed"] * 6, "subs refused without a rate")
        write(path, pubsub_file(**{"api-key": "new-key", "client-message-rate": 1, "client-message-burst": 2}))
        mark_of_rate = len(server.log)
        hup(re.escape(f"wspush: SIGHUP: {path}:6: client-message-rate changed (0 -> 1): in effect now"),
            "client-message-rate set")
        # Logged right after the rate's line: waited for, as the log reader may not be there yet.
        server.wait_for_log(re.escape(f"{path}:7: client-message-burst changed (20 -> 2): in effect now"), scaled(10),
                            what="client-message-burst reloaded", start=mark_of_rate)
        got = answers(6)
        check(got[:2] == ["subbed"] * 2 and got.count("subbed") <= 3 and got.count("rate_limited") >= 3,
              f"at 1 a second, bursts of 2: {got}")
        talker.close_socket()
        # --upgrade-rate: none at first (a quick series all get in), then 2 a second: refused past it.
        heads = [upgrade_head(server.port) for _ in range(8)]
        check(all(h.startswith(b"HTTP/1.1 101") for h in heads), f"without a rate: {[h[:12] for h in heads]}")
        write(path, pubsub_file(**{"api-key": "new-key", "upgrade-rate": 2}))
        hup(re.escape(f"wspush: SIGHUP: {path}:6: upgrade-rate changed (0 -> 2): in effect now"), "upgrade-rate set")
        before = metric(server, 'wspush_upgrades_total{result="rate_limited"}')
        started = time.monotonic()
        heads = [upgrade_head(server.port) for _ in range(8)]
        elapsed = time.monotonic() - started
        admitted = sum(h.startswith(b"HTTP/1.1 101") for h in heads)
        refused = [h for h in heads if h.startswith(b"HTTP/1.1 503")]
        check(admitted + len(refused) == 8, f"upgrades answered otherwise: {[h[:12] for h in heads]}")
        check(admitted <= 2 + 2 * elapsed + 1, f"{admitted} of 8 got in within {elapsed:.2f} s at 2 a second")
        check(all(b"\r\nRetry-After: " in h for h in refused), f"a 503 without Retry-After: {refused[:1]}")
        counted = metric(server, 'wspush_upgrades_total{result="rate_limited"}') - before
        check(counted == len(refused), f"{len(refused)} refused, {counted} counted as rate_limited")
        # --log-level: debug lines appear (a refused upgrade, an admin request), and go again.
        check(not server.log_lines("wspush: debug: "), "debug lines at --log-level info")
        write(path, pubsub_file(**{"api-key": "new-key", "upgrade-rate": 2, "log-level": "debug"}))
        hup(re.escape(f"wspush: SIGHUP: {path}:7: log-level changed (info -> debug): in effect now"), "log-level debug")
        mark = len(server.log)
        check(http_request(admin, "GET", "/healthz")[0] == 200, "/healthz")
        server.wait_for_log(re.escape("wspush: debug: admin: GET /healthz"), scaled(10), what="a debug line", start=mark)
        heads = [upgrade_head(server.port) for _ in range(6)]
        check(any(h.startswith(b"HTTP/1.1 503") for h in heads), "no upgrade refused at 2 a second")
        server.wait_for_log(re.escape("wspush: debug: upgrade refused: 503 --upgrade-rate reached"), scaled(10),
                            what="the refusal's debug line", start=mark)
        write(path, pubsub_file(**{"api-key": "new-key", "log-level": "info"}))
        mark = len(server.log)
        hup(re.escape(f"{path}:6: log-level changed (debug -> info): in effect now"), "log-level info")
        server.wait_for_log(re.escape("upgrade-rate changed (2 -> 0): in effect now"), scaled(10),
                            what="upgrade-rate taken out and reloaded", start=mark)
        mark = len(server.log)
        check(http_request(admin, "GET", "/healthz")[0] == 200, "/healthz")
        heads = [upgrade_head(server.port) for _ in range(8)]
        check(all(h.startswith(b"HTTP/1.1 101") for h in heads), f"the rate lifted: {[h[:12] for h in heads]}")
        hup(re.escape(f"SIGHUP: {path} read again: no option changed"), "the file unchanged")
        check(not [l for l in server.log[mark:] if "wspush: debug: " in l],
              "debug lines after --log-level went back to info")
        # A restart-only option is still reported so, next to a reloaded one.
        write(path, pubsub_file(**{"api-key": "new-key", "history-size": 7, "max-connections": 50}))
        mark = len(server.log)
        hup(re.escape(f"wspush: warning: SIGHUP: {path}:6: history-size changed (100 -> 7): it needs a restart; "
                      "100 stays in effect until then"), "history-size changed")
        server.wait_for_log(re.escape(f"{path}:7: max-connections changed (0 -> 50): in effect now"), scaled(10),
                            what="max-connections reloaded next to history-size", start=mark)
        with RawWebSocket(server.port).open():
            pass


def run(args) -> None:
    with tempfile.TemporaryDirectory(prefix="wspush-config-") as tmp:
        run_step("the file's listener, mode and --max-connections take effect", from_file, args, tmp)
        run_step("WSPUSH_* over the file, the command line over WSPUSH_*", precedence, args, tmp)
        run_step("a bad file is refused at start with FILE:LINE:COLUMN and the key", refused_at_start, args, tmp)
        run_step("SIGHUP: a changed option needs a restart, a bad file changes nothing", sighup, args, tmp)
        run_step("SIGHUP: api-key, upgrade-rate, log-level and max-connections change at once", sighup_reloads,
                 args, tmp)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
