#!/usr/bin/env bash
# Issue 4: GET p50/p99 of 1 KiB and 1 MiB blobs while one of three replicas is SIGSTOPped (alive
# but silent), hedging on vs off, both frontends against the same storage nodes in one run.
# Usage: run.sh [--smoke]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh

requests=${REQUESTS:-10000}; big_requests=${BIG_REQUESTS:-1000}; first=${FIRST_REQUESTS:-2000}
out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then requests=60; big_requests=20; first=30; out=$(mktemp); fi

bench_build
work=$(mktemp -d "$root/target/bench-hedge.XXXX")
trap 'stop_all "$work"; rm -rf "$work"' EXIT
start_cluster "$work" 3 12
on=$(free_port); off=$(free_port)
start_frontend "$work" hedging-on "$on"
start_frontend "$work" hedging-off "$off" $'[router]\nhedging = false'
upload 50 1024 "http://127.0.0.1:$on" "$work/small"
upload 20 1048576 "http://127.0.0.1:$on" "$work/big"

measure() { # label port ids requests
  "$LARDER" bench get --endpoint "http://127.0.0.1:$2" --ids "$3" --concurrency 16 --requests "$4" \
    | python3 -c "import sys,json; r=json.load(sys.stdin); print(f\"| $1 | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | {r['ok']} | {r['errors']} |\")"
}

rows=()
for state in healthy stopped; do
  if [ "$state" = stopped ]; then
    kill -STOP "$(cat "$work/s1.pid")"
    # Right after the stop neither frontend knows yet: reads wait for a hedge (or a timeout)
    # until the node is marked down. Measured apart from the steady state that follows.
    rows+=("$(measure "1 KiB, first $first reads after the stop, hedging on" "$on" "$work/small" "$first")")
    rows+=("$(measure "1 KiB, first $first reads after the stop, hedging off" "$off" "$work/small" "$first")")
  fi
  for size in small big; do
    n=$requests; [ "$size" = big ] && n=$big_requests
    label_size=$([ "$size" = small ] && echo "1 KiB" || echo "1 MiB")
    rows+=("$(measure "$label_size, $state, hedging on" "$on" "$work/$size" "$n")")
    rows+=("$(measure "$label_size, $state, hedging off" "$off" "$work/$size" "$n")")
  done
done
kill -CONT "$(cat "$work/s1.pid")"

{
  echo "# Hedged reads with one replica stopped (SIGSTOP)"
  echo
  echo "Three storage nodes, 12 partitions x 3 replicas, two frontends in the same run against the same"
  echo "nodes: one with hedging (default: hedge at p95 of recent latency), one with \`hedging = false\`."
  echo "Router defaults otherwise (request timeout 5 s; a replica that loses a hedge race gets a health"
  echo "check, and 3 checks unanswered within 200 ms (or ten hedge delays, if longer) mark it down for"
  echo "2 s, then one probe). Load: \`larder bench get\`, 16 streams on one HTTP/2 connection, cycling"
  echo "over 50 x 1 KiB or 20 x 1 MiB blobs. Target: with hedging, p99 with a stopped replica <= 2x the healthy p99."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "REQUESTS=$requests BIG_REQUESTS=$big_requests FIRST_REQUESTS=$first benchmarks/hedged-reads/run.sh"
  echo '```'
  echo
  echo "## Results"
  echo
  echo "| blobs, replica state, hedging | p50 ms | p99 ms | max ms | ok | errors |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
} > "$out"
cat "$out"
