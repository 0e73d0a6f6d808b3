#!/usr/bin/env bash
# What one HTTP/2 exchange costs each side on this machine, with nothing of Larder's in it: a
# client (`crates/larder/examples/client_cost.rs`, one connection, TASKS tasks each sending
# `GET /1024` in a loop) through hyper's client and through h2 directly, against the bare hyper
# server (`hello_h2`). The client runs one tokio worker, the server its default. CPU per request
# from /proc/<pid>/stat of each process, ROUNDS rounds alternating which client goes first.
#   ROUNDS=3 SECONDS_EACH=6 TASKS="64 256" benchmarks/cpu-per-request/client-exchange.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../lib.sh
source "$here/../lib.sh"
rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-6}
tasks_list=${TASKS:-64 256}
(cd "$root" && cargo build --release -q -p larder --example client_cost --example hello_h2)
bin="$root/target/release/examples"
port=$(free_port)
"$bin/hello_h2" "127.0.0.1:$port" &
server=$!
trap 'kill $server 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_port "$port"
ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
hz=$(getconf CLK_TCK)
echo "| round | tasks | client | requests/s | client CPU µs/request | server CPU µs/request |"
echo "| ---: | ---: | --- | ---: | ---: | ---: |"
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then order="hyper h2"; else order="h2 hyper"; fi
  for tasks in $tasks_list; do
    for mode in $order; do
      before=$(ticks)
      out=$(TOKIO_WORKER_THREADS=1 "$bin/client_cost" "127.0.0.1:$port" "$mode" "$seconds" "$tasks")
      after=$(ticks)
      python3 - "$out" "$before" "$after" "$hz" "$round" "$tasks" <<'PY'
import sys
out, before, after, hz, rnd, tasks = sys.argv[1:]
f = dict(kv.split("=") for kv in out.split()[1:])
n = float(f["requests"])
server = (float(after) - float(before)) / float(hz) * 1e6 / n
print(f"| {rnd} | {tasks} | {out.split()[0]} | {float(f['rate']):,.0f} | {float(f['client_us']):.1f} | {server:.1f} |")
PY
    done
  done
done
