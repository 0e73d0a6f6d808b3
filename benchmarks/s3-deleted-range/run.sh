#!/usr/bin/env bash
# Listing a bucket after most of its names were deleted: the commit before emptied index
# leaves were merged (BASE) next to this checkout (HEAD), alternating, in one run. Each: a
# `larder dev --nodes 1 --replicas 1` cluster made once for its configs, then its storage node
# and frontend started by hand from them with `[s3] index_leaf_entries = LEAF` (the base has
# no --frontend-settings), a key, then deleted_range.py (boto3): NAMES names put, all but the
# first and last ten deleted, the whole bucket listed at once, 2 s and 10 s later. Prints a
# table; RESULTS.md keeps one.
#
# With KEEP_EVERY=8, one name in eight is kept, spread over the whole bucket (every leaf
# thinned rather than a range emptied: what merges of leaves with names are for).
#
# usage: benchmarks/s3-deleted-range/run.sh [--smoke]
#   env: BASE=4fd4167 NAMES=8000 LEAF=50 THREADS=16 ROUNDS=2 KEEP_EVERY=0
#        PYTHON=<one with boto3> (default: a venv made here)
#        CACHE=~/.cache/larder-s3-deleted-range (release target dirs, kept between runs)
#   --smoke (scripts/bench-smoke): this checkout's debug build only, the tests' venv, 300
#   names at 4 a leaf; nothing is built and nothing kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/benchmarks/lib-s3.sh"
base=${BASE:-4fd4167}
names=${NAMES:-8000}
leaf=${LEAF:-50}
threads=${THREADS:-16}
rounds=${ROUNDS:-2}
keep_every=${KEEP_EVERY:-0}
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1 names=300 leaf=4 threads=4 rounds=1
  target=${CARGO_TARGET_DIR:-$root/target}
  PYTHON=${PYTHON:-$target/test-venv/bin/python}
fi
s3_bench_start s3-deleted-range

if [ "$smoke" = 0 ]; then
  s3_bench_builds s3-deleted-range "$base"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
stop() { kill "$@" 2>/dev/null || true; for p in "$@"; do wait "$p" 2>/dev/null || true; done; }

run_one() { # NAME BINARY
  local dir=$work/$1-$RANDOM port s3 key id secret dev node front
  port=$(free_port) s3=$(free_port)
  LARDER_LOG=warn "$2" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!
  pids+=("$dev")
  wait_port "$s3"
  stop "$dev"
  sed -i "s/^\[s3\]$/[s3]\nindex_leaf_entries = $leaf/" "$dir/frontend-dc1.toml"
  grep -q "index_leaf_entries = $leaf" "$dir/frontend-dc1.toml"
  LARDER_LOG=warn "$2" storage --config "$dir/s1.toml" >> "$dir.log" 2>&1 &
  node=$!
  pids+=("$node")
  LARDER_LOG=warn,s3s=off "$2" frontend --config "$dir/frontend-dc1.toml" >> "$dir.log" 2>&1 &
  front=$!
  pids+=("$front")
  wait_port "$s3"
  for _ in $(seq 1 100); do # until the storage node takes writes
    key=$("$2" s3 key create --config "$dir/frontend-dc1.toml" --grant '*:owner' 2>/dev/null) && break
    sleep 0.2
  done
  id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  secret=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  local out merged
  out=$("$python" "$root/benchmarks/s3-deleted-range/deleted_range.py" "http://127.0.0.1:$s3" \
    "$id" "$secret" "$names" "$threads" "$keep_every")
  merged=$(curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^larder_frontend_s3_index_leaves_merged_total/ {print $2}')
  echo "| $1 | $(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
cell = lambda l: "%d / %d / %.1f" % (l["pages"], l["keys"], l["ms"])
row = [d["put_per_s"], d["delete_s"], cell(d["at_once"]), cell(d["after_2s"]), cell(d["after_10s"]), sys.argv[2] or "-", d["put_errors"]]
print(" | ".join(str(x) for x in row))' "$out" "$merged") |"
  stop "$front" "$node"
}

echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "base: $(git -C "$root" rev-parse --short "$base"); head: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- crates || echo ' with local changes')"
if [ "$keep_every" -gt 0 ]; then
  kept="all but one in $keep_every deleted"
else
  kept="all but 20 deleted"
fi
echo "deleted_range: $names names at $leaf a leaf from $threads threads, $kept, then listed"
echo
echo "| build | PUT/s | delete s | list at once: pages / keys / ms | 2 s later | 10 s later | leaves merged | PUT errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
if [ "$smoke" = 1 ]; then
  run_one head "$target/debug/larder"
  exit 0
fi
for _ in $(seq 1 "$rounds"); do
  run_one base "$cache/base/release/larder"
  run_one head "$cache/head/release/larder"
done
