#!/usr/bin/python3
"""Shutdown and socket release under hostile load, against the real binary:

- drain while publishing: --threads 2 --reuseport, 50 subscribers all on one reactor (the other holds no
  connection, so it has nothing to drain and finishes at once, while the first drains over
  --drain-seconds 2 plus the close timeout of clients that do not answer the close), and 4 threads
  hammering the admin API on keep-alive connections at full speed (2 with POST /publish to the
  subscribers' topic, 2 with POST /publish/batch of 100 lines), SIGTERM while they run: /readyz
  turns 503, every subscriber's stream ends with a close frame 1001 (no event after it) and then
  EOF, the closes come in several batches (told apart by the last event each subscriber got before
  its close, since the publishing goes on: not timed), the process exits 0, every publish request
  gets an HTTP answer (200 or 503; the admin listener keeps answering while draining) and none
  hangs; a connection refused or dropped after SIGTERM (the admin listener closing at exit) is fine;
- a close must really release the socket: --max-connections 10, --max-pending-bytes 1 MiB;
  three rounds of 10 raw clients that subscribe and never read (small receive window, and they
  keep their sockets open) are fed 64 KiB events until the server closes them as slow
  consumers. The server's side of each must go away (no longer ESTABLISHED in /proc/net/tcp)
  while the client side stays open and unread, so that the port never holds more than 10
  server-side connections and each round's clients get in; SIGTERM then ends the process (exit 0).

How long the exits take is printed, not checked (a figure for a benchmark); every wait here is a
timeout that only stops a hang. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import base64
import http.client
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (Findings, OP_TEXT, ServerProcess, TestFailure, accept_key, admin_port, arg_parser,  # noqa: E402
                         check, decode_frame, encode_frame, http_request, parse_http_head, recv_some, run_main,
                         scaled, scrape_metrics, upgrade_request, wait_gauge)

MiB = 1 << 20
DRAIN_SECONDS = 2
HANG = 60  # seconds (scaled) after which a process that has not exited is taken as hung
# The drain spreads its closes over --drain-seconds at the loop's 50 ms tick: some 40 batches for
# 50 connections. Fewer than this many is "all at once", whatever the machine's speed.
MIN_DRAIN_BATCHES = 3
SUBSCRIBERS = 50
SLOW_CLOSES = "wspush_slow_consumer_closes_total"


# ---- helpers -----------------------------------------------------------------------------------



def subscribed_socket(port: int, topic: str, small_window: bool) -> socket.socket:
    """A raw client that upgraded and subscribed to `topic` (`subbed` seen). With `small_window`
    its receive buffer and segment size are tiny (set before connect), for a client that will
    never read."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if small_window:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(scaled(10))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(upgrade_request("/ws", key))
    buf = bytearray()
    deadline = time.monotonic() + scaled(10)
    while b"\r\n\r\n" not in buf:
        recv_some(s, buf, deadline, "the upgrade answer")
    end = buf.index(b"\r\n\r\n") + 4
    status, _, headers = parse_http_head(bytes(buf[:end]))
    if status != 101:
        s.close()
        raise TestFailure(f"upgrade answered {status}, expected 101")
    check((headers.get("sec-websocket-accept") or [""])[0] == accept_key(key), "bad Sec-WebSocket-Accept")
    del buf[:end]
    s.sendall(encode_frame(OP_TEXT, json.dumps({"op": "sub", "topics": [topic]}).encode()))
    while True:
        frame, used = decode_frame(buf)
        if frame is None:
            recv_some(s, buf, deadline, "subbed")
            continue
        del buf[:used]
        reply = json.loads(frame.payload) if frame.opcode == OP_TEXT else {}
        check(reply.get("op") == "subbed", f"sub answered {frame.describe()}")
        return s


def established_server_side(port: int) -> int:
    """ESTABLISHED TCP sockets whose local port is the server's (its side of each connection).
    Counted by address pair: the kernel's table may list an entry twice while it changes."""
    seen = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                seen.add((fields[1], fields[2]))
    return len(seen)


def wait_exit_within(server: ServerProcess, timeout: float) -> "tuple[int | None, float]":
    """(exit status or None if still running after `timeout`, seconds waited)."""
    started = time.monotonic()
    try:
        return server.wait_exit(timeout), time.monotonic() - started
    except TestFailure:
        return None, time.monotonic() - started


# ---- B.1: drain while publishing ------------------------------------------------------------------

def subscribers_on_one_shard(port: int, admin: int, n: int, topic: str) -> "list[socket.socket]":
    """`n` subscribers of `topic`, all on the same reactor, so that the other reactor holds no
    connection at all. `wspush_topics` is summed over the reactors (docs/METRICS.md: a topic with
    subscribers on two counts twice): a newcomer that makes it 2 landed on the other reactor and
    is sent away again."""
    kept: "list[socket.socket]" = []
    for _ in range(20 * n):  # one in two lands right: the bound only stops a hang
        if len(kept) == n:
            return kept
        s = subscribed_socket(port, topic, False)
        if scrape_metrics(admin).get("wspush_topics", 0) == 1:
            kept.append(s)
            continue
        s.close()
        wait_gauge(admin, "wspush_topics", 1, "a subscriber that left")
    raise TestFailure(f"only {len(kept)} of {n} subscribers landed on the same reactor in {20 * n} tries")


class Subscribers:
    """`socks`: raw subscribed clients, read by one thread until EOF. What they receive is discarded
    but for its last bytes (`tails`), which must end with the server's close frame. They never
    answer it: each is closed by --close-timeout (default 5 s)."""

    TAIL = 4096  # bytes kept of each stream: the close frame and the event before it

    def __init__(self, socks: "list[socket.socket]"):
        self.socks = socks
        self.tails = [bytearray() for _ in socks]
        self.eof = [False] * len(socks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = {s: k for k, s in enumerate(self.socks)}
        live = list(self.socks)
        deadline = time.monotonic() + scaled(120)
        while live and not self._stop.is_set() and time.monotonic() < deadline:
            ready, _, _ = select.select(live, [], [], 0.2)
            for s in ready:
                try:
                    chunk = s.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                k = index[s]
                if not chunk:
                    live.remove(s)
                    self.eof[k] = True
                    continue
                tail = self.tails[k]
                tail += chunk
                if len(tail) > 2 * self.TAIL:
                    del tail[:-self.TAIL]

    def wait_all_closed(self, timeout: float) -> None:
        """Lets the reader take what is left up to every EOF (the server has closed them all once it
        has exited), within `timeout`."""
        self._thread.join(timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()


EVENT_SEQ = re.compile(rb'"id":"[^"]*:(\d+)"')


def stream_end(tail: bytes) -> "tuple[int | None, int | None]":
    """(the code of the close frame that ends the stream or None if it does not end with one, the
    sequence number of the last event before it or None). The server's frames are unmasked; the
    events are ASCII JSON, so a 0x88 byte followed by the length of the rest is the close frame."""
    for i in range(len(tail) - 2, max(-1, len(tail) - 128), -1):
        if tail[i] == 0x88 and tail[i + 1] == len(tail) - i - 2:
            code = int.from_bytes(tail[i + 2:i + 4], "big") if len(tail) - i - 2 >= 2 else None
            seqs = EVENT_SEQ.findall(bytes(tail[:i]))
            return code, int(seqs[-1]) if seqs else None
    return None, None


def wait_draining(admin: int) -> "str | None":
    """Polls /readyz until it answers 503 draining (a poll: SIGTERM is handled asynchronously);
    returns what went wrong, or None."""
    deadline = time.monotonic() + scaled(30)
    while True:
        try:
            status, text = http_request(admin, "GET", "/readyz")
        except OSError as exc:
            return f"/readyz failed before it said draining: {type(exc).__name__}: {exc}"
        if status == 503:
            return None if "draining" in text else f"/readyz answered 503 {text!r}, expected draining"
        if status != 200:
            return f"/readyz answered {status} {text!r} after SIGTERM"
        if time.monotonic() >= deadline:
            return f"/readyz still answered 200 {scaled(30):.0f}s after SIGTERM"
        time.sleep(0.02)  # polling: the signal's handling has no event the test can wait on


class Publishers:
    """`n` threads, each publishing over its own keep-alive connection as fast as answers come."""

    def __init__(self, admin: int, n: int, request_timeout: float, batch_threads: int = 0):
        self.admin = admin
        self.request_timeout = request_timeout
        self.lock = threading.Condition()
        self.statuses: dict = {}
        self.answered = 0
        self.answered_after_term = 0
        self.timeouts: list = []  # (thread, seconds after SIGTERM or None)
        self.errors_before_term: list = []
        self.errors_after_term = 0
        self.refused = 0
        self.term_at = None
        self._stop = threading.Event()
        self.batch_threads = batch_threads
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(n)]
        for t in self._threads:
            t.start()

    def _since_term(self):
        return None if self.term_at is None else time.monotonic() - self.term_at

    def _run(self, k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=self.request_timeout)
        if k < self.batch_threads:  # NDJSON batches of 100 to a topic nobody subscribes to
            path = "/publish/batch"
            body = "\n".join(json.dumps({"topic": "bulk", "data": {"from": k, "n": j}}) for j in range(100)).encode()
        else:
            path = "/publish"
            body = json.dumps({"topic": "drain", "data": {"from": k, "pad": "x" * 100}}).encode()
        hard_deadline = time.monotonic() + scaled(120)
        n = 0
        while not self._stop.is_set() and time.monotonic() < hard_deadline:
            n += 1
            sent_at = self._since_term()
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                after_term = self.term_at is not None
                with self.lock:
                    self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
                    self.answered += 1
                    self.answered_after_term += after_term
                    self.lock.notify_all()
                if resp.will_close:
                    conn.close()
            except socket.timeout:
                with self.lock:
                    self.timeouts.append((k, sent_at))
                conn.close()
                return  # a hung server hangs every further request too
            except ConnectionRefusedError:
                with self.lock:
                    self.refused += 1
                return  # the admin listener is gone: the process is exiting
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                with self.lock:
                    if self.term_at is None:
                        self.errors_before_term.append(f"{type(exc).__name__}: {exc}")
                    else:
                        self.errors_after_term += 1
                conn.close()  # http.client reconnects on the next request

    def wait_answers(self, count: int, timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.answered >= count, timeout=timeout)

    def stop(self, timeout: float) -> "list[int]":
        """Stops the threads; returns the ones still stuck after `timeout`."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [k for k, t in enumerate(self._threads) if t.is_alive()]


def drain_while_publishing(server: ServerProcess) -> None:
    admin = admin_port(server)
    subs = Subscribers(subscribers_on_one_shard(server.port, admin, SUBSCRIBERS, "drain"))
    wait_gauge(admin, "wspush_connections", SUBSCRIBERS, f"the {SUBSCRIBERS} subscribers, nobody else")
    request_timeout = scaled(30)  # only stops a hang: 4 full-speed publishers and a drain share 2 cores
    pubs = Publishers(admin, 4, request_timeout, batch_threads=2)
    problems = []
    try:
        check(pubs.wait_answers(500, scaled(20)),
              f"the publishers got only {pubs.answered} answers before SIGTERM\n" + server.log_tail())
        pubs.term_at = time.monotonic()
        server.signal(signal.SIGTERM)
        readyz = wait_draining(admin)
        if readyz:
            problems.append(readyz)
        limit = scaled(HANG)
        rc, waited = wait_exit_within(server, limit)
        stuck = pubs.stop(request_timeout + scaled(2))
        subs.wait_all_closed(scaled(10))
    finally:
        pubs.stop(0)
        subs.close()
    if rc is None:
        problems.append(f"the process had not exited {limit:.0f}s after SIGTERM (--drain-seconds {DRAIN_SECONDS})")
    elif rc != 0:
        problems.append(f"the process exited with {rc} after SIGTERM, expected 0")
    if pubs.timeouts:
        when = ", ".join("before SIGTERM" if t is None else f"{t:.1f}s after SIGTERM" for _, t in pubs.timeouts[:4])
        problems.append(f"{len(pubs.timeouts)} publish request(s) got no answer within {request_timeout:.0f}s "
                        f"(sent: {when})")
    if stuck:
        problems.append(f"publisher thread(s) {stuck} still inside a request after every deadline")
    bad = {s: c for s, c in pubs.statuses.items() if s not in (200, 503)}
    if bad:
        problems.append(f"publishes answered with statuses other than 200/503: {bad}")
    if pubs.errors_before_term:
        problems.append(f"publish connections failed before SIGTERM: {pubs.errors_before_term[:3]}")
    if pubs.answered_after_term == 0:
        problems.append("no publish was answered after SIGTERM (the admin listener keeps answering while draining)")
    # Every subscriber: its stream ends with the drain's close frame, 1001, then EOF.
    ends = [stream_end(t) for t in subs.tails]
    open_left = subs.eof.count(False)
    if open_left:
        problems.append(f"{open_left} of {SUBSCRIBERS} subscribers never saw their connection closed")
    codes: dict = {}
    for code, _ in ends:
        codes[code] = codes.get(code, 0) + 1
    if codes != {1001: SUBSCRIBERS}:
        problems.append(f"the subscribers' streams ended with close codes {codes} (None: no close frame last), "
                        f"expected 1001 for all {SUBSCRIBERS}")
    # In batches: the publishing goes on during the drain, so the connections closed by one batch
    # got the same last event and a later batch's got a later one.
    last = [seq for _, seq in ends]
    batches = len(set(last))
    if None in last:
        problems.append(f"{last.count(None)} subscriber(s) got no event before their close")
    elif batches < MIN_DRAIN_BATCHES:
        problems.append(f"the drain closed the {SUBSCRIBERS} subscribers in {batches} batch(es) (the last events they "
                        f"got: {sorted(set(last))}), expected them spread over --drain-seconds {DRAIN_SECONDS}")
    print(f"   (answers {pubs.statuses}, {pubs.answered_after_term} after SIGTERM; timeouts {len(pubs.timeouts)}, "
          f"dropped after SIGTERM {pubs.errors_after_term}, refused {pubs.refused}; exit {rc} after {waited:.1f}s; "
          f"subscribers closed {subs.eof.count(True)}/{SUBSCRIBERS} with {codes}, in {batches} batches)")
    if rc is None:
        problems.append(server.log_tail(8))
    check(not problems, "; ".join(problems))


# ---- B.2: a closed connection's socket really goes away --------------------------------------------

def release_rounds(server: ServerProcess, rounds: int = 3, per_round: int = 10) -> None:
    admin = admin_port(server)
    held: "list[socket.socket]" = []  # every client socket: open, never read, until the end
    blob = "x" * (64 * 1024)
    problems, peak, summary = [], 0, []
    try:
        for r in range(1, rounds + 1):
            before = scrape_metrics(admin).get(SLOW_CLOSES, 0.0)
            try:
                for _ in range(per_round):
                    held.append(subscribed_socket(server.port, "big", True))
            except TestFailure as exc:
                problems.append(f"round {r}: a new client could not get in ({exc}) with "
                                f"{established_server_side(server.port)} server-side sockets ESTABLISHED")
                break
            peak = max(peak, established_server_side(server.port))
            # Feed them until the server has given up on all of them as slow consumers.
            closes, published = 0.0, 0
            while closes < per_round and published < 200:
                status, text = http_request(admin, "POST", "/publish",
                                            json.dumps({"topic": "big", "data": blob}).encode())
                check(status == 200, f"round {r}: publish answered {status} {text[:200]}")
                published += 1
                closes = scrape_metrics(admin).get(SLOW_CLOSES, 0.0) - before
                peak = max(peak, established_server_side(server.port))
            if closes < per_round:
                problems.append(f"round {r}: only {closes:.0f} of {per_round} non-readers closed as slow "
                                f"consumers after {published} events of 64 KiB")
                break
            # The server's side of each must go away, although the clients keep theirs open.
            deadline = time.monotonic() + scaled(20)  # a timeout that only stops a hang
            while True:
                now_held = established_server_side(server.port)
                peak = max(peak, now_held)
                if now_held == 0 or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)  # polling the kernel's socket table: there is no event to wait on
            summary.append(f"round {r}: {published} events, {now_held} server-side ESTABLISHED left")
            if now_held:
                problems.append(f"round {r}: {now_held} server-side socket(s) still ESTABLISHED "
                                f"{scaled(20):.0f}s after the slow-consumer closes (close-timeout 1 s)")
                break
        if peak > per_round:
            problems.append(f"up to {peak} server-side sockets ESTABLISHED on the port with --max-connections "
                            f"{per_round} (closed connections hold their sockets)")
        server.signal(signal.SIGTERM)
        limit = scaled(HANG)
        rc, waited = wait_exit_within(server, limit)
        summary.append(f"SIGTERM: exit {rc} after {waited:.1f}s")
        if rc is None:
            problems.append(f"SIGTERM: the process had not exited {limit:.0f}s after it "
                            f"({established_server_side(server.port)} server-side sockets ESTABLISHED)")
        elif rc != 0:
            problems.append(f"SIGTERM: exited with {rc}, expected 0")
    finally:
        for s in held:
            s.close()
    print("   (" + "; ".join(summary) + f"; peak {peak})")
    check(not problems, "; ".join(problems))


def run(args) -> None:
    quiet = not args.verbose
    findings = Findings()  # every finding is checked and reported, not only the first that fails
    step = findings.step

    def start(*extra):
        return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=quiet,
                             extra=["--threads", "2", "--drain-seconds", str(DRAIN_SECONDS), *extra]).start()

    # --reuseport: each reactor accepts from its own socket and the kernel picks one by a hash of
    # the connection's addresses, so half the newcomers land on each reactor however busy either
    # is (from one shared socket, the reactor that wakes first takes it: under load, mostly one).
    with start("--reuseport") as server:
        step("SIGTERM while 4 threads publish at full speed: every subscriber closed 1001 in batches, exit 0, "
             "every request answered",
             drain_while_publishing, server)
    with start("--max-connections", "10", "--max-pending-bytes", str(MiB), "--close-timeout", "1") as server:
        step("slow consumers closed while they keep their sockets: server side released, SIGTERM exits",
             release_rounds, server)
    findings.done()


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
