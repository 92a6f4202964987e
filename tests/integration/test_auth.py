#!/usr/bin/python3
"""Token checks during the upgrade (JWT HS256, tokens minted here with hmac/hashlib).

With --jwt-secret: a valid token in ?token= or in the cookie wspush_token upgrades (raw client and
Python `websockets`) and echoes; a missing, malformed, badly signed, expired, alg=none or HS512 token
or not valid yet (`nbf` more than the 30 s leeway ahead) gets 401 before switching protocols and the
TCP connection is closed; the server keeps serving.
Without a secret and without --auth=none the server refuses to start, saying why; --jwt-secret-file
works. Exit 0 pass, 1 fail, 77 io_uring unavailable.
"""
import asyncio
import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import websockets  # noqa: E402
from wsp_testlib import (OP_TEXT, RawWebSocket, ServerProcess, arg_parser, check, http_exchange,  # noqa: E402
                         run_main, run_step, scaled, upgrade_request)

SECRET = "test-secret-\u00e9-not-for-production"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(claims: dict, secret: str = SECRET, alg: str = "HS256") -> str:
    head = b64url(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    body = b64url(json.dumps(claims).encode())
    digest = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}.get(alg, hashlib.sha256)
    sig = b64url(hmac.new(secret.encode(), f"{head}.{body}".encode(), digest).digest())
    return f"{head}.{body}.{sig}"


def claims(**extra) -> dict:
    return {"sub": "user-42", "exp": int(time.time()) + 3600, "topics": ["mailbox:42"], **extra}


def expect_echo_with(port: int, path: str, extra: str = "") -> None:
    with RawWebSocket(port).open(path=path, extra_headers=extra) as ws:
        ws.send_frame(OP_TEXT, b"authorised")
        ws.expect_message(OP_TEXT, b"authorised")


def valid_tokens(port: int) -> None:
    token = mint(claims())
    expect_echo_with(port, f"/ws?token={token}")
    # nbf a little ahead (a minter's clock a few seconds fast) is within the 30 s leeway; past is fine.
    expect_echo_with(port, "/ws?token=" + mint(claims(nbf=int(time.time()) + 10)))
    expect_echo_with(port, "/ws?token=" + mint(claims(nbf=int(time.time()) - 60)))
    expect_echo_with(port, "/ws", f"Cookie: theme=dark; wspush_token={token}\r\n")


def refused(port: int) -> None:
    good = mint(claims())
    head, body, sig = good.split(".")
    cases = {
        "no token": "/ws",
        "malformed": "/ws?token=not-a-jwt",
        "bad signature": f"/ws?token={head}.{body}.{b64url(b'x' * 32)}",
        "wrong secret": "/ws?token=" + mint(claims(), secret="another secret"),
        "expired": "/ws?token=" + mint(claims(exp=int(time.time()) - 10)),
        "alg none": f"/ws?token={b64url(json.dumps({'alg': 'none'}).encode())}.{body}.",
        "alg HS512": "/ws?token=" + mint(claims(), alg="HS512"),
        "exp missing": "/ws?token=" + mint({"sub": "x", "topics": []}),
        "nbf 500 s ahead": "/ws?token=" + mint(claims(nbf=int(time.time()) + 500)),
    }
    for name, path in cases.items():
        resp = http_exchange(port, upgrade_request(path))
        check(resp.status == 401, f"{name}: expected 401, got {resp.status} {resp.reason}")
        check(resp.closed, f"{name}: the server kept the TCP connection open after 401")


async def websockets_client(port: int) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token={mint(claims())}") as ws:
        await ws.send("hello")
        check(await asyncio.wait_for(ws.recv(), scaled(10)) == "hello", "no echo with a valid token")
    try:
        await websockets.connect(f"ws://127.0.0.1:{port}/ws?token={mint(claims(), secret='wrong')}")
    except websockets.exceptions.InvalidStatusCode as exc:
        check(exc.status_code == 401, f"websockets saw {exc.status_code}, expected 401")
    else:
        check(False, "a badly signed token was accepted")


def refuses_to_start_without_secret(binary: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSPUSH_")}
    out = subprocess.run([binary, "--listen", "127.0.0.1:0"], capture_output=True, timeout=scaled(20), env=env)
    check(out.returncode != 0, "the server started without a secret and without --auth=none")
    check(b"--auth=none" in out.stderr and b"--jwt-secret" in out.stderr,
          f"the refusal does not say what to do: {out.stderr[:300]!r}")


def secret_file(args) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".secret") as f:
        f.write(SECRET + "\n")  # the trailing newline is not part of the secret
        f.flush()
        with ServerProcess(args.server, io=args.io, mode="echo", extra=["--jwt-secret-file", f.name],
                           jwt_secret="", quiet=not args.verbose) as server:
            expect_echo_with(server.port, f"/ws?token={mint(claims())}")
            resp = http_exchange(server.port, upgrade_request("/ws?token=" + mint(claims(), secret=SECRET + "\n")))
            check(resp.status == 401, f"a token signed with the newline was accepted ({resp.status})")


def run(args) -> None:
    quiet = not args.verbose
    with ServerProcess(args.server, io=args.io, mode="echo", jwt_secret=SECRET, quiet=quiet) as server:
        run_step("valid tokens (query, cookie) upgrade and echo", valid_tokens, server.port)
        run_step("missing, malformed, forged, expired, alg=none, HS512 tokens -> 401", refused, server.port)
        run_step("Python websockets with a valid and a forged token", lambda: asyncio.run(websockets_client(server.port)))
        check(server.alive(), "server exited\n" + server.log_tail())
    run_step("no secret and no --auth=none -> refuses to start", refuses_to_start_without_secret, args.server)
    run_step("--jwt-secret-file", secret_file, args)


if __name__ == "__main__":
    run_main(run, arg_parser(__doc__.splitlines()[0]))
