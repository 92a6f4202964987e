#!/usr/bin/env python3
"""The Redis bus: what a paced resume does when something gives way in the middle of it.

A replay longer than what its connection can take is sent in pages, each read from Redis once
the client has read the last (docs/REDIS.md "Resume"). Against the real binary and a real
redis-server, with a client that reads part of its backlog and then stops reading:
- the node's links to Redis drop while the replay waits for the client: the client then reads
  an unbroken prefix of its backlog, in order, and a 1013 close; resuming from the last event it
  got brings the rest, in order, without a duplicate, and nothing of the replay stays behind on
  the node (its gauges go back to 0);
- the stream is trimmed past the client's place while the replay waits (a burst of publishes
  longer than the history): the client reads its prefix, then {"op":"lost","topics":[t]}, then
  the topic's events from where its stream began when the next page was read, in order, to the
  newest (another notice before each further gap, if the stream was trimmed again between two
  pages), then live events: nothing missed silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, arg_parser, check, metric, poll_until, run_main,  # noqa: E402
                         scaled)
from wsp_wire import OP_CLOSE, OP_TEXT, RawWebSocket, parse_close  # noqa: E402

HISTORY = 100
EVENT_BYTES = 60_000
MiB = 1 << 20


class SmallWindow(RawWebSocket):
    """A client with a small receive buffer, so that what it leaves unread stays on the node."""

    def connect(self) -> "SmallWindow":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        s.settimeout(scaled(10))
        s.connect(("127.0.0.1", self.port))
        s.setblocking(False)
        self.sock = s
        return self


def start_node(args, rs: RedisServer) -> ServerProcess:
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", rs.url, "--threads", "2", "--max-message-bytes", str(128 << 10),
                                "--max-pending-bytes", str(MiB), "--history-size", str(HISTORY)]).start()


def fill(r: redis.Redis, topic: str, n: int) -> "list[str]":
    blob = json.dumps("x" * (EVENT_BYTES - 2))
    return [r.execute_command("FCALL", "wspush_publish", 0, topic, blob).decode() for _ in range(n)]


def sub_and_stall(s: ServerProcess, topic: str, since: str, read: int) -> "tuple[SmallWindow, list[str]]":
    """Subscribes with `since`, reads `subbed` and `read` events, then stops reading once the
    replay waits for this client (the node has a paced replay, and it stays so)."""
    ws = SmallWindow(s.port).open()
    ws.send_frame(OP_TEXT, json.dumps({"op": "sub", "topics": [topic], "since": {topic: since}}).encode())
    m = json.loads(ws.next_event(scaled(10)).payload)
    check(m.get("op") == "subbed" and not m.get("lost"), f"the resume was answered {m}")
    got = [json.loads(ws.next_event(scaled(10)).payload)["id"] for _ in range(read)]
    check(poll_until(lambda: metric(s, "wspush_bus_replays_paced") == 1, scaled(10)),
          "the replay did not wait for its client to read")
    return ws, got


def read_until_close(ws: RawWebSocket) -> "tuple[list[dict], int | None]":
    """Every message up to the server's close frame, and its code (None: no close came)."""
    msgs = []
    while True:
        e = ws.next_event(scaled(20))
        if e.opcode == OP_CLOSE:
            return msgs, parse_close(e.payload)[0]
        msgs.append(json.loads(e.payload))


def read_ids(ws: RawWebSocket, until: str) -> "list[dict]":
    """Messages up to and with the event `until`."""
    msgs = []
    while True:
        e = ws.next_event(scaled(20))
        check(e.opcode == OP_TEXT, f"the server sent {e.describe()} before the event {until}")
        msgs.append(json.loads(e.payload))
        if msgs[-1].get("id") == until:
            return msgs


def nothing_left(s: ServerProcess) -> bool:
    return metric(s, "wspush_bus_replays_paced") == 0 and metric(s, "wspush_bus_pending") == 0


@contextlib.contextmanager
def stalled_resume(args):
    """A node on a fresh Redis, the topic `big` with HISTORY events of EVENT_BYTES, and a client
    that resumed before all of them, read 3 and stopped reading (sub_and_stall). Yields the node,
    a Redis client, the backlog's ids, the client and the ids it read; checks that the node did
    not crash, and stops both."""
    rs = RedisServer(persistent=False).start()
    s = start_node(args, rs)
    r = redis.Redis(port=rs.port)
    try:
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1, scaled(30)), "the node's bus did not come up")
        since = fill(r, "big", 1)[0]
        ids = fill(r, "big", HISTORY - 1)
        ws, got = sub_and_stall(s, "big", since, 3)
        yield s, r, ids, ws, got
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


def outage(args) -> None:
    with stalled_resume(args) as (s, r, ids, ws, got):
        ups = metric(s, "wspush_bus_reconnects_total")
        for kind in ("pubsub", "normal"):
            r.execute_command("CLIENT", "KILL", "TYPE", kind)
        check(poll_until(lambda: metric(s, "wspush_bus_reconnects_total") > ups, scaled(10)),
              "the node did not see its links drop")
        msgs, code = read_until_close(ws)
        got += [m["id"] for m in msgs if m.get("topic") == "big"]
        check(all(m.get("topic") == "big" for m in msgs), f"unexpected messages: {[m for m in msgs if 'topic' not in m]}")
        check(code == 1013, f"the interrupted replay ended with close {code}, not 1013 (try again later)")
        check(got == ids[:len(got)] and len(got) < len(ids),
              f"before the close the client got {len(got)} events that are not the start of its backlog in order")
        print(f"  outage after {len(got)} of {len(ids)} events: close 1013", file=sys.stderr)
        ws.close_socket()
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1, scaled(30)), "the node's bus did not come back")
        check(poll_until(lambda: nothing_left(s), scaled(10)), "the interrupted replay left a sub under way")
        # Resuming from the last event it got brings the rest of the backlog, then live events.
        with SmallWindow(s.port).open() as again:
            again.send_frame(OP_TEXT, json.dumps({"op": "sub", "topics": ["big"], "since": {"big": got[-1]}}).encode())
            m = json.loads(again.next_event(scaled(10)).payload)
            check(m.get("op") == "subbed" and not m.get("lost"), f"the second resume was answered {m}")
            rest = [x["id"] for x in read_ids(again, ids[-1])]
            check(got + rest == ids, f"the two resumes brought {len(got)} + {len(rest)} events, not the backlog "
                  f"of {len(ids)} once each in order")
            live = r.execute_command("FCALL", "wspush_publish", 0, "big", '"live"').decode()
            check([x.get("id") for x in read_ids(again, live)] == [live], "the live event did not follow alone")
        check(poll_until(lambda: nothing_left(s), scaled(10)), "a finished replay left something under way")


def trimmed(args) -> None:
    with stalled_resume(args) as (s, r, ids, ws, got):
        # More than the history holds, published while the replay waits: the client's place in
        # the stream is trimmed away.
        newer = fill(r, "big", HISTORY + 20)
        held = [e[0].decode() for e in r.xrange("wspush:stream:big")]
        check(len(held) == HISTORY and held[-1] == newer[-1].split(":", 1)[1], "the stream was not trimmed as expected")
        epoch = newer[-1].split(":", 1)[0]
        held = [f"{epoch}:{i}" for i in held]
        msgs = read_ids(ws, newer[-1])
        # Runs of events with a notice between: each run follows on in the topic's events
        # without a gap (a gap comes only behind a notice), the first from the start of the
        # backlog, the last to the newest; nothing twice.
        every = ids + newer
        runs: "list[list[str]]" = [list(got)]
        for m in msgs:
            if m.get("op") == "lost":
                check(m == {"op": "lost", "topics": ["big"]}, f"the notice reads {m}")
                runs.append([])
            else:
                check(m.get("topic") == "big", f"unexpected message: {str(m)[:200]}")
                runs[-1].append(m["id"])
        check(len(runs) >= 2, "no lost notice: the client missed events without being told")
        check(runs[0] == ids[:len(runs[0])], f"before the first notice: {len(runs[0])} events that are not the "
              "start of the backlog in order")
        at = len(runs[0])
        for k, run in enumerate(runs[1:], 1):
            j = every.index(run[0]) if run and run[0] in every else -1
            check(j >= at and run == every[j:j + len(run)], f"run {k} after a notice ({len(run)} events, from event "
                  f"{j} of {len(every)}) does not follow on in order from where the last ended ({at})")
            at = j + len(run) if run else at
        check(at == len(every), f"the runs end at event {at}, not at the newest ({len(every)})")
        check(set(held) <= {i for run in runs for i in run}, "events the stream still holds are missing")
        print(f"  trimmed while paced: runs of {[len(run) for run in runs]} events with a lost notice between",
              file=sys.stderr)
        live = r.execute_command("FCALL", "wspush_publish", 0, "big", '"live"').decode()
        check([x.get("id") for x in read_ids(ws, live)] == [live], "the live event did not follow alone")
        check(poll_until(lambda: nothing_left(s), scaled(10)), "a finished replay left something under way")
        ws.close_socket()


def main(args) -> None:
    f = Findings()
    f.step("the links to Redis drop while a paced replay waits for its client", lambda: outage(args))
    f.step("the stream is trimmed past the client's place while a paced replay waits", lambda: trimmed(args))
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
