#!/usr/bin/env bash
# B9 (issue 15): how fast a new replica is bootstrapped (one streamed export from a live peer,
# appended in batches with one durable commit each), and what it costs foreground traffic.
#
# Three storage nodes with one partition (3 replicas: every node holds everything) and a frontend,
# all on this machine's disk. For each blob size (1 KiB, 64 KiB, 4 MiB) a fresh cluster is filled
# with MIB MiB of blobs, then a 4th node `s4` is started on a map that places a bootstrapping
# replica of the partition on it (pushed through the map authority with `larder cluster push-map`,
# the cluster's credentials on). Measured: the time from s4's start until its bulk copy is durable
# (s4's log: "bulk copy done", after the last batch is synced and its cursor saved), as MB/s and records/s into s4, next to
# `dd conv=fdatasync` of the same bytes on the same disk and the cluster's own 1 KiB PUT rate at
# 256 concurrent streams, both in the same run. Then, on the 64 KiB data, foreground p99 of 1 KiB
# GETs and PUTs (h2load at a fixed rate) while s4 bootstraps, throttled (the default
# `[redistribution] rate_mb_per_s`) and unthrottled, next to the same load with no bootstrap.
# Usage: run.sh [--smoke]   (--smoke: 2 MiB per size, 1 s loads, results to a temp file)
# Knobs: MIB (default 256), DURATION (s per load, default 8), RPS (default 200), OUT,
# ROUNDS (idle + throttled pairs of part 2, each on a fresh cluster; default 5),
# SIZES (blob sizes of part 1, default "1024 65536 4194304"), COPY_ONLY=1 (print part 1's rows
# and stop: no dd, PUT rate, latency or RESULTS.md; e.g. BENCH_PROFILE=dev SIZES=1024 MIB=64).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh

mib=${MIB:-256}; duration=${DURATION:-8}; rps=${RPS:-200}; out=${OUT:-$here/RESULTS.md}
rounds=${ROUNDS:-5}
smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; mib=2; duration=1; rps=20; rounds=1; out=$(mktemp); fi

# The internal API keeps its credentials (the cluster secret, lib.sh's default): the map goes
# through `larder cluster push-map`, and the end of s4's copy is read from s4's own log.
STORAGE_EXTRA=$'[redistribution]'
bench_build
work=$(mktemp -d "${CARGO_TARGET_DIR:-$root/target}/bench-b9.XXXX")
trap 'stop_all "$work"; rm -rf "$work"' EXIT
default_rate=$("$LARDER" config defaults | awk '/^\[redistribution\]/ {r=1} r && !done && /^rate_mb_per_s/ {print $3; done=1}')

# fresh_cluster: stops whatever runs, starts 3 nodes (1 partition) and a frontend; sets url.
fresh_cluster() {
  stop_all "$work"
  rm -rf "${work:?}"/*
  start_cluster "$work" 3 1
  port=$(free_port)
  start_frontend "$work" frontend "$port"
  url="http://127.0.0.1:$port"
  s4_port=$(free_port)
}

# fill SIZE: MIB MiB of SIZE-byte blobs through the frontend (h2load, 64 streams).
fill() {
  head -c "$1" /dev/urandom > "$work/blob"
  local count=$(( mib * 1048576 / $1 )); [ "$count" -gt 0 ] || count=1
  local clients=$(( count < 4 ? count : 4 ))
  h2load -n "$count" -c "$clients" -m 16 -d "$work/blob" "$url/v1/blobs" > "$work/fill.out" 2>&1
  grep -q " 0 failed, 0 errored" "$work/fill.out" || { cat "$work/fill.out" >&2; exit 1; }
}

# grow RATE: the map with s4 (a bootstrapping replica of partition 0), s4's config with RATE
# (empty: the default), pushed to s1..s3. Partition 0 is the map's last table, so the appended
# replica table joins its replicas.
grow() {
  python3 - "$work/cluster.toml" "$s4_port" > "$work/cluster4.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
revision = int(re.search(r"^revision = (\d+)", text, re.M).group(1)) if re.search(r"^revision = ", text, re.M) else 1
text = re.sub(r"^revision = \d+\n", "", text, flags=re.M)
print(f"revision = {revision + 1}")
print(text)
print('[[partitions.replicas]]\nnode = "s4"\ndisk = "disk0"\nstate = "bootstrapping"\n')
print(f'[[nodes]]\nid = "s4"\ndatacenter = "dc1"\naddress = "127.0.0.1:{sys.argv[2]}"\ndisks = ["disk0"]')
PY
  printf 'node_id = "s4"\ncluster_map = "cluster4.toml"\ndata_dir = "s4"\n%s\n%s\n%s\n' \
    "$STORAGE_EXTRA" "${1:+rate_mb_per_s = $1}" "$STORAGE_AUTH" > "$work/s4.toml"
  # Through the map authority, with the cluster's credentials, as an operator would.
  "$LARDER" cluster push-map --config "$work/s1.toml" "$work/cluster4.toml" > "$work/push-map.out" 2>&1 ||
    { cat "$work/push-map.out" >&2; exit 1; }
}

# bootstrap: starts s4 (fresh data) and waits until its bulk copy is durable (s4 logs "bulk copy
# done" once the last batch is synced and its cursor saved); prints "seconds bytes records" and
# writes the end time (the log line's own timestamp) to bootstrap.ended. The poll is one grep of
# s4's log every 50 ms: the poller must not load the machine whose foreground latency part 2
# measures (a curl and a python3 per poll, as once, took a third of a core while a copy ran).
bootstrap() {
  [ -e "$work/s4.pid" ] && { kill "$(cat "$work/s4.pid")" 2>/dev/null || true; wait "$(cat "$work/s4.pid")" 2>/dev/null || true; }
  rm -rf "$work/s4"
  : > "$work/s4.log"
  local began; began=$(date +%s.%N)
  NODE_LOG=warn,larder_storage::bootstrap=info start_node "$work" 4
  local done_line="" deadline=$(( $(date +%s) + 900 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    done_line=$(grep -m1 "bulk copy done" "$work/s4.log" || true)
    [ -n "$done_line" ] && break
    sleep 0.05
  done
  [ -n "$done_line" ] || { echo "b9: s4's bulk copy did not end in 900 s:" >&2; tail -5 "$work/s4.log" >&2; exit 1; }
  python3 - "$done_line" "$began" "$work/bootstrap.ended" <<'PY'
import re, sys, datetime
line, began, ended_file = sys.argv[1], float(sys.argv[2]), sys.argv[3]
stamp = re.sub(r"\x1b\[[0-9;]*m", "", line).split()[0]
ended = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
records = re.search(r"records=(\d+)", line).group(1)
size = re.search(r"bytes=(\d+)", line).group(1)
open(ended_file, "w").write(f"{ended}\n")
print(ended - began, size, records)
PY
}

rate() { python3 -c "print(f'{float(\"$1\") / max(float(\"$2\"), 1e-9) / ${3:-1}:.1f}')"; }

# --- 1. copy rate per blob size, unthrottled ---
rows=()
for size in ${SIZES:-1024 65536 4194304}; do
  fresh_cluster
  fill "$size"
  grow 0
  read -r secs bytes records < <(bootstrap)
  rows+=("| $size | $records | $((bytes / 1000000)) | $(python3 -c "print(f'{$secs:.2f}')") | **$(rate "$bytes" "$secs" 1e6)** | **$(rate "$records" "$secs")** |")
  if [ "$size" = 1024 ]; then small_rate=$(rate "$records" "$secs"); fi
  if [ "$size" = 4194304 ]; then big_rate=$(rate "$bytes" "$secs" 1e6); fi
done
if [ -n "${COPY_ONLY:-}" ]; then printf '%s\n' "${rows[@]}"; exit 0; fi
dd_mib=$(( mib > 4 ? mib : 4 ))
dd_rate=$(dd if=/dev/zero of="$work/dd.bin" bs=4M count=$((dd_mib / 4)) conv=fdatasync 2>&1 | awk -F', ' '/copied/ {print $NF}')
rm -f "$work/dd.bin"
# The store's own rate for 1 KiB records, 256 writers on one store (benchmarks/store's tool).
bench_cargo -p larder-store --example store_bench
store_bench="${CARGO_TARGET_DIR:-$root/target}/$([ "$(bench_profile)" = dev ] && echo debug || echo release)/examples/store_bench"
mkdir -p "$work/store"
store_rate=$(LARDER_BENCH_SIZES=1024 LARDER_BENCH_WRITERS=256 LARDER_BENCH_RECOVERY_RECORDS=1000 \
  LARDER_BENCH_DD_COUNT=4 "$store_bench" "$work/store" "$([ "$mib" -gt 2 ] && echo 3 || echo 0.2)" 1 2>&1 >/dev/null \
  | awk '/^1024 B x 256: puts\/s/ {print $NF}')
rm -rf "$work/store"
head -c 1024 /dev/urandom > "$work/1k"
puts=$(( mib * 64 > 2000 ? mib * 64 : 2000 ))
h2load -n "$puts" -c 4 -m 64 -d "$work/1k" "$url/v1/blobs" > "$work/put256.out" 2>&1
put_rate=$(h2load_rps < "$work/put256.out")

# --- 2. foreground p99: idle, bootstrapping throttled (default), unthrottled ---
# A fresh cluster for each bootstrap: once s4 is caught up the map authority makes it live (the
# next revision), and a map placing it again as bootstrapping would be an older revision.
latency_cluster() {
  fresh_cluster
  fill 65536
  head -c 1024 /dev/urandom > "$work/1k"
  get_id=$(upload_blob "$work/1k" "$url/v1/blobs")
}
latency_cluster
load() { # NAME
  h2load -c 1 -m 64 --rps "$rps" -D "$duration" --log-file "$work/$1.get.log" \
    "$url/v1/blobs/$get_id" > "$work/$1.get.out" 2>&1 &
  local g=$!
  h2load -c 1 -m 64 --rps "$rps" -D "$duration" --log-file "$work/$1.put.log" \
    -d "$work/1k" "$url/v1/blobs" > "$work/$1.put.out" 2>&1 || true
  wait "$g" || true
}
p99() { # LOG [FROM TO]: p99 ms and count of 2xx requests that started in the window
  python3 - "$1" "${2:-0}" "${3:-1e12}" <<'PY'
import math, os, sys
lo, hi = float(sys.argv[2]) * 1e6, float(sys.argv[3]) * 1e6
lines = open(sys.argv[1]).readlines() if os.path.exists(sys.argv[1]) else []  # h2load failed
lat = sorted(int(c[2]) / 1000 for c in (l.split("\t") for l in lines if l.strip())
             if lo <= int(c[0]) <= hi and c[1].startswith("2"))
p = lat[min(len(lat) - 1, max(0, math.ceil(0.99 * len(lat)) - 1))] if lat else float("nan")
print(f"{p:.2f} {len(lat)}")
PY
}
settle() { sync; sleep 2; }
# bootstrapping MODE: s4 bootstraps (throttled: the default rate; unthrottled: none) under the
# load; prints "copy-MB/s GET-p99 GETs PUT-p99 PUTs" for requests started before the copy ended.
bootstrapping() {
  grow "$([ "$1" = unthrottled ] && echo 0 || true)"
  settle
  local began ended bpid secs bytes records g n_g p n_p
  began=$(date +%s.%N)
  ( bootstrap > "$work/$1.bootstrap" ) &
  bpid=$!
  load "$1"
  wait "$bpid"
  ended=$(cat "$work/bootstrap.ended")
  read -r secs bytes records < "$work/$1.bootstrap"
  read -r g n_g < <(p99 "$work/$1.get.log" "$began" "$ended")
  read -r p n_p < <(p99 "$work/$1.put.log" "$began" "$ended")
  echo "$(rate "$bytes" "$secs" 1e6) $g $n_g $p $n_p"
}
ratio() { python3 -c "print(f'{float(\"$1\") / float(\"$2\"):.2f}')"; }
# ROUNDS rounds of idle then throttled, each on a fresh cluster: the two p99s of a round are
# side by side, and the target is judged on the median of the rounds' ratios (one disk stall
# on this shared machine can make any single p99).
round_rows=(); get_ratios=(); put_ratios=()
for round in $(seq 1 "$rounds"); do
  [ "$round" = 1 ] || latency_cluster
  settle
  load idle
  # Read now: the next fresh cluster empties the work directory.
  read -r idle_get n_idle_get < <(p99 "$work/idle.get.log")
  read -r idle_put n_idle_put < <(p99 "$work/idle.put.log")
  read -r t_rate t_get t_n_get t_put t_n_put < <(bootstrapping throttled)
  get_ratios+=("$(ratio "$t_get" "$idle_get")"); put_ratios+=("$(ratio "$t_put" "$idle_put")")
  round_rows+=("| $round | $idle_get | $t_get | ${get_ratios[-1]}x | $idle_put | $t_put | ${put_ratios[-1]}x | $t_rate |")
done
latency_rows=("| throttled | $t_rate | $t_get | $t_n_get | $t_put | $t_n_put |")
latency_cluster
read -r u_rate u_get u_n_get u_put u_n_put < <(bootstrapping unthrottled)
latency_rows+=("| unthrottled | $u_rate | $u_get | $u_n_get | $u_put | $u_n_put |")
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

{
  echo "# B9: bootstrapping a new replica (bulk export), and foreground p99 meanwhile"
  echo
  echo "Three storage nodes, one partition (3 replicas) and a frontend on one machine, durable writes;"
  echo "a 4th node bootstraps the partition from one live peer through \`GET .../export\` (one HTTP/2"
  echo "exchange), appending in batches that each become durable in one commit round before its cursor"
  echo "is saved. Seconds: from starting s4 until s4 logs that its bulk copy is durable (\"bulk copy done\")."
  echo "The map is pushed through the map authority (\`larder cluster push-map\`), with the cluster's credentials."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "MIB=$mib DURATION=$duration RPS=$rps ROUNDS=$rounds benchmarks/b9-redistribution/run.sh"
  echo '```'
  echo
  echo "## 1. Copy rate into the new node, unthrottled"
  echo
  echo "| blob bytes | records | MB | seconds | MB/s | records/s |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Same disk, same run: \`dd bs=4M conv=fdatasync\` of $dd_mib MiB: **$dd_rate**; the cluster's own"
  echo "1 KiB PUT rate at 256 concurrent streams (h2load -c 4 -m 64, 3 durable replicas): **$put_rate req/s**;"
  echo "the store's own (\`store_bench\`, one store, 256 writers, 1 KiB, durable): **$store_rate puts/s**."
  echo
  echo "## 2. Foreground p99 while bootstrapping ($((mib)) MiB of 64 KiB blobs)"
  echo
  echo "h2load, one connection per load, $rps req/s of 1 KiB GETs and $rps req/s of 1 KiB PUTs for"
  echo "$duration s; the bootstrapping rows count only requests that started before the copy was done."
  echo "Throttled = the default \`[redistribution] rate_mb_per_s\` ($default_rate MB/s)."
  echo
  echo "| run | copy MB/s | GET p99 ms | GETs | PUT p99 ms | PUTs |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  echo "| idle | - | $idle_get | $n_idle_get | $idle_put | $n_idle_put |"
  printf '%s\n' "${latency_rows[@]}"
  echo
  echo "Rounds ($rounds): idle then throttled on a fresh cluster each; the rows above are the last."
  echo
  echo "| round | GET p99 idle ms | throttled ms | ratio | PUT p99 idle ms | throttled ms | ratio | copy MB/s |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${round_rows[@]}"
  echo
  if [ "$smoke" = 0 ]; then echo "![B9 plot](b9-redistribution.svg)"; echo; fi
  echo "## Targets (issue 15)"
  echo
  echo "| target | goal | this run | met |"
  echo "| --- | --- | --- | --- |"
  python3 - "${big_rate:-nan}" "$dd_rate" "${small_rate:-nan}" "${store_rate:-nan}" \
    "$(median "${get_ratios[@]}")" "$(median "${put_ratios[@]}")" \
    "${get_ratios[*]}" "${put_ratios[*]}" <<'PY'
import sys
big, dd, small, store, get_ratio, put_ratio, get_all, put_all = sys.argv[1:]
dd_mb = float(dd.split()[0]) * {"GB/s": 1000, "MB/s": 1, "kB/s": 0.001}.get(dd.split()[1], float("nan"))
n = len(get_all.split())
rows = [
    ("4 MiB blobs, unthrottled, vs dd (fdatasync)", ">= 0.8x", float(big) / dd_mb,
     f"{float(big):.1f} MB/s vs {dd_mb:.0f}"),
    ("1 KiB blobs, records/s vs the store's 256-writer rate", ">= 0.5x", float(small) / float(store),
     f"{float(small):,.0f} vs {float(store):,.0f}/s"),
    ("GET p99, throttled at the default rate, vs idle", "<= 2x", float(get_ratio),
     f"median of {n} rounds: {get_all}"),
    ("PUT p99, throttled at the default rate, vs idle", "<= 2x", float(put_ratio),
     f"median of {n} rounds: {put_all}"),
]
for name, goal, ratio, figures in rows:
    met = ratio >= float(goal.split()[1][:-1]) if goal.startswith(">=") else ratio <= float(goal.split()[1][:-1])
    print(f"| {name} | {goal} | {ratio:.2f}x ({figures}) | {'yes' if met else '**no**'} |")
PY
} > "$out"
if [ "$smoke" = 0 ]; then python3 "$here/plot.py" "$out" "$here/b9-redistribution.svg"; fi
cat "$out"
