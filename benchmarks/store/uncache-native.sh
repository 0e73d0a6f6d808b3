#!/usr/bin/env bash
# Two Larder builds side by side under native PUTs of 1 MiB blobs (`POST /v1/blobs`, h2load 1
# connection x 16 streams, 4 MiB windows) against `larder dev` (3 storage nodes, 3 replicas,
# data on the real disk under target/, fresh for each round), builds alternating round by round.
# Prints the rate and the CPU per PUT of the dev process (frontend) and of its three storage
# nodes summed, from /proc/<pid>/stat before and after the load: issue 13's 1 MiB PUT row,
# for the page-cache change of benchmarks/store/UNCACHE.md.
#
# usage: BASE_BIN=<larder> HEAD_BIN=<larder> benchmarks/store/uncache-native.sh
#   env: ROUNDS=2 DURATION=10 (seconds)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
: "${BASE_BIN:?a release build of the base}" "${HEAD_BIN:?a release build of the head}"
rounds=${ROUNDS:-2}
duration=${DURATION:-10}
bench_workdir uncache-native # $work, and an EXIT trap that stops what is in `pids`
head -c $((1 << 20)) /dev/urandom > "$work/body"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sum_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(ticks "$p"))); done; echo "$t"; }

# one_round NAME BINARY: prints a table row.
one_round() {
  local name=$1 bin=$2 dir=$work/$1-$RANDOM port nodes f0 s0 f1 s1 out done rate
  port=$(free_port)
  LARDER_LOG=warn "$bin" dev --data-dir "$dir" --listen "127.0.0.1:$port" > "$dir.log" 2>&1 &
  dev=$!
  pids=("$dev")
  wait_port "$port"
  sleep 1
  nodes=$(pgrep -P "$dev" | tr '\n' ' ')
  # shellcheck disable=SC2086
  f0=$(ticks "$dev") s0=$(sum_ticks $nodes)
  out=$(h2load -c1 -m16 -D "$duration" --window-bits=22 --connection-window-bits=24 \
    -d "$work/body" "http://127.0.0.1:$port/v1/blobs")
  # shellcheck disable=SC2086
  f1=$(ticks "$dev") s1=$(sum_ticks $nodes)
  kill "$dev"; wait "$dev" 2>/dev/null || true; pids=()
  rm -rf "$dir"
  done=$(awk '/status codes:/ {print $3}' <<< "$out")
  rate=$(awk '/^finished in/ {print $4}' <<< "$out")
  python3 -c "
hz = 100; n = max($done, 1)
print(f'| $name | {float(\"$rate\"):.1f} | {($f1 - $f0) * 1e3 / hz / n:.3f} | {($s1 - $s0) * 1e3 / hz / n:.3f} | $done |')"
}

echo "## $(date -u +%Y-%m-%dT%H:%MZ): native PUT 1 MiB, ${duration} s, 1 x 16 streams, $rounds rounds"
echo
echo '```'
echo "BASE_BIN=$BASE_BIN HEAD_BIN=$HEAD_BIN ROUNDS=$rounds DURATION=$duration benchmarks/store/uncache-native.sh"
echo '```'
machine_description "$work"
echo
echo "| build | PUT/s | frontend CPU ms per PUT | storage CPU ms per PUT, 3 nodes summed | 2xx |"
echo "| --- | ---: | ---: | ---: | ---: |"
for r in $(seq 1 "$rounds"); do
  if ((r % 2)); then one_round base "$BASE_BIN"; one_round head "$HEAD_BIN"
  else one_round head "$HEAD_BIN"; one_round base "$BASE_BIN"; fi
done
