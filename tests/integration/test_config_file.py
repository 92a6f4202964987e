#!/usr/bin/python3
"""--config FILE on the real binary: options from a TOML file, under the environment and the
command line.

- A server whose command line is only `--config FILE --io X` listens where the file says, in the
  file's mode, with the file's --max-connections (the next upgrade gets 503);
- WSPUSH_MAX_CONNECTIONS wins over the file, --max-connections over both;
- a bad file (unknown key, bad value, wrong TOML type, TOML syntax; in a namespace table too, an
  empty or bad prefix, a table given twice) is refused at start: exit 2,
  its name, line, column and key on stderr, nothing listening;
- SIGHUP reads the file again: an option changed there is logged as needing a restart and keeps
  its running value, and so is a namespace table added or changed; a file that no longer parses is
  logged with its line and changes nothing;
  the server serves throughout.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_ports import release_port, reserve_port  # noqa: E402
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, admin_port, arg_parser, check,  # noqa: E402
                         http_exchange, run_main, run_step, scaled, upgrade_request, wait_gauge)


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
        write(path, base_file(5))
        hup(re.escape(f"wspush: warning: SIGHUP: {path}:6: max-connections changed (2 -> 5): it needs a restart; "
                      "2 stays in effect until then"), "max-connections changed")
        check(len(server.log_lines("changed (")) == 1, "more than the one changed option logged\n" + server.log_tail())
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


def run(args) -> None:
    with tempfile.TemporaryDirectory(prefix="wspush-config-") as tmp:
        run_step("the file's listener, mode and --max-connections take effect", from_file, args, tmp)
        run_step("WSPUSH_* over the file, the command line over WSPUSH_*", precedence, args, tmp)
        run_step("a bad file is refused at start with FILE:LINE:COLUMN and the key", refused_at_start, args, tmp)
        run_step("SIGHUP: a changed option needs a restart, a bad file changes nothing", sighup, args, tmp)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
