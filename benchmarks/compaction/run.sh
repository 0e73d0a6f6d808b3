#!/usr/bin/env bash
# Issue 14: compaction's throughput, and what it costs foreground traffic.
#
# Three storage nodes (12 partitions x 3 replicas: every node holds a replica of everything) and a
# frontend, all on this machine's disk; background compaction off, so passes run only when this
# script asks (`larder compaction run`, which the operator uses too).
#  1. Throughput: MIB blobs of 1 MiB are uploaded and 2 of every 3 deleted; each node in turn is
#     compacted with no rate limit. Per node: MB/s of live data copied and MB/s of garbage
#     reclaimed (the pass's own totals and duration, from `larder compaction status --json`), next
#     to dd writing and fdatasyncing the same number of bytes as were copied, in the same run.
#  2. The default rate: the same again (fresh garbage), all three nodes compacting at once at the
#     default `[compaction] rate_mb_per_s` while h2load sends 1 KiB GETs and 1 KiB PUTs at a fixed
#     rate (RPS each, one connection each); the p99 of the requests that started while every node
#     was compacting, next to the same load with no compaction just before and just after. And
#     MB/s reclaimed per node at the default rate. ROUNDS rounds of that (fresh garbage each): the
#     target is judged on the median of the rounds' ratios, since one stall of this shared
#     virtual disk decides a single run's p99.
# Usage: run.sh [--smoke]   (--smoke: a few MiB, 1 s loads, one round, results to a temp file)
# Knobs: MIB (default 600), DURATION (s per load, default 8), RPS (default 300), ROUNDS
# (default 5), BUSY_REQUESTS (the nodes' [compaction] busy_requests; default: theirs), OUT,
# KEEP (a directory for the request and node logs; with NODE_LOG=warn,larder_store::compact=debug,
# `timeline.py KEEP ROUND` lines a round's slow requests up with each node's segment rewrites).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh

mib=${MIB:-600}; duration=${DURATION:-8}; rps=${RPS:-300}; rounds=${ROUNDS:-5}
out=${OUT:-$here/RESULTS.md}
if [ "${1:-}" = "--smoke" ]; then mib=12; duration=1; rps=50; rounds=1; out=$(mktemp); fi

STORAGE_EXTRA=$'[compaction]\nenabled = false'${BUSY_REQUESTS:+$'\nbusy_requests = '$BUSY_REQUESTS}
bench_build
work=$(mktemp -d "${CARGO_TARGET_DIR:-$root/target}/bench-compaction.XXXX")
# KEEP=<dir>: the h2load request logs and the processes' logs are copied there at the end.
trap 'stop_all "$work"; [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP"; cp "$work"/*.log "$KEEP"/ 2>/dev/null || true; }; rm -rf "$work"' EXIT
start_cluster "$work" 3 12
port=$(free_port)
start_frontend "$work" frontend "$port"
url="http://127.0.0.1:$port"
default_rate=$("$LARDER" config defaults | awk '!done && /^rate_mb_per_s/ {print $3; done=1}')

# fill COUNT: uploads COUNT distinct 1 MiB blobs (8 at a time, each answer to its own file), then
# deletes 2 of every 3.
fill() {
  rm -rf "$work/answers" && mkdir "$work/answers"
  seq 1 "$1" | xargs -P 8 -I{} sh -c \
    "head -c 1048576 /dev/urandom | curl -sS --http2-prior-knowledge --data-binary @- -o '$work/answers/{}' '$url/v1/blobs'"
  cat "$work"/answers/* | python3 -c 'import sys,re,json; [print(m) for m in re.findall(r"\"id\":\"([^\"]+)\"", sys.stdin.read())]' > "$work/ids"
  awk 'NR % 3 != 0' "$work/ids" | xargs -P 8 -I{} curl -sS -o /dev/null -X DELETE "$url/v1/blobs/{}"
}

compact() { # NODE [RATE]
  "$LARDER" compaction run --config "$work/s1.toml" --node "$1" ${2:+--rate "$2"} > /dev/null
}

# last_pass NODE: "seconds reclaimed_bytes copied_bytes" of the node's last pass.
last_pass() {
  "$LARDER" compaction status --config "$work/s1.toml" --node "$1" --json \
    | python3 -c 'import sys,json; p=json.load(sys.stdin)["last_pass"]; print(p["seconds"], p["bytes_reclaimed"], p["live_bytes_copied"])'
}

# syncs NODE: "round_syncs sync_seconds syncs_met_writeback writeback_bytes_met" over the node's
# disks (`disks` in `larder compaction status --json`): counters, read before and after a load.
syncs() {
  "$LARDER" compaction status --config "$work/s1.toml" --node "$1" --json | python3 -c '
import sys, json
d = json.load(sys.stdin)["disks"].values()
print(sum(x["journal_syncs"] for x in d), sum(x["sync_seconds"] for x in d),
      sum(x["syncs_during_compaction_writeback"] for x in d),
      sum(x["compaction_writeback_bytes_during_syncs"] for x in d))'
}
snap() { for n in s1 s2 s3; do syncs "$n" > "$work/$n.$1.syncs"; done; }
# sync_row NODE LOAD: a table row of the node's round syncs over every round's load LOAD, from
# the snaps LOAD.<round>.0 and LOAD.<round>.1.
sync_row() {
  python3 - "$1" "$2" "$work" <<'PY'
import glob, sys
node, load, work = sys.argv[1:]
total = [0.0] * 4
for before in glob.glob(f"{work}/{node}.{load}.*.0.syncs"):
    a = [float(x) for x in open(before).read().split()]
    b = [float(x) for x in open(before[: -len("0.syncs")] + "1.syncs").read().split()]
    total = [t + y - x for t, x, y in zip(total, a, b)]
n, secs, met, met_bytes = total
mean = f"{secs / n * 1000:.2f}" if n else "-"
per = f"{met_bytes / met / 1024:.0f}" if met else "-"
print(f"| {node} | {load} | {n:.0f} | {mean} | {met:.0f} | {per} |")
PY
}

mbps() { python3 -c "print(f'{float(\"$1\") / 1e6 / max(float(\"$2\"), 1e-9):.1f}')"; }

# --- 1. throughput, one node at a time, no rate limit ---
fill "$mib"
rows_throughput=()
copied_total=0
for n in s1 s2 s3; do
  compact "$n"
  read -r secs reclaimed copied < <(last_pass "$n")
  copied_total=$((copied_total + copied))
  rows_throughput+=("| $n | $(python3 -c "print(f'{$secs:.2f}')") | $((copied / 1000000)) | $((reclaimed / 1000000)) | **$(mbps "$copied" "$secs")** | **$(mbps "$reclaimed" "$secs")** |")
done
dd_mib=$((copied_total / 3 / 1048576 + 1))
dd_rate=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$dd_mib" conv=fdatasync 2>&1 | awk -F', ' '/copied/ {print $NF}')
rm -f "$work/dd.bin"

# --- 2. foreground latency without and with compaction at the default rate ---
head -c 1024 /dev/urandom > "$work/1k"
get_id=$(upload_blob "$work/1k" "$url/v1/blobs")
load() { # NAME: GET and PUT 1 KiB at RPS each for DURATION s, at the same time
  h2load -c 1 -m 64 --rps "$rps" -D "$duration" --log-file "$work/$1.get.log" \
    "$url/v1/blobs/$get_id" > "$work/$1.get.out" 2>&1 &
  local g=$!
  h2load -c 1 -m 64 --rps "$rps" -D "$duration" --log-file "$work/$1.put.log" \
    -d "$work/1k" "$url/v1/blobs" > "$work/$1.put.out" 2>&1 || true
  wait "$g" || true
}
# p99 (ms) and count of the requests in LOG that started between FROM and TO (s since epoch).
p99() {
  python3 - "$1" "${2:-0}" "${3:-1e12}" <<'PY'
import math, sys
lo, hi = float(sys.argv[2]) * 1e6, float(sys.argv[3]) * 1e6
lat = sorted(int(c[2]) / 1000 for c in (l.split("\t") for l in open(sys.argv[1]) if l.strip())
             if lo <= int(c[0]) <= hi and c[1].startswith("2"))
p = lat[min(len(lat) - 1, max(0, math.ceil(0.99 * len(lat)) - 1))] if lat else float("nan")
print(f"{p:.2f} {len(lat)}")
PY
}
# Write-back of what came before (dd, the rewrites, the uploads) must not land in a measurement.
settle() { sync; sleep 2; }
ratio() { python3 -c "a, b = float('$1'), float('$2'); print(f'{a / b:.2f}' if b > 0 else '-')"; }
lower() { python3 -c "print(f'{min(float(\"$1\"), float(\"$2\")):.2f}')"; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# round R: the load without compaction (before), fresh garbage, all three nodes compacting at the
# default rate under the same load (busy), the load again without (after). Appends the round's
# rows to rows_rounds and its ratios and reclaim rates to the arrays below.
rows_rounds=(); rows_default=(); get_ratios=(); put_ratios=(); reclaim_rates=()
round() {
  local r=$1 n
  settle
  snap "idle.$r.0"
  load "before$r"
  snap "idle.$r.1"
  fill "$mib"
  settle
  snap "busy.$r.0"
  local began pass_pids=()
  began=$(date +%s.%N)
  for n in s1 s2 s3; do
    ( compact "$n" "$default_rate"; date +%s.%N > "$work/$n.ended" ) &
    pass_pids+=($!)
  done
  load "busy$r"
  for p in "${pass_pids[@]}"; do wait "$p"; done
  snap "busy.$r.1"
  local first_end
  first_end=$(sort -n "$work"/s?.ended | head -1)
  settle
  load "after$r"
  local secs reclaimed copied rate
  for n in s1 s2 s3; do
    read -r secs reclaimed copied < <(last_pass "$n")
    rate=$(mbps "$reclaimed" "$secs")
    reclaim_rates+=("$rate")
    rows_default+=("| $r | $n | $(python3 -c "print(f'{$secs:.2f}')") | $((reclaimed / 1000000)) | **$rate** | $(mbps "$copied" "$secs") |")
  done
  local kind before after idle busy nb nbusy ratio window
  echo "$began $first_end" > "$work/window$r.log"
  window=$(python3 -c "print(f'{$first_end - $began:.1f}')")
  for kind in get put; do
    read -r before nb < <(p99 "$work/before$r.$kind.log")
    read -r after _ < <(p99 "$work/after$r.$kind.log")
    # The stricter reference: the lower p99 of the loads without compaction (before and after).
    idle=$(lower "$before" "$after")
    read -r busy nbusy < <(p99 "$work/busy$r.$kind.log" "$began" "$first_end")
    ratio=$(ratio "$busy" "$idle")
    if [ "$kind" = get ]; then get_ratios+=("$ratio"); else put_ratios+=("$ratio"); fi
    rows_rounds+=("| $r | ${kind^^} 1 KiB | $before / $after | $nb | $busy | $nbusy | $window | **$ratio** |")
  done
}
for r in $(seq 1 "$rounds"); do round "$r"; done
rows_syncs=()
for load in idle busy; do
  for n in s1 s2 s3; do rows_syncs+=("$(sync_row "$n" "$load")"); done
done

{
  echo "# Compaction: throughput, and foreground p99 while it runs"
  echo
  echo "Three storage nodes and a frontend on one machine (12 partitions x 3 replicas, so every node"
  echo "holds every blob; durable writes), data on the disk below. $mib blobs of 1 MiB uploaded, 2 of"
  echo "every 3 deleted, then compacted with \`larder compaction run\`; figures per node are the pass's"
  echo "own totals and duration (scan, verified copy, syncs, swap). The machine is shared and small:"
  echo "the run is noisy; read ratios, not absolute numbers."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "MIB=$mib DURATION=$duration RPS=$rps ROUNDS=$rounds ${BUSY_REQUESTS:+BUSY_REQUESTS=$BUSY_REQUESTS }benchmarks/compaction/run.sh"
  echo '```'
  echo
  echo "## 1. Throughput, no rate limit, one node at a time"
  echo
  echo "| node | pass s | live MB copied | garbage MB reclaimed | live copied MB/s | garbage reclaimed MB/s |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows_throughput[@]}"
  echo
  echo "dd of the bytes one node copied ($dd_mib MiB, bs=1M, conv=fdatasync), same disk, same run: **$dd_rate**"
  echo
  echo "## 2. At the default rate ($default_rate MB/s), all three nodes at once, under load, $rounds rounds"
  echo
  echo "Foreground: h2load, one connection per load, $rps req/s of 1 KiB GETs and $rps req/s of 1 KiB PUTs"
  echo "at the same time for $duration s; \"compacting\" counts only the requests that started while all"
  echo "three nodes were compacting (the window's seconds are in the table). The same load ran without"
  echo "compaction before and after, in the same round (\`sync\` and 2 s of rest before each load); a"
  echo "round's ratio is to the lower of those two p99s. Each round compacts fresh garbage ($mib blobs of"
  echo "1 MiB uploaded, 2 of every 3 deleted)."
  echo
  echo "| round | load | p99 ms, no compaction (before / after) | requests | p99 ms, compacting | requests | window s | ratio |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows_rounds[@]}"
  echo
  echo "**Median of the $rounds rounds' ratios: GET $(median "${get_ratios[@]}")x, PUT $(median "${put_ratios[@]}")x.**"
  echo
  echo "| round | node | pass s | garbage MB reclaimed | garbage reclaimed MB/s | live copied MB/s |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows_default[@]}"
  echo
  echo "**Median garbage reclaimed per node at the default rate: $(median "${reclaim_rates[@]}") MB/s** (three nodes at once, one disk)."
  echo
  echo "Targets (issue 14): foreground p99 ≤ 1.5x while compacting at the default rate (judged on the"
  echo "median of the rounds); the default rate reclaims ≥ 50 MB/s of garbage on this machine."
  echo
  echo "## 3. The nodes' commit round syncs during the loads (counted by the nodes, not timed here)"
  echo
  echo "Per node, summed over the rounds: the loads without compaction before (idle) and the loads"
  echo "with it (busy, until every pass ended): round syncs (journal fdatasyncs, which PUTs wait for),"
  echo "their mean duration, how many started while that node's compaction write-back was in flight,"
  echo "and how much of it then."
  echo
  echo "| node | load | round syncs | mean sync ms | syncs meeting write-back | KiB in flight per such sync |"
  echo "| --- | --- | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows_syncs[@]}"
} > "$out"
cat "$out"
