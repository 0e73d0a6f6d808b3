#!/usr/bin/env bash
# S3 PutObject of 1 KiB objects into one bucket, many clients at once: the commit before the
# batched bucket-index writes (BASE) next to this checkout (HEAD), alternating, in one run.
# Each: `larder dev --nodes 1 --replicas 1` (release build, fsync on), a key, then
# put_burst.py (boto3, THREADS threads, SECONDS s). Prints a table; RESULTS.md keeps one.
#
# usage: benchmarks/s3-batching/run.sh [--smoke]
#   env: BASE=1433aef~1 THREADS=16 SECONDS_EACH=15 ROUNDS=2 SIZE=1024 PYTHON=<one with boto3>
#        BASE_SRC=<where the base's worktree lives> (default ~/.cache/larder-s3-batching/base-src)
#   --smoke (scripts/bench-smoke): this checkout's debug build only, the tests' venv, 4 threads
#   for 2 s; nothing is built and nothing kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/benchmarks/lib-s3.sh"
base=${BASE:-1433aef~1}
threads=${THREADS:-16}
seconds=${SECONDS_EACH:-15}
rounds=${ROUNDS:-2}
size=${SIZE:-1024}
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1 threads=4 seconds=2 rounds=1
  target=${CARGO_TARGET_DIR:-$root/target}
  PYTHON=${PYTHON:-$target/test-venv/bin/python}
fi
S3_BENCH_GRACE=2
s3_bench_start s3-batching

if [ "$smoke" = 0 ]; then
  s3_bench_builds s3-batching "$base"
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
  out=$("$python" "$root/benchmarks/s3-batching/put_burst.py" "http://127.0.0.1:$s3" "$id" "$secret" \
    bench "$threads" "$seconds" "$size")
  echo "| $1 | $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(" | ".join(str(d[k]) for k in ("ops_per_s","p50_ms","p99_ms","errors")))' "$out") |"
  kill "$dev"; wait "$dev" 2>/dev/null || true
}

echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "base: $(git -C "$root" rev-parse --short "$base"); head: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- crates || echo ' with local changes')"
echo "put_burst: $threads threads, $seconds s, $size-byte objects, one bucket"
echo
echo "| build | PUT/s | p50 ms | p99 ms | errors |"
echo "| --- | ---: | ---: | ---: | ---: |"
if [ "$smoke" = 1 ]; then
  run_one head "$target/debug/larder"
  exit 0
fi
for _ in $(seq 1 "$rounds"); do
  run_one base "$cache/base/release/larder"
  run_one head "$cache/head/release/larder"
done
