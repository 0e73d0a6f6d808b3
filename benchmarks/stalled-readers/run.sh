#!/usr/bin/env bash
# Issue 13 (a read's memory): while N HTTP/1.1 clients hold GETs of a 4,000,000-byte blob
# (one record) open without reading them, the RSS of the storage nodes and of the frontend,
# and a normal GET's time meanwhile; then the GET rate of that blob with nobody stalled
# (h2load). BASE's build (before storage nodes streamed reads) next to this checkout's, one
# `larder dev` (3 nodes, 32 partitions, 3 replicas) each, alternating.
# Usage: BASE=<rev> [READERS="200 1000"] [ROUNDS=2] [OUT=<report>] [BASE_IS=..] [HEAD_IS=..] run.sh [--smoke]
# With SAME_BUILD=1, this checkout's build is both sides, told apart by BASE_SETTINGS and
# HEAD_SETTINGS (each a file for `larder dev --frontend-settings`; BASE is then unused).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh
source benchmarks/lib-s3.sh

base=${BASE:-d860cfe}
readers=${READERS:-200 1000}
rounds=${ROUNDS:-2}
hold=${HOLD:-8}
out=${OUT:-$here/RESULTS.md}
smoke=0
if [ "${1:-}" = --smoke ]; then smoke=1; readers=20; rounds=1; hold=1; out=$(mktemp); fi
PYTHON=${PYTHON:-python3} s3_bench_start stalled-readers
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

declare -A binary
declare -A settings=([base]=${BASE_SETTINGS:-} [head]=${HEAD_SETTINGS:-})
if [ "$smoke" = 1 ]; then # the tests' build, this checkout only
  bench_build
  builds=(head)
  binary[head]=$LARDER
elif [ "${SAME_BUILD:-0}" = 1 ]; then
  bench_build
  builds=(base head)
  binary[base]=$LARDER
  binary[head]=$LARDER
  base="$(git rev-parse --short HEAD) with $(basename "${BASE_SETTINGS:-no settings}")"
  BASE_IS=${BASE_IS:-frontend settings ${BASE_SETTINGS:-none}}
  HEAD_IS=${HEAD_IS:-the same build, frontend settings ${HEAD_SETTINGS:-none}}
else
  s3_bench_builds stalled-readers "$base"
  builds=(base head)
  binary[base]=$cache/base/release/larder
  binary[head]=$cache/head/release/larder
fi
head -c 4000000 /dev/urandom > "$work/blob"

# run_build BUILD: one `larder dev` of BUILD; a row per reader count, and the GET rate.
run_build() {
  local build=$1 port; port=$(free_port)
  local extra=(); [ -n "${settings[$build]}" ] && extra=(--frontend-settings "${settings[$build]}")
  LARDER_LOG=error "${binary[$build]}" dev --data-dir "$work/data-$build" --listen "127.0.0.1:$port" \
    --s3-listen 127.0.0.1:0 "${extra[@]}" >/dev/null 2>"$work/dev-$build.log" &
  local dev=$!
  pids+=("$dev")
  wait_port "$port"
  local id; id=$(upload_blob "$work/blob" "http://127.0.0.1:$port/v1/blobs")
  h2load -n 20 -c 1 "http://127.0.0.1:$port/v1/blobs/$id" >/dev/null # warm-up
  for n in $readers; do
    "$python" "$here/stalled.py" "$dev" "$port" "$id" "$n" "$hold" |
      "$python" -c "import sys, json; r = json.load(sys.stdin)
print(f\"| $build | {r['readers']} | {r['idle']['storage']:.0f} | {r['stalled']['storage']:.0f} | {r['after']['storage']:.0f} | {r['idle']['frontend']:.0f} | {r['stalled']['frontend']:.0f} | {r['after']['frontend']:.0f} | {r['get_status']} in {r['get_seconds']*1000:.0f} ms |\")" >>"$work/rows"
  done
  local n=$((smoke == 1 ? 20 : 2000))
  local rps; rps=$(h2load -n "$n" -c 4 -m 4 "http://127.0.0.1:$port/v1/blobs/$id" | h2load_rps)
  echo "| $build | $rps |" >>"$work/rates"
  kill "$dev"; wait "$dev" 2>/dev/null || true
}

: >"$work/rows"; : >"$work/rates"
for round in $(seq 1 "$rounds"); do
  order=("${builds[@]}")
  if [ $((round % 2)) = 0 ]; then order=($(printf '%s\n' "${builds[@]}" | tac)); fi
  for build in "${order[@]}"; do run_build "$build"; done
done

{
  echo "# Stalled readers: a read's memory on the storage nodes"
  echo
  echo "Issue 13. \`larder dev\` (3 storage nodes, 32 partitions x 3 replicas, frontend in the dev"
  echo "process) of each build, one after the other, rounds alternating which goes first. One blob of"
  echo "4,000,000 bytes (one record). N HTTP/1.1 clients each send a GET for it with a 4 KiB receive"
  echo "buffer and read nothing for ${hold} s; then the RSS (MiB) of the storage nodes (summed) and of the"
  echo "frontend, and one normal GET (curl) of the blob; then the clients hang up, and 3 s later the"
  echo "storage nodes' and the frontend's RSS again. Then, with nobody stalled, the GET rate of the"
  echo "blob (h2load, 4 connections x 4 streams). base: \`$base\` (${BASE_IS:-a node read a whole record before answering});"
  echo "head: this checkout (\`$(git rev-parse --short HEAD)\`, ${HEAD_IS:-read pieces streamed})."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  if [ "${SAME_BUILD:-0}" = 1 ]; then
    echo "SAME_BUILD=1 BASE_SETTINGS=${BASE_SETTINGS:-} HEAD_SETTINGS=${HEAD_SETTINGS:-} READERS=\"$readers\" ROUNDS=$rounds HOLD=$hold benchmarks/stalled-readers/run.sh"
    for side in base head; do
      [ -n "${settings[$side]}" ] && { echo "# $side: ${settings[$side]}"; sed 's/^/#   /' "${settings[$side]}"; }
    done
  else
    echo "BASE=$base BASE_SETTINGS=${BASE_SETTINGS:-} HEAD_SETTINGS=${HEAD_SETTINGS:-} READERS=\"$readers\" ROUNDS=$rounds HOLD=$hold benchmarks/stalled-readers/run.sh"
  fi
  for side in base head; do
    [ "${SAME_BUILD:-0}" = 1 ] || [ -z "${settings[$side]}" ] || { echo "# $side: ${settings[$side]}"; sed 's/^/#   /' "${settings[$side]}"; }
  done
  echo '```'
  echo
  echo "## Memory with stalled readers"
  echo
  echo "| build | stalled readers | storage RSS idle | storage RSS stalled | storage RSS after | frontend RSS idle | frontend RSS stalled | frontend RSS after | a normal GET meanwhile |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  sort -s -t'|' -k2,2 -k3,3n "$work/rows"
  echo
  echo "## GET rate of the blob, nobody stalled (req/s)"
  echo
  echo "| build | req/s |"
  echo "| --- | ---: |"
  sort -s -t'|' -k2,2 "$work/rates"
} >"$out"
echo "wrote $out"
