#!/usr/bin/env bash
# B4 where its effect exists (issue 13): the frontend's storage pool as HTTP/1.1 with 30
# connections per node vs HTTP/2 with 4, with 2, 5 and 20 ms of round-trip time added between the
# frontend and the storage nodes (B3's delay line, benchmarks/lib-delay.sh), at several offered
# loads: p50/p95/p99, frontend CPU per request and RSS, as curves with a plot. An HTTP/1.1 pool
# connection carries one request per round trip, so 30 per node saturate near 30 x 3 / RTT
# requests per second (4,500/s at 20 ms), a load 2 cores can offer; on loopback (B4) they never do.
# Also B2's PUT row (4 MiB PUTs end to end, 1 connection x 8 streams) through the same path.
#
# Needs root (namespaces, TUN), Go (the delay line), h2load, python3 (matplotlib for the plot:
# installed into a venv under target/ if missing).
# Usage: run.sh [--smoke]   (--smoke: one RTT, one load each, 1 s, no plot, results to a temp file)
# Knobs (environment): RTTS ("2 5 20"), GET_RATES, PUT_RATES (offered req/s, whole client),
# DURATION (s per point, 10), MIX (blob sizes GETs cycle through and PUTs send), OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/../lib.sh"
source "$here/../lib-cluster.sh"
source "$here/../lib-delay.sh"

rtts=${RTTS:-"2 5 20"}
get_rates=${GET_RATES:-"1000 2000 3000 4000 5000 6000"}
put_rates=${PUT_RATES:-"250 500 1000 1500 2000"}
duration=${DURATION:-10}
# Small blobs: the pool's connections, not the bytes, are the resource under test (B4's mix with
# 1 and 4 MiB blobs is bound by bandwidth on 2 cores long before 30 connections run out).
mix=${MIX:-"1024 1024 1024 1024 1024 1024 1024 1024 1024 1024 1024 1024 16384 16384 16384 16384"}
out=${OUT:-$here/RESULTS.md}
plot=1
if [ "${1:-}" = "--smoke" ]; then
  rtts=5; get_rates=200; put_rates=100; duration=1; plot=0; out=$(mktemp)
fi
clients=16 # h2load connections; each may hold 64 requests in flight (1,024 in all)

if [ "$(id -u)" != 0 ]; then
  echo "B4 with delay needs root: it creates network namespaces and TUN devices" >&2
  [ "${1:-}" = "--smoke" ] && { echo "smoke run skipped (not root)" >&2; exit 0; }
  exit 1
fi
bench_build
target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d "$target/bench-b4-delay.XXXX")
data=$(mktemp -d /dev/shm/bench-b4-delay.XXXX) # relaxed durability on tmpfs: the pool is measured
trap 'set +e; cluster_down; delay_cleanup; rm -rf "$work" "$data"' EXIT
trap 'exit 130' INT TERM
delay_setup "$work"

results=$work/results
: > "$results"
record() { echo "$1 $2" >> "$results"; }
in_f() { ip netns exec "$ns_f" "$@"; }

# h2load's log -> "p50 p95 p99 ok total" (ms).
summarize() {
  python3 - "$1" <<'PY'
import math, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
lat = sorted(int(r[2]) / 1000 for r in rows)
ok = sum(1 for r in rows if r[1].startswith("2"))
pct = lambda q: lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))] if lat else 0
print(f"{pct(0.5):.1f} {pct(0.95):.1f} {pct(0.99):.1f} {ok} {len(rows)}")
PY
}

# point KEY RATE h2load-target...: one offered load for DURATION s.
point() {
  local key=$1 rate=$2; shift 2
  local per_client=$(( (rate + clients - 1) / clients )) cpu_before
  cpu_before=$(cpu_seconds "$FRONTEND_PID")
  rm -f "$work/log"
  in_f h2load -c "$clients" -m 64 --rps "$per_client" -D "$duration" --log-file "$work/log" "$@" \
    > "$work/h2load.out" 2>&1 || true
  touch "$work/log"
  read -r p50 p95 p99 ok total <<< "$(summarize "$work/log")"
  record "$key.offered" $((per_client * clients))
  record "$key.achieved" "$(h2load_rps < "$work/h2load.out")"
  record "$key.p50" "$p50"; record "$key.p95" "$p95"; record "$key.p99" "$p99"
  record "$key.ok" "$ok"; record "$key.sent" "$total"
  record "$key.cpu_s" "$(python3 -c "print(round($(cpu_seconds "$FRONTEND_PID") - $cpu_before, 2))")"
  record "$key.rss_mib" "$(awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$FRONTEND_PID/status")"
}

i=0
for size in $mix; do head -c "$size" /dev/urandom > "$work/blob$i"; i=$((i + 1)); done
head -c $((4 << 20)) /dev/urandom > "$work/4m"
for rtt in $rtts; do
  delay_up "$rtt"
  record "rtt.$rtt.measured" "$(measure_rtt)"
  for mode in "http1-for-comparison|30" "http2|4"; do
    protocol=${mode%%|*}; conns=${mode#*|}
    STORAGE_NETNS=$ns_s FRONTEND_NETNS=$ns_f cluster_up "$data/$protocol-$rtt" 3 12 "[pool]
protocol = \"$protocol\"
connections_per_node = $conns
http1_connections_per_node = $conns
[router]
hedging = false" '[store]
durability = "relaxed-no-sync-for-benchmarks"' "$addr_s"
    url="http://$FRONTEND/v1/blobs"
    : > "$work/uris"
    for f in "$work"/blob*; do
      echo "$url/$(in_f curl -sS --data-binary @"$f" "$url" | python3 -c 'import sys,json; print(json.load(sys.stdin)["id"])')" >> "$work/uris"
    done
    # Warm-up: open the pool's connections and grow their congestion windows.
    in_f h2load -c 4 -m 64 -n 2000 -i "$work/uris" >/dev/null 2>&1 || true
    key="$protocol.$rtt"
    for rate in $get_rates; do point "$key.get.$rate" "$rate" -i "$work/uris"; done
    # PUTs send the mix's first size (1 KiB by default); each crosses the pool 3 times.
    for rate in $put_rates; do point "$key.put.$rate" "$rate" -d "$work/blob0" "$url"; done
    # B2's PUT row: 4 MiB PUTs, 1 connection x 8 streams, 4 MiB windows, as fast as they go.
    rm -f "$work/log"
    in_f h2load -c 1 -m 8 -w 22 -W 26 -D "$duration" --log-file "$work/log" -d "$work/4m" "$url" \
      > "$work/h2load.out" 2>&1 || true
    touch "$work/log"
    read -r p50 p95 p99 ok total <<< "$(summarize "$work/log")"
    record "$key.put4m.mbps" "$(python3 -c "print(round($ok * 4.194304 / $duration))")"
    record "$key.put4m.p95" "$p95"; record "$key.put4m.ok" "$ok/$total"
    record "$key.peak_rss_mib" "$(peak_rss_mib "$FRONTEND_PID")"
    cluster_down
    rm -rf "${data:?}/$protocol-$rtt"
  done
  delay_down
done

python=python3
if [ "$plot" = 1 ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
  [ -x "$target/bench-venv/bin/python" ] || python3 -m venv "$target/bench-venv"
  "$target/bench-venv/bin/python" -c 'import matplotlib' 2>/dev/null ||
    "$target/bench-venv/bin/pip" install -q matplotlib
  python=$target/bench-venv/bin/python
fi
command_line="RTTS=\"$rtts\" GET_RATES=\"$get_rates\" PUT_RATES=\"$put_rates\" DURATION=$duration benchmarks/b4-pool-delay/run.sh"
png=""; [ "$plot" = 1 ] && png="$here/b4-pool-delay.png"
"$python" "$here/report.py" "$results" "$command_line" "$(machine_description "$data")" \
  "$rtts" "$get_rates" "$put_rates" "$duration" "$png" > "$out"
cat "$out"
