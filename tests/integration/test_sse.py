#!/usr/bin/python3
"""Event streams (`GET /sse?topics=...`, Server-Sent Events) against the real binary.

A raw-socket stream client that parses the stream as the WHATWG algorithm does (fields, comments,
multi-line data, `retry:`), and curl, check: the 200 head; `subbed` first, then every published
event with its data byte for byte (line breaks as EventSource joins them) and an `id:` that
carries every topic's position; resume from Last-Event-ID and ?since= with no gap and no
duplicate, and across a restart (the embedded history is gone: `lost`); the token from the query,
the cookie and `Authorization: Bearer` (401, 403); bad input (400, 405, 431); keepalive comment
lines; the token's expiry, a drain and a slow consumer each end the stream with a `retry:`; a
stream's client that speaks is closed; TLS; the metrics. With redis-server installed, resume
across nodes on the Redis bus and across a node's restart, with no gap and no duplicate. Exit 0
pass, 1 fail, 77 io_uring unavailable.
"""
import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (ServerProcess, TestFailure, admin_port, arg_parser, check, metric,  # noqa: E402
                         poll_until, publish_ok, run_main, run_step, scaled)
from wsp_tls import client_context, make_cert, tls_args  # noqa: E402

SECRET = "sse-test-secret"


def mint(claims: dict) -> str:
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = enc(json.dumps(claims).encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{enc(sig)}"


def token(topics, exp_in: float = 3600) -> str:
    return mint({"sub": "u", "exp": int(time.time() + exp_in), "topics": topics})


class Stream:
    """One event stream over a raw socket (or TLS), parsed as EventSource would."""

    def __init__(self, port: int, query: str, headers=(), tls: ssl.SSLContext = None, path: str = "/sse"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=scaled(10))
        if tls:
            self.sock = tls.wrap_socket(self.sock, server_hostname="localhost")
        req = f"GET {path}?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        req += "".join(f"{h}\r\n" for h in headers) + "\r\n"
        self.sock.sendall(req.encode())
        self.buf = b""
        self.status = 0
        self.head = ""
        self.body = b""
        self.last_id = ""
        self.retry = None
        self.comments = 0
        self.ended = False
        self._read_head()

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return False
        except (ConnectionResetError, ssl.SSLError):
            data = b""
        if not data:
            self.ended = True
            return False
        self.buf += data
        return True

    def _read_head(self) -> None:
        deadline = time.monotonic() + scaled(10)
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                raise TestFailure(f"no response head (got {self.buf[:200]!r})")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.head = head.decode()
        self.status = int(self.head.split(" ")[1])
        if self.status != 200:
            deadline = time.monotonic() + scaled(5)
            while self._fill(deadline):
                pass
            self.body = self.buf

    def header(self, name: str) -> str:
        for line in self.head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == name.lower():
                return v.strip()
        return ""

    def next(self, seconds: float = 10):
        """The next dispatched event as (type, data, id), or None when the stream ended."""
        deadline = time.monotonic() + scaled(seconds)
        event, data, has_data = "", [], False
        while True:
            while b"\n" not in self.buf:
                if not self._fill(deadline):
                    if self.ended:
                        return None
                    raise TestFailure(f"no event within {seconds} s (buffered {self.buf[:200]!r})")
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.decode().rstrip("\r")
            if line == "":
                if has_data:
                    return (event or "message", "\n".join(data), self.last_id)
                event, data, has_data = "", [], False
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
                has_data = True
            elif name == "id":
                self.last_id = value
            elif name == "retry" and value.isdigit():
                self.retry = int(value)

    def expect(self, kind: str, seconds: float = 10):
        ev = self.next(seconds)
        check(ev is not None, f"the stream ended where `{kind}` was expected")
        check(ev[0] == kind, f"expected a `{kind}` event, got {ev}")
        return json.loads(ev[1]), ev[2]

    def expect_end(self, seconds: float = 10) -> None:
        deadline = time.monotonic() + scaled(seconds)
        while not self.ended:
            if b"\n\n" in self.buf:
                ev = self.next(seconds)
                check(ev is None, f"expected the stream to end, got {ev}")
            elif not self._fill(deadline) and not self.ended:
                raise TestFailure(f"the stream did not end within {seconds} s")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def q(topics, **params) -> str:
    return urllib.parse.urlencode({"topics": ",".join(topics), **params})


def open_ok(port: int, topics, **kw) -> "tuple[Stream, dict, str]":
    s = Stream(port, q(topics, **kw.pop("params", {})), **kw)
    check(s.status == 200, f"stream {topics} answered {s.status}: {s.body!r}")
    subbed, sid = s.expect("subbed")
    check(subbed["topics"] == list(topics), f"subbed names {subbed['topics']}, not {topics}")
    return s, subbed, sid


def events(s: Stream, n: int) -> "list[tuple[dict, str]]":
    out = []
    for _ in range(n):
        msg, sid = s.expect("message")
        out.append((msg, sid))
    return out


# ---- steps ----------------------------------------------------------------------------------------


def basic(server: ServerProcess) -> None:
    s, subbed, sid = open_ok(server.port, ["mailbox:42", "team:7"], params={"token": token(["mailbox:*", "team:7"])})
    check(s.header("Content-Type") == "text/event-stream", f"content type {s.header('Content-Type')!r}")
    check(s.header("Cache-Control") == "no-store", "an event stream must not be cached")
    check(s.header("Content-Length") == "", "an event stream has no length")
    check(subbed["lost"] == [] and len(sid.split(",")) == 2, f"subbed {subbed} with id {sid!r}")
    raw = '{\n  "new": [1, 2],\r\n  "from": "a\\u0000b"\n}'  # line breaks of every kind, an escape
    ids = [publish_ok(server, "mailbox:42", {"n": 1}), publish_ok(server, "team:7", json.loads(raw)),
           publish_ok(server, "mailbox:42", [3])]
    got = events(s, 3)
    check([m["topic"] for m, _ in got] == ["mailbox:42", "team:7", "mailbox:42"], f"topics {got}")
    check([m["id"] for m, _ in got] == ids, f"ids {[m['id'] for m, _ in got]} != {ids}")
    check([m["data"] for m, _ in got] == [{"n": 1}, json.loads(raw), [3]], f"data {got}")
    # The stream id: every topic's position, in the request's order.
    check(got[0][1] == f"{ids[0]},{sid.split(',')[1]}", f"first id {got[0][1]!r}")
    check(got[1][1] == f"{ids[0]},{ids[1]}", f"second id {got[1][1]!r}")
    check(got[2][1] == f"{ids[2]},{ids[1]}", f"third id {got[2][1]!r}")
    s.close()
    # The data byte for byte, line breaks as EventSource joins them (CRLF -> LF).
    one, _, _ = open_ok(server.port, ["mailbox:1"], params={"token": token(["mailbox:1"])})
    publish_raw(server, "mailbox:1", raw)
    ev = one.next()
    check(ev[1] == '{"topic":"mailbox:1","id":"%s","data":%s}' % (ev[2], raw.replace("\r\n", "\n")),
          f"data not byte for byte: {ev[1]!r}")
    one.close()


def publish_raw(server: ServerProcess, topic: str, raw_json: str) -> None:
    import urllib.request
    body = '{"topic":"%s","data":%s}' % (topic, raw_json)
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port(server)}/publish", data=body.encode())
    with urllib.request.urlopen(req, timeout=scaled(10)) as r:
        check(r.status == 200, f"publish answered {r.status}")


def with_curl(server: ServerProcess) -> None:
    """curl, a client nobody here wrote, reads the stream."""
    if not shutil.which("curl"):
        print("  (curl not installed: step skipped)")
        return
    url = f"http://127.0.0.1:{server.port}/sse?topics=mailbox:9"
    proc = subprocess.Popen(["curl", "-sN", "--max-time", str(scaled(20)), "-H", f"Authorization: Bearer {token(['mailbox:9'])}", url],
                            stdout=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
        check(first.startswith(b"event: subbed"), f"curl read {first!r}")
        while proc.stdout.readline().strip():
            pass
        eid = publish_ok(server, "mailbox:9", {"curl": True})
        lines = [proc.stdout.readline() for _ in range(2)]
        check(lines == [f"id: {eid}\n".encode(), b'data: {"topic":"mailbox:9","id":"%s","data":{"curl": true}}\n' % eid.encode()],
              f"curl read {lines}")
    finally:
        proc.kill()
        proc.wait()


def resume(server: ServerProcess) -> None:
    topics = ["mailbox:5", "team:5"]
    s, _, _ = open_ok(server.port, topics)
    first = [publish_ok(server, t, {"k": k}) for k, t in enumerate(topics * 2)]
    got = events(s, 4)
    last = got[1][1]  # as if the connection broke after two events
    s.close()
    later = [publish_ok(server, t, {"k": 10 + k}) for k, t in enumerate(topics)]
    # Last-Event-ID: what EventSource sends by itself.
    r, subbed, _ = open_ok(server.port, topics, headers=[f"Last-Event-ID: {last}"])
    check(subbed["lost"] == [], f"resume lost {subbed['lost']}")
    want = sorted(first[2:] + later)
    replay = events(r, 4)
    check(sorted(m["id"] for m, _ in replay) == want, f"replayed {[m['id'] for m, _ in replay]}, want {want}")
    live = publish_ok(server, "team:5", {"live": 1})
    m, sid = r.expect("message")
    check(m["id"] == live and sid.split(",")[1] == live, f"after the replay: {m} id {sid}")
    r.close()
    # ?since= (a new stream resuming explicitly), and Last-Event-ID wins over it.
    r2, _, _ = open_ok(server.port, topics, params={"since": got[3][1]})
    replay = events(r2, 3)
    check(sorted(m["id"] for m, _ in replay) == sorted(later + [live]), f"?since= replayed {replay}")
    r2.close()
    r3, _, _ = open_ok(server.port, topics, params={"since": got[0][1]}, headers=[f"Last-Event-ID: {sid}"])
    publish_ok(server, "mailbox:5", {"after": 1})
    m, _ = r3.expect("message")
    check(m["data"] == {"after": 1}, f"Last-Event-ID did not win over ?since=: got {m}")
    r3.close()


def restart_loses(args, server: ServerProcess) -> "ServerProcess":
    """The embedded history does not outlive the process: a resume after a restart is `lost`."""
    topics = ["mailbox:77", "team:77"]
    s, _, _ = open_ok(server.port, topics)
    publish_ok(server, "mailbox:77", {"before": 1})
    _, sid = s.expect("message")
    s.close()
    server.kill()
    again = ServerProcess(args.server, io=args.io, mode="pubsub", extra=["--ping-interval", "0.5"],
                          quiet=not args.verbose).start()
    r, subbed, rid = open_ok(again.port, topics, headers=[f"Last-Event-ID: {sid}"])
    check(sorted(subbed["lost"]) == sorted(topics), f"after a restart, subbed {subbed}")
    # A lost topic's position is the new subscription's, not the old one it cannot resume from.
    check(all(new and new != old for new, old in zip(rid.split(","), sid.split(","))),
          f"after a restart the stream id is still {rid!r} (was {sid!r})")
    r.close()
    return again


def auth(server: ServerProcess) -> None:
    t = token(["mailbox:1"])
    for how, kw in [("query", {"params": {"token": t}}), ("cookie", {"headers": [f"Cookie: a=b; wspush_token={t}"]}),
                    ("bearer", {"headers": [f"Authorization: Bearer {t}"]})]:
        s, _, _ = open_ok(server.port, ["mailbox:1"], **kw)
        s.close()
    cases = [({}, 401, "no token"), ({"token": "x.y.z"}, 401, "a forged token"),
             ({"token": token(["mailbox:1"], exp_in=-10)}, 401, "an expired token"),
             ({"token": token(["mailbox:2"])}, 403, "a topic outside the grants")]
    for params, status, what in cases:
        s = Stream(server.port, q(["mailbox:1", "mailbox:2"] if status == 403 else ["mailbox:1"], **params))
        check(s.status == status, f"{what}: answered {s.status}, not {status}")
        s.close()
    s = Stream(server.port, q(["mailbox:1"]), headers=["Authorization: Basic dTpw"])
    check(s.status == 401, f"Basic credentials are no token: answered {s.status}")


def bad_input(server: ServerProcess) -> None:
    cases = [("", 400, "no topics"), ("topics=", 400, "empty topics"), ("topics=a,a", 400, "a topic twice"),
             ("topics=" + ",".join(f"t{k}" for k in range(17)), 400, "17 topics"),
             ("topics=a*", 400, "a pattern"), ("topics=a%2", 400, "a broken escape"),
             ("topics=" + "x" * 129, 400, "a topic too long"), ("topics=a%20b", 400, "a space"),
             ("topics=a,b&since=x", 400, "one position for two topics"),
             ("topics=a&since=x,y", 400, "two positions for one topic"),
             ("topics=a&since=%22x%22", 400, "a quote in a position"),
             ("topics=a&since=" + "1" * 65, 400, "a position too long"),
             ("topics=a&x=" + "y" * 20000, 431, "a huge query string")]
    for query, status, what in cases:
        s = Stream(server.port, query)
        check(s.status == status, f"{what}: answered {s.status}, not {status} ({s.body[:100]!r})")
        s.close()
    for value, what in [("a,b", "two positions for one topic"), ('"x"', "a quoted id"), ("x" * 65, "a long id")]:
        s = Stream(server.port, "topics=a", headers=[f"Last-Event-ID: {value}"])
        check(s.status == 400 and b"Last-Event-ID" in s.body, f"Last-Event-ID {what}: {s.status} {s.body!r}")
        s.close()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10))
    sock.sendall(b"POST /sse?topics=a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    check(sock.recv(100).startswith(b"HTTP/1.1 405"), "POST to the stream path is not 405")
    sock.close()
    # A topic percent-encoded as URLSearchParams writes it opens the same topic.
    s, subbed, _ = open_ok(server.port, ["mailbox:3"])  # urlencode writes mailbox%3A3
    s.close()
    # A stream's client that sends anything after its request is closed.
    s, _, _ = open_ok(server.port, ["mailbox:3"])
    s.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    s.expect_end(10)
    # A sub the session refuses after the 200 (an unreadable position) ends the stream with it.
    s = Stream(server.port, q(["mailbox:3"], since="nonsense"))
    if s.status == 200:
        ev = s.next()
        check(ev is not None and ev[0] in ("subbed", "refused"), f"unreadable position: {ev}")
        if ev[0] == "refused":
            s.expect_end(10)
    s.close()


def keepalive(server: ServerProcess) -> None:
    s, _, _ = open_ok(server.port, ["mailbox:8"])
    deadline = time.monotonic() + scaled(10)
    while s.comments < 3 and time.monotonic() < deadline:
        s._fill(deadline)
        while b"\n" in s.buf and s.buf.startswith(b":"):
            line, s.buf = s.buf.split(b"\n", 1)
            s.comments += 1
            s.buf = s.buf[1:] if s.buf.startswith(b"\n") else s.buf
    check(s.comments >= 3, f"{s.comments} keepalive comments in 10 s at --ping-interval 0.5")
    eid = publish_ok(server, "mailbox:8", 1)
    m, _ = s.expect("message")
    check(m["id"] == eid, "a stream kept alive by comments still gets events")
    s.close()


def expiry(server: ServerProcess) -> None:
    s, _, _ = open_ok(server.port, ["mailbox:1"], params={"token": token(["mailbox:1"], exp_in=2)})
    started = time.monotonic()
    s.expect_end(10)
    check(s.retry is not None and 1000 <= s.retry <= 10000, f"an expired stream ends with retry: ({s.retry})")
    check(time.monotonic() - started < scaled(5), "the stream outlived its token by seconds")


def slow_consumer(server: ServerProcess) -> None:
    before = metric(server, "wspush_slow_consumer_closes_total")
    s = Stream(server.port, q(["mailbox:slow"]))
    check(s.status == 200, f"answered {s.status}")
    s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = "x" * 60000
    for _ in range(400):  # 24 MB against --max-pending-bytes 1 MiB, never read
        publish_ok(server, "mailbox:slow", big)
        if metric(server, "wspush_slow_consumer_closes_total") > before:
            break
    check(poll_until(lambda: metric(server, "wspush_slow_consumer_closes_total") > before, scaled(10)),
          "a stream that never reads was not closed as a slow consumer")
    s.close()


def streams_metric(server: ServerProcess) -> None:
    opened = metric(server, "wspush_event_streams_opened_total")
    streams = [open_ok(server.port, [f"mailbox:m{k}"])[0] for k in range(3)]
    check(poll_until(lambda: metric(server, "wspush_event_streams") >= 3, scaled(10)), "wspush_event_streams")
    check(metric(server, "wspush_event_streams_opened_total") >= opened + 3, "wspush_event_streams_opened_total")
    for s in streams:
        s.close()
    check(poll_until(lambda: metric(server, "wspush_event_streams") == 0, scaled(10)), "closed streams still counted")


def drain(args) -> None:
    server = ServerProcess(args.server, io=args.io, mode="pubsub", extra=["--drain-seconds", "1"],
                           quiet=not args.verbose).start()
    streams = [open_ok(server.port, [f"mailbox:d{k}"])[0] for k in range(20)]
    server.signal(signal.SIGTERM)
    retries = set()
    for s in streams:
        s.expect_end(15)
        check(s.retry is not None, "a drained stream ends without retry:")
        retries.add(s.retry)
    check(len(retries) > 5, f"the drain's retry: values are not spread: {sorted(retries)}")
    check(server.wait_exit(scaled(20)) == 0, "the drain did not end with exit 0")


def tls(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = make_cert(tmp)
        server = ServerProcess(args.server, io=args.io, mode="pubsub", extra=tls_args(cert, key),
                               quiet=not args.verbose).start()
        s, _, _ = open_ok(server.port, ["mailbox:tls"], tls=client_context(cert, alpn=False))
        eid = publish_ok(server, "mailbox:tls", {"secure": True})
        m, sid = s.expect("message")
        check(m["id"] == eid and sid == eid, f"over TLS: {m} id {sid}")
        s.close()
        server.kill()


def redis_bus(args) -> None:
    """Resume across nodes, and across a node's restart, on the Redis bus: no gap, no duplicate."""
    if not shutil.which("redis-server"):
        print("  (redis-server not installed: step skipped)")
        return
    from wsp_bus import node as bus_node
    from wsp_redis import RedisServer
    redis = RedisServer().start()
    try:
        def node():  # once it is up on the bus and ready: a publish before that is refused 503
            return bus_node(args, redis.url)
        a, b = node(), node()
        topics = ["mailbox:r1", "team:r1"]
        s, _, _ = open_ok(a.port, topics)
        sent = [publish_ok(a, t, {"k": k}) for k, t in enumerate(topics * 2)]
        got = events(s, 4)
        check([m["id"] for m, _ in got] == sent, f"on node a: {got}")
        last = got[1][1]
        s.close()
        more = [publish_ok(b, t, {"k": 10 + k}) for k, t in enumerate(topics)]
        r, subbed, _ = open_ok(b.port, topics, headers=[f"Last-Event-ID: {last}"])
        check(subbed["lost"] == [], f"resume on node b lost {subbed['lost']}")
        replay = events(r, 4)
        check(sorted(m["id"] for m, _ in replay) == sorted(sent[2:] + more), f"node b replayed {replay}")
        live = publish_ok(a, "mailbox:r1", {"live": 1})
        m, sid = r.expect("message")
        check(m["id"] == live, f"live after the replay: {m}")
        r.close()
        # The node restarts: a stream resumes on the new process from its Last-Event-ID.
        b.kill()
        later = publish_ok(a, "team:r1", {"while": "b was down"})
        b2 = node()
        r2, subbed, _ = open_ok(b2.port, topics, headers=[f"Last-Event-ID: {sid}"])
        check(subbed["lost"] == [], f"after the restart, lost {subbed['lost']}")
        m, _ = r2.expect("message")
        check(m["id"] == later, f"after the restart, replayed {m}, want {later}")
        r2.close()
        # A position the bus cannot read passes the request's checks; the session refuses the
        # sub after the 200: the stream gets `refused` (not EventSource's own `error`), a
        # spread retry:, and ends.
        bad = Stream(b2.port, q(["mailbox:r1"], since="nonsense"))
        check(bad.status == 200, f"answered {bad.status}")
        ev = bad.next()
        check(ev is not None and ev[0] == "refused" and json.loads(ev[1]).get("code") == "bad_request",
              f"an unreadable position on the Redis bus: {ev}")
        bad.expect_end(10)
        check(bad.retry is not None and 1000 <= bad.retry <= 10000, f"a refused stream ended with retry: {bad.retry}")
        bad.close()
        for n in (a, b2):
            n.kill()
    finally:
        redis.close()


def main(args) -> None:
    server = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                           extra=["--ping-interval", "0.5", "--max-pending-bytes", "1048576"],
                           jwt_secret=SECRET).start()
    run_step("auth: query, cookie, bearer; 401 and 403", auth, server)
    run_step("events, ids and data byte for byte", basic, server)
    run_step("curl reads the stream", with_curl, server)
    run_step("bad input", bad_input_auth, server)
    run_step("token expiry ends the stream with retry:", expiry, server)
    server.kill()
    open_server = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                                extra=["--ping-interval", "0.5", "--max-pending-bytes", "1048576"]).start()
    run_step("bad input", bad_input, open_server)
    run_step("resume from Last-Event-ID and ?since=", resume, open_server)
    run_step("keepalive comments", keepalive, open_server)
    run_step("slow consumer", slow_consumer, open_server)
    run_step("metrics", streams_metric, open_server)
    again = run_step("restart: lost", restart_loses, args, open_server)
    again.kill()
    run_step("drain ends every stream with a spread retry:", drain, args)
    run_step("TLS", tls, args)
    run_step("Redis bus: resume across nodes and a restart", redis_bus, args)


def bad_input_auth(server: ServerProcess) -> None:
    """With tokens, a bad request is still 400 before the token is looked at."""
    s = Stream(server.port, "topics=a,a")
    check(s.status == 400, f"a topic twice answered {s.status} with tokens on")


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__))
