#!/usr/bin/env bash
# B2 (issue 5): frontend <-> storage throughput for 4 MiB blobs with 1, 2, 4 and 8 HTTP/2
# connections per storage node (Ambry: 732 / 891 / 963 / 971 MB/s), next to iperf3's
# single-stream TCP figure over loopback measured in the same run.
# Usage: run.sh [--smoke]   (--smoke: tiny request counts, results to a temp file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/../lib-cluster.sh"

gets=${GETS:-400}; puts=${PUTS:-120}; iperf_seconds=5
out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then gets=8; puts=4; iperf_seconds=1; out=$(mktemp); fi

command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
bench_build
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-b2.XXXX")
# The storage nodes' data goes to tmpfs: all three replicas share this machine's one disk, whose
# write-back rate (not the pool) would otherwise bound PUTs. One row repeats 4 connections on disk.
shm=$(mktemp -d /dev/shm/bench-b2.XXXX)
trap 'cluster_down; rm -rf "$work" "$shm"' EXIT

# iperf3: one TCP stream over loopback, the ceiling for one connection on this machine.
iport=$(free_port)
iperf3 -s -1 -p "$iport" >/dev/null 2>&1 &
sleep 0.5 # (a probe connection would use up the one-off server)
iperf=$(iperf3 -c 127.0.0.1 -p "$iport" -t "$iperf_seconds" -J |
  python3 -c 'import sys,json; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))')

head -c $((4 << 20)) /dev/urandom > "$work/blob"
mbps() { python3 -c "print(round($1 * 4.194304))"; } # req/s of 4 MiB -> MB/s
rows=()
for setting in 1:tmpfs 2:tmpfs 4:tmpfs 8:tmpfs 4:disk; do
  conns=${setting%%:*}; medium=${setting#*:}
  data="$shm/c$conns"; [ "$medium" = disk ] && data="$work/c$conns-disk"
  # Relaxed durability: this measures the network stack, not the disk's fdatasync rate.
  cluster_up "$data" 3 12 "[pool]
connections_per_node = $conns" '[store]
durability = "relaxed-no-sync-for-benchmarks"'
  url="http://$FRONTEND/v1/blobs"
  : > "$work/uris"
  for _ in 1 2 3 4 5 6 7 8; do
    id=$(upload_blob "$work/blob" "$url")
    echo "$url/$id" >> "$work/uris"
  done
  # One client connection, 8 streams, 4 MiB stream windows (h2load's own 64 KiB default
  # window would measure h2load, not Larder).
  get=$(h2load -c 1 -m 8 -w 22 -W 26 -n "$gets" -i "$work/uris" 2>&1)
  put=$(h2load -c 1 -m 8 -w 22 -W 26 -n "$puts" -d "$work/blob" "$url" 2>&1)
  get_rps=$(echo "$get" | h2load_rps); put_rps=$(echo "$put" | h2load_rps)
  rows+=("$conns|$medium|$(mbps "$get_rps")|$(mbps "$put_rps")|$(echo "$get" | h2load_2xx)/$gets|$(echo "$put" | h2load_2xx)/$puts")
  cluster_down
  rm -rf "$data"
done

{
  echo "# B2: frontend <-> storage throughput for 4 MiB blobs by connections per storage node"
  echo
  echo "Issue 5. Three storage nodes (relaxed durability: the network stack is measured, not the"
  echo "disk) and one frontend, all on this machine's 2 cores with the load generator. h2load sends"
  echo "4 MiB GETs (8 blobs, round-robin) and 4 MiB PUTs through the frontend on one HTTP/2"
  echo "connection with 8 streams; each GET crosses the frontend <-> storage pool once, each PUT"
  echo "three times (one copy per replica). iperf3: one TCP stream over loopback, same run."
  echo "The storage nodes' data is on tmpfs (/dev/shm) except in the last row: the three replicas"
  echo "share this machine's one disk, whose write-back rate would bound PUTs, not the pool."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "GETS=$gets PUTS=$puts benchmarks/b2-pool-connections/run.sh"
  echo '```'
  echo
  echo "iperf3, one TCP stream over loopback: **$iperf MB/s**"
  echo
  echo "| connections per node | storage data on | 4 MiB GET MB/s (end to end) | 4 MiB PUT MB/s (end to end) | GET 2xx | PUT 2xx | Ambry MB/s |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"
  ambry=(732 891 963 971 963); i=0
  for r in "${rows[@]}"; do
    IFS='|' read -r c m g p gok pok <<< "$r"
    echo "| $c | $m | $g | $p | $gok | $pok | ${ambry[$i]} |"; i=$((i + 1))
  done
  echo
  echo "Targets: GET and PUT >= 1/3 of iperf3 ($((iperf / 3)) MB/s); 4 connections within 5 % of 8."
} > "$out"
cat "$out"
