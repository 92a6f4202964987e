#!/bin/bash
# What --client-message-rate costs on the hot path: node CPU per client message (a `pub` over
# WebSocket, one subscriber), with the limit off and on (set so high it never refuses: only its
# check runs), side by side, ROUNDS times interleaved. Each run is one fresh single-threaded node
# on loopback; CPU is read from /proc (utime + stime, 10 ms ticks: 1.5M messages keep that under 1%).
#
#   loadgen/scenarios/limit_cost.sh [ROUNDS] [MESSAGES]     # from the repository root, after a build
#
# The other limits are not on the message path: --upgrade-rate is one atomic cell per upgrade,
# --max-connections-per-user one mutex-guarded lookup per upgrade and close, and
# --max-connection-lifetime one timer per connection, set at its open.
set -u
rounds=${1:-3}
messages=${2:-1500000}
port=$((20000 + RANDOM % 20000))
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() {
  local name="$1"; shift
  port=$((port + 2))
  ./build/server/wspush --auth=none --allow-client-publish --threads 1 --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$((port + 1))" "$@" 2>/dev/null &
  local pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  local t0; t0=$(cpu_ticks $pid)
  local out; out=$(timeout 300 ./build/loadgen/wspush-loadgen fanout --url "ws://127.0.0.1:$port/ws" --publish-via ws \
    --connections 1 --messages "$messages" --json 2>/dev/null)
  local t1; t1=$(cpu_ticks $pid)
  kill $pid; wait $pid 2>/dev/null
  local loss; loss=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$out" 2>/dev/null || echo "?")
  printf '%-4s %.3f us node CPU per message (loss %s)\n' "$name" "$(echo "($t1 - $t0) * 10000 / $messages" | bc -l)" "$loss"
}
for _ in $(seq "$rounds"); do
  run off
  run on --client-message-rate 1000000 --client-message-burst 1000000
done
