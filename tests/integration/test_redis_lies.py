#!/usr/bin/python3
"""What a node does when "Redis" breaks the protocol: a Python server speaking RESP sets the node's
bus up correctly (FUNCTION LOAD, HSET, FCALL wspush_epoch on the command connection, SUBSCRIBE on
the subscriber connection, publishes and markers delivered), then, one step at a time, lies:

- an unsolicited `+OK`, then an unsolicited `:1`, on the command connection;
- a one-element push `*1 message` and a push whose first element is an integer on the subscriber
  connection;
- `*2147483647` (an array header of 2^31-1 elements) on the command connection;
- seven nested array headers on the subscriber connection;
- a `$1073741824` bulk header followed by data (at most ~50 MB, until the node closes).

After each: the node still runs (/healthz 200), a client's WebSocket connection stays open (ping,
pong), the node's RSS stayed within a few MB of where it was (sampled through the step),
`wspush_bus_protocol_errors_total` rose, the log says what was wrong and that the link was
dropped, and the bus reconnects (`wspush_bus_reconnects_total`, a new connection to the server).

And a stall: the server stops answering (it still accepts bytes); `wspush_bus_stalled` turns 1 and
/readyz 503 within about `--redis-timeout` (1 s here), and both come back once it answers again.
A client's `pub` whose FCALL wspush_publish_batch the server holds unanswered, then drops the
command connection, is answered `{"op":"error","code":"timeout",...,"of":"pub"}` (it may have been
published) and counted in `wspush_publishes_total{source="client",result="timeout"}`; one sent
while the bus is down (its set-up held) is answered `unavailable` (it was not).
At the end a publish still goes through the bus to the subscriber that stayed.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_ports import reserve_port  # noqa: E402
from wsp_testlib import (OP_TEXT, Findings, RawWebSocket, ServerProcess, TestFailure, admin_port,  # noqa: E402
                         arg_parser, check, metric, publish_ok, scrape_metrics, rss_bounds_checked, run_main, scaled, rss_mb, RssPeak)

RSS_SLACK_MB = 8  # "a few MB": what one step may leave behind (allocator noise), far below the attack


# ---- a RESP server that answers the node's set-up, and lies on demand -----------------------------

def bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def push(*parts) -> bytes:
    out = b"*%d\r\n" % len(parts)
    for p in parts:
        out += b":%d\r\n" % p if isinstance(p, int) else bulk(p)
    return out


class Conn:
    def __init__(self, server: "LyingRedis", sock: socket.socket):
        self.server, self.sock = server, sock
        self.role = ""  # "cmd" at FUNCTION LOAD, "sub" at SUBSCRIBE
        self.channels: "set[bytes]" = set()
        self.wlock = threading.Lock()
        self.closed = False
        self.holding = False  # from a held command on, every command waits (answers keep their order)
        self.held: "list" = []

    def send(self, data: bytes) -> bool:
        with self.wlock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.closed = True
                return False

    def commands(self):
        """The node's commands: arrays of bulk strings."""
        buf = b""

        def need(n: int) -> bool:
            nonlocal buf
            while len(buf) < n:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return False
                buf += chunk
            return True

        def line() -> "bytes | None":
            nonlocal buf
            while b"\r\n" not in buf:
                if not need(len(buf) + 1):
                    return None
            i = buf.index(b"\r\n")
            out, buf = buf[:i], buf[i + 2:]
            return out

        while True:
            head = line()
            if head is None or not head.startswith(b"*"):
                return
            args = []
            for _ in range(int(head[1:])):
                h = line()
                if h is None:
                    return
                n = int(h[1:])
                if not need(n + 2):
                    return
                args.append(buf[:n])
                buf = buf[n + 2:]
            yield args

    def run(self) -> None:
        try:
            for args in self.commands():
                self.server.answering.wait()  # a stall: bytes are read, nothing is answered
                with self.server.cond:
                    if self.holding or self.server.holds(args):
                        self.holding = True
                        self.held.append(args)
                        self.server.cond.notify_all()
                        continue
                if not self.send(self.server.answer(self, args)):
                    break
        except OSError:
            pass
        self.closed = True
        self.sock.close()


class LyingRedis:
    def __init__(self):
        self.port = reserve_port()
        self.lsock = socket.create_server(("127.0.0.1", self.port))
        self.cond = threading.Condition()
        self.conns: "list[Conn]" = []
        self.accepted = {"cmd": 0, "sub": 0}
        self.answering = threading.Event()
        self.answering.set()
        self.last_id = (0, 0)
        self.marks: "list[int]" = []         # the time of each mark published
        self.replays: "list[list]" = []      # the arguments of each FCALL wspush_replay
        self.hold_topic_subs = False         # SUBSCRIBE of a topic channel waits for release_subs()
        self.held_subs: "list" = []
        self.hold_verbs: "set[bytes]" = set()  # FUNCTION, or an FCALL's function: its connection waits (release)
        threading.Thread(target=self.accept_loop, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self.lsock.accept()
            except OSError:
                return
            c = Conn(self, sock)
            with self.cond:
                self.conns.append(c)
            threading.Thread(target=c.run, daemon=True).start()

    def took_role(self, c: Conn, role: str) -> None:
        if c.role:
            return
        with self.cond:
            c.role = role
            self.accepted[role] += 1
            self.cond.notify_all()

    def deliver(self, channel: bytes, payload: bytes) -> int:
        with self.cond:
            subs = [c for c in self.conns if c.role == "sub" and not c.closed and channel in c.channels]
        for c in subs:
            c.send(push(b"message", channel, payload))
        return len(subs)

    def next_id(self) -> bytes:
        """An event's id as Redis makes it (XADD *): the millisecond it was added, then a sequence
        within it, so that every id is above the marks heard before it. The node drops a live
        event whose id is not past where a catch-up read up to (the replay had it)."""
        with self.cond:
            ms = max(int(time.time() * 1000), self.last_id[0])
            self.last_id = (ms, self.last_id[1] + 1 if ms == self.last_id[0] else 0)
            return b"fakeepoch:%d-%d" % self.last_id

    def answer(self, c: Conn, args) -> bytes:
        verb = args[0].upper()
        if verb == b"SUBSCRIBE" and self.hold_topic_subs and args[1].startswith(b"wspush:topic:"):
            with self.cond:
                self.held_subs.append((c, args))
            return b""
        if verb in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
            self.took_role(c, "sub")
            out = b""
            for ch in args[1:]:
                (c.channels.add if verb == b"SUBSCRIBE" else c.channels.discard)(ch)
                out += push(verb.lower(), ch, len(c.channels))
            return out
        if verb == b"PING":
            return push(b"pong", b"") if c.role == "sub" else b"+PONG\r\n"
        if verb == b"FUNCTION":
            self.took_role(c, "cmd")
            return bulk(b"wspush")
        if verb == b"HSET":
            return b":2\r\n"
        if verb == b"PUBLISH":
            return b":%d\r\n" % self.deliver(args[1], args[2])
        if verb == b"FCALL" and args[1] == b"wspush_epoch":
            return bulk(b"fakeepoch")
        if verb == b"FCALL" and args[1] == b"wspush_publish":
            eid = self.next_id()
            self.deliver(b"wspush:topic:" + args[3], eid + b" " + args[4])
            return bulk(eid)
        if verb == b"FCALL" and args[1] == b"wspush_publish_batch":
            ids = []
            for k in range(3, len(args) - 1, 2):
                ids.append(self.next_id())
                self.deliver(b"wspush:topic:" + args[k], ids[-1] + b" " + args[k + 1])
            return b"*%d\r\n" % len(ids) + b"".join(bulk(i) for i in ids)
        if verb == b"FCALL" and args[1] == b"wspush_mark":
            # The moment up to which the node has seen every event (see wspush.lua): from then on
            # a catch-up after a reconnect reads from it, and this server has missed nothing.
            ms = int(time.time() * 1000)
            with self.cond:
                self.marks.append(ms)
            self.deliver(args[3], b"mark fakeepoch %d" % ms)
            return b":1\r\n"
        if verb == b"FCALL" and args[1] == b"wspush_replay":
            with self.cond:
                self.replays.append(args)
            return b"*1\r\n:0\r\n"  # nothing missed, nothing lost
        return b"+OK\r\n"

    def holds(self, args) -> bool:
        verb = args[0].upper()
        return (verb if verb != b"FCALL" else args[1]) in self.hold_verbs

    def holding(self) -> "list[Conn]":
        with self.cond:
            return [c for c in self.conns if c.held and not c.closed]

    def release(self) -> None:
        """Holds nothing more, and answers what each connection held, in order."""
        with self.cond:
            self.hold_verbs = set()
            for c in self.conns:
                held, c.held, c.holding = c.held, [], False
                for args in held:
                    c.send(self.answer(c, args))

    def release_subs(self) -> None:
        with self.cond:
            self.hold_topic_subs = False
            held, self.held_subs = self.held_subs, []
        for c, args in held:
            c.send(self.answer(c, args))

    def drop_all(self) -> None:
        with self.cond:
            conns = [c for c in self.conns if not c.closed]
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def current(self, role: str) -> Conn:
        with self.cond:
            live = [c for c in self.conns if c.role == role and not c.closed]
        check(bool(live), f"no {role} connection from the node")
        return live[-1]

    def flood(self, role: str, header: bytes, limit: int) -> int:
        """`header`, then data until the node closes or `limit` bytes went out; returns the bytes sent."""
        c = self.current(role)
        sent = 0
        chunk = b"x" * 65536
        with c.wlock:
            c.sock.settimeout(scaled(10))
            try:
                c.sock.sendall(header)
                while sent < limit:
                    sent += c.sock.send(chunk)
            except OSError:  # reset, broken pipe, or the node reads no more (timeout)
                pass
        return sent

    def close(self) -> None:
        self.lsock.close()
        with self.cond:
            conns = list(self.conns)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# ---- the node -------------------------------------------------------------------------------------


def http_status(s: ServerProcess, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port(s)}{path}", timeout=scaled(5)) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_until(what: str, cond, s: ServerProcess, seconds: float = 15) -> None:
    """Polls `cond` (a real observable: a metric, the fake server's state); fails if the node dies or
    the generous deadline passes."""
    deadline = time.monotonic() + scaled(seconds)

    def holds() -> bool:
        try:
            return cond()
        except OSError:  # the admin listener refused: the node is gone (checked next) or busy
            return False

    while not holds():
        check(s.alive(), f"the node died (exit {s.proc.poll()}) while waiting for {what}\n" + s.log_tail())
        check(time.monotonic() < deadline, f"{what}: not within {scaled(seconds):.0f}s\n" + s.log_tail())
        time.sleep(0.02)


class Rig:
    """One node on the lying server with one subscribed client; started again if a step killed it
    (so every lie is tried, and reported, even on a node that dies of the first)."""

    def __init__(self, args):
        self.args = args
        self.fake = LyingRedis()
        self.node = None
        self.ws = None

    def ensure(self) -> None:
        if self.node is not None and self.node.alive():
            return
        if self.node is not None:
            print(f"  (the node died: exit {self.node.proc.poll()}; starting another)", flush=True)
            self.node.kill()
        self.node = ServerProcess(self.args.server, io=self.args.io, mode="pubsub", quiet=not self.args.verbose,
                                  extra=["--bus", self.fake.url, "--threads", "1", "--redis-timeout", "1",
                                         "--allow-client-publish"]).start()
        self.wait_up()
        self.ws = RawWebSocket(self.node.port).open()
        marks = metric(self.node, "wspush_bus_marks_total")
        self.ws.send_frame(OP_TEXT, json.dumps({"op": "sub", "topics": ["lies"]}).encode())
        reply = json.loads(self.ws.recv_frame().payload)
        check(reply.get("op") == "subbed", f"sub answered {reply}")
        # A mark heard after the subscription: after each reconnect the node catches the topic up
        # from it (this server missed nothing), rather than telling the client it may be lost.
        wait_until("a mark", lambda: metric(self.node, "wspush_bus_marks_total") > marks, self.node)

    def wait_up(self) -> None:
        wait_until("the bus up", lambda: metric(self.node, "wspush_bus_up") == 1, self.node, 30)

    def client_open(self, what: str) -> None:
        self.ws.send_frame(0x9, b"still?")
        f = self.ws.recv_frame()
        check(f.opcode == 0xA and f.payload == b"still?", f"{what}: the client got {f.describe()} for its ping")

    def lie(self, name: str, role: str, send, expect_log: str) -> None:
        self.ensure()
        s = self.node
        errors0 = metric(s, "wspush_bus_protocol_errors_total")
        reconnects0 = metric(s, "wspush_bus_reconnects_total")
        accepted0 = self.fake.accepted[role]
        log0 = len(s.log)
        with RssPeak(s.proc.pid, every=0.01) as peak:
            rss0 = peak.base_mb
            detail = send()
            try:
                wait_until("wspush_bus_protocol_errors_total to rise",
                           lambda: metric(s, "wspush_bus_protocol_errors_total") > errors0, s)
                wait_until(f"a new {role} connection", lambda: self.fake.accepted[role] > accepted0, s)
                wait_until("wspush_bus_reconnects_total to rise",
                           lambda: metric(s, "wspush_bus_reconnects_total") > reconnects0, s)
                self.wait_up()
            finally:
                rss1 = rss_mb(s.proc.pid) if s.alive() else float("nan")
                print(f"  {name}: RSS {rss0:.1f} MB before, {rss1:.1f} MB after, peak {peak.peak_mb:.1f} MB"
                      f"{detail if isinstance(detail, str) else ''}", flush=True)
        check(http_status(s, "/healthz") == 200, "/healthz is not 200")
        self.client_open(name)
        if rss_bounds_checked():
            check(peak.peak_mb - rss0 <= RSS_SLACK_MB, f"RSS rose from {rss0:.1f} to a peak of {peak.peak_mb:.1f} MB")
            check(rss1 - rss0 <= RSS_SLACK_MB, f"RSS rose from {rss0:.1f} to {rss1:.1f} MB")
        s.wait_for_log(expect_log, scaled(5), what=f"a log line matching {expect_log!r}", start=log0)

    def stall(self) -> None:
        self.ensure()
        s = self.node
        log0 = len(s.log)
        check(http_status(s, "/readyz") == 200 and metric(s, "wspush_bus_stalled") == 0, "not ready before the stall")
        self.fake.answering.clear()
        try:
            # --redis-timeout 1 and a PING every second: about 2 s; the deadline only stops a hang.
            wait_until("wspush_bus_stalled 1", lambda: metric(s, "wspush_bus_stalled") == 1, s)
            wait_until("/readyz 503", lambda: http_status(s, "/readyz") == 503, s)
            s.wait_for_log(r"bus: .*(stall|not answered)", scaled(5), what="the stall in the log", start=log0)
            check(http_status(s, "/healthz") == 200, "/healthz is not 200 during the stall")
            self.client_open("during the stall")
        finally:
            self.fake.answering.set()
        wait_until("wspush_bus_stalled 0", lambda: metric(s, "wspush_bus_stalled") == 0, s)
        wait_until("/readyz 200", lambda: http_status(s, "/readyz") == 200, s)

    def mark_before_resubscribe(self) -> None:
        """After a reconnect, a mark heard before the topic is subscribed again is no floor for
        it: events published between the outage and its subscription would be skipped. The
        catch-up must start from the floor the topic had when the outage began."""
        self.ensure()
        s = self.node
        floor = self.fake.marks[-1]  # ensure() waited for a mark after the sub
        reconnects0 = metric(s, "wspush_bus_reconnects_total")
        with self.fake.cond:
            self.fake.hold_topic_subs = True
            replays0 = len(self.fake.replays)
        self.fake.drop_all()
        try:
            wait_until("the reconnect", lambda: metric(s, "wspush_bus_reconnects_total") > reconnects0, s)
            # Up (the node's own channel is subscribed), the topic's SUBSCRIBE unanswered: a mark
            # comes meanwhile, later than the floor.
            wait_until("a mark after the reconnect", lambda: self.fake.marks[-1] > floor + 1, s)
        finally:
            self.fake.release_subs()
        wait_until("the catch-up's replay", lambda: len(self.fake.replays) > replays0, s)
        args = self.fake.replays[replays0]
        since = args[4].decode()
        ms = int(since.split(":")[1].split("-")[0])
        check(args[3] == b"lies" and ms < floor,
              f"the catch-up read from {since} (a mark after the outage), not from before the floor {floor}")
        self.client_open("after the catch-up")

    def client_pub(self, topic: str) -> None:
        self.ws.send_frame(OP_TEXT, b'{"op":"pub","topic":"%s","data":{"n":1}}' % topic.encode())

    def pub_in_flight(self) -> None:
        """A client's pub sent to Redis and unanswered when the link breaks may have been published:
        the client hears `timeout` (the admin API's 504), not `unavailable`. One refused while the
        bus is down did not go: `unavailable`."""
        self.ensure()
        s = self.node
        series = 'wspush_publishes_total{{source="client",result="{}"}}'.format
        timeouts0, unavailable0 = metric(s, series("timeout")), metric(s, series("unavailable"))
        self.fake.hold_verbs = {b"wspush_publish_batch"}
        try:
            self.client_pub("maybe")
            wait_until("the pub's FCALL wspush_publish_batch", lambda: self.fake.holding(), s)
            c = self.fake.holding()[0]
            check(c.role == "cmd" and c.held[0][3:] == [b"maybe", b'{"n":1}'], f"held {c.held[0]}")
            # The node's next connection waits in its set-up: the bus stays down for the second pub.
            self.fake.hold_verbs = {b"FUNCTION"}
            c.sock.shutdown(socket.SHUT_RDWR)
            e = json.loads(self.ws.recv_frame().payload)
            check(e == {"op": "error", "code": "timeout", "topic": "maybe", "of": "pub"}, f"the pub in flight: {e}")
            check(metric(s, series("timeout")) == timeouts0 + 1 and metric(s, series("unavailable")) == unavailable0,
                  f"{series('timeout')} {metric(s, series('timeout'))} (was {timeouts0}), "
                  f"{series('unavailable')} {metric(s, series('unavailable'))} (was {unavailable0})")
            wait_until("the node's set-up, held", lambda: any(x.role == "" for x in self.fake.holding()), s)
            check(metric(s, "wspush_bus_up") == 0, "the bus is up while its set-up is held")
            self.client_pub("down")
            e = json.loads(self.ws.recv_frame().payload)
            check(e == {"op": "error", "code": "unavailable", "topic": "down", "of": "pub"}, f"a pub while down: {e}")
            check(metric(s, series("unavailable")) == unavailable0 + 1 and metric(s, series("timeout")) == timeouts0 + 1,
                  f"{series('unavailable')} {metric(s, series('unavailable'))} (was {unavailable0})")
        finally:
            self.fake.release()
        self.wait_up()
        self.client_open("after the pubs")

    def still_serves(self) -> None:
        self.ensure()
        self.wait_up()  # a step that failed may have left the bus reconnecting
        eid = publish_ok(self.node, "lies", {"n": 1})
        try:
            f = self.ws.recv_frame()
        except TestFailure as e:  # with what the bus says: a Findings step records it and goes on
            bus = "\n".join(f"{k} {v}" for k, v in scrape_metrics(admin_port(self.node)).items()
                            if k.startswith("wspush_bus"))
            raise TestFailure(f"{e}\n{bus}\n{self.node.log_tail(80)}") from None
        e = json.loads(f.payload)
        check(e == {"topic": "lies", "id": eid, "data": {"n": 1}}, f"the subscriber got {e}")


def main(args) -> None:
    rig = Rig(args)
    f = Findings()
    dropped = r"bus: lost redis://\S+ \(.*{}.*\); reconnecting"
    try:
        f.step("an unsolicited +OK on the command connection",
               lambda: rig.lie("+OK", "cmd", lambda: rig.fake.current("cmd").send(b"+OK\r\n"),
                               dropped.format("no command waiting")))
        f.step("an unsolicited :1 on the command connection",
               lambda: rig.lie(":1", "cmd", lambda: rig.fake.current("cmd").send(b":1\r\n"),
                               dropped.format("no command waiting")))
        f.step("a push *1 message on the subscriber connection",
               lambda: rig.lie("*1 message", "sub", lambda: rig.fake.current("sub").send(b"*1\r\n$7\r\nmessage\r\n"),
                               dropped.format("push")))
        f.step("a push whose first element is an integer",
               lambda: rig.lie("integer push", "sub",
                               lambda: rig.fake.current("sub").send(b"*3\r\n:1\r\n$1\r\na\r\n$1\r\nb\r\n"),
                               dropped.format("push")))
        f.step("*2147483647 on the command connection",
               lambda: rig.lie("*2147483647", "cmd", lambda: rig.fake.current("cmd").send(b"*2147483647\r\n"),
                               dropped.format("elements")))
        f.step("seven nested array headers on the subscriber connection",
               lambda: rig.lie("7 nested arrays", "sub",
                               lambda: rig.fake.current("sub").send(b"*16\r\n" * 7),
                               dropped.format("nest")))

        def big_bulk():
            sent = rig.fake.flood("cmd", b"$1073741824\r\n", 50 << 20)
            return f"; {sent / 1e6:.1f} MB sent after the header"
        f.step("a $1073741824 bulk and data", lambda: rig.lie("$1073741824", "cmd", big_bulk, dropped.format("bulk")))
        f.step("Redis stalls: stalled, /readyz 503, then back", rig.stall)
        f.step("a mark heard before the topic is subscribed again is no floor for it", rig.mark_before_resubscribe)
        f.step("a client's pub in flight when the link breaks: timeout; refused while down: unavailable",
               rig.pub_in_flight)
        f.step("a publish still reaches the subscriber that stayed", rig.still_serves)
        f.done()
    finally:
        rig.fake.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
