#!/bin/bash
# Broadcast bursts measured with the neutral counting client, servers side by side.
#
#   loadgen/scenarios/burst_compare.sh RUNS 'NAME=COMMAND' ['NAME=COMMAND' ...]
#
# For each run and each server in turn: a fresh server (COMMAND, pinned to core 0 with
# GOMAXPROCS=1; it must print "listening on 127.0.0.1:PORT" and broadcast every text message to
# every client), then build/loadgen/wspush-countclient on core 1: 19,000 connections, three bursts
# of 200 x 64 B, 0.3 s apart. Prints deliveries/s and microseconds of server CPU per delivery
# (clock ticks / schedstat) for each burst. Only processes started here are stopped, by PID.
#   e.g. burst_compare.sh 3 "wspush=build/server/wspush --mode=broadcast --auth=none --threads 1 \
#          --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0"
set -u
runs=$1; shift
here=$(cd "$(dirname "$0")/../.." && pwd)
cc=${COUNTCLIENT:-$here/build/loadgen/wspush-countclient}
one() {
  local name=$1 cmd=$2 log port pid out
  log=$(mktemp /tmp/burst_compare.XXXXXX)
  taskset -c 0 env GOMAXPROCS=1 $cmd >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do grep -q 'listening on 127.0.0.1:' "$log" && break; sleep 0.05; done
  port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
  if [ -z "$port" ]; then
    echo "$name: did not start"; kill -TERM $pid; wait $pid 2>/dev/null; rm -f "$log"; return
  fi
  out=$(taskset -c 1 "$cc" --port "$port" --server-pid "$pid" --connections 19000 --messages 200 --size 64 \
        --procs 2 --bursts 3 --gap 0.3 2>&1)
  echo "$name: $(echo "$out" | awk '/^deliveries\/s:/{d=$2} /^us server CPU per delivery/{printf "%.2fM/s %s/%s us | ", d/1e6, $6, $8}')"
  kill -TERM $pid; wait $pid 2>/dev/null
  rm -f "$log"
}
for _ in $(seq "$runs"); do
  for spec in "$@"; do one "${spec%%=*}" "${spec#*=}"; done
done
