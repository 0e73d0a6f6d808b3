#!/usr/bin/env bash
# How much of an S3 PutObject's cost is the index leaf it rewrites: `warp put` of 1 KiB objects
# (16 clients, new names) through two frontends of one `larder dev --nodes 1 --replicas 1`
# cluster, one with `[s3] index_leaf_entries` = LEAF_SMALL (default 50), the other with the
# default 1,000, alternating. Reports warp's rate and CPU per PUT of the frontend under load and
# of the storage node, from /proc/<pid>/stat over warp's run.
#
# usage: LARDER_BIN=<larder> benchmarks/s3-compare/leaf-size.sh
#   env: ROUNDS=2 DURATION=15s LEAF_SMALL=50 OUT=<file> (default: stdout only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/warp-lib.sh"
: "${LARDER_BIN:?a release build of larder}"
rounds=${ROUNDS:-2} duration=${DURATION:-15s} small=${LEAF_SMALL:-50}
warp=${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}/warp-v1.4.0/bin/warp
[ -x "$warp" ] || { echo "no warp at $warp: run benchmarks/s3-compare/run.sh once" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/s3-leaf-size.XXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# one_round LEAF: prints "| LEAF | rate | frontend ms | storage ms |".
one_round() {
  local leaf=$1 dir=$work/leaf-$1-$RANDOM port s3 port2 s32 dev fe node f0 s0 f1 s1
  port=$(free_port) s3=$(free_port) port2=$(free_port) s32=$(free_port)
  LARDER_LOG=warn,s3s=off "$LARDER_BIN" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!; pids+=("$dev")
  wait_port "$s3"
  # A second frontend of the same cluster, with the leaf bound under test.
  sed -e "s/127.0.0.1:$port\"/127.0.0.1:$port2\"/; s/127.0.0.1:$s3\"/127.0.0.1:$s32\"/" \
    -e 's/frontend-dc1-uploads/frontend-under-test-uploads/' \
    -e "s/^\[s3\]/[s3]\nindex_leaf_entries = $leaf/" "$dir/frontend-dc1.toml" > "$dir/under-test.toml"
  LARDER_LOG=warn,s3s=off "$LARDER_BIN" frontend --config "$dir/under-test.toml" > "$dir.fe.log" 2>&1 &
  fe=$!; pids+=("$fe")
  wait_port "$s32"
  s3_key "$LARDER_BIN" "$dir/under-test.toml"
  node=$(pgrep -P "$dev" | head -1)
  f0=$(ticks "$fe") s0=$(ticks "$node")
  (cd "$work" && "$warp" put --obj.size 1KiB --host "127.0.0.1:$s32" --access-key "$AK" \
    --secret-key "$SK" --bucket warp-put --region us-east-1 --duration "$duration" \
    --concurrent 16 --noclear --no-color > "$dir.warp" 2>&1)
  f1=$(ticks "$fe") s1=$(ticks "$node")
  kill "$fe" "$dev"; wait "$fe" "$dev" 2>/dev/null || true
  warp_row "$leaf" "$dir.warp" "$((f1 - f0))" "$((s1 - s0))" "${duration%s}"
}

{
  echo "## $(date -u +%Y-%m-%dT%H:%MZ): warp put 1KiB, $duration, 16 clients, leaves of 1,000 and $small names, $rounds rounds"
  echo
  echo '```'
  echo "LARDER_BIN=$LARDER_BIN ROUNDS=$rounds DURATION=$duration LEAF_SMALL=$small benchmarks/s3-compare/leaf-size.sh"
  echo '```'
  machine_description "$work"
  echo
  echo "| index_leaf_entries | PUT/s | frontend CPU ms per PUT | storage CPU ms per PUT |"
  echo "| --- | ---: | ---: | ---: |"
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order=(1000 "$small"); else order=("$small" 1000); fi
    for leaf in "${order[@]}"; do one_round "$leaf"; done
  done
} | tee ${OUT:+"$OUT"}
