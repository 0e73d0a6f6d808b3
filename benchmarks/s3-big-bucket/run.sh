#!/usr/bin/env bash
# S3 against a bucket that already holds many names: the commit before the bucket index split
# into leaves (BASE: one index record per bucket) next to this checkout (HEAD), alternating,
# in one run. Each: `larder dev --nodes 1 --replicas 1` (release build, fsync on), a key, then
# big_bucket.py (boto3): PRELOAD names put from 64 threads, then PutObject of new names and
# GetObject of preloaded ones from THREADS threads for SECONDS each, then the first listing
# page. Prints a table; RESULTS.md keeps one.
#
# usage: benchmarks/s3-big-bucket/run.sh [--smoke]
#   env: BASE=caa6c70~1 PRELOAD=5000 THREADS=16 SECONDS_EACH=15 ROUNDS=2 SIZE=1024
#        PYTHON=<one with boto3> BASE_SRC=<the base's worktree> (default under CACHE)
#        CACHE=~/.cache/larder-s3-big-bucket (release target dirs, kept between runs)
#        HEAD_ONLY=1: this checkout only, no base (for sizes the base cannot hold, >10,000)
#   --smoke (scripts/bench-smoke): this checkout's debug build only, the tests' venv, 300
#   names, 4 threads for 2 s; nothing is built and nothing kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/benchmarks/lib-s3.sh"
base=${BASE:-caa6c70~1}
preload=${PRELOAD:-5000}
threads=${THREADS:-16}
seconds=${SECONDS_EACH:-15}
rounds=${ROUNDS:-2}
size=${SIZE:-1024}
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1 threads=4 seconds=2 rounds=1 preload=300
  target=${CARGO_TARGET_DIR:-$root/target}
  PYTHON=${PYTHON:-$target/test-venv/bin/python}
fi
S3_BENCH_GRACE=2
s3_bench_start s3-big-bucket

if [ "$smoke" = 0 ]; then
  s3_bench_builds s3-big-bucket "$base"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

run_one() { # NAME BINARY
  local dir=$work/$1-$RANDOM port s3 key id secret dev
  port=$(free_port) s3=$(free_port)
  LARDER_LOG=warn,s3s=off "$2" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!
  pids+=("$dev")
  wait_port "$s3"
  key=$("$2" s3 key create --config "$dir/frontend-dc1.toml" --grant '*:owner')
  id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  secret=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  local out
  out=$("$python" "$root/benchmarks/s3-big-bucket/big_bucket.py" "http://127.0.0.1:$s3" "$id" "$secret" \
    bench "$preload" "$threads" "$seconds" "$size")
  echo "| $1 | $(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
p, g = d["put"], d["get"]
row = [d["preload_per_s"], p["ops_per_s"], p["p50_ms"], p["p99_ms"], g["ops_per_s"], g["p50_ms"], g["p99_ms"], d["list_ms"], d["preload_errors"] + p["errors"] + g["errors"]]
print(" | ".join(str(x) for x in row))' "$out") |"
  kill "$dev"; wait "$dev" 2>/dev/null || true
}

echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "base: $(git -C "$root" rev-parse --short "$base"); head: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- crates || echo ' with local changes')"
echo "big_bucket: $preload names first, then $threads threads, $seconds s each, $size-byte objects"
echo
echo "| build | preload PUT/s | PUT/s | PUT p50 ms | PUT p99 ms | GET/s | GET p50 ms | GET p99 ms | list 1,000 ms | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
if [ "$smoke" = 1 ]; then
  run_one head "$target/debug/larder"
  exit 0
fi
for _ in $(seq 1 "$rounds"); do
  [ "${HEAD_ONLY:-0}" = 1 ] || run_one base "$cache/base/release/larder"
  run_one head "$cache/head/release/larder"
done
