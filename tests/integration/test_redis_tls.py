#!/usr/bin/python3
"""The Redis bus over TLS, as an ACL user: a real redis-server that listens only on a TLS port
(certificates made here with `openssl`: a CA, Redis's certificate for 127.0.0.1, a client
certificate, since Redis asks for one), whose default user is off and whose one user has only the
rule docs/REDIS.md gives (read from it); two wspush nodes reach it with rediss://wspush@..., the password from
--redis-password-file; Python `websockets` clients and Python's `ssl` for raw checks.

- the rule is what Redis runs: an unauthenticated PING is refused (NOAUTH), the user may not
  touch a key outside wspush:* (NOPERM);
- a subscriber on node A gets every publish made through node B (admin, keyed, and a client's `pub`),
  in order, once; a resume on B from what A saw replays the rest (the history over TLS too);
- a node given another CA refuses the link: its log names the certificate check that failed,
  /readyz answers 503 with that reason, and it keeps trying (never plain text: there is no
  plain port to fall back to);
- a node with a wrong password: /readyz 503 whose reason says the credentials are wrong;
- rediss-cluster://: a Redis Cluster of three masters with TLS ports (the cluster bus and
  replication over TLS too): a node reaches every master over TLS (CLUSTER SLOTS answers a TLS
  client with the TLS ports) and delivers on topics of each.
Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import json
import os
import shutil
import socket
import ssl
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wsp_bus import connect, readyz, resume_on_other_node, slot_of  # noqa: E402
from wsp_redis import Pki, RedisCluster, RedisServer, _encode, _read_resp, free_port  # noqa: E402
from wsp_testlib import (Findings, ServerProcess, admin_port, arg_parser, check, metric, poll_until,  # noqa: E402
                         publish_ok, recv_json, run_main, scaled, subscribe)

PASSWORD = "s3cret:with@odd/chars"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def documented_rule() -> str:
    """The ACL rule docs/REDIS.md gives for a node, as it stands there."""
    prefix = "ACL SETUSER wspush on >PASSWORD "
    for line in open(os.path.join(ROOT, "docs", "REDIS.md")):
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise AssertionError("docs/REDIS.md gives no line 'ACL SETUSER wspush on >PASSWORD ...'")


ACL_RULE = documented_rule()


def tls_redis(pki: Pki) -> "tuple[RedisServer, int]":
    """redis-server on a TLS port only, client certificates required, the default user off."""
    port = free_port()
    rs = RedisServer(extra=("--port", "0", "--tls-port", str(port), "--tls-cert-file", pki.server[1],
                            "--tls-key-file", pki.server[0], "--tls-ca-cert-file", pki.ca[1],
                            "--tls-auth-clients", "yes", "--user", "default", "off",
                            "--user", "wspush", "on", ">" + PASSWORD, *ACL_RULE.split()))
    rs.start(wait=False)
    check(poll_until(lambda: raw(pki, port, auth=True) == "PONG", scaled(30)), "redis-server did not answer over TLS")
    return rs, port


def raw(pki: Pki, port: int, *command: str, auth: bool) -> object:
    """One command over TLS as Python's ssl makes it (PING by default); RuntimeError carries a
    Redis error; None while Redis does not answer yet."""
    ctx = ssl.create_default_context(cafile=pki.ca[1])
    ctx.load_cert_chain(pki.client[1], pki.client[0])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=scaled(5)) as s:
            with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
                f = t.makefile("rb")
                if auth:
                    t.sendall(_encode("AUTH", "wspush", PASSWORD))
                    check(_read_resp(f) == "OK", "AUTH as wspush refused")
                t.sendall(_encode(*(command or ("PING",))))
                return _read_resp(f)
    except (OSError, ssl.SSLError):
        return None


def ready_body(s: ServerProcess) -> "tuple[int, dict]":
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port(s)}/readyz", timeout=scaled(5)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def tls_node(args, pki: Pki, port: int, url: str = "", ca: str = "") -> ServerProcess:
    return ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                         extra=["--bus", url or f"rediss://wspush@127.0.0.1:{port}", "--threads", "2",
                                "--history-size", "1000", "--allow-client-publish",
                                "--redis-password-file", pki.password_file, "--redis-tls-ca", ca or pki.ca[1],
                                "--redis-tls-cert", pki.client[1], "--redis-tls-key", pki.client[0]]).start()


# ---- the steps ------------------------------------------------------------------------------------

def acl_holds(pki: Pki, port: int) -> None:
    try:
        raw(pki, port, auth=False)
        check(False, "an unauthenticated PING was answered")
    except RuntimeError as e:
        check(str(e).startswith("NOAUTH"), f"an unauthenticated PING: {e}")
    try:
        raw(pki, port, "SET", "other:key", "1", auth=True)
        check(False, "the node's user wrote a key outside wspush:*")
    except RuntimeError as e:
        check(str(e).startswith("NOPERM"), f"a key outside wspush:*: {e}")


async def delivery(a: ServerProcess, b: ServerProcess) -> None:
    topics = ["mailbox:tls:1", "mailbox:tls:2"]
    w = await connect(a)
    try:
        r = await subscribe(w, topics)
        check(r.get("lost") == [], f"sub: {r}")
        for n in range(20):
            t = topics[n % 2]
            eid = publish_ok(b, t, n)
            e = await recv_json(w)
            check(e == {"topic": t, "id": eid, "data": n}, f"event {n} through TLS: {e}")
        # A publish with an idempotency key, twice: the rule lets the keyed function remember it.
        req = lambda: urllib.request.Request(f"http://127.0.0.1:{admin_port(b)}/publish", data=json.dumps(
            {"topic": topics[1], "data": "keyed", "idempotency_key": "tls-key-1"}).encode())
        with urllib.request.urlopen(req(), timeout=scaled(10)) as r1, urllib.request.urlopen(req(), timeout=scaled(10)) as r2:
            id1, id2 = json.loads(r1.read())["id"], json.loads(r2.read())["id"]
        check(id1 == id2, f"a keyed publish sent twice as the ACL user: {id1} then {id2}")
        e = await recv_json(w)
        check(e == {"topic": topics[1], "id": id1, "data": "keyed"}, f"the keyed event: {e}")
        wb = await connect(b)
        try:
            await wb.send(json.dumps({"op": "pub", "topic": topics[0], "data": "from b"}))
            e = await recv_json(w)
            check(e.get("topic") == topics[0] and e.get("data") == "from b", f"a client's pub on B: {e}")
        finally:
            await wb.close()
    finally:
        await w.close()
    await resume_on_other_node(a, b, ["mailbox:tls:3"], "a resume over TLS")


def wrong_ca(args, pki: Pki, port: int) -> None:
    s = tls_node(args, pki, port, ca=pki.other_ca[1])
    try:
        s.wait_for_log(r"certificate verify failed", scaled(20), "the log naming the failed certificate check")
        status, body = ready_body(s)
        check(status == 503 and body.get("status") == "bus_down" and "certificate verify failed" in body.get("reason", ""),
              f"/readyz with a CA that does not sign Redis's certificate: {status} {body}")
        check(metric(s, "wspush_bus_up") == 0, "wspush_bus_up is not 0")
        check(s.alive(), "the node exited over a certificate: it should keep trying")
    finally:
        s.kill()


def wrong_password(args, pki: Pki, port: int) -> None:
    s = tls_node(args, pki, port, url=f"rediss://wspush:nope@127.0.0.1:{port}")
    try:
        check(poll_until(lambda: "password is wrong" in ready_body(s)[1].get("reason", ""), scaled(20)),
              f"/readyz with a wrong password: {ready_body(s)}\n" + s.log_tail())
        check(ready_body(s)[0] == 503, "a wrong password left the node ready")
    finally:
        s.kill()


async def cluster_over_tls(args, pki: Pki) -> None:
    cluster = RedisCluster(masters=3, replicas=0, persistent=False, pki=pki).start()
    s = None
    try:
        s = ServerProcess(args.server, io=args.io, mode="pubsub", quiet=not args.verbose,
                          extra=["--bus", cluster.tls_url, "--threads", "2", "--redis-tls-ca", pki.ca[1]]).start()
        check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(30)),
              "a node did not come up on a cluster over TLS\n" + s.log_tail())
        # A topic on each master.
        topics, masters = [], set()
        for k in range(1000):
            t = f"mailbox:tls-cluster:{k}"
            port = cluster.node_of(slot_of(t)).port
            if port not in masters:
                masters.add(port)
                topics.append(t)
            if len(masters) == 3:
                break
        check(len(topics) == 3, f"topics on {len(masters)} masters only")
        w = await connect(s)
        try:
            await subscribe(w, topics)
            for t in topics:
                eid = publish_ok(s, t, t)
                e = await recv_json(w)
                check(e == {"topic": t, "id": eid, "data": t}, f"over TLS through the cluster: {e}")
        finally:
            await w.close()
        check(not s.crashed(), "the node crashed\n" + s.log_tail())
    finally:
        if s is not None:
            s.kill()
        cluster.close()


def main(args) -> None:
    if shutil.which("openssl") is None:
        raise AssertionError("openssl is needed (Debian package openssl)")
    pki = Pki(PASSWORD)
    rs = None
    try:
        rs, port = tls_redis(pki)
        f = Findings()
        f.step("the ACL holds: no default user, no key outside wspush:*", lambda: acl_holds(pki, port))
        a = tls_node(args, pki, port)
        b = tls_node(args, pki, port)
        for s in (a, b):
            check(poll_until(lambda: metric(s, "wspush_bus_up") == 1 and readyz(s) == 200, scaled(20)),
                  "a node did not come up over TLS as the ACL user\n" + s.log_tail())
        f.step("two nodes over TLS: every publish, in order, once; a resume", lambda: asyncio.run(delivery(a, b)))
        f.step("another CA: refused, named in the log and /readyz", lambda: wrong_ca(args, pki, port))
        f.step("a wrong password: /readyz says so", lambda: wrong_password(args, pki, port))
        f.step("rediss-cluster://: three masters over TLS", lambda: asyncio.run(cluster_over_tls(args, pki)))
        for s in (a, b):
            check(not s.crashed(), "a node crashed\n" + s.log_tail())
        check(not rs.crashed(), f"redis-server crashed (exit {rs.proc.returncode})")
        f.done()
    finally:
        if rs is not None:
            rs.close()
        pki.close()


if __name__ == "__main__":
    run_main(main, arg_parser(__doc__.splitlines()[0]))
