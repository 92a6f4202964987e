#!/usr/bin/python3
"""wspush RFC 6455 conformance suite (our own, over raw sockets, modelled on Autobahn's categories).

Categories: 1 framing, 2 pings/pongs, 3 reserved bits, 4 opcodes, 5 fragmentation, 6 UTF-8, 7 close
handling, 9 limits, 10 a whole connection one byte per send. Each case runs on a fresh connection to a
`--mode=echo` server and prints `case 6.4.2 OK` (or FAILED / NON-STRICT with what was expected and seen);
the run exits non-zero if any strict case failed, 77 if `--io uring` fell back to epoll.

    conformance.py --server build/server/wspush --io uring [--case '6.*'] [--list]
    conformance.py --port 8080 --case '7.*'      # against a server you started yourself
    conformance.py --server build/server/wspush --tls --case '1.*'   # over TLS (wss://), via a relay
"""
import fnmatch
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import casekit  # noqa: E402
import cases_close  # noqa: E402
import cases_framing  # noqa: E402
import cases_utf8  # noqa: E402
from wsp_testlib import (RawWebSocket, ServerProcess, TestFailure, admin_port, arg_parser, run_main,  # noqa: E402
                         scrape_metrics)
from wsp_tls import TlsRelay, make_cert, tls_args  # noqa: E402

# After a protocol error the server may no longer find our close frame in the stream; it then closes
# TCP after --close-timeout. A short one keeps such cases quick without changing what is checked.
SERVER_OPTIONS = ["--close-timeout", "2"]


def all_cases() -> list:
    if not casekit.CASES:
        for module in (cases_framing, cases_utf8, cases_close):
            module.register()
        ids = [c.id for c in casekit.CASES]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        assert not duplicates, f"duplicate case ids: {duplicates}"
    return casekit.CASES


def run_case(case: casekit.Case, port: int) -> str:
    """Runs one case; returns '' on success, else what went wrong."""
    client = RawWebSocket(port, timeout=case.timeout)
    try:
        if not case.opens_itself:
            client.open()
        for step in case.steps:
            step(client)
        return ""
    except TestFailure as exc:
        return str(exc)
    except OSError as exc:
        return f"socket error: {exc!r}"
    finally:
        client.close_socket()


def run_all(cases: list, port: int, server, verbose: bool) -> list:
    failed, non_strict = [], []
    for n, case in enumerate(cases):
        started = time.monotonic()
        problem = run_case(case, port)
        took = f"{time.monotonic() - started:.2f}s"
        if not problem:
            print(f"case {case.id} OK" + (f"  ({case.description}; {took})" if verbose else ""), flush=True)
        elif not case.strict:
            non_strict.append(case.id)
            print(f"case {case.id} NON-STRICT  {case.description}\n    {problem}", flush=True)
        else:
            failed.append(case.id)
            print(f"case {case.id} FAILED  {case.description} ({took})\n    {problem}", flush=True)
        if problem and server is not None and not server.alive():
            rest = [c.id for c in cases[n + 1:]]
            failed.extend(rest)
            print(f"server died during case {case.id}; {len(rest)} remaining cases count as failed\n"
                  + server.log_tail(), flush=True)
            break
    print(f"\n{len(cases)} cases: {len(cases) - len(failed) - len(non_strict)} OK, {len(failed)} FAILED, "
          f"{len(non_strict)} NON-STRICT", flush=True)
    if non_strict:
        print("non-strict (reported, not required): " + " ".join(non_strict))
    return failed


def select_cases(patterns) -> list:
    cases = all_cases()
    if patterns:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    return cases


def main(args) -> None:
    cases = select_cases(args.case)
    if args.list:
        for c in cases:
            print(f"{c.id:10} {'' if c.strict else '(non-strict) '}{c.description}")
        return
    if not cases:
        raise TestFailure(f"no case matches {args.case}")
    if args.port:
        failed = run_all(cases, args.port, None, args.verbose)
    elif args.tls:
        # The cases speak plain sockets to a relay that carries each write, as it comes, to the
        # server over TLS: the same bytes cross the server's TLS record path.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = make_cert(tmp)
            with ServerProcess(args.server, io=args.io, mode="echo", extra=SERVER_OPTIONS + tls_args(cert, key),
                               quiet=not args.verbose) as server:
                print(f"server: {server.backend_line.strip()} (TLS, via a relay)", flush=True)
                relay = TlsRelay(server.port, cert)
                try:
                    failed = run_all(cases, relay.port, server, args.verbose)
                finally:
                    relay.close()
                if relay.errors:
                    raise TestFailure("; ".join(relay.errors[:3]))
                m = scrape_metrics(admin_port(server))
                done = sum(m.get(f'wspush_tls_handshakes_total{{result="{r}"}}', 0) for r in ("ok", "resumed"))
                if done < len(cases):
                    raise TestFailure(f"{len(cases)} cases but {done:.0f} TLS handshakes: the relay was bypassed")
                print(f"{done:.0f} TLS handshakes", flush=True)
    else:
        with ServerProcess(args.server, io=args.io, mode="echo", extra=SERVER_OPTIONS,
                           quiet=not args.verbose) as server:
            print(f"server: {server.backend_line.strip()}", flush=True)
            failed = run_all(cases, server.port, server, args.verbose)
    if failed:
        raise TestFailure(f"{len(failed)} case(s) failed: {' '.join(failed)}")


def parser():
    p = arg_parser(__doc__.splitlines()[0])
    for action in p._actions:
        if action.dest == "server":
            action.required = False
    p.add_argument("--port", type=int, default=0, help="test a server already listening on 127.0.0.1:PORT")
    p.add_argument("--case", action="append", help="only cases whose id matches this glob (repeatable)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--tls", action="store_true", help="start the server with a test certificate and run the cases over TLS")
    return p


if __name__ == "__main__":
    p = parser()
    ns = p.parse_known_args()[0]
    if not (ns.server or ns.port or ns.list):
        p.error("one of --server or --port is required")
    run_main(main, p)
