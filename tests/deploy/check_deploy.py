#!/usr/bin/env python3
"""Checks the deployment files in deploy/ against the real binary and the docs.

    check_deploy.py --wspush PATH/TO/wspush --root REPO_ROOT

- every wspush flag and WSPUSH_* variable the files use exists in `wspush --help`;
- the systemd unit: required keys, stop timeout above the drain window, io_uring not filtered,
  `systemd-analyze verify` where it works;
- deploy/wspush.toml: valid TOML with every option of `--help` commented out at its default, each
  value taken by the real binary (`--config` with every line uncommented), and the file as
  shipped starting the real binary;
- sysctl and limits files: keys exist in this kernel, values parse and agree with each other;
- the Dockerfile: Debian 12 stages, a non-root user, runtime packages that exist and cover the
  binary's shared libraries, CMake options that exist, a build context that holds what it copies;
- compose.yaml: services, commands, health checks, dependencies, the nginx variant;
- compose.cluster.yaml: six Redis in cluster mode announcing their service names, the one-shot
  service that makes the cluster naming each of them, nodes whose --bus names the cluster and
  that wait for it, the same nginx variant;
- the Kubernetes manifests: kinds and API versions, probes on the admin port, grace period
  above preStop + drain, selectors that match, the admin port fenced by the NetworkPolicy;
- the Grafana dashboard: valid JSON whose queries use only metrics (and labels) of
  docs/METRICS.md;
- `nginx -t` on the shipped nginx config and the compose variant.

A check that needs a tool this machine lacks is skipped with a note. Exit status 1 when any
check failed.
"""
import argparse
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
from wsp_nginx import nginx_prefix  # noqa: E402  (the throwaway nginx prefix the Redis test uses too)


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []
        self.skipped: list[str] = []

    def check(self, cond: bool, what: str) -> bool:
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"FAIL {what}")
        return cond

    def fail(self, what: str) -> None:
        self.check(False, what)

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        print(f"skip {what}")


R = Report()


# ---- the binary's flags -----------------------------------------------------------------------

class Flags:
    """What `wspush --help` lists: each flag, whether it takes a value, and its default."""

    def __init__(self, help_text: str) -> None:
        self.takes_value: dict[str, bool] = {}
        self.default: dict[str, str] = {}
        last = None
        for line in help_text.splitlines():
            m = re.match(r"^\s+--([a-z0-9][a-z0-9-]*)(.*)$", line)
            if m:
                last = m.group(1)
                rest = m.group(2)
                # "--name METAVAR   description": the metavar comes before a run of 2+ spaces.
                head = re.split(r"\s{2,}", rest.strip(), maxsplit=1)[0] if rest.strip() else ""
                self.takes_value[last] = bool(head) and not rest.startswith("  ")
            if last:
                d = re.search(r"\[default: ([^\]]*)\]", line)
                if d and last not in self.default:
                    self.default[last] = d.group(1)

    def __contains__(self, name: str) -> bool:
        return name in self.takes_value

    def env_flag(self, var: str) -> str | None:
        """WSPUSH_MAX_CONNECTIONS -> max-connections when that flag exists."""
        if not var.startswith("WSPUSH_"):
            return None
        name = var[len("WSPUSH_"):].lower().replace("_", "-")
        return name if name in self else None

    def number(self, name: str, given: dict[str, str]) -> float:
        return float(given.get(name, self.default.get(name, "0")))


def parse_args(flags: Flags, args: list[str], where: str) -> dict[str, str]:
    """Checks a wspush argument list; returns {flag: value} ('' for switches)."""
    out: dict[str, str] = {}
    k = 0
    while k < len(args):
        a = str(args[k])
        if not a.startswith("--"):
            R.fail(f"{where}: stray argument {a!r} (not a --flag or its value)")
            k += 1
            continue
        name, eq, value = a[2:].partition("=")
        if not R.check(name in flags, f"{where}: --{name} is not a flag of `wspush --help`"):
            k += 1
            continue
        if flags.takes_value[name] and not eq:
            if k + 1 >= len(args):
                R.fail(f"{where}: --{name} needs a value")
                break
            value = str(args[k + 1])
            k += 1
        elif not flags.takes_value[name] and eq and value not in ("true", "false"):
            R.fail(f"{where}: --{name} is a switch, given {value!r}")
        out[name] = value
        k += 1
    return out


def check_env_names(flags: Flags, names, where: str) -> None:
    for n in names:
        R.check(flags.env_flag(n) is not None,
                f"{where}: {n} is no WSPUSH_<flag> of `wspush --help`")


def host_port(value: str) -> tuple[str, int] | None:
    m = re.match(r"^\[?([^\]]*)\]?:(\d+)$", value)
    return (m.group(1), int(m.group(2))) if m else None


# ---- docs/METRICS.md --------------------------------------------------------------------------

class Metrics:
    def __init__(self, text: str) -> None:
        self.type: dict[str, str] = {}
        self.labels: dict[str, dict[str, set[str] | None]] = {}
        for line in text.splitlines():
            m = re.match(r"^\|\s*`(wspush_[a-z0-9_]+)`\s*\|\s*([a-z]+)\s*\|([^|]*)\|", line)
            if not m:
                continue
            name, typ, cell = m.group(1), m.group(2), m.group(3)
            self.type[name] = typ
            labels: dict[str, set[str] | None] = {}
            for seg in cell.split(";"):
                lm = re.match(r"\s*`([a-z_][a-z0-9_]*)`\s*(=|\()", seg)
                if not lm:
                    continue
                if lm.group(2) == "=":
                    rest = seg[lm.end():]
                    rest = re.sub(r"\([^()]*\)", "", rest)  # notes in parentheses
                    labels[lm.group(1)] = set(re.findall(r"`([a-z0-9_]+)`", rest))
                else:
                    labels[lm.group(1)] = None  # values described elsewhere
            self.labels[name] = labels


PROM_FUNCS_RATE = ("rate", "irate", "increase")
TARGET_LABELS = {"instance", "job"}


def check_promql(metrics: Metrics, expr: str, where: str) -> None:
    names = set(re.findall(r"\bwspush_[a-z0-9_]+\b", expr))
    R.check(bool(names), f"{where}: no wspush_ metric in {expr!r}")
    used_labels: set[str] = set(TARGET_LABELS)
    for n in sorted(names):
        base, suffix = n, ""
        if n not in metrics.type:
            m = re.match(r"^(.*)_(bucket|sum|count)$", n)
            if m and metrics.type.get(m.group(1)) == "histogram":
                base, suffix = m.group(1), m.group(2)
            else:
                R.fail(f"{where}: metric {n} is not in docs/METRICS.md")
                continue
        elif metrics.type[n] == "histogram":
            R.fail(f"{where}: histogram {n} has no plain series (use _bucket, _sum or _count)")
        doc_labels = metrics.labels.get(base, {})
        used_labels |= set(doc_labels)
        if suffix == "bucket":
            used_labels.add("le")
        # label matchers of this metric's selectors
        for sel in re.finditer(rf"\b{n}\b\s*\{{([^}}]*)\}}", expr):
            for lm in re.finditer(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"', sel.group(1)):
                label, op, value = lm.groups()
                if label in TARGET_LABELS:
                    continue
                if not R.check(label in doc_labels, f"{where}: {n} has no label {label!r} in docs/METRICS.md"):
                    continue
                values = doc_labels[label]
                if op == "=" and values:
                    R.check(value in values, f"{where}: {n}{{{label}}} has no value {value!r} in docs/METRICS.md")
        # rate() and friends need a counter (or a histogram's series)
        for fm in re.finditer(rf"\b({'|'.join(PROM_FUNCS_RATE)})\s*\(\s*{n}\b", expr):
            R.check(metrics.type[base] in ("counter", "histogram"),
                    f"{where}: {fm.group(1)}() of {n}, a {metrics.type[base]}")
    for bm in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", bm.group(1)):
            R.check(label in used_labels, f"{where}: grouping by {label!r}, a label none of its metrics has")
    if "histogram_quantile" in expr:
        R.check("_bucket" in expr and re.search(r"by\s*\([^)]*\ble\b", expr) is not None,
                f"{where}: histogram_quantile without a _bucket series summed by le")


# ---- small parsers ----------------------------------------------------------------------------

def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    cur = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        m = re.match(r"^\[(.+)\]$", line)
        if m:
            cur = m.group(1)
            sections.setdefault(cur, [])
            continue
        key, eq, value = line.partition("=")
        if not eq or cur is None:
            R.fail(f"systemd unit: cannot parse line {raw!r}")
            continue
        sections[cur].append((key.strip(), value.strip()))
    return sections


def unit_values(sections, section: str, key: str) -> list[str]:
    return [v for k, v in sections.get(section, []) if k == key]


def systemd_seconds(value: str) -> float | None:
    total = 0.0
    units = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
             "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "ms": 0.001, "msec": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if not parts or re.sub(r"[\d.\sa-z]", "", value):
        return None
    for num, unit in parts:
        if unit not in units:
            return None
        total += float(num) * units[unit]
    return total


def compose_seconds(value) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(value))
    if not m or not any(m.groups()):
        return None
    return int(m.group(1) or 0) * 60 + float(m.group(2) or 0)


def parse_sysctl(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        if not R.check(bool(eq), f"sysctl: cannot parse line {raw!r}"):
            continue
        key = key.strip().lstrip("-")
        R.check(key not in out, f"sysctl: {key} set twice")
        out[key] = value.strip()
    return out


def ints(value: str) -> list[int] | None:
    try:
        return [int(x) for x in value.split()]
    except ValueError:
        return None


def parse_port_list(value: str) -> set[int] | None:
    ports: set[int] = set()
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not m:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if not (0 < lo <= hi <= 65535):
            return None
        ports.update(range(lo, hi + 1))
    return ports


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    cur = ""
    for raw in text.splitlines():
        s = raw.strip()
        if s.startswith("#") or (not s and not cur):
            continue  # comments (also inside a continued instruction) and blank lines
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        if cur.strip():
            op, _, rest = cur.strip().partition(" ")
            out.append((op.upper(), rest.strip()))
        cur = ""
    return out


def apt_packages(run: str) -> list[str]:
    pkgs: list[str] = []
    for m in re.finditer(r"apt-get\s+install\s+([^&;|]*)", run):
        pkgs += [t for t in m.group(1).split() if not t.startswith("-")]
    return pkgs


def nginx_strip(text: str) -> str:
    """The config without its leading comment block and the upstream's server lines."""
    lines = text.splitlines()
    k = 0
    while k < len(lines) and (lines[k].startswith("#") or not lines[k].strip()):
        k += 1
    body = [ln for ln in lines[k:] if not re.match(r"^\s+server\s+\S+:\d+\s", ln)]
    return "\n".join(body)


def upstream_servers(text: str) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"(?m)^\s+server\s+([\w.-]+):(\d+)\s", text)]


# ---- the checks -------------------------------------------------------------------------------

class Deploy:
    def __init__(self, root: str, wspush: str) -> None:
        self.root = root
        self.wspush = wspush
        self.dir = os.path.join(root, "deploy")
        help_run = subprocess.run([wspush, "--help"], capture_output=True, text=True, timeout=30)
        if help_run.returncode != 0 or "--listen" not in help_run.stdout:
            print(f"FAIL `{wspush} --help` exited {help_run.returncode}: {help_run.stderr.strip()}")
            sys.exit(1)
        self.flags = Flags(help_run.stdout)
        self.metrics = Metrics(self.read("docs/METRICS.md"))
        self.sysctl: dict[str, str] = {}

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> str:
        with open(self.path(rel), encoding="utf-8") as f:
            return f.read()

    def exists(self, rel: str) -> bool:
        return R.check(os.path.isfile(self.path(rel)), f"{rel} is missing")

    # -- systemd --------------------------------------------------------------------------------
    def systemd(self) -> None:
        rel = "deploy/systemd/wspush@.service"
        if not self.exists(rel):
            return
        text = self.read(rel)
        u = parse_unit(text)
        where = "systemd unit"
        for s in ("Unit", "Service", "Install"):
            R.check(s in u, f"{where}: no [{s}] section")
        svc = lambda key: unit_values(u, "Service", key)  # noqa: E731
        R.check("%i" in text or "%I" in text, f"{where}: a template unit that never uses its instance (%i)")

        user = (svc("User") or [""])[-1]
        dynamic = (svc("DynamicUser") or ["no"])[-1] in ("yes", "true", "1", "on")
        R.check(dynamic or (user and user not in ("root", "0")), f"{where}: runs as root (set User= or DynamicUser=yes)")
        for key, want in (("KillSignal", "SIGTERM"), ("Restart", "on-failure"), ("NoNewPrivileges", "yes"),
                          ("ProtectSystem", "strict"), ("PrivateTmp", "yes")):
            R.check((svc(key) or [""])[-1] == want, f"{where}: {key}={want} expected, got {svc(key)}")
        R.check(any(re.search(r"\bkill\s+(-HUP|-s\s*HUP|-SIGHUP|-1)\s+\$MAINPID", v) for v in svc("ExecReload")),
                f"{where}: ExecReload should send SIGHUP to $MAINPID (certificate reload)")

        nofile = (svc("LimitNOFILE") or [""])[-1]
        nofile_n = int(nofile.split(":")[-1]) if re.fullmatch(r"\d+(:\d+)?", nofile) else None
        if R.check(nofile_n is not None, f"{where}: LimitNOFILE must be a number, got {nofile!r}"):
            R.check(nofile_n >= 65536, f"{where}: LimitNOFILE={nofile_n} is too low for a push server")
            nr_open = ints(self.sysctl.get("fs.nr_open", "1048576")) or [1048576]
            R.check(nofile_n <= nr_open[0],
                    f"{where}: LimitNOFILE={nofile_n} above fs.nr_open={nr_open[0]}: the start would fail")

        starts = svc("ExecStart")
        if not R.check(len(starts) == 1, f"{where}: one ExecStart expected, got {len(starts)}"):
            return
        argv = shlex.split(starts[0].lstrip("-@+!:"))
        R.check(os.path.isabs(argv[0]) and os.path.basename(argv[0]) == "wspush",
                f"{where}: ExecStart runs {argv[0]!r}, not an absolute path to wspush")
        given = parse_args(self.flags, argv[1:], f"{where} ExecStart")
        self.unit_given = given
        R.check("reuseport" in given, f"{where}: instances share the public port: --reuseport expected")
        R.check(given.get("config") == "/etc/wspush/wspush.toml",
                f"{where}: --config /etc/wspush/wspush.toml expected (deploy/wspush.toml), got {given.get('config')!r}")
        drain = self.flags.number("drain-seconds", given)
        close = self.flags.number("close-timeout", given)
        stop = systemd_seconds((svc("TimeoutStopSec") or svc("TimeoutSec") or [""])[-1])
        if R.check(stop is not None, f"{where}: TimeoutStopSec missing or unparsable"):
            R.check(stop > drain + close,
                    f"{where}: TimeoutStopSec={stop:g}s must exceed --drain-seconds ({drain:g}) + --close-timeout ({close:g})")

        # EnvironmentFile: the shipped example's variables must be flags, and not ones that
        # ExecStart sets (the command line wins: the file's value would be ignored).
        env_rel = "deploy/systemd/wspush.env.example"
        if self.exists(env_rel):
            names = []
            for raw in self.read(env_rel).splitlines():
                line = raw.strip()
                if line and not line.startswith("#"):
                    name, eq, _ = line.partition("=")
                    if R.check(bool(eq), f"{env_rel}: cannot parse {raw!r}"):
                        names.append(name.strip())
            check_env_names(self.flags, names, env_rel)
            for n in names:
                f = self.flags.env_flag(n)
                R.check(f not in given, f"{env_rel}: {n} is overridden by --{f} on the unit's ExecStart")
            self.env_example = {n: v.split("=", 1)[1] for n, v in
                                ((ln.split("=", 1)[0].strip(), ln.strip()) for ln in self.read(env_rel).splitlines()
                                 if ln.strip() and not ln.strip().startswith("#"))}

        self.syscall_filter(u)
        self.systemd_verify(text)

    def syscall_filter(self, u) -> None:
        filters = unit_values(u, "Service", "SystemCallFilter")
        if not filters:
            return
        where = "systemd unit: SystemCallFilter"
        uring = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
        if shutil.which("systemd-analyze") is None:
            R.skip(f"{where}: systemd-analyze not found, io_uring calls not resolved")
            return
        cache: dict[str, set[str]] = {}

        def expand(item: str) -> set[str]:
            if not item.startswith("@"):
                return {item.split(":")[0]}
            if item not in cache:
                out = subprocess.run(["systemd-analyze", "syscall-filter", item], capture_output=True, text=True)
                calls: set[str] = set()
                for line in out.stdout.splitlines()[1:]:
                    t = line.strip()
                    if t and not t.startswith("#"):
                        calls |= expand(t)
                cache[item] = calls
            return cache[item]

        allow: set[str] | None = None
        deny: set[str] = set()
        for f in filters:
            negate = f.startswith("~")
            items = set()
            for item in f.lstrip("~").split():
                items |= expand(item)
            if negate:
                deny |= items
            else:
                allow = items if allow is None else allow | items
        blocked = {c for c in uring if (allow is not None and c not in allow) or c in deny}
        R.check(not blocked, f"{where} blocks {sorted(blocked)}: io_uring would fall back to epoll")

    def systemd_verify(self, text: str) -> None:
        if shutil.which("systemd-analyze") is None:
            R.skip("systemd-analyze verify: systemd-analyze not found")
            return
        tmp = tempfile.mkdtemp(prefix="wspush-unit-")
        try:
            # verify checks that ExecStart's program exists: point it at the binary under test.
            unit = os.path.join(tmp, "wspush@0.service")
            with open(unit, "w") as f:
                f.write(re.sub(r"(?m)^(ExecStart=[-@+!:]*)\S+", lambda m: m.group(1) + os.path.abspath(self.wspush), text))
            run = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
            out = (run.stdout + run.stderr).strip()
            ours = [ln for ln in out.splitlines() if "wspush@" in ln]
            if ours:
                R.fail("systemd-analyze verify: " + "; ".join(ours))
            elif run.returncode != 0:
                R.skip(f"systemd-analyze verify does not work here (exit {run.returncode}: {out[:200]})")
            else:
                R.check(True, "systemd-analyze verify")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- the --config file ----------------------------------------------------------------------
    # `# name = value` lines: the options, commented out. Prose comments never start that way.
    OPTION_LINE = re.compile(r"^#\s?([a-z][a-z0-9-]*\s*=.*)$")
    # Read when the option is parsed: their example paths exist only on a server.
    READ_AT_PARSE = ("jwt-secret-file", "redis-password-file")

    def config_file(self) -> None:
        rel = "deploy/wspush.toml"
        if not self.exists(rel):
            return
        text = self.read(rel)
        try:
            shipped = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            R.fail(f"{rel}: not TOML: {e}")
            return
        R.check(shipped == {}, f"{rel}: every option should be commented out, set: {sorted(shipped)}")
        for name in shipped:  # should one be set after all: not where the unit's command line or env file wins
            R.check(name not in getattr(self, "unit_given", {}), f"{rel}: {name} is overridden by the unit's --{name}")
            R.check(name not in {self.flags.env_flag(n) for n in getattr(self, "env_example", {})},
                    f"{rel}: {name} is overridden by deploy/systemd/wspush.env.example")
        lines = [self.OPTION_LINE.sub(r"\1", ln) for ln in text.splitlines()]
        seen: dict[str, int] = {}
        for n, (raw, line) in enumerate(zip(text.splitlines(), lines), 1):
            if raw == line:
                continue
            name = line.split("=", 1)[0].strip()
            R.check(name not in seen, f"{rel}:{n}: {name} again (line {seen.get(name)})")
            R.check(name in self.flags and name not in ("config", "help"), f"{rel}:{n}: {name} is no option of `wspush --help`")
            seen[name] = n
        for name in self.flags.takes_value:
            if name not in ("config", "help"):
                R.check(name in seen, f"{rel}: no commented line for --{name}")
        try:
            values = tomllib.loads("\n".join(lines))
        except tomllib.TOMLDecodeError as e:
            R.fail(f"{rel}: with its options uncommented, not TOML: {e}")
            return
        for name, v in values.items():
            d = self.flags.default.get(name)
            if d is None or d.startswith("(") or d in ("none", "system store"):
                continue  # unset by default: the line shows an example
            if d in ("on", "off") and isinstance(v, bool):
                shown = "on" if v else "off"
            elif isinstance(v, bool):
                shown = "true" if v else "false"
            else:
                shown = f"{v:g}" if isinstance(v, float) else str(v)
            R.check(shown == d, f"{rel}:{seen.get(name)}: {name} = {v!r}, but its default is {d}")
        # The real binary takes every line with its TOML type (--help: no checks across options).
        tmp = tempfile.mkdtemp(prefix="wspush-config-")
        try:
            every = os.path.join(tmp, "every.toml")
            with open(every, "w") as f:
                f.write("\n".join(ln for raw, ln in zip(text.splitlines(), lines)
                                  if raw == ln or ln.split("=", 1)[0].strip() not in self.READ_AT_PARSE))
            env = {k: v for k, v in os.environ.items() if not k.startswith("WSPUSH_")}
            run = subprocess.run([self.wspush, "--config", every, "--help"], capture_output=True, text=True,
                                 timeout=30, env=env)
            R.check(run.returncode == 0, f"{rel}: with its options uncommented, `wspush --config` refuses it: "
                                         f"{run.stderr.strip()}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.start_with(self.path(rel), rel, env)

    def start_with(self, config: str, where: str, env: dict) -> None:
        """The real binary starts on the file as shipped (on free ports) and stops on SIGTERM."""
        proc = subprocess.Popen([self.wspush, "--config", config, "--auth=none", "--listen", "127.0.0.1:0",
                                 "--admin-listen", "127.0.0.1:0", "--drain-seconds", "0.1"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env)
        log = b""
        try:
            sel = selectors.DefaultSelector()
            sel.register(proc.stderr, selectors.EVENT_READ)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and b"listening on" not in log:
                if sel.select(timeout=0.5):
                    chunk = os.read(proc.stderr.fileno(), 65536)
                    if not chunk:
                        break
                    log += chunk
            if not R.check(b"listening on" in log, f"{where}: `wspush --config {where}` did not start: "
                                                   + " | ".join(log.decode(errors="replace").splitlines()[-5:])):
                return
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            R.check(rc == 0, f"{where}: the server started on it exited {rc} on SIGTERM")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # -- sysctl and limits ----------------------------------------------------------------------
    def sysctl_and_limits(self) -> None:
        rel = "deploy/sysctl/90-wspush.conf"
        if not self.exists(rel):
            return
        self.sysctl = s = parse_sysctl(self.read(rel))
        for key, value in s.items():
            p = "/proc/sys/" + key.replace(".", "/")
            if os.path.isdir("/proc/sys"):
                R.check(os.path.exists(p), f"sysctl: {key} does not exist in this kernel ({p})")
            if key == "net.ipv4.ip_local_reserved_ports":
                R.check(parse_port_list(value) is not None, f"sysctl: {key} = {value!r} is no port list")
            else:
                R.check(ints(value) is not None, f"sysctl: {key} = {value!r} is not made of integers")
        for key in ("fs.nr_open", "fs.file-max", "net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog",
                    "net.ipv4.tcp_mem", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.ip_local_port_range"):
            R.check(key in s, f"sysctl: {key} not set")
        v = {k: ints(x) for k, x in s.items() if k != "net.ipv4.ip_local_reserved_ports"}
        for key in ("net.ipv4.tcp_mem", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            t = v.get(key)
            if t is not None:
                R.check(len(t) == 3 and 0 < t[0] <= t[1] <= t[2], f"sysctl: {key} needs three rising values, got {t}")
        pr = v.get("net.ipv4.ip_local_port_range")
        if pr is not None:
            R.check(len(pr) == 2 and 1024 <= pr[0] < pr[1] <= 65535, f"sysctl: ip_local_port_range {pr} out of 1024..65535")
        nr_open = (v.get("fs.nr_open") or [0])[0]
        R.check(1048576 <= nr_open <= 1073741816, f"sysctl: fs.nr_open={nr_open} outside 1048576..1073741816")
        file_max = (v.get("fs.file-max") or [0])[0]
        R.check(file_max >= nr_open, f"sysctl: fs.file-max={file_max} below fs.nr_open={nr_open}")
        R.check((v.get("net.core.somaxconn") or [0])[0] >= 4096,
                "sysctl: net.core.somaxconn below 4096, the backlog wspush asks for")
        reserved = parse_port_list(s.get("net.ipv4.ip_local_reserved_ports", "")) or set()
        if pr and len(pr) == 2 and pr[0] <= 8100:
            # ephemeral ports overlap the listeners: they must be reserved
            R.check(8080 in reserved and 8100 in reserved,
                    "sysctl: ip_local_port_range covers 8080/8100+: reserve them (ip_local_reserved_ports)")

        rel = "deploy/limits/90-wspush.conf"
        if self.exists(rel):
            seen = {}
            for raw in self.read(rel).splitlines():
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if not R.check(len(parts) == 4, f"limits: cannot parse {raw!r}"):
                    continue
                domain, typ, item, value = parts
                R.check(typ in ("soft", "hard", "-"), f"limits: type {typ!r}")
                R.check(item == "nofile", f"limits: item {item!r} (only nofile expected)")
                if R.check(value.isdigit(), f"limits: value {value!r}"):
                    R.check(int(value) <= nr_open, f"limits: nofile {value} above fs.nr_open {nr_open}: logins would fail")
                    seen[typ] = int(value)
            if "soft" in seen and "hard" in seen:
                R.check(seen["soft"] <= seen["hard"], "limits: soft nofile above hard")

    # -- Dockerfile -----------------------------------------------------------------------------
    def dockerfile(self) -> None:
        rel = "deploy/docker/Dockerfile"
        if not self.exists(rel):
            return
        ins = dockerfile_instructions(self.read(rel))
        stages: list[dict] = []
        for op, rest in ins:
            if op == "FROM":
                m = re.match(r"^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
                if not R.check(m is not None, f"Dockerfile: cannot parse FROM {rest!r}"):
                    continue
                stages.append({"image": m.group(1), "name": m.group(2), "ins": []})
            elif stages:
                stages[-1]["ins"].append((op, rest))
            elif op != "ARG":
                R.fail(f"Dockerfile: {op} before the first FROM")
        if not R.check(len(stages) >= 2, "Dockerfile: a build stage and a runtime stage expected"):
            return
        names = {s["name"] for s in stages if s["name"]}
        for s in stages:
            if s["image"] not in names:
                R.check(re.fullmatch(r"debian:(12|bookworm)(-slim|[.\d]*(-slim)?)?", s["image"]) is not None,
                        f"Dockerfile: stage from {s['image']!r}, not Debian 12")
        runtime = stages[-1]
        users = [r for op, r in runtime["ins"] if op == "USER"]
        R.check(bool(users) and users[-1].split(":")[0] not in ("root", "0"),
                f"Dockerfile: the runtime stage must end with a non-root USER, got {users}")
        ops = {op for op, _ in runtime["ins"]}
        for op in ("ENTRYPOINT", "EXPOSE", "HEALTHCHECK"):
            R.check(op in ops, f"Dockerfile: no {op} in the runtime stage")
        for op, r in runtime["ins"]:
            if op == "HEALTHCHECK":
                R.check("/healthz" in r or "/readyz" in r, "Dockerfile: HEALTHCHECK asks neither /healthz nor /readyz")
            if op == "ENTRYPOINT":
                try:
                    ep = json.loads(r)
                except ValueError:
                    ep = None
                if R.check(isinstance(ep, list) and ep, "Dockerfile: ENTRYPOINT must be the exec (JSON) form"):
                    copied = [x.split()[-1] for o, x in runtime["ins"] if o == "COPY"]
                    R.check(ep[0] in copied, f"Dockerfile: ENTRYPOINT {ep[0]} is not a file the stage copies in")
            if op == "ENV":
                for m in re.finditer(r"(WSPUSH_[A-Z0-9_]+)=", r):
                    check_env_names(self.flags, [m.group(1)], "Dockerfile ENV")

        # CMake options and targets of the build stages exist
        cmake_text = ""
        for d, _, files in os.walk(self.root, followlinks=True):
            if any(part.startswith(("build", "node_modules", ".")) for part in os.path.relpath(d, self.root).split(os.sep) if part != "."):
                continue
            for f in files:
                if f == "CMakeLists.txt" or f.endswith(".cmake"):
                    with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                        cmake_text += fh.read()
        for s in stages[:-1]:
            for op, r in s["ins"]:
                if op != "RUN":
                    continue
                for m in re.finditer(r"-D([A-Za-z0-9_]+)=", r):
                    opt = m.group(1)
                    if not opt.startswith("CMAKE_"):
                        R.check(re.search(rf"(option|set)\(\s*{opt}\b", cmake_text) is not None,
                                f"Dockerfile: -D{opt} is not an option of the CMake project")
                for m in re.finditer(r"--target\s+([A-Za-z0-9_.-]+)", r):
                    R.check(re.search(rf"add_(executable|library)\(\s*{re.escape(m.group(1))}\b", cmake_text) is not None,
                            f"Dockerfile: --target {m.group(1)} is no CMake target")

        # what the build copies from the context (the repository root) exists and is not ignored
        ignore_rel = "deploy/docker/Dockerfile.dockerignore"
        patterns = []
        if os.path.isfile(self.path(ignore_rel)):
            patterns = [ln.strip() for ln in self.read(ignore_rel).splitlines() if ln.strip() and not ln.startswith("#")]
        for s in stages:
            for op, r in s["ins"]:
                if op != "COPY" or "--from" in r:
                    continue
                for src in r.split()[:-1]:
                    if src.startswith("--"):
                        continue
                    R.check(os.path.exists(self.path(src)), f"Dockerfile: COPY {src}: not in the repository root")
                    if patterns:
                        top = src.strip("/").split("/")[0]
                        included = True
                        for p in patterns:
                            neg = p.startswith("!")
                            pat = p.lstrip("!").strip("/")
                            if pat == "*" or pat == top or pat == "**":
                                included = neg
                        R.check(included, f"Dockerfile: COPY {src} is excluded by {ignore_rel}")

        self.runtime_packages(apt_packages(" ".join(r for op, r in runtime["ins"] if op == "RUN")),
                              [p for s in stages[:-1] for op, r in s["ins"] if op == "RUN" for p in apt_packages(r)])

    def runtime_packages(self, runtime_pkgs: list[str], build_pkgs: list[str]) -> None:
        R.check(bool(runtime_pkgs), "Dockerfile: the runtime stage installs no package")
        R.check(not any(p.endswith("-dev") or p in ("build-essential", "cmake") for p in runtime_pkgs),
                f"Dockerfile: build packages in the runtime stage: {runtime_pkgs}")
        if shutil.which("apt-cache") is None:
            R.skip("Dockerfile packages: apt-cache not found")
        elif subprocess.run(["apt-cache", "show", "libc6"], capture_output=True).returncode != 0:
            R.skip("Dockerfile packages: apt-cache knows no package here (apt-get update first)")
        else:
            for p in runtime_pkgs + build_pkgs:
                r = subprocess.run(["apt-cache", "show", "--no-all-versions", p], capture_output=True, text=True)
                R.check(r.returncode == 0 and "Package:" in r.stdout, f"Dockerfile: apt package {p} does not exist")
        # every shared library of the binary comes from the base image or a runtime package
        if shutil.which("ldd") is None or shutil.which("dpkg") is None:
            R.skip("Dockerfile runtime libraries: ldd or dpkg not found")
            return
        ldd = subprocess.run(["ldd", self.wspush], capture_output=True, text=True)
        base = {"libc6", "libgcc-s1", "libstdc++6"}
        for m in re.finditer(r"=>\s+(/\S+)", ldd.stdout):
            lib = m.group(1)
            candidates = [lib, os.path.realpath(lib)]
            candidates += [c[4:] if c.startswith("/usr/") else "/usr" + c for c in list(candidates)]
            pkg = None
            for c in candidates:
                r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
                if r.returncode == 0:
                    pkg = r.stdout.split(":")[0].strip()
                    break
            if pkg is None:
                R.skip(f"Dockerfile runtime libraries: no Debian package owns {lib}")
                continue
            if re.match(r"^lib(asan|ubsan|tsan|lsan)\d*$", pkg):
                continue  # a sanitizer build under test; the image builds without
            R.check(pkg in base or pkg in runtime_pkgs,
                    f"Dockerfile: the binary needs {os.path.basename(lib)} (Debian package {pkg}), "
                    f"which the runtime stage does not install")

    # -- compose --------------------------------------------------------------------------------
    def load_compose(self, rel: str, where: str) -> dict | None:
        """A compose file, parsed (None: absent, or not YAML, which fails)."""
        if not self.exists(rel):
            return None
        try:
            return yaml.safe_load(self.read(rel))
        except yaml.YAMLError as e:
            R.fail(f"{where}: not YAML: {e}")
            return None

    def compose_config(self, rel: str, where: str) -> None:
        """`docker compose config` on a compose file, where docker compose runs."""
        if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
            env = {**os.environ, "WSPUSH_JWT_SECRET": "x", "WSPUSH_API_KEY": "x"}
            r = subprocess.run(["docker", "compose", "-f", self.path(rel), "config", "-q"], capture_output=True, text=True, env=env)
            R.check(r.returncode == 0, f"docker compose config ({where}): {r.stderr.strip()}")
        else:
            R.skip(f"docker compose config ({where}): docker compose not available")

    def compose(self) -> None:
        rel = "deploy/docker/compose.yaml"
        where = "compose.yaml"
        c = self.load_compose(rel, where)
        if c is None:
            return
        services = c.get("services") or {}
        R.check("redis" in services, f"{where}: no redis service")
        R.check("nginx" in services, f"{where}: no nginx service")
        here = os.path.dirname(self.path(rel))

        def is_node(svc) -> bool:
            b = svc.get("build")
            df = b.get("dockerfile", "Dockerfile") if isinstance(b, dict) else None
            return df is not None and df.endswith("deploy/docker/Dockerfile")

        nodes = {n: s for n, s in services.items() if is_node(s)}
        R.check(len(nodes) >= 2, f"{where}: two wspush nodes (built from deploy/docker/Dockerfile) expected, got {sorted(nodes)}")
        for name, svc in services.items():
            R.check("image" in svc or "build" in svc, f"{where}: {name} has neither image nor build")
            R.check("healthcheck" in svc, f"{where}: {name} has no healthcheck")
            deps = svc.get("depends_on") or {}
            for d in deps:
                R.check(d in services, f"{where}: {name} depends on unknown service {d}")

        redis = services.get("redis") or {}
        R.check(str(redis.get("image", "")).startswith("redis:7"), f"{where}: redis should be Redis 7, got {redis.get('image')}")
        rcmd = [str(x) for x in (redis.get("command") or [])]
        rjoined = " ".join(rcmd)
        R.check(re.search(r"--appendonly\s+yes", rjoined) is not None, f"{where}: redis without --appendonly yes")
        R.check(re.search(r"--stream-node-max-bytes\s+512\b", rjoined) is not None,
                f"{where}: redis without --stream-node-max-bytes 512 (docs/PERFORMANCE.md)")
        redis_port = int(re.search(r"--port\s+(\d+)", rjoined).group(1)) if "--port" in rjoined else 6379

        listen_ports = {}
        for k, (name, svc) in enumerate(sorted(nodes.items())):
            w = f"{where} {name}"
            b = svc["build"]
            ctx = os.path.normpath(os.path.join(here, b.get("context", ".")))
            R.check(ctx == os.path.normpath(self.root), f"{w}: build context {ctx} is not the repository root")
            R.check(os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))), f"{w}: dockerfile not found")
            cmd = svc.get("command") or []
            if not R.check(isinstance(cmd, list), f"{w}: command must be a list"):
                continue
            given = parse_args(self.flags, cmd, w)
            env = svc.get("environment") or {}
            env_names = list(env) if isinstance(env, dict) else [e.split("=")[0] for e in env]
            check_env_names(self.flags, env_names, w)
            bus = given.get("bus", "")
            m = re.match(r"^redis://(?::[^@]*@)?([\w.-]+):(\d+)(/\d+)?$", bus)
            if R.check(m is not None, f"{w}: --bus=redis://HOST:PORT expected, got {bus!r}"):
                R.check(m.group(1) in services and int(m.group(2)) == redis_port,
                        f"{w}: --bus points at {m.group(1)}:{m.group(2)}, not the redis service")
                R.check("redis" in (svc.get("depends_on") or {}), f"{w}: does not depend on redis")
            R.check(any(x in given for x in ("jwt-secret", "jwt-secret-file", "auth")) or
                    any(x in env_names for x in ("WSPUSH_JWT_SECRET", "WSPUSH_JWT_SECRET_FILE", "WSPUSH_AUTH")),
                    f"{w}: no token secret (the server refuses to start without one)")
            admin = host_port(given.get("admin-listen", self.flags.default.get("admin-listen", "")))
            listen = host_port(given.get("listen", self.flags.default.get("listen", "")))
            if R.check(admin is not None and listen is not None, f"{w}: --listen/--admin-listen unparsable"):
                listen_ports[name] = listen[1]
                if admin[0] not in ("127.0.0.1", "::1", "localhost"):
                    R.check("api-key" in given or "WSPUSH_API_KEY" in env_names,
                            f"{w}: admin listener beyond loopback without an API key")
                hc = json.dumps(svc.get("healthcheck", {}).get("test", ""))
                R.check(f"/{admin[1]}" in hc or f":{admin[1]}" in hc, f"{w}: healthcheck does not ask the admin port {admin[1]}")
                R.check("/readyz" in hc or "/healthz" in hc, f"{w}: healthcheck asks neither /readyz nor /healthz")
                published = [str(p) for p in svc.get("ports") or []]
                want = f"127.0.0.1:{8100 + k}:{admin[1]}"
                R.check(want in published, f"{w}: admin port published as {published}, expected {want} (8100 + N, loopback)")
            grace = compose_seconds(svc.get("stop_grace_period", "10s"))
            drain = self.flags.number("drain-seconds", given)
            close = self.flags.number("close-timeout", given)
            R.check(grace is not None and grace > drain + close,
                    f"{w}: stop_grace_period {svc.get('stop_grace_period')} must exceed drain + close timeout ({drain + close:g}s)")
            nofile = ((svc.get("ulimits") or {}).get("nofile") or {})
            hard = nofile.get("hard", nofile) if isinstance(nofile, dict) else nofile
            R.check(isinstance(hard, int) and hard >= 65536, f"{w}: ulimits nofile missing or below 65536")

        nginx = services.get("nginx") or {}
        for n in nodes:
            R.check(n in (nginx.get("depends_on") or {}), f"{where}: nginx does not depend on {n}")
        confs = [v.split(":")[0] for v in nginx.get("volumes") or [] if isinstance(v, str) and v.split(":")[0].endswith(".conf")]
        if R.check(len(confs) == 1, f"{where}: nginx should mount one .conf, got {confs}"):
            conf = os.path.normpath(os.path.join(here, confs[0]))
            if R.check(os.path.isfile(conf), f"{where}: nginx config {confs[0]} not found"):
                variant = open(conf).read()
                shipped = self.read("deploy/nginx/wspush.conf")
                R.check(nginx_strip(variant) == nginx_strip(shipped),
                        f"{where}: {confs[0]} differs from deploy/nginx/wspush.conf beyond its upstream servers")
                ups = upstream_servers(variant)
                R.check(sorted(ups) == sorted(listen_ports.items()),
                        f"{where}: nginx upstream {ups} is not the nodes' --listen ports {sorted(listen_ports.items())}")
                self.compose_nginx = (variant, [h for h, _ in ups])
        self.compose_config(rel, where)

    def compose_cluster(self) -> None:
        rel = "deploy/docker/compose.cluster.yaml"
        where = "compose.cluster.yaml"
        c = self.load_compose(rel, where)
        if c is None:
            return
        services = c.get("services") or {}
        redis = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("redis:7") and
                 str((s.get("command") or [""])[0]) == "redis-server"}
        R.check(len(redis) >= 6, f"{where}: six Redis nodes (3 masters, 3 replicas) expected, got {sorted(redis)}")
        for name, svc in redis.items():
            joined = " ".join(str(x) for x in svc["command"])
            for want in (r"--cluster-enabled\s+yes", r"--appendonly\s+yes", r"--stream-node-max-bytes\s+512\b",
                         rf"--cluster-announce-hostname\s+{re.escape(name)}\b", r"--cluster-preferred-endpoint-type\s+hostname"):
                R.check(re.search(want, joined) is not None, f"{where}: {name} lacks {want}")
            R.check("healthcheck" in svc, f"{where}: {name} has no healthcheck")
        init = services.get("redis-cluster-init") or {}
        script = " ".join(str(x) for x in (init.get("command") or []))
        R.check("--cluster create" in script and "--cluster-replicas 1" in script,
                f"{where}: redis-cluster-init does not make the cluster with a replica per master")
        for name in redis:
            R.check(name in script, f"{where}: redis-cluster-init does not name {name}")
            R.check(name in (init.get("depends_on") or {}), f"{where}: redis-cluster-init does not wait for {name}")
        nodes = {n: s for n, s in services.items() if isinstance(s.get("build"), dict) or s.get("image") == "wspush:local"}
        anchor = (c.get("x-wspush") or {})
        R.check(len(nodes) >= 2, f"{where}: two wspush nodes expected, got {sorted(nodes)}")
        for name, svc in nodes.items():
            w = f"{where} {name}"
            given = parse_args(self.flags, [str(x) for x in svc.get("command") or []], w)
            bus = given.get("bus", "")
            m = re.match(r"^redis-cluster://(?::[^@]*@)?(.+)$", bus)
            if R.check(m is not None, f"{w}: --bus=redis-cluster://... expected, got {bus!r}"):
                for seed in m.group(1).split(","):
                    host = seed.rsplit(":", 1)[0]
                    R.check(host in redis, f"{w}: seed {seed} is not a Redis service of the file")
            deps = svc.get("depends_on") or anchor.get("depends_on") or {}
            R.check((deps.get("redis-cluster-init") or {}).get("condition") == "service_completed_successfully",
                    f"{w}: does not wait for redis-cluster-init to complete")
        nginx = services.get("nginx") or {}
        confs = [v.split(":")[0] for v in nginx.get("volumes") or [] if isinstance(v, str) and v.split(":")[0].endswith(".conf")]
        R.check(confs == ["./nginx.conf"], f"{where}: nginx should mount ./nginx.conf (compose.yaml's), got {confs}")
        self.compose_config(rel, where)

    # -- Kubernetes -----------------------------------------------------------------------------
    def kubernetes(self) -> None:
        rel = "deploy/kubernetes/wspush.yaml"
        if not self.exists(rel):
            return
        where = "kubernetes"
        try:
            docs = [d for d in yaml.safe_load_all(self.read(rel)) if d]
        except yaml.YAMLError as e:
            R.fail(f"{where}: not YAML: {e}")
            return
        api = {"Deployment": "apps/v1", "Service": "v1", "PodDisruptionBudget": "policy/v1",
               "NetworkPolicy": "networking.k8s.io/v1", "ConfigMap": "v1", "Secret": "v1"}
        by_kind: dict[str, list[dict]] = {}
        for d in docs:
            kind = d.get("kind")
            if R.check(kind in api, f"{where}: unexpected kind {kind!r}"):
                R.check(d.get("apiVersion") == api[kind], f"{where}: {kind} should be {api[kind]}, got {d.get('apiVersion')}")
            R.check(bool((d.get("metadata") or {}).get("name")), f"{where}: a {kind} without metadata.name")
            by_kind.setdefault(kind, []).append(d)
        for kind in ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"):
            R.check(kind in by_kind, f"{where}: no {kind}")
        if "Deployment" not in by_kind:
            return
        dep = by_kind["Deployment"][0]
        spec = dep.get("spec") or {}
        tmpl = spec.get("template") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        sel = (spec.get("selector") or {}).get("matchLabels") or {}

        def matches(selector: dict) -> bool:
            return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

        R.check(matches(sel), f"{where}: Deployment selector {sel} does not match its pod labels {labels}")
        pod = tmpl.get("spec") or {}
        containers = pod.get("containers") or []
        if not R.check(len(containers) >= 1, f"{where}: no container"):
            return
        ct = containers[0]
        w = f"{where} container {ct.get('name')}"
        R.check(bool(ct.get("image")), f"{w}: no image")
        R.check("command" not in ct or os.path.basename(str(ct["command"][0])) == "wspush", f"{w}: command is not wspush")
        given = parse_args(self.flags, [str(a) for a in ct.get("args") or []], w)
        env_names = [e.get("name") for e in ct.get("env") or []]
        check_env_names(self.flags, env_names, w)
        configmaps = {(d.get("metadata") or {}).get("name"): d for d in by_kind.get("ConfigMap", [])}
        for ef in ct.get("envFrom") or []:
            ref = (ef.get("configMapRef") or {}).get("name")
            if ref is not None and R.check(ref in configmaps, f"{w}: envFrom ConfigMap {ref} is not in the file"):
                check_env_names(self.flags, list((configmaps[ref].get("data") or {})), f"{where} ConfigMap {ref}")
        ports = {p.get("name"): p.get("containerPort") for p in ct.get("ports") or []}
        admin = host_port(given.get("admin-listen", self.flags.default.get("admin-listen", "")))
        listen = host_port(given.get("listen", self.flags.default.get("listen", "")))
        if R.check(admin is not None and listen is not None, f"{w}: --listen/--admin-listen unparsable"):
            R.check(admin[0] in ("0.0.0.0", "::", ""), f"{w}: the admin listener must bind 0.0.0.0 for probes, got {admin[0]}")
            R.check(admin[1] in ports.values(), f"{w}: admin port {admin[1]} is not a containerPort {ports}")
            R.check(listen[1] in ports.values(), f"{w}: public port {listen[1]} is not a containerPort {ports}")
            R.check("api-key" in given or "WSPUSH_API_KEY" in env_names, f"{w}: admin listener on 0.0.0.0 without an API key")
            for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                hg = (ct.get(probe) or {}).get("httpGet") or {}
                port = hg.get("port")
                port = ports.get(port, port)
                R.check(hg.get("path") == path and port == admin[1],
                        f"{w}: {probe} should GET {path} on the admin port {admin[1]}, got {hg.get('path')} on {port}")
        R.check(int(given.get("threads", "0") or 0) > 0, f"{w}: --threads 0 counts the node's cores: set it to the CPU request")
        drain = self.flags.number("drain-seconds", given)
        close = self.flags.number("close-timeout", given)
        pre = ((ct.get("lifecycle") or {}).get("preStop") or {})
        sleep = 0.0
        if "sleep" in pre:
            sleep = float(pre["sleep"].get("seconds", 0))
        elif "exec" in pre:
            cmd = pre["exec"].get("command") or []
            if len(cmd) == 2 and os.path.basename(str(cmd[0])) == "sleep":
                sleep = float(cmd[1])
        grace = pod.get("terminationGracePeriodSeconds", 30)
        R.check(grace > sleep + drain + close,
                f"{where}: terminationGracePeriodSeconds {grace} must exceed preStop {sleep:g} + --drain-seconds {drain:g} + --close-timeout {close:g}")
        psc = pod.get("securityContext") or {}
        csc = ct.get("securityContext") or {}
        R.check(psc.get("runAsNonRoot") or csc.get("runAsNonRoot"), f"{w}: runAsNonRoot not set")
        R.check(csc.get("readOnlyRootFilesystem") is True, f"{w}: readOnlyRootFilesystem not set")
        R.check(csc.get("allowPrivilegeEscalation") is False, f"{w}: allowPrivilegeEscalation not false")
        res = ct.get("resources") or {}
        R.check(bool(res.get("requests")) and bool((res.get("limits") or {}).get("memory")), f"{w}: resources requests and a memory limit expected")
        secret_file = given.get("jwt-secret-file")
        if R.check(secret_file is not None or "WSPUSH_JWT_SECRET" in env_names, f"{w}: no token secret"):
            if secret_file:
                vols = {v.get("name"): v for v in pod.get("volumes") or []}
                ok = False
                for vm in ct.get("volumeMounts") or []:
                    mp = vm.get("mountPath", "").rstrip("/")
                    v = vols.get(vm.get("name")) or {}
                    if "secret" in v and os.path.dirname(secret_file) == mp:
                        items = v["secret"].get("items")
                        ok = items is None or any(i.get("path") == os.path.basename(secret_file) for i in items)
                R.check(ok, f"{w}: --jwt-secret-file {secret_file} is not a file of a mounted Secret")

        for svc in by_kind.get("Service", []):
            n = svc["metadata"]["name"]
            s = svc.get("spec") or {}
            R.check(matches(s.get("selector") or {}), f"{where}: Service {n} selector does not match the pods")
            for p in s.get("ports") or []:
                tp = p.get("targetPort", p.get("port"))
                R.check(tp in ports or tp in ports.values(), f"{where}: Service {n} targetPort {tp} is no container port")
        for pdb in by_kind.get("PodDisruptionBudget", []):
            s = pdb.get("spec") or {}
            R.check(matches((s.get("selector") or {}).get("matchLabels") or {}), f"{where}: PodDisruptionBudget selector does not match the pods")
            R.check("maxUnavailable" in s or "minAvailable" in s, f"{where}: PodDisruptionBudget without maxUnavailable/minAvailable")
        if admin is not None:
            admin_names = {n for n, p in ports.items() if p == admin[1]} | {admin[1]}
            for np in by_kind.get("NetworkPolicy", []):
                s = np.get("spec") or {}
                R.check(matches((s.get("podSelector") or {}).get("matchLabels") or {}), f"{where}: NetworkPolicy podSelector does not match the pods")
                R.check("Ingress" in (s.get("policyTypes") or ["Ingress"]), f"{where}: NetworkPolicy does not police ingress")
                covered = False
                for rule in s.get("ingress") or []:
                    rule_ports = [p.get("port") for p in rule.get("ports") or []]
                    hits_admin = not rule_ports or any(p in admin_names for p in rule_ports)
                    if hits_admin:
                        covered = True
                        R.check(bool(rule.get("from")), f"{where}: NetworkPolicy opens the admin port to everyone")
                R.check(covered, f"{where}: NetworkPolicy admits nobody to the admin port (Prometheus, publishers)")

    # -- Grafana --------------------------------------------------------------------------------
    def grafana(self) -> None:
        rel = "deploy/grafana/wspush-dashboard.json"
        if not self.exists(rel):
            return
        where = "grafana"
        try:
            d = json.loads(self.read(rel))
        except ValueError as e:
            R.fail(f"{where}: not JSON: {e}")
            return
        R.check(isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 36, f"{where}: schemaVersion {d.get('schemaVersion')}")
        R.check(bool(d.get("title")) and bool(d.get("uid")), f"{where}: title and uid expected")
        variables = {v.get("name"): v for v in (d.get("templating") or {}).get("list") or []}
        ds = variables.get("DS_PROMETHEUS") or {}
        R.check(ds.get("type") == "datasource" and ds.get("query") == "prometheus", f"{where}: no datasource variable DS_PROMETHEUS")
        for name, v in variables.items():
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            if v.get("type") == "query" and q:
                check_promql(self.metrics, str(q), f"{where} variable {name}")
        panels = []
        for p in d.get("panels") or []:
            panels.append(p)
            panels += p.get("panels") or []
        ids = [p.get("id") for p in panels]
        R.check(len(ids) == len(set(ids)) and None not in ids, f"{where}: panel ids must be unique")
        R.check(len(panels) > 5, f"{where}: only {len(panels)} panels")
        for p in panels:
            w = f"{where} panel {p.get('title')!r}"
            gp = p.get("gridPos") or {}
            R.check(all(isinstance(gp.get(k), int) for k in "hwxy") and gp.get("x", 0) + gp.get("w", 0) <= 24, f"{w}: bad gridPos {gp}")
            if p.get("type") == "row":
                continue
            R.check(p.get("type") in ("timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"), f"{w}: panel type {p.get('type')}")
            R.check((p.get("datasource") or {}).get("uid") == "${DS_PROMETHEUS}", f"{w}: datasource is not ${{DS_PROMETHEUS}}")
            targets = p.get("targets") or []
            R.check(bool(targets), f"{w}: no query")
            for t in targets:
                R.check((t.get("datasource") or {}).get("uid", "${DS_PROMETHEUS}") == "${DS_PROMETHEUS}", f"{w}: target datasource")
                check_promql(self.metrics, t.get("expr", ""), w)

    # -- nginx -t -------------------------------------------------------------------------------
    def nginx(self) -> None:
        if shutil.which("nginx") is None:
            R.skip("nginx -t: nginx not found")
            return
        configs = [("deploy/nginx/wspush.conf", self.read("deploy/nginx/wspush.conf"))]
        variant = getattr(self, "compose_nginx", None)
        if variant:
            text, hosts = variant
            for h in hosts:  # nginx resolves upstream names at load: compose's exist only there
                text = re.sub(rf"(?m)^(\s+server\s+){re.escape(h)}:", r"\g<1>127.0.0.1:", text)
            configs.append(("deploy/docker/nginx.conf", text))
        for rel, text in configs:
            tmp = nginx_prefix(text)
            try:
                r = subprocess.run(["nginx", "-t", "-q", "-p", tmp, "-e", f"{tmp}/error.log", "-c", f"{tmp}/nginx.conf"],
                                   capture_output=True, text=True, timeout=30)
                R.check(r.returncode == 0, f"nginx -t {rel}: {r.stderr.strip()}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    # -- README ---------------------------------------------------------------------------------
    def readme(self) -> None:
        rel = "deploy/README.md"
        if not self.exists(rel):
            return
        text = self.read(rel)
        for d, _, files in os.walk(self.dir):
            for f in files:
                p = os.path.relpath(os.path.join(d, f), self.dir)
                if p != "README.md":
                    R.check(p in text or f in text, f"deploy/README.md does not mention {p}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wspush", required=True, help="the wspush binary (its --help is the list of flags)")
    ap.add_argument("--root", required=True, help="the repository root")
    a = ap.parse_args()
    d = Deploy(os.path.abspath(a.root), os.path.abspath(a.wspush))
    for step in (d.sysctl_and_limits, d.systemd, d.config_file, d.dockerfile, d.compose, d.compose_cluster, d.kubernetes, d.grafana,
                 d.nginx, d.readme):
        try:
            step()
        except Exception as e:  # a file shaped so differently that a check crashed: say where
            R.fail(f"{step.__name__}: {type(e).__name__}: {e}")
    print(f"deploy_check: {R.passed} checks passed, {len(R.failed)} failed, {len(R.skipped)} skipped")
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
