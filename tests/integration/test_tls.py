#!/usr/bin/python3
"""TLS on the public listener (--tls-cert/--tls-key), against the real binary with a certificate
made here and verified by the clients.

- Python `websockets` over wss://: ALPN http/1.1, subscribe, a publish (small and 60 KB) arrives;
  the page over https://.
- Settings: TLS 1.3 and 1.2 both work; a TLS 1.2 client offering only an old cipher (no forward
  secrecy) is refused; tickets resume sessions (1.3 and 1.2).
- SIGHUP: an open connection survives the reload, a new one sees the new certificate, a session
  from before the reload still resumes; a broken certificate is refused with a log line and the
  previous one stays in use.
- Bad input, each answered or closed and counted in wspush_tls_handshakes_total{result}: plain
  HTTP (400 in plain text), garbage instead of a ClientHello, an oversized record header, a
  truncated handshake, a handshake never finished (closed at --upgrade-timeout), ClientHellos
  trickled by a few bytes while a real client is served, renegotiation (openssl s_client), a
  peer vanishing mid-record, a record that does not decrypt.
- SIGTERM still drains and exits with TLS connections open.
- Kernel TLS (--kernel-tls): the start-up line says what is done; wss works with auto, on and off;
  wspush_tls_kernel_tx_total{result} counts the handoffs, or (a kernel without the "tls" ULP,
  --kernel-tls=on) the fallbacks to user space, with one log line per process.

Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import http.client

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, http_request,  # noqa: E402
                         run_main, scaled, scrape_metrics)
from wsp_tls import MemoryClient, client_context, client_hello, make_cert, tls_args  # noqa: E402

UPGRADE_TIMEOUT = 2


def tls_count(server: ServerProcess, result: str) -> float:
    return scrape_metrics(admin_port(server)).get(f'wspush_tls_handshakes_total{{result="{result}"}}', 0)


def wait_at_least(read, at_least: float, seconds: float = 10) -> float:
    """Counters are bumped on the server's threads (a handshake's as it closes): poll `read` (a
    scrape) until it shows `at_least`, or the time is up; returns the last reading."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        n = read()
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def wait_count(server: ServerProcess, result: str, at_least: float, seconds: float = 10) -> float:
    return wait_at_least(lambda: tls_count(server, result), at_least, seconds)


def kernel_offers_tls() -> bool:
    try:
        with open("/proc/sys/net/ipv4/tcp_available_ulp") as f:
            return "tls" in f.read().split()
    except OSError:
        return False


def kernel_tx(server: ServerProcess, result: str) -> float:
    """-1 when the series is missing."""
    return scrape_metrics(admin_port(server)).get(f'wspush_tls_kernel_tx_total{{result="{result}"}}', -1)


def wait_kernel_tx(server: ServerProcess, result: str, at_least: float, seconds: float = 10) -> float:
    return wait_at_least(lambda: kernel_tx(server, result), at_least, seconds)


def kernel_line(server: ServerProcess) -> str:
    return next((l for l in server.log if "kernel TLS: " in l), "")


def publish(admin: int, topic: str, data) -> None:
    status, body = http_request(admin, "POST", "/publish", json.dumps({"topic": topic, "data": data}).encode())
    check(status == 200, f"publish answered {status} {body}")


def wait_closed(sock: socket.socket, seconds: float) -> bytes:
    """Reads until the server ends the connection; returns what came. Fails if it does not."""
    sock.settimeout(scaled(seconds))
    got = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return got
            got += data
    except ConnectionResetError:
        return got
    except socket.timeout:
        raise AssertionError(f"the server did not close within {scaled(seconds):.0f}s (got {got[:80]!r})")


def raw(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10))


# ---- clients that behave ----------------------------------------------------------------------

async def wss_pubsub(server: ServerProcess, cert: str) -> None:
    admin = admin_port(server)
    ctx = client_context(cert)
    async with websockets.connect(f"wss://localhost:{server.port}/ws", ssl=ctx, ping_interval=None,
                                  max_size=None) as ws:
        obj = ws.transport.get_extra_info("ssl_object")
        check(obj.selected_alpn_protocol() == "http/1.1", f"ALPN {obj.selected_alpn_protocol()!r}")
        check(obj.version() == "TLSv1.3", f"negotiated {obj.version()}")
        await ws.send(json.dumps({"op": "sub", "topics": ["mailbox:42"]}))
        r = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(r.get("op") == "subbed", f"sub answered {r}")
        publish(admin, "mailbox:42", {"new": 1})
        e = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(e.get("topic") == "mailbox:42" and e.get("data") == {"new": 1}, f"event {e}")
        big = "x" * 60000
        publish(admin, "mailbox:42", big)
        e = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(e.get("data") == big, f"the 60 KB event came back with {len(str(e.get('data')))} bytes of data")


def https_page(server: ServerProcess, cert: str) -> None:
    conn = http.client.HTTPSConnection("localhost", server.port, context=client_context(cert), timeout=scaled(10))
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        body = resp.read().decode()
        check(resp.status == 200 and "<html" in body.lower(), f"GET / over https: {resp.status} {body[:80]!r}")
    finally:
        conn.close()


def session_of(server: ServerProcess, ctx: ssl.SSLContext, session=None) -> "tuple[ssl.SSLSession, bool]":
    """One https request (so a TLS 1.3 ticket has arrived); the session and whether it was resumed."""
    with ctx.wrap_socket(raw(server), server_hostname="localhost", session=session) as s:
        s.sendall(b"GET /wspush.mjs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
        check(got.startswith(b"HTTP/1.1 200"), f"GET /wspush.mjs over TLS: {got[:60]!r}")
        return s.session, s.session_reused


def versions_and_resumption(server: ServerProcess, cert: str) -> None:
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        ctx = client_context(cert, max_version=version)
        before = tls_count(server, "resumed")
        session, reused = session_of(server, ctx)
        check(not reused, f"{version.name}: a first connection cannot be resumed")
        _, reused = session_of(server, ctx, session)
        check(reused, f"{version.name}: the session ticket was not accepted")
        check(wait_count(server, "resumed", before + 1) >= before + 1, f"{version.name}: resumed not counted")


def old_cipher_refused(server: ServerProcess, cert: str) -> None:
    ctx = client_context(cert, max_version=ssl.TLSVersion.TLSv1_2)
    ctx.set_ciphers("AES128-SHA")  # RSA key exchange, CBC: nothing a modern server offers
    before = tls_count(server, "bad_hello")
    try:
        with ctx.wrap_socket(raw(server), server_hostname="localhost"):
            raise AssertionError("a TLS 1.2 handshake with only AES128-SHA succeeded")
    except ssl.SSLError:
        pass
    check(wait_count(server, "bad_hello", before + 1) == before + 1, "the refused hello was not counted bad_hello")


# ---- SIGHUP -------------------------------------------------------------------------------------

def peer_cn(server: ServerProcess) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with ctx.wrap_socket(raw(server), server_hostname="localhost") as s:
        der = s.getpeercert(binary_form=True)
    pem = ssl.DER_cert_to_PEM_cert(der)
    out = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem.encode(), capture_output=True)
    return out.stdout.decode().strip().split("CN = ")[-1].split("CN=")[-1]


async def reload_on_sighup(server: ServerProcess, cert: str, key: str, tmp: str) -> None:
    admin = admin_port(server)
    check(peer_cn(server) == "localhost", f"before the reload the CN is {peer_cn(server)!r}")
    ctx = client_context(cert)
    session, _ = session_of(server, ctx)
    async with websockets.connect(f"wss://localhost:{server.port}/ws", ssl=ctx, ping_interval=None) as ws:
        await ws.send(json.dumps({"op": "sub", "topics": ["reload"]}))
        await asyncio.wait_for(ws.recv(), scaled(10))
        # A new certificate and key in the same files, then SIGHUP.
        new_cert, new_key = make_cert(tmp, "next", cn="reloaded.localhost")
        shutil.copyfile(new_cert, cert)
        shutil.copyfile(new_key, key)
        mark = len(server.log)
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_for_log(r"TLS certificate reloaded \(CN=reloaded\.localhost", scaled(10), start=mark)
        check(peer_cn(server) == "reloaded.localhost", f"after the reload a new connection sees {peer_cn(server)!r}")
        # The open connection continues.
        publish(admin, "reload", "after")
        e = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(e.get("data") == "after", f"the connection opened before the reload got {e}")
        # The ticket keys outlive the certificate: a session from before still resumes.
        _, reused = session_of(server, ctx, session)
        check(reused, "a session from before the reload was not resumed")
        # A broken certificate: refused with a log line, the current one stays.
        with open(cert, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        mark = len(server.log)
        os.kill(server.proc.pid, signal.SIGHUP)
        line = server.wait_for_log(r"TLS certificate NOT reloaded.*", scaled(10), start=mark).group(0)
        check(cert in line, f"the refusal does not name the file: {line!r}")
        check(peer_cn(server) == "reloaded.localhost", "after a refused reload the certificate changed")
        publish(admin, "reload", "still")
        e = json.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
        check(e.get("data") == "still", f"after the refused reload the connection got {e}")


# ---- bad input ----------------------------------------------------------------------------------

def plain_http(server: ServerProcess) -> None:
    before = tls_count(server, "plain_http")
    with raw(server) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\r\n")
        got = wait_closed(s, 10)
    check(got.startswith(b"HTTP/1.1 400") and b"speaks TLS" in got, f"plain HTTP got {got[:120]!r}")
    check(wait_count(server, "plain_http", before + 1) == before + 1, "plain_http not counted")


def garbage(server: ServerProcess) -> None:
    before = tls_count(server, "bad_hello")
    for junk in (b"\x00\x01\x02garbage that is not TLS\r\n",               # not a record
                 b"\x16\x09\x09\x00\x10" + b"\x00" * 16,                   # a record of no TLS version
                 b"\x16\x03\x01\xff\xff",                                  # a hello longer than a record
                 b"\x16\x03\x01\x00\x20" + os.urandom(32)):                # the right size, random inside
        with raw(server) as s:
            s.sendall(junk)
            got = wait_closed(s, 10)
        check(not got.startswith(b"HTTP"), f"{junk[:8]!r}: answered {got[:40]!r}")
    check(wait_count(server, "bad_hello", before + 4) == before + 4,
          f"bad_hello went {before:.0f} -> {tls_count(server, 'bad_hello'):.0f}, expected +4")


def truncated_handshake(server: ServerProcess) -> None:
    hello = client_hello()
    before = tls_count(server, "incomplete")
    with raw(server) as s:
        s.sendall(hello[: len(hello) // 2])
    check(wait_count(server, "incomplete", before + 1) == before + 1, "a truncated hello was not counted incomplete")


def never_finished(server: ServerProcess, cert: str) -> None:
    """Half a ClientHello, then nothing: closed by --upgrade-timeout (counted `timeout`, not as a
    broken or unfinished hello). Meanwhile a few clients trickle their hellos a few bytes at a
    time, and a real client is served at once."""
    hello = client_hello()
    results = ("timeout", "incomplete", "bad_hello", "failed")
    before = {r: tls_count(server, r) for r in results}
    pool_before = scrape_metrics(admin_port(server)).get("wspush_pool_task_duration_seconds_count", 0)
    stuck = raw(server)
    stuck.sendall(hello[:40])
    tricklers = [raw(server) for _ in range(20)]
    for k in range(0, 30, 3):
        for t in tricklers:
            t.sendall(hello[k:k + 3])
    https_page(server, cert)  # served while they trickle
    # The wait only stops a hang; why they were closed is the counters' to say.
    for s in [stuck] + tricklers:
        wait_closed(s, UPGRADE_TIMEOUT + 30)
        s.close()
    want = before["timeout"] + 21
    check(wait_count(server, "timeout", want) == want,
          f"timeout went {before['timeout']:.0f} -> {tls_count(server, 'timeout'):.0f}, expected +21")
    after = {r: tls_count(server, r) for r in results}
    for r in results[1:]:
        check(after[r] == before[r], f"{r} went {before[r]:.0f} -> {after[r]:.0f}: an unfinished hello was "
                                     "closed as something else than its --upgrade-timeout")
    pool_after = scrape_metrics(admin_port(server)).get("wspush_pool_task_duration_seconds_count", 0)
    # The one https request above is the only upgrade-path work; the handshakes took no worker.
    check(pool_after - pool_before <= 1, f"the trickled handshakes ran {pool_after - pool_before:.0f} pool tasks")


def renegotiation(server: ServerProcess, cert: str) -> None:
    if shutil.which("openssl") is None:
        raise AssertionError("the openssl command is needed (Debian package openssl)")
    before = tls_count(server, "renegotiation")
    # s_client renegotiates when a line "R" arrives on its stdin (TLS 1.2; 1.3 has no renegotiation).
    p = subprocess.Popen(["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-tls1_2",
                          "-CAfile", cert, "-servername", "localhost"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Wait for the handshake before asking: the session summary ends with "---".
        deadline = time.monotonic() + scaled(10)
        seen = b""
        while b"Verify return code: 0" not in seen and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        check(b"Verify return code: 0" in seen, f"s_client did not finish its handshake: {seen[-300:]!r}")
        p.stdin.write(b"R\n")
        p.stdin.flush()
        rest, _ = p.communicate(timeout=scaled(10))  # ends when the server closes
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(b"RENEGOTIATING" in seen + rest, "s_client did not try to renegotiate")
    check(wait_count(server, "renegotiation", before + 1) == before + 1, "renegotiation not counted")


def vanish_mid_record(server: ServerProcess, cert: str) -> None:
    before = tls_count(server, "truncated")
    c = MemoryClient(server.port, cert, scaled(10))
    rec = c.records(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n" + b"x" * 1000)
    c.sock.sendall(rec[: len(rec) // 2])
    c.close()
    check(wait_count(server, "truncated", before + 1) == before + 1, "a peer gone mid-record was not counted truncated")


def bad_record(server: ServerProcess, cert: str) -> None:
    before = tls_count(server, "bad_record")
    c = MemoryClient(server.port, cert, scaled(10))
    rec = bytearray(c.records(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"))
    rec[-3] ^= 0x40  # inside the authentication tag
    c.sock.sendall(bytes(rec))
    wait_closed(c.sock, 10)
    c.close()
    check(wait_count(server, "bad_record", before + 1) == before + 1, "a record that did not decrypt was not counted")


async def drain_with_tls_open(server: ServerProcess, cert: str) -> None:
    async with websockets.connect(f"wss://localhost:{server.port}/ws", ssl=client_context(cert),
                                  ping_interval=None) as ws:
        server.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(ws.recv(), scaled(10))
        except websockets.ConnectionClosed as exc:
            check(exc.rcvd is not None and exc.rcvd.code == 1001, f"drained with {exc.rcvd}")
        else:
            raise AssertionError("a message instead of the drain's close")
    rc = server.wait_exit(scaled(15))
    check(rc == 0, f"exit status {rc} after SIGTERM")


def vanished_peers_bytes_stay_theirs(server: ServerProcess, cert: str) -> None:
    """Peers that vanish right after the handshake while other connections open. The server's
    last records for a vanished peer (its session tickets) were queued when its socket was
    closed; they must go nowhere else. They once went to whichever connection got the closed
    descriptor's number next: here, an admin request would read TLS bytes as its answer."""
    stop = threading.Event()
    bad: list[str] = []

    def admin_requests() -> None:
        while not stop.is_set():
            try:
                status, _ = http_request(admin_port(server), "GET", "/healthz")
                if status != 200:
                    bad.append(f"status {status}")
            except Exception as e:  # a foreign byte stream is not an HTTP answer
                bad.append(repr(e)[:200])

    threads = [threading.Thread(target=admin_requests) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(150):
            c = MemoryClient(server.port, cert, scaled(10))
            rec = c.records(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            c.sock.sendall(rec[: len(rec) // 2])
            c.close()
    finally:
        stop.set()
        for t in threads:
            t.join()
    check(not bad, f"admin answers that were not HTTP: {bad[:3]}")


# ---- kernel TLS ---------------------------------------------------------------------------------

def kernel_tls_auto(server: ServerProcess) -> None:
    """The default (auto), after the connections above: handed over where the kernel offers the
    ULP, else nothing tried and nothing counted."""
    line = kernel_line(server)
    if kernel_offers_tls():
        check("kernel TLS: offered, transmit handed to the kernel after each handshake" in line, f"log: {line!r}")
        check(wait_kernel_tx(server, "handed", 1) >= 1, "no handoff counted")
    else:
        check("kernel TLS: not offered (" in line and "user space" in line, f"log: {line!r}")
        check(kernel_tx(server, "handed") == 0 and kernel_tx(server, "fallback") == 0,
              f"handed {kernel_tx(server, 'handed')}, fallback {kernel_tx(server, 'fallback')} without a handoff")


def kernel_tls_mode(args, cert: str, key: str, mode: str) -> None:
    """A server with --kernel-tls=MODE: wss and https work (TLS 1.3 and 1.2, resumed too) and the
    log line and the counters say what happened."""
    extra = tls_args(cert, key) + [f"--kernel-tls={mode}"]
    with ServerProcess(args.server, io=args.io, mode="pubsub", extra=extra, quiet=not args.verbose) as server:
        asyncio.run(wss_pubsub(server, cert))
        https_page(server, cert)
        versions_and_resumption(server, cert)
        line = kernel_line(server)
        failed_lines = [l for l in server.log if "kernel TLS: a handoff failed" in l]
        if mode == "off":
            check("kernel TLS: off (--kernel-tls=off)" in line, f"log: {line!r}")
            check(kernel_tx(server, "handed") == 0 and kernel_tx(server, "fallback") == 0, "off, yet counted")
            check(not failed_lines, f"off, yet a handoff was tried: {failed_lines}")
        elif kernel_offers_tls():
            check("kernel TLS: offered, transmit handed" in line, f"log: {line!r}")
            check(wait_kernel_tx(server, "handed", 6) >= 6, f"handed {kernel_tx(server, 'handed')} of 6 connections")
            check(kernel_tx(server, "fallback") == 0, "a handoff failed where the kernel offers the ULP")
        else:
            # This kernel lacks the ULP: every connection tries, is refused, and stays in user space.
            check("kernel TLS: not listed by the kernel" in line and "--kernel-tls=on" in line, f"log: {line!r}")
            check(wait_kernel_tx(server, "fallback", 6) >= 6, f"fallback {kernel_tx(server, 'fallback')} of 6 connections")
            check(kernel_tx(server, "handed") == 0, "handed over on a kernel without the ULP")
            check(len(failed_lines) == 1 and "TCP_ULP" in failed_lines[0],
                  f"the failure should be logged once, naming the step: {failed_lines}")
        check(not server.crashed(), "the server crashed\n" + server.log_tail())


def main(args) -> None:
    quiet = not args.verbose
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = make_cert(tmp)
        extra = tls_args(cert, key) + ["--upgrade-timeout", str(UPGRADE_TIMEOUT), "--drain-seconds", "1"]
        with ServerProcess(args.server, io=args.io, mode="pubsub", extra=extra, quiet=quiet) as server:
            check(any("kernel TLS: " in l for l in server.log), "no line saying whether kernel TLS is offered")
            f = Findings()
            f.step("wss: ALPN, subscribe, publishes", lambda: asyncio.run(wss_pubsub(server, cert)))
            f.step("https: the page", https_page, server, cert)
            f.step("kernel TLS: auto", kernel_tls_auto, server)
            f.step("TLS 1.3 and 1.2, resumption", versions_and_resumption, server, cert)
            f.step("an old cipher is refused", old_cipher_refused, server, cert)
            f.step("plain HTTP to the TLS port", plain_http, server)
            f.step("garbage instead of a ClientHello", garbage, server)
            f.step("a truncated handshake", truncated_handshake, server)
            f.step("a handshake never finished, and trickled ones", never_finished, server, cert)
            f.step("renegotiation", renegotiation, server, cert)
            f.step("a peer vanishing mid-record", vanish_mid_record, server, cert)
            f.step("a vanished peer's last records go nowhere else", vanished_peers_bytes_stay_theirs, server, cert)
            f.step("a record that does not decrypt", bad_record, server, cert)
            f.step("SIGHUP reload", lambda: asyncio.run(reload_on_sighup(server, cert, key, tmp)))
            now_cert = os.path.join(tmp, "next.crt")  # what the server presents after the reload
            f.step("drain with TLS connections open", lambda: asyncio.run(drain_with_tls_open(server, now_cert)))
            check(not server.crashed(), "the server crashed\n" + server.log_tail())
            ktls_cert, ktls_key = make_cert(tmp, "ktls")
            f.step("kernel TLS: --kernel-tls=on", kernel_tls_mode, args, ktls_cert, ktls_key, "on")
            f.step("kernel TLS: --kernel-tls=off", kernel_tls_mode, args, ktls_cert, ktls_key, "off")
            f.done()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
