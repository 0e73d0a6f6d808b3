#!/usr/bin/env bash
# Two Larder builds side by side under one S3 PutObject load: `warp put` of 1 KiB objects (16
# clients, new names, SigV4 headers) against `larder dev --nodes 1 --replicas 1` (fsync on) on a
# fresh data dir, the builds alternating round by round. Reports warp's rate and the CPU per PUT
# of the dev process (frontend and S3 port) and of its storage node, from /proc/<pid>/stat
# before and after warp's run (its preparation is a bucket creation; --noclear: no cleanup).
#
# usage: BASE_BIN=<larder> HEAD_BIN=<larder> benchmarks/s3-compare/put-ab.sh
#   env: ROUNDS=3 DURATION=15s SIZE=1KiB CONCURRENT=16 OUT=<file> (default: stdout only)
# warp comes from run.sh's tool directory (run.sh installs it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/warp-lib.sh"
: "${BASE_BIN:?a release build of the base}" "${HEAD_BIN:?a release build of the head}"
rounds=${ROUNDS:-3}
duration=${DURATION:-15s}
size=${SIZE:-1KiB}
warp=${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}/warp-v1.4.0/bin/warp
[ -x "$warp" ] || { echo "no warp at $warp: run benchmarks/s3-compare/run.sh once" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/s3-put-ab.XXXX")
dev=""
cleanup() {
  [ -n "$dev" ] && kill "$dev" 2>/dev/null && wait "$dev" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT


# one_round NAME BINARY: prints "NAME rate frontend-ms storage-ms".
one_round() {
  local name=$1 bin=$2 dir=$work/$1-$RANDOM port s3 node f0 s0 f1 s1
  port=$(free_port) s3=$(free_port)
  LARDER_LOG=warn,s3s=off "$bin" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!
  wait_port "$s3"
  s3_key "$bin" "$dir/frontend-dc1.toml"
  node=$(pgrep -P "$dev" | head -1)
  f0=$(ticks "$dev") s0=$(ticks "$node")
  warp_put "127.0.0.1:$s3" "$work" "$dir.warp" "$size" "$duration"
  f1=$(ticks "$dev") s1=$(ticks "$node")
  kill "$dev"; wait "$dev" 2>/dev/null || true; dev=""
  # A round's data goes with it: 4 MiB rounds write tens of GB between them.
  rm -rf "$dir"
  warp_row "$name" "$dir.warp" "$((f1 - f0))" "$((s1 - s0))" "${duration%s}"
}

{
  echo "## $(date -u +%Y-%m-%dT%H:%MZ): warp put $size, $duration, ${CONCURRENT:-16} clients, $rounds rounds"
  echo
  echo '```'
  echo "CONCURRENT=${CONCURRENT:-16} BASE_BIN=$BASE_BIN HEAD_BIN=$HEAD_BIN ROUNDS=$rounds DURATION=$duration SIZE=$size benchmarks/s3-compare/put-ab.sh"
  echo '```'
  machine_description "$work"
  echo
  echo "| build | PUT/s | p50 ms | p99 ms | frontend CPU ms per PUT | storage CPU ms per PUT |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for r in $(seq 1 "$rounds"); do
    # Alternate which build goes first: the machine drifts over a run.
    if [ $((r % 2)) = 1 ]; then order=(base head); else order=(head base); fi
    for b in "${order[@]}"; do
      if [ "$b" = base ]; then one_round base "$BASE_BIN"; else one_round head "$HEAD_BIN"; fi
    done
  done
} | tee ${OUT:+"$OUT"}
