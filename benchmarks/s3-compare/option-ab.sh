#!/usr/bin/env bash
# Two `[s3]` settings side by side under one S3 PutObject load: `warp put` (16 clients, new
# names) through two frontends of one `larder dev --nodes 1 --replicas 1` cluster (fsync on),
# one with OPTION_A, the other with OPTION_B appended to its `[s3]` section, alternating round
# by round on a fresh cluster each. Reports warp's rate and the CPU per PUT of the frontend
# under load and of the storage node, from /proc/<pid>/stat over warp's run.
#
# usage: LARDER_BIN=<larder> OPTION_A='index_delta_bytes = 0' OPTION_B='index_delta_bytes = 16384' \
#          benchmarks/s3-compare/option-ab.sh
#   env: ROUNDS=2 DURATION=15s SIZE=1KiB OUT=<file> (default: stdout only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/warp-lib.sh"
: "${LARDER_BIN:?a release build of larder}" "${OPTION_A:?TOML lines for [s3]}" "${OPTION_B:?TOML lines for [s3]}"
rounds=${ROUNDS:-2} duration=${DURATION:-15s} size=${SIZE:-1KiB}
warp=${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}/warp-v1.4.0/bin/warp
[ -x "$warp" ] || { echo "no warp at $warp: run benchmarks/s3-compare/run.sh once" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/s3-option-ab.XXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# one_round OPTION: prints "| OPTION | rate | frontend ms | storage ms |".
one_round() {
  local option=$1 dir=$work/option-$RANDOM port s3 port2 s32 dev fe node f0 s0 f1 s1
  port=$(free_port) s3=$(free_port) port2=$(free_port) s32=$(free_port)
  LARDER_LOG=warn,s3s=off "$LARDER_BIN" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3" --nodes 1 --replicas 1 > "$dir.log" 2>&1 &
  dev=$!; pids+=("$dev")
  wait_port "$s3"
  # A second frontend of the same cluster, with the setting under test.
  sed -e "s/127.0.0.1:$port\"/127.0.0.1:$port2\"/; s/127.0.0.1:$s3\"/127.0.0.1:$s32\"/" \
    -e 's/frontend-dc1-uploads/frontend-under-test-uploads/' \
    "$dir/frontend-dc1.toml" | awk -v opt="$option" '{print} /^\[s3\]$/ {print opt}' \
    > "$dir/under-test.toml"
  LARDER_LOG=warn,s3s=off "$LARDER_BIN" frontend --config "$dir/under-test.toml" > "$dir.fe.log" 2>&1 &
  fe=$!; pids+=("$fe")
  wait_port "$s32"
  s3_key "$LARDER_BIN" "$dir/under-test.toml"
  node=$(pgrep -P "$dev" | head -1)
  f0=$(ticks "$fe") s0=$(ticks "$node")
  warp_put "127.0.0.1:$s32" "$work" "$dir.warp" "$size" "$duration"
  f1=$(ticks "$fe") s1=$(ticks "$node")
  kill "$fe" "$dev"; wait "$fe" "$dev" 2>/dev/null || true
  warp_row "\`$option\`" "$dir.warp" "$((f1 - f0))" "$((s1 - s0))" "${duration%s}"
}

{
  echo "## $(date -u +%Y-%m-%dT%H:%MZ): warp put $size, $duration, ${CONCURRENT:-16} clients, \`$OPTION_A\` against \`$OPTION_B\`, $rounds rounds"
  echo
  echo '```'
  echo "LARDER_BIN=$LARDER_BIN OPTION_A='$OPTION_A' OPTION_B='$OPTION_B' ROUNDS=$rounds DURATION=$duration SIZE=$size benchmarks/s3-compare/option-ab.sh"
  echo '```'
  machine_description "$work"
  echo
  echo "| [s3] setting | PUT/s | p50 ms | p99 ms | frontend CPU ms per PUT | storage CPU ms per PUT |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order=("$OPTION_A" "$OPTION_B"); else order=("$OPTION_B" "$OPTION_A"); fi
    for option in "${order[@]}"; do one_round "$option"; done
  done
} | tee ${OUT:+"$OUT"}
