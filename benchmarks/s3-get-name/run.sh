#!/usr/bin/env bash
# The S3 port's cost per GetObject of one name in a bucket that holds many (or, with OP=put,
# per PutObject overwriting names in it): a base commit (BASE) next to this checkout (HEAD),
# alternating, in one run. Each round and build: `larder dev --nodes 1 --replicas 1` (release
# build, fsync on) on a fresh data dir, a key, NAMES objects of SIZE bytes put by boto3
# (fill.py), then h2load GETs of one name through a presigned SigV4 URL (so the client signs
# nothing per request), or PUTs of SIZE bytes through presigned URLs of 128 names spread over
# the bucket: REQUESTS requests, 4 connections x 16 streams. Reports req/s and the server's CPU
# per request (user + system of the dev process, which runs the frontend, and its storage
# node, from /proc/<pid>/stat). OP=list: ListObjectsV2 of the bucket's first 1,000 names through one
# presigned URL.
#
# usage: benchmarks/s3-get-name/run.sh [--smoke]
#   env: OP=get|put|list BASE=274910d~1 NAMES=1000 SIZE=1024 REQUESTS=20000 ROUNDS=3
#        OUT=<file> (default RESULTS.md, RESULTS-put.md for OP=put, RESULTS-list.md for OP=list)
#        PYTHON=<one with boto3> CACHE=~/.cache/larder-s3-get-name (the base's worktree and
#        both release target dirs, kept between runs)
#        MAX_KEYS=1000 (OP=list: names per page; the page starts at the bucket's first name)
#        BASE_BIN=<binary> HEAD_BIN=<binary>: release builds made beforehand; nothing is built
#   --smoke (scripts/bench-smoke): this checkout's debug build only, the tests' venv, 50 names,
#   500 requests, one round; nothing is built and nothing kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/benchmarks/lib.sh"
source "$root/benchmarks/lib-cluster.sh"
source "$root/benchmarks/lib-s3.sh"
base=${BASE:-274910d~1}
names=${NAMES:-1000}
size=${SIZE:-1024}
requests=${REQUESTS:-20000}
rounds=${ROUNDS:-3}
op=${OP:-get}
case $op in
  get) out=${OUT:-$here/RESULTS.md} what=GetObject ;;
  put) out=${OUT:-$here/RESULTS-put.md} what=PutObject ;;
  list) out=${OUT:-$here/RESULTS-list.md} what=ListObjectsV2 ;;
  *) echo "OP must be get, put or list" >&2; exit 2 ;;
esac
smoke=0
target=${CARGO_TARGET_DIR:-$root/target}
if [ "${1:-}" = "--smoke" ]; then
  smoke=1 names=50 requests=500 rounds=1 out=$(mktemp)
  PYTHON=${PYTHON:-$target/test-venv/bin/python}
fi
s3_bench_start s3-get-name

base_bin=${BASE_BIN:-}; head_bin=${HEAD_BIN:-}
if [ -n "$base_bin$head_bin" ] && { [ ! -x "$base_bin" ] || [ ! -x "$head_bin" ]; }; then
  echo "BASE_BIN and HEAD_BIN go together, each an executable" >&2; exit 2
fi
if [ "$smoke" = 0 ] && [ -z "$base_bin" ]; then
  HEAD_ONLY=0 s3_bench_builds s3-get-name "$base"
  base_bin=$cache/base/release/larder head_bin=$cache/head/release/larder
fi
export MAX_KEYS=${MAX_KEYS:-1000}

rows=()
run_one() { # NAME BINARY
  local dir=$work/$1-$RANDOM port s3 key id secret dev url storage
  port=$(free_port) s3=$(free_port)
  LARDER_LOG=warn,s3s=off "$2" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!
  pids+=("$dev")
  wait_port "$s3"
  key=$("$2" s3 key create --config "$dir/frontend-dc1.toml" --grant '*:owner')
  id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  secret=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  local load=()
  if [ "$op" = put ]; then
    "$python" "$here/fill.py" "http://127.0.0.1:$s3" "$id" "$secret" bench "$names" "$size" put > "$dir.urls"
    head -c "$size" /dev/urandom > "$dir.body"
    load=(-i "$dir.urls" -d "$dir.body" -H ':method: PUT')
  elif [ "$op" = list ]; then
    load=("$("$python" "$here/fill.py" "http://127.0.0.1:$s3" "$id" "$secret" bench "$names" "$size" list)")
  else
    load=("$("$python" "$here/fill.py" "http://127.0.0.1:$s3" "$id" "$secret" bench "$names" "$size")")
  fi
  storage=$(pgrep -P "$dev" | head -1)
  h2load -c 4 -m 16 -n 200 "${load[@]}" > /dev/null 2>&1 # warm-up
  local cpu0 cpu1 out rate ok
  cpu0=$(python3 -c "print($(cpu_seconds "$dev") + $(cpu_seconds "$storage"))")
  out=$(h2load -c 4 -m 16 -n "$requests" "${load[@]}" 2>&1)
  cpu1=$(python3 -c "print($(cpu_seconds "$dev") + $(cpu_seconds "$storage"))")
  rate=$(awk '/^finished in/ {print $4}' <<< "$out")
  ok=$(awk '/^status codes:/ {print $3}' <<< "$out")
  rows+=("| $1 | $rate | $(python3 -c "print(f'{($cpu1 - $cpu0) / $requests * 1e6:.0f}')") | $ok of $requests |")
  kill "$dev"; wait "$dev" 2>/dev/null || true
}

if [ "$smoke" = 1 ]; then
  run_one head "$target/debug/larder"
else
  for _ in $(seq 1 "$rounds"); do
    run_one base "$base_bin"
    run_one head "$head_bin"
  done
fi

{
  if [ "$op" = list ]; then
    echo "# S3 $what in a bucket of $names names: cost per request"
  else
    echo "# S3 $what of one name in a bucket of $names: cost per request"
  fi
  echo
  if [ "$op" = put ]; then
    echo "h2load (4 connections x 16 streams, $requests requests) PUTs $size-byte objects over 128 of the"
    echo "bucket's names (presigned SigV4 URLs, cycled)"
  elif [ "$op" = list ]; then
    echo "h2load (4 connections x 16 streams, $requests requests) lists the bucket's first $MAX_KEYS names"
    echo "(ListObjectsV2, one presigned SigV4 URL)"
  else
    echo "h2load (4 connections x 16 streams, $requests requests) GETs one $size-byte object through a"
    echo "presigned SigV4 URL"
  fi
  echo "from \`larder dev --nodes 1 --replicas 1\`, whose bucket holds $names names. CPU per request:"
  echo "user + system of the dev process (frontend and S3 port) and its storage node. base and head"
  echo "alternate, each on a fresh cluster."
  echo
  echo "## Machine"
  machine_description "$work"
  echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## Command"
  echo '```'
  echo "OP=$op MAX_KEYS=$MAX_KEYS BASE=$base NAMES=$names SIZE=$size REQUESTS=$requests ROUNDS=$rounds benchmarks/s3-get-name/run.sh"
  echo '```'
  if [ -n "${BASE_BIN:-}" ]; then
    echo "base: $BASE_BIN ($("$BASE_BIN" --version 2>/dev/null || true)); head: $HEAD_BIN ($("$HEAD_BIN" --version 2>/dev/null || true)), built beforehand"
  else
    echo "base: $(git -C "$root" rev-parse --short "$base"); head: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- crates || echo ' with local changes')"
  fi
  echo
  echo "| build | $op/s | server CPU µs per $op | 2xx |"
  echo "| --- | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
} > "$out"
cat "$out"
