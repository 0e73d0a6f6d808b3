#!/usr/bin/env bash
# B4 (issue 5): the frontend's storage pool as HTTP/1.1 with 30 connections per node (Ambry before
# HTTP/2) vs HTTP/2 with 4, under the same offered load of mixed 1 KiB - 4 MiB GETs: p95 latency,
# CPU seconds and peak RSS of the frontend (Ambry: p95 100 -> 38 ms, memory 6.6 -> 4.9 GB).
# Usage: run.sh [--smoke]   (--smoke: a second of load, results to a temp file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/../lib-cluster.sh"

clients=${CLIENTS:-8}; rate=${RATE:-25}; seconds=${SECONDS_OF_LOAD:-20}
out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then seconds=1; out=$(mktemp); fi
requests=$((clients * rate * seconds))

bench_build
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-b4.XXXX")
trap 'cluster_down; rm -rf "$work"' EXIT

# The mix: many small blobs, a few large ones (each line is one request target, cycled).
sizes=(1024 1024 1024 1024 1024 1024 1024 1024 16384 16384 16384 16384 262144 262144 1048576 4194304)
rows=()
for mode in "http1-for-comparison|30" "http2|4"; do
  protocol=${mode%%|*}; conns=${mode#*|}
  cluster_up "$work/$protocol" 3 12 "[pool]
protocol = \"$protocol\"
connections_per_node = $conns
http1_connections_per_node = $conns" '[store]
durability = "relaxed-no-sync-for-benchmarks"'
  url="http://$FRONTEND/v1/blobs"
  : > "$work/uris"
  for size in "${sizes[@]}"; do
    head -c "$size" /dev/urandom > "$work/blob"
    id=$(upload_blob "$work/blob" "$url")
    echo "$url/$id" >> "$work/uris"
  done
  cpu_before=$(cpu_seconds "$FRONTEND_PID")
  # Open-loop-ish: each client sends at a fixed rate (--rps) whatever the answers' latency.
  h2load -c "$clients" -m 32 -w 22 -W 26 --rps "$rate" -n "$requests" -i "$work/uris" \
    --log-file "$work/$protocol.log" > "$work/$protocol.out" 2>&1
  cpu=$(python3 -c "print(round($(cpu_seconds "$FRONTEND_PID") - $cpu_before, 1))")
  rss=$(peak_rss_mib "$FRONTEND_PID")
  stats=$(python3 - "$work/$protocol.log" <<'PY'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
lat = sorted(int(r[2]) / 1000 for r in rows)
ok = sum(1 for r in rows if r[1].startswith("2"))
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0
print(f"{pct(0.5):.1f}|{pct(0.95):.1f}|{pct(0.99):.1f}|{ok}/{len(rows)}")
PY
)
  rows+=("$protocol, $conns connections per node|$stats|$cpu|$rss")
  cluster_down
done

{
  echo "# B4: HTTP/1.1 pool of 30 connections vs HTTP/2 pool of 4, same offered load"
  echo
  echo "Issue 5. Three storage nodes (relaxed durability) and one frontend on this machine's 2 cores,"
  echo "with the load generator. h2load offers the same load to both: $clients clients x $rate req/s"
  echo "(--rps), $requests GETs cycling through 16 blobs (8 x 1 KiB, 4 x 16 KiB, 2 x 256 KiB, 1 MiB,"
  echo "4 MiB). Only the frontend's storage pool differs (\`pool.protocol\`). Latency is per request"
  echo "at the client (h2load --log-file); CPU seconds and peak RSS (VmHWM) are the frontend's."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "CLIENTS=$clients RATE=$rate SECONDS_OF_LOAD=$seconds benchmarks/b4-http1-vs-http2-pool/run.sh"
  echo '```'
  echo
  echo "| frontend -> storage pool | p50 ms | p95 ms | p99 ms | 2xx | frontend CPU s | frontend peak RSS MiB |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for r in "${rows[@]}"; do
    IFS='|' read -r label p50 p95 p99 ok cpu rss <<< "$r"
    echo "| $label | $p50 | $p95 | $p99 | $ok | $cpu | $rss |"
  done
} > "$out"
cat "$out"
