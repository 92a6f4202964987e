#!/usr/bin/python3
"""Two limits of a node, against the real binary: Python `websockets` clients, and a real
redis-server for the bus.

- `--max-topics-per-connection`: a connection may hold that many topics; a `sub` past it is
  answered `{"op":"error","code":"too_many_subscriptions","topic":...}` and changes nothing (all
  or nothing, also for a sub of several topics that crosses the limit), the connection stays
  usable and its subscriptions keep delivering; a topic it already holds or one freed by `unsub`
  is taken. Both with the embedded bus and with Redis (the two paths of server/pubsub/session.cpp).
- the open-files limit: started with a soft RLIMIT_NOFILE below the hard one, the server raises
  the soft limit to the hard one (/proc/<pid>/limits), logs both, and holds more connections than
  the soft limit it was started with.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import resource
import sys
import time
import urllib.error
import urllib.request

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, metric,  # noqa: E402
                         publish_ok, recv_json, run_main, scaled, subscribe)

LIMIT = 4


# ---- helpers --------------------------------------------------------------------------------------





def wait_bus_ready(s: ServerProcess, seconds: float = 30) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port(s)}/readyz", timeout=scaled(5)) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError:
            pass
        check(time.monotonic() < deadline, "the node did not become ready\n" + s.log_tail())
        time.sleep(0.05)


async def connect(s: ServerProcess):
    return await websockets.connect(f"ws://127.0.0.1:{s.port}/ws", ping_interval=None, open_timeout=scaled(30))


async def refused(ws, topics, named: str, what: str) -> None:
    """A sub of `topics` answered too_many_subscriptions naming `named`."""
    await ws.send(json.dumps({"op": "sub", "topics": topics}))
    e = await recv_json(ws)
    check(e == {"op": "error", "code": "too_many_subscriptions", "topic": named}, f"{what}: answered {e}")


async def delivers(s: ServerProcess, ws, topic: str, others=(), what: str = "") -> None:
    """A publish to each of `others` (topics the connection must not hold), then one to `topic`:
    the next event the connection gets is the one of `topic` (the others never came)."""
    for t in others:
        publish_ok(s, t, "not-held")
    eid = publish_ok(s, topic, what or topic)
    e = await recv_json(ws)
    check(e.get("id") == eid and e.get("topic") == topic,
          f"{what}: expected the event of {topic}, got {e} (a topic in {list(others)} delivered?)")


async def unsubscribe(ws, topics) -> None:
    await ws.send(json.dumps({"op": "unsub", "topics": topics}))
    e = await recv_json(ws)
    check(e == {"op": "unsubbed", "topics": topics}, f"unsub {topics} answered {e}")


# ---- too_many_subscriptions -----------------------------------------------------------------------

async def topic_limit(s: ServerProcess, bus: bool) -> None:
    """One connection against --max-topics-per-connection 4. `bus`: the node is on Redis, whose
    path checks the whole sub before asking Redis and names the sub's first topic; the embedded
    path adds the topics one by one, undoes them at the first one past the limit and names it."""
    ws = await connect(s)
    other = await connect(s)
    try:
        subs0, errors0 = metric(s, "wspush_subscriptions"), metric(s, "wspush_client_errors_total")
        held = ["a", "b", "c", "d"]
        r = await subscribe(ws, held)    # exactly at the limit
        check(r.get("lost") == [], f"at the limit: {r}")
        check(metric(s, "wspush_subscriptions") - subs0 == LIMIT, "4 subscriptions not counted")

        # One topic past the limit: refused, nothing changes, the connection goes on.
        await refused(ws, ["e"], "e", "a fifth topic")
        await delivers(s, ws, "a", others=["e"], what="a held topic after the refusal")
        await delivers(s, ws, "d", what="the last topic taken at the limit")
        check(metric(s, "wspush_subscriptions") - subs0 == LIMIT, "a refused sub changed the subscription count")
        check(metric(s, "wspush_client_errors_total") - errors0 == 1, "the refusal is not counted as a client error")

        # A topic it already holds adds nothing: taken at the limit.
        await subscribe(ws, ["b"])
        await delivers(s, ws, "b", what="a topic subscribed twice")

        # Several topics crossing the limit: all or nothing.
        await unsubscribe(ws, ["c", "d"])                      # holds a, b
        await refused(ws, ["x", "y", "z"], "x" if bus else "z", "three topics where two fit")
        await delivers(s, ws, "a", others=["x", "y", "z"], what="none of the three was taken")
        check(metric(s, "wspush_subscriptions") - subs0 == 2, "a refused sub of several topics left some behind")
        await refused(ws, ["a", "x", "y", "z"], "a" if bus else "z", "a held topic and three new ones")
        await delivers(s, ws, "b", others=["x", "y", "z"], what="still none of the three")

        # What fits is taken: the two freed places.
        await subscribe(ws, ["x", "y"])
        await delivers(s, ws, "y", what="a topic taken in a freed place")
        await delivers(s, ws, "a", others=["c", "d"], what="an older topic, not the ones let go")
        check(metric(s, "wspush_subscriptions") - subs0 == LIMIT, "back at the limit")

        # The limit is per connection: another one takes the same topics, and one more of its own.
        await subscribe(other, ["a", "b", "x", "y"])
        await refused(other, ["c"], "c", "the other connection past its own limit")
        eid = publish_ok(s, "x", "both")
        for w in (ws, other):
            e = await recv_json(w)
            check(e.get("id") == eid, f"both connections hold x: got {e}")
        check(metric(s, "wspush_client_errors_total") - errors0 == 4, "refusals counted")
    finally:
        await ws.close()
        await other.close()


async def topic_limit_on_bus(args) -> None:
    rs = RedisServer(persistent=False).start()
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--bus", rs.url, "--max-topics-per-connection", LIMIT]).start()
    try:
        wait_bus_ready(s)
        await topic_limit(s, bus=True)
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


async def topic_limit_embedded(args) -> None:
    s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                      extra=["--max-topics-per-connection", LIMIT]).start()
    try:
        await topic_limit(s, bus=False)
        check(not s.crashed(), "the server crashed")
    finally:
        s.kill()


# ---- the open-files limit -------------------------------------------------------------------------

class LimitedServer(ServerProcess):
    """The server started with RLIMIT_NOFILE (soft, hard): set by a Python that then execs the
    binary, so the server is the same process (its PID reads /proc/<pid>/limits)."""

    def __init__(self, *a, nofile: "tuple[int, int]", **kw):
        super().__init__(*a, **kw)
        self.nofile = nofile

    def command(self) -> "list[str]":
        soft, hard = self.nofile
        shim = ("import os, resource, sys; "
                f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
                "os.execv(sys.argv[1], sys.argv[1:])")
        return [sys.executable, "-c", shim] + super().command()


def proc_nofile(pid: int) -> "tuple[int, int]":
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def nofile_raised(args, soft: int, hard: int) -> ServerProcess:
    s = LimitedServer(args.server, io=args.io, quiet=not args.verbose, nofile=(soft, hard)).start()
    check(proc_nofile(s.proc.pid) == (hard, hard),
          f"started with {soft}/{hard}: /proc/{s.proc.pid}/limits says {proc_nofile(s.proc.pid)}")
    m = s.wait_for_log(r"open files limit: soft (\d+) -> (\d+) \(hard (\d+)\)(.*)", scaled(10),
                       what="the open files limit line")
    check(tuple(int(x) for x in m.groups()[:3]) == (soft, hard, hard),
          f"started with {soft}/{hard}, the log says: {m.group(0)}")
    advice = "; each connection needs one: raise the hard limit (ulimit -Hn) for more"
    check(m.group(4) == (advice if hard < 65536 else ""), f"the advice after the limits: {m.group(4)!r}")
    return s


async def echo_many(s: ServerProcess, n: int) -> None:
    """n connections open at once, each echoed."""
    socks = []
    try:
        for start in range(0, n, 50):
            socks += await asyncio.gather(*[connect(s) for _ in range(start, min(n, start + 50))],
                                          return_exceptions=True)
            failed = [(k, repr(x)) for k, x in enumerate(socks) if isinstance(x, BaseException)]
            check(not failed, f"{len(failed)} of the first {len(socks)} connections failed, the first: "
                              f"{failed[:1]}\n" + s.log_tail(5))
        await asyncio.gather(*[ws.send(f"hello {k}") for k, ws in enumerate(socks)])
        got = await asyncio.gather(*[asyncio.wait_for(ws.recv(), scaled(20)) for ws in socks])
        check(got == [f"hello {k}" for k in range(n)], "an echo went missing or astray")
    finally:
        await asyncio.gather(*[ws.close() for ws in socks if not isinstance(ws, BaseException)],
                             return_exceptions=True)


def open_files_limit(args) -> None:
    _, machine_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    check(machine_hard != resource.RLIM_INFINITY and machine_hard >= 512,
          f"this machine's hard RLIMIT_NOFILE is {machine_hard}")
    # The soft limit well below the machine's hard one.
    s = nofile_raised(args, min(256, machine_hard // 2), machine_hard)
    s.kill()
    # Both below: the soft one goes up to the (lowered) hard one, and the connections that need
    # the raise are served. Started with 64, the server would run out of descriptors well before
    # 200 connections.
    s = nofile_raised(args, 64, 400)
    try:
        asyncio.run(echo_many(s, 200))
        check(not s.crashed(), "the server crashed")
        check(metric(s, "wspush_connections_accepted_total") >= 200, "not every connection was accepted")
    finally:
        s.kill()
    # Already at the hard limit: nothing to raise, said as such.
    s = nofile_raised(args, 300, 300)
    s.kill()


def main(args) -> None:
    f = Findings()
    f.step("too_many_subscriptions, embedded bus", lambda: asyncio.run(topic_limit_embedded(args)))
    f.step("too_many_subscriptions, Redis bus", lambda: asyncio.run(topic_limit_on_bus(args)))
    f.step("the open-files limit raised at start", open_files_limit, args)
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
