#!/usr/bin/python3
"""Broadcast mode with 1,000 Python `websockets` clients.

Three senders send numbered text messages concurrently; a fourth sends a binary message (ignored in
broadcast mode). Each sender ends with a text fence. Every client, the senders included, must receive
every text message exactly once and, per sender, in order (the server guarantees per-connection order,
not an order across senders), and no binary message. A duplicate or a stray binary emitted by the
server before the fence of its sender is caught because each sender's output is FIFO.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import ServerProcess, TestFailure, arg_parser, check, run_main, scaled  # noqa: E402

CLIENTS = 1000
SENDERS = 3
PER_SENDER = 20
BINARY_SENDER = SENDERS  # client index that sends the ignored binary message
CONNECT_CONCURRENCY = 64


async def open_clients(port: int) -> list:
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(i: int):
        async with gate:
            return await websockets.connect(f"ws://127.0.0.1:{port}/ws?client={i}", max_size=None, ping_interval=None,
                                            compression=None, open_timeout=scaled(60), close_timeout=scaled(10))
    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CLIENTS))), scaled(180))


async def collect(ws, index: int) -> dict:
    """Reads until every fence has arrived; returns {sender: [seq, ...]} and fails on anything odd."""
    seen: dict = {s: [] for s in range(SENDERS)}
    fences: set = set()
    while len(fences) < SENDERS + 1:
        message = await ws.recv()
        if isinstance(message, bytes):
            raise TestFailure(f"client {index} received a binary message ({message[:20]!r}); "
                              "binary messages must be ignored in broadcast mode")
        kind, sender, seq = message.split(":")
        sender = int(sender)
        if kind == "fence":
            check(sender not in fences, f"client {index} got fence {sender} twice")
            fences.add(sender)
        else:
            check(sender not in fences, f"client {index} got {message!r} after sender {sender}'s fence")
            seen[sender].append(int(seq))
    return seen


async def send_all(ws, sender: int) -> None:
    if sender == BINARY_SENDER:
        await ws.send(b"binary must not be broadcast")
    else:
        for seq in range(PER_SENDER):
            await ws.send(f"msg:{sender}:{seq}")
    await ws.send(f"fence:{sender}:0")


def verify(index: int, seen: dict) -> None:
    for sender, seqs in seen.items():
        if seqs != list(range(PER_SENDER)):
            dupes = sorted({s for s in seqs if seqs.count(s) > 1})
            missing = sorted(set(range(PER_SENDER)) - set(seqs))
            raise TestFailure(f"client {index}, sender {sender}: got {len(seqs)} messages "
                              f"(missing {missing}, duplicated {dupes}, order {seqs[:PER_SENDER + 5]})")


async def run(args) -> None:
    with ServerProcess(args.server, io=args.io, mode="broadcast", quiet=not args.verbose) as server:
        clients = await open_clients(server.port)
        print(f"ok - {CLIENTS} clients connected", flush=True)
        try:
            readers = [asyncio.create_task(collect(ws, i)) for i, ws in enumerate(clients)]
            await asyncio.wait_for(asyncio.gather(*(send_all(clients[s], s) for s in range(SENDERS + 1))),
                                   scaled(60))
            done, pending = await asyncio.wait(readers, timeout=scaled(180),
                                               return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            errors = [task.exception() for task in done if task.exception() is not None]
            if errors:
                raise errors[0]
            if pending:
                stuck = [i for i, t in enumerate(readers) if t not in done][:10]
                raise TestFailure(f"only {len(done)} of {CLIENTS} clients received every fence within "
                                  f"{scaled(180):.0f}s; e.g. clients {stuck} are still waiting")
            results = [task.result() for task in readers]
            for index, seen in enumerate(results):
                verify(index, seen)
            print(f"ok - every client got {SENDERS}x{PER_SENDER} messages once, in order, no binary", flush=True)
        except websockets.ConnectionClosed as exc:
            raise TestFailure(f"a client was disconnected during the broadcast: {exc}")
        finally:
            await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)
        check(server.alive(), "server exited during the test\n" + server.log_tail())


if __name__ == "__main__":
    run_main(lambda args: asyncio.run(run(args)), arg_parser(__doc__.splitlines()[0]))
