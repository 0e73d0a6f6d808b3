#!/usr/bin/env bash
# Two Larder builds side by side under one S3 PutObject load: `warp put` of 1 KiB objects (16
# clients, new names, SigV4 headers) against `larder dev --nodes 1 --replicas 1` (fsync on) on a
# fresh data dir, the builds alternating round by round. Reports warp's rate and the CPU per PUT
# of the dev process (frontend and S3 port) and of its storage node, from /proc/<pid>/stat
# before and after warp's run (its preparation is a bucket creation; --noclear: no cleanup).
#
# usage: BASE_BIN=<larder> HEAD_BIN=<larder> benchmarks/s3-compare/put-ab.sh
#   env: ROUNDS=3 DURATION=15s SIZE=1KiB OUT=<file> (default: stdout only)
# warp comes from run.sh's tool directory (run.sh installs it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
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

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# one_round NAME BINARY: prints "NAME rate frontend-ms storage-ms".
one_round() {
  local name=$1 bin=$2 dir=$work/$1-$RANDOM port s3 key ak sk node f0 s0 f1 s1 rate
  port=$(free_port) s3=$(free_port)
  LARDER_LOG=warn,s3s=off "$bin" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!
  wait_port "$s3"
  key=$("$bin" s3 key create --config "$dir/frontend-dc1.toml" --grant '*:owner')
  ak=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  sk=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  node=$(pgrep -P "$dev" | head -1)
  f0=$(ticks "$dev") s0=$(ticks "$node")
  (cd "$work" && "$warp" put --obj.size "$size" --host "127.0.0.1:$s3" --access-key "$ak" \
    --secret-key "$sk" --bucket warp-put --region us-east-1 --duration "$duration" \
    --concurrent 16 --noclear --no-color > "$dir.warp" 2>&1)
  f1=$(ticks "$dev") s1=$(ticks "$node")
  kill "$dev"; wait "$dev" 2>/dev/null || true; dev=""
  rate=$(grep -o '[0-9.]* obj/s' "$dir.warp" | head -1 | cut -d' ' -f1)
  [ -n "$rate" ] || { echo "warp failed: $(tail -3 "$dir.warp")" >&2; exit 1; }
  python3 - "$name" "$rate" "$((f1 - f0))" "$((s1 - s0))" "${duration%s}" <<'EOF'
import os, sys
name, rate, fe, st, secs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
ops = rate * secs
print(f"| {name} | {rate:,.1f} | {fe * tick_ms / ops:.3f} | {st * tick_ms / ops:.3f} |")
EOF
}

{
  echo "## $(date -u +%Y-%m-%dT%H:%MZ): warp put $size, $duration, 16 clients, $rounds rounds"
  echo
  echo '```'
  echo "BASE_BIN=$BASE_BIN HEAD_BIN=$HEAD_BIN ROUNDS=$rounds DURATION=$duration SIZE=$size benchmarks/s3-compare/put-ab.sh"
  echo '```'
  machine_description "$work"
  echo
  echo "| build | PUT/s | frontend CPU ms per PUT | storage CPU ms per PUT |"
  echo "| --- | ---: | ---: | ---: |"
  for r in $(seq 1 "$rounds"); do
    # Alternate which build goes first: the machine drifts over a run.
    if [ $((r % 2)) = 1 ]; then order=(base head); else order=(head base); fi
    for b in "${order[@]}"; do
      if [ "$b" = base ]; then one_round base "$BASE_BIN"; else one_round head "$HEAD_BIN"; fi
    done
  done
} | tee ${OUT:+"$OUT"}
