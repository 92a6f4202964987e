#!/bin/bash
# The pub/sub burst as wspush-loadgen reads it and as the counting client wspush-subcount reads
# it, alternated on the same server binary (issue 12: the load generator must not be what limits
# the figure it measures).
#
#   loadgen/scenarios/burst_vs_subcount.sh RUNS [BUILD_DIR]
#
# Each run starts a fresh server per client: BUILD_DIR/server/wspush in pub/sub mode, --auth=none,
# --threads 1, pinned to core 0 (more server options in $SERVER_ARGS). The client, pinned to core
# 1: 19,000 subscribers of one topic over two processes, then 200 x 64 B published through the
# admin API, 32 in flight. Prints deliveries/s and µs of server CPU per delivery (clock ticks,
# both) for each; the loadgen's line also its loss, duplicates and misdeliveries ("foreign"),
# and each line the CPU that processes other than this script's used meanwhile ("others", clock
# ticks; a quiet machine shows a few): a run beside someone else's load is not a figure.
# WSPUSH, LOADGEN and SUBCOUNT override the binaries; LOADGEN_BEFORE, when set, is a second
# load generator run in the same rotation (an older build, for before/after figures);
# LOADGEN_ARGS adds options to the load generator's runs. SETTLE (seconds, default 0.25: both
# tools' default) is how long both wait between the last subscription and the first publish;
# SETTLE=0 publishes at once (a slower burst for both: docs/PERFORMANCE.md says why). MESSAGES
# (default 200) sets the burst's length for both.
# Each run waits for an idle second first. Only processes started here are stopped, by PID;
# every client run is bounded by `timeout`.
set -u
runs=$1
settle=${SETTLE:-0.25}
messages=${MESSAGES:-200}
build=${2:-$(cd "$(dirname "$0")/../.." && pwd)/build}
WSPUSH=${WSPUSH:-$build/server/wspush}
LOADGEN=${LOADGEN:-$build/loadgen/wspush-loadgen}
SUBCOUNT=${SUBCOUNT:-$build/loadgen/wspush-subcount}
server() {   # starts the server; sets SP, PORT, APORT
  log=$(mktemp /tmp/burst_vs_subcount.XXXXXX)
  taskset -c 0 "$WSPUSH" --auth=none --threads 1 --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    ${SERVER_ARGS:-} >"$log" 2>&1 &
  SP=$!
  for _ in $(seq 200); do grep -q 'admin API at 127.0.0.1:' "$log" && grep -q 'listening on 127.0.0.1:' "$log" && break; sleep 0.05; done
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
  APORT=$(grep -o 'admin API at 127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
}
stop() { kill -TERM "$SP"; wait "$SP" 2>/dev/null; rm -f "$log"; }
# CPU the machine spent outside this script's own processes (the server and the client, waited
# for), in clock ticks: what others ran meanwhile on a shared machine.
busy() { awk '/^cpu /{print $2 + $3 + $4 + $9}' /proc/stat; }   # user nice system steal: irq time is nobody's
ticks_file=$(mktemp /tmp/burst_vs_subcount.XXXXXX)
ours() {   # this shell's waited-for children, user + system (`times` in this shell, not a subshell)
  times >"$ticks_file"
  ours=$(tail -1 "$ticks_file" | awk '{s = 0; for (i = 1; i <= 2; i++) {split($i, a, /[ms]/); s += a[1] * 60 + a[2]} printf "%d", s * 100}')
}
mark() { b0=$(busy); ours; o0=$ours; }
# Before each run: until a whole second passes with both cores at least 95% idle (at most 30 s),
# so no run starts while the kernel still frees the previous run's 19,000 sockets.
settle() {
  local a b
  for _ in $(seq 30); do
    a=($(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat)); sleep 1
    b=($(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat))
    [ $(( (b[0] - a[0]) * 20 )) -le $(( b[1] - a[1] + b[0] - a[0] )) ] && return
  done
}
others() { local b1; b1=$(busy); ours; others=$(( (b1 - b0) - (ours - o0) )); }
loadgen() {   # NAME BINARY
  settle
  mark
  server
  out=$(timeout 180 taskset -c 1 "$2" fanout --url "ws://127.0.0.1:$PORT/ws" --admin "http://127.0.0.1:$APORT" \
        --server-pid "$SP" --connections 19000 --procs 2 --messages "$messages" --size 64 --hold "$settle" --quiet ${LOADGEN_ARGS:-} 2>&1)
  stop
  others
  echo "run $r $1: $(echo "$out" | awk '/deliveries\/s$/{rate = $(NF-1)} /server CPU/{us = $3}
        /loss/{for (i = 1; i <= NF; i++) if ($i ~ /^(loss|duplicates|foreign)$/) checks = checks " " $i " " $(i+1)}
        /problem/{problems = problems " |" $0}
        END {printf "%.2fM/s %s us |%s%s", rate / 1e6, us, checks, problems}') | others $others ticks"
}
subcount() {
  settle
  mark
  server
  out=$(timeout 180 taskset -c 1 "$SUBCOUNT" --port "$PORT" --admin-port "$APORT" --server-pid "$SP" \
        --connections 19000 --procs 2 --messages "$messages" --size 64 \
        --settle-ms "$(awk -v s="$settle" 'BEGIN {printf "%d", s * 1000}')" 2>&1)
  stop
  others
  echo "run $r subcount: $(echo "$out" | awk '/^deliveries\/s:/{rate = $2} /^us server CPU/{us = $6}
        /^deliveries:/{got = $2 " of " $4} /^subcount:.*(not|failed|lost|refused|died)/{problems = problems " |" $0}
        END {printf "%.2fM/s %s us | delivered %s%s", rate / 1e6, us, got, problems}') | others $others ticks"
}
for r in $(seq "$runs"); do
  if [ -n "${LOADGEN_BEFORE:-}" ]; then loadgen loadgen-before "$LOADGEN_BEFORE"; fi
  loadgen loadgen "$LOADGEN"
  subcount
done
rm -f "$ticks_file"
