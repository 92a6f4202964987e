#!/usr/bin/env python3
"""The Redis bus: a long resume is read in bounded pages (issue 19, item 5).

Against the real binary and a real redis-server: one topic of 100 events of 60 KB, then 10
`sub` messages with a `since` before all of them, on 10 connections that never read. Checked:
- Redis's memory stays bounded (its peak grows by a few pages, not by 10 whole replays of 6 MB);
- the node's RSS stays bounded;
- how long Redis was busy with one replay command (SLOWLOG) and how late another subscriber's
  live events came meanwhile are measured and printed, not asserted (a loaded machine);
- a connection that reads gets the whole backlog, in order, then live events, with no
  duplicate, on one connection, even with --max-pending-bytes 1 MiB (the replay is paced by
  its reads: the node holds at most a page of it per connection).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import redis
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_redis import RedisServer  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, arg_parser, check, metric, poll_until, recv_json,  # noqa: E402
                         rss_bounds_checked, run_main, scaled, RssPeak)
from wsp_wire import OP_TEXT, RawWebSocket  # noqa: E402

EVENTS = 100
EVENT_BYTES = 60_000
NON_READERS = 10
MiB = 1 << 20


def used_mb(r: redis.Redis, field: str) -> float:
    return int(r.info("memory")[field]) / MiB


def replay_commands(r: redis.Redis) -> list:
    """The FCALL wspush_replay commands Redis ran since the last SLOWLOG RESET (it logs all)."""
    def text(c) -> bytes:
        return c if isinstance(c, bytes) else str(c).encode()
    return [e for e in r.slowlog_get(4096) if b"wspush_replay" in text(e["command"])]


def start_node(args, rs: RedisServer) -> ServerProcess:
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", rs.url, "--threads", "2", "--max-message-bytes", str(128 << 10),
                                "--max-pending-bytes", str(MiB), "--history-size", str(EVENTS + 10)]).start()


class Ticker(threading.Thread):
    """Publishes a small event on `tick` every 50 ms (straight into Redis) and notes when."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.r = redis.Redis(port=port)
        self.sent: "dict[str, float]" = {}
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.05):
            n += 1
            eid = self.r.execute_command("FCALL", "wspush_publish", 0, "tick", str(n)).decode()
            self.sent[eid] = time.monotonic()


async def watch_ticks(port: int, ticker: Ticker, lags: "list[float]", stop: asyncio.Event) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws", ping_interval=None) as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["tick"]}))
        check((await recv_json(ws, scaled(10)))["op"] == "subbed", "the tick watcher was not subscribed")
        ticker.start()
        while not stop.is_set():
            try:
                e = json.loads(await asyncio.wait_for(ws.recv(), 0.2))
            except asyncio.TimeoutError:
                continue
            at = ticker.sent.get(e.get("id", ""))
            if at is not None:
                lags.append(time.monotonic() - at)


async def read_backlog(port: int, since: str, ids: "list[str]", r: redis.Redis) -> None:
    """One connection that reads: all of the backlog, in order, then a live event, once each. The
    same sub names a topic without `since`, published to while the backlog is on its way: the
    connection joins it with the replay, and that event comes once, before the live one."""
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws", ping_interval=None, max_size=None) as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["big", "fresh"], "since": {"big": since}}))
        got: "list[str]" = []
        fresh: "list[str]" = []
        fresh_id = live = None
        deadline = time.monotonic() + scaled(60)
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic())))
            if m.get("op") == "subbed":
                check(not m.get("lost"), f"the reader's resume said lost: {m}")
                check("fresh" in (m.get("at") or {}), f"no position for the topic without since: {m}")
                continue
            if m.get("topic") == "fresh":
                fresh.append(m["id"])
                continue
            check(m.get("topic") == "big", f"unexpected message: {str(m)[:200]}")
            got.append(m["id"])
            await asyncio.sleep(0.005)  # a client that reads at its own pace, not at the kernel's
            if len(got) == 10:  # subbed went with the first page; the rest is on its way
                fresh_id = r.execute_command("FCALL", "wspush_publish", 0, "fresh", '"during"').decode()
            if len(got) == EVENTS:
                live = r.execute_command("FCALL", "wspush_publish", 0, "big", '"live"').decode()
            if live is not None and m["id"] == live:
                break
        check(got[:EVENTS] == ids, f"the backlog came {len(got)} events, not the {EVENTS} in order "
              f"(first differing at {next((k for k, (a, b) in enumerate(zip(got, ids)) if a != b), None)})")
        check(got[EVENTS:] == [live], f"after the backlog: {got[EVENTS:]} (want only the live event {live})")
        check(fresh == [fresh_id], f"published to the topic without since during the replay: {fresh_id}; got {fresh}")


async def attack(args) -> None:
    rs = RedisServer(persistent=False, extra=("--slowlog-log-slower-than", "0", "--slowlog-max-len", "4096")).start()
    s = start_node(args, rs)
    r = redis.Redis(port=rs.port)
    try:
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1, scaled(30)), "the node's bus did not come up")
        since = r.execute_command("FCALL", "wspush_publish", 0, "big", '"start"').decode()
        blob = json.dumps("x" * (EVENT_BYTES - 2))
        ids = [r.execute_command("FCALL", "wspush_publish", 0, "big", blob).decode() for _ in range(EVENTS)]
        ticker = Ticker(rs.port)
        lags: "list[float]" = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_ticks(s.port, ticker, lags, stop))
        end = time.monotonic() + scaled(20)
        while len(lags) < 3 and time.monotonic() < end and not watcher.done():
            await asyncio.sleep(0.05)
        check(len(lags) >= 3, "the tick watcher heard nothing")
        r.slowlog_reset()
        redis_base, redis_peak_before = used_mb(r, "used_memory"), used_mb(r, "used_memory_peak")
        node_rss = RssPeak(s.proc.pid).start()
        sub = json.dumps({"op": "sub", "topics": ["big"], "since": {"big": since}}).encode()
        quiet = [RawWebSocket(s.port).open() for _ in range(NON_READERS)]
        for q in quiet:
            q.send_frame(OP_TEXT, sub)
        # Every sub answered, and each replay either through or waiting for its client to read
        # the page it was sent (twice in a row: not a page on its way to a client that then
        # asks the next), while watching the node.
        end = time.monotonic() + scaled(30)
        settled, last = 0, -1
        while time.monotonic() < end and settled < 2:
            paced, pending = metric(s, "wspush_bus_replays_paced"), metric(s, "wspush_bus_pending")
            commands = len(replay_commands(r))
            settled = settled + 1 if commands >= NON_READERS and pending == paced and commands == last else 0
            last = commands
            await asyncio.sleep(0.05)
        print(f"  settled: {settled >= 2}; {pending:.0f} subs under way, {paced:.0f} waiting for their client",
              file=sys.stderr)
        await asyncio.sleep(0.5)
        node_rss.stop()
        node_base, node_peak = node_rss.base_mb, node_rss.peak_mb
        redis_peak = used_mb(r, "used_memory_peak")
        replays = replay_commands(r)
        longest = max((e["duration"] for e in replays), default=0) / 1000
        stop.set()
        ticker.stop.set()
        await watcher
        late = max(lags) * 1000 if lags else float("nan")
        print(f"  {NON_READERS} subs of {EVENTS} x {EVENT_BYTES} B: Redis used_memory {redis_base:.1f} MB, peak "
              f"{redis_peak_before:.1f} -> {redis_peak:.1f} MB; node RSS {node_base:.1f} -> peak {node_peak:.1f} MB; "
              f"{len(replays)} replay commands, the longest {longest:.1f} ms; live ticks at most {late:.0f} ms late",
              file=sys.stderr)
        # Whole replies: 10 x 6 MB built in Redis at once (and its output buffers); pages: a few.
        # Each finding is noted, and the reader runs whatever the bounds said.
        failed = []
        if redis_peak - max(redis_peak_before, redis_base) >= 24:
            failed.append(f"Redis's memory peaked at {redis_peak:.1f} MB ({redis_peak_before:.1f} before)")
        if rss_bounds_checked() and node_peak - node_base >= 32:
            failed.append(f"the node grew {node_base:.1f} -> {node_peak:.1f} MB for {NON_READERS} subs that never read")
        try:
            await read_backlog(s.port, since, ids, r)
        except websockets.ConnectionClosed as exc:
            failed.append(f"the connection that reads was closed before its backlog was through: {exc}")
        check(not failed, "; ".join(failed))
        for q in quiet:
            q.close_socket()
        check(not s.crashed(), "the node crashed")
    finally:
        s.kill()
        rs.close()


def main(args) -> None:
    f = Findings()
    f.step("a long resume on connections that never read, and one that reads", lambda: asyncio.run(attack(args)))
    f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
