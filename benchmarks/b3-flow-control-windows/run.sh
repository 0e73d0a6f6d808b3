#!/usr/bin/env bash
# B3 (issue 5): 64 KiB vs 4 MiB HTTP/2 flow-control windows on the frontend <-> storage hop, for
# 4 MiB blobs, with 0, 5 and 20 ms of added round-trip time (Ambry's figure 4).
#
# Topology: two network namespaces this script creates (and always removes): the storage nodes
# in one, the frontend and h2load in the other. The only path between them is a pair of TUN
# devices joined by delayline/ (Go, standard library only), which holds every IP packet for half
# the RTT in each direction. TCP stays end to end; nothing proxies or re-segments.
#
# Why not `tc qdisc add dev <veth> root netem delay`: the benchmark machine's kernel (Firecracker
# VM) is built without sch_netem and has no modules to load ("Specified qdisc kind is unknown"),
# so the delay is added in user space at the IP level instead. Never on the shared loopback.
#
# Needs root (namespaces, TUN), Go (builds the delay line), h2load, iperf3, curl, python3.
# Usage: run.sh [--smoke]   (--smoke: one RTT, one concurrency, 1 s runs, results to a temp file)
# Knobs (environment): DURATION, RTTS, WINDOWS_KIB, CONCURRENCY, MTU, STORAGE_DATA (tmpfs or
# disk), OUT, and TCP_CC (default: the host's; a namespace may only pick one listed in
# net.ipv4.tcp_allowed_congestion_control).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/../lib-cluster.sh"

duration=${DURATION:-12}        # seconds of measurement per (window, RTT, concurrency, op)
rtts=${RTTS:-"0 5 20"}          # added round-trip time, ms
windows=${WINDOWS_KIB:-"64 4096"} # stream = connection window, KiB, on both ends of the hop
concurrency=${CONCURRENCY:-"1 8"} # h2load streams in flight (one client connection)
mtu=${MTU:-1500}
medium=${STORAGE_DATA:-tmpfs}   # where the storage nodes keep their data: tmpfs or disk
cc=${TCP_CC:-$(sysctl -n net.ipv4.tcp_congestion_control)} # TCP congestion control in both namespaces
iperf_seconds=5; rtt_probes=20
out=${OUT:-$here/RESULTS.md}
if [ "${1:-}" = "--smoke" ]; then
  duration=1; rtts=5; concurrency=1; iperf_seconds=1; rtt_probes=5; out=$(mktemp)
fi

if [ "$(id -u)" != 0 ]; then
  echo "B3 needs root: it creates network namespaces and TUN devices" >&2
  [ "${1:-}" = "--smoke" ] && { echo "B3 smoke run skipped (not root)" >&2; exit 0; }
  exit 1
fi
export PATH="$PATH:/usr/local/go/bin" # where scripts/test may have installed Go
command -v go >/dev/null || { echo "B3 needs Go to build its delay line" >&2; exit 1; }
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
bench_build
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-b3.XXXX")
# The storage nodes' data goes to tmpfs, as in B2: the three replicas of every PUT share this
# machine's one disk, whose write-back rate would otherwise bound PUTs, not the window.
data=$work/cluster
[ "$medium" = tmpfs ] && data=$(mktemp -d /dev/shm/bench-b3.XXXX)/cluster

# Unique per run, so parallel runs (CI smoke and a full run) never share a namespace. Device
# names live inside the namespaces, so they need not be unique.
tag="$$-$RANDOM"
ns_s="b3-$tag-storage" ns_f="b3-$tag-frontend"
dev=b3delay addr_s=10.203.0.1 addr_f=10.203.0.2
dl_pid=""

delay_down() {
  [ -n "$dl_pid" ] || return 0
  kill "$dl_pid" 2>/dev/null || true
  wait "$dl_pid" 2>/dev/null || true # its TUN devices vanish with it
  dl_pid=""
}

cleanup() {
  set +e
  cluster_down
  delay_down
  for ns in "$ns_s" "$ns_f"; do
    [ -e "/var/run/netns/$ns" ] || continue
    # Whatever still runs in this run's own namespaces (an iperf3 server whose client failed)
    # was started by this script.
    for p in $(ip netns pids "$ns"); do kill "$p" 2>/dev/null; done
    ip netns del "$ns" # takes the veth pair with it
  done
  rm -rf "$work" "$(dirname "$data")"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd "$here/delayline" && go build -o "$work/delayline" .)

for ns in "$ns_s" "$ns_f"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # IPv6 would only add router solicitations to the delay line's counters. A pooled connection
  # that idles longer than an RTO would otherwise restart slow start on its next request (Linux
  # default), which at 20 ms costs several RTTs per 4 MiB and hides the HTTP/2 window effect;
  # storage pools are long-lived and tuned this way. The namespace's own setting only.
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    net.ipv4.tcp_slow_start_after_idle=0 net.ipv4.tcp_congestion_control="$cc"
done
# A plain veth pair between the same namespaces: the path without the delay line, for reference.
ip link add b3veth netns "$ns_s" type veth peer name b3veth netns "$ns_f"
ip -n "$ns_s" addr add 10.203.1.1/30 dev b3veth
ip -n "$ns_f" addr add 10.203.1.2/30 dev b3veth
ip -n "$ns_s" link set b3veth mtu "$mtu" up
ip -n "$ns_f" link set b3veth mtu "$mtu" up

delay_up() { # RTT_MS
  rm -f "$work/delayline.ready"
  "$work/delayline" -a "$ns_s:$dev" -b "$ns_f:$dev" -rtt "${1}ms" -ready "$work/delayline.ready" \
    2>>"$work/delayline.log" &
  dl_pid=$!
  for _ in $(seq 100); do
    [ -e "$work/delayline.ready" ] && break
    kill -0 "$dl_pid" 2>/dev/null || { cat "$work/delayline.log" >&2; exit 1; }
    sleep 0.05
  done
  ip -n "$ns_s" addr add "$addr_s" peer "$addr_f" dev "$dev"
  ip -n "$ns_f" addr add "$addr_f" peer "$addr_s" dev "$dev"
  ip -n "$ns_s" link set "$dev" mtu "$mtu" up
  ip -n "$ns_f" link set "$dev" mtu "$mtu" up
}

# Median round trip through the path, from the frontend's namespace: the time connect() takes
# to a closed port of the storage namespace (SYN out, RST back), in ms.
measure_rtt() { # ADDRESS
  ip netns exec "$ns_f" python3 - "$1" "$rtt_probes" <<'EOF'
import socket, statistics, sys, time
samples = []
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    t = time.perf_counter()
    try:
        s.connect((sys.argv[1], 9))
    except ConnectionRefusedError:
        samples.append((time.perf_counter() - t) * 1000)
    s.close()
print(f"{statistics.median(samples):.2f}")
EOF
}

# iperf3, one TCP stream from the frontend's namespace to the storage's, MB/s.
measure_iperf() { # ADDRESS
  ip netns exec "$ns_s" iperf3 -s -1 -B "$1" -p 5201 >/dev/null 2>&1 &
  local server=$!
  sleep 0.5 # (a probe connection would use up the one-off server)
  ip netns exec "$ns_f" iperf3 -c "$1" -p 5201 -t "$iperf_seconds" -J |
    python3 -c 'import sys,json; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))'
  wait "$server" || true
}

# h2load's per-request log -> "MB/s p50_ms p99_ms ok total": MB/s is 4 MiB x answered 2xx over
# the span from the first request's start to the last one's end.
summarize() { # LOG
  python3 - "$1" <<'EOF'
import math, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
ok = sorted(int(r[2]) for r in rows if r[1].startswith("2"))
if not ok:
    print("- - -", 0, len(rows)); sys.exit()
span = (max(int(r[0]) + int(r[2]) for r in rows) - min(int(r[0]) for r in rows)) / 1e6
mbps = len(ok) * 4194304 / span / 1e6
pct = lambda q: ok[min(len(ok) - 1, math.ceil(q * len(ok)) - 1)] / 1000
fmt = lambda x: f"{x:.1f}" if x < 100 else f"{x:.0f}"
print(fmt(mbps), fmt(pct(0.5)), fmt(pct(0.99)), len(ok), len(rows))
EOF
}

# Flow control's limit in MB/s of client bytes: one window per round trip per stream, and, as
# stream window = connection window, per pool connection (NODES x connections_per_node). A PUT
# is three streams (one per replica) that all cross the path.
pool_connections=12 # 3 storage nodes x the default 4 connections per node
ceiling() { # GET|PUT STREAMS WINDOW_KIB RTT_MS
  python3 -c "
copies = 3 if '$1' == 'PUT' else 1
streams = min($2 * copies, $pool_connections)
r = streams * min($3 * 1024, 4194304) / ($4 / 1000) / copies / 1e6
print('> 10,000' if r > 10000 else f'{r:.1f}' if r < 100 else f'{r:,.0f}')"
}

head -c $((4 << 20)) /dev/urandom > "$work/blob"
veth_iperf=$(measure_iperf 10.203.1.1)
declare -A rtt_measured iperf_at drops rows
for rtt in $rtts; do
  delay_up "$rtt"
  rtt_measured[$rtt]=$(measure_rtt "$addr_s")
  iperf_at[$rtt]=$(measure_iperf "$addr_s")
  for w in $windows; do
    # Both ends of the hop: the frontend's pool receives GET bodies, the storage nodes' server
    # receives PUT bodies. Hedging off: at 20 ms a hedge would fire on nearly every early read
    # and send the blob twice.
    STORAGE_NETNS=$ns_s FRONTEND_NETNS=$ns_f cluster_up "$data" 3 12 "[limits]
stream_window = \"$w KiB\"
connection_window = \"$w KiB\"
[pool]
stream_window = \"$w KiB\"
connection_window = \"$w KiB\"
[router]
hedging = false" "[store]
durability = \"relaxed-no-sync-for-benchmarks\"
[http2]
stream_window = \"$w KiB\"
connection_window = \"$w KiB\"" "$addr_s"
    url="http://$FRONTEND/v1/blobs"
    # Eight blobs to read, uploaded in parallel (one at a time takes ~1.5 s each at 64 KiB, 20 ms).
    mapfile -t urls < <(yes "$url" | head -8)
    ip netns exec "$ns_f" curl -sS --no-progress-meter -Z --data-binary @"$work/blob" "${urls[@]}" |
      python3 -c '
import json, sys
data, dec, i = sys.stdin.read(), json.JSONDecoder(), 0
while data[i:].strip():  # the answers, concatenated in whatever order they finished
    doc, i = dec.raw_decode(data, len(data) - len(data[i:].lstrip()))
    print(sys.argv[1] + "/" + doc["id"])' "$url" > "$work/uris"
    [ "$(wc -l < "$work/uris")" = 8 ] || { echo "uploads failed" >&2; exit 1; }
    # Warm up: open every pool connection and let TCP grow its congestion windows.
    ip netns exec "$ns_f" h2load -c 1 -m 8 -w 22 -W 26 -n 16 -i "$work/uris" >/dev/null 2>&1
    ip netns exec "$ns_f" h2load -c 1 -m 4 -w 22 -W 26 -n 4 -d "$work/blob" "$url" >/dev/null 2>&1
    for c in $concurrency; do
      for op in GET PUT; do
        rm -f "$work/requests.log"
        # One client connection with 4 MiB stream windows (h2load's own 64 KiB default would
        # measure h2load, not the hop under test).
        target=(-i "$work/uris"); [ "$op" = PUT ] && target=(-d "$work/blob" "$url")
        ip netns exec "$ns_f" h2load -c 1 -m "$c" -w 22 -W 26 -D "$duration" \
          --log-file "$work/requests.log" "${target[@]}" >"$work/h2load.out" 2>&1 || true
        touch "$work/requests.log"
        rows[$c,$w,$rtt,$op]=$(summarize "$work/requests.log")
      done
    done
    cluster_down
    rm -rf "$data"
  done
  delay_down
  drops[$rtt]=$(grep -o '[0-9]* dropped' "$work/delayline.log" | awk '{d += $1} END {print d + 0}')
  : > "$work/delayline.log"
done

label() { [ "$1" -ge 1024 ] && echo "$(($1 / 1024)) MiB" || echo "$1 KiB"; }

{
  echo "# B3: 64 KiB vs 4 MiB HTTP/2 flow-control windows, 4 MiB blobs, added round-trip time"
  echo
  echo "Issue 5; Ambry's figure 4 (64 KB vs 4 MB initial window, both with 4 MB write-buffer mark"
  echo "and 4 MB TCP buffers). Three storage nodes in one network namespace, the frontend and"
  echo "h2load in another; the frontend <-> storage pool is the only traffic that crosses between"
  echo "them, over a delay line that adds the round-trip time. The window is set on both ends of"
  echo "that hop, **stream window = connection window**: the frontend's \`[pool] stream_window\` and"
  echo "\`connection_window\` (what storage may send it: GET bodies) and the storage nodes'"
  echo "\`[http2] stream_window\` and \`connection_window\` (what the frontend may send: PUT bodies)."
  echo "64 KiB is HTTP/2's default for both. Everything else is at its default (4 connections per"
  echo "node, 1 MiB max frame, 4 MiB send buffer, kernel TCP buffer autotuning), except: storage"
  echo "data on $medium with relaxed durability (the network is measured, not the disk: all three"
  echo "replicas would share this machine's one disk) and hedged reads off (at"
  echo "20 ms a hedge would fire on most early reads and send the blob twice). The frontend's public"
  echo "port is given the same windows (\`[limits] stream_window\`, \`connection_window\`), so at"
  echo "64 KiB h2load's uploads to the frontend also run at 64 KiB windows, over the frontend"
  echo "namespace's loopback (no added delay)."
  echo
  echo "h2load sends 4 MiB GETs (8 blobs, round-robin) or 4 MiB PUTs for ${duration} s each on one"
  echo "connection with ${concurrency// / or } streams in flight, after a short warm-up. Each GET crosses the hop"
  echo "once; each PUT three times in parallel (one copy per replica; the client is answered at 2)."
  echo "MB/s = 4 MiB x 2xx answers / (last end - first start). Latency is per request, end to end."
  echo
  echo "## Why not netem, and what replaces it"
  echo
  echo "The issue asks for \`tc netem\` on a veth pair. This machine's kernel (Firecracker VM,"
  echo "$(uname -r)) is built without \`sch_netem\` and has no modules to load (\`tc qdisc add ... netem\`"
  echo "answers \"Specified qdisc kind is unknown\"). So the delay is added in user space at the IP"
  echo "level: \`delayline/\` (Go, standard library only) opens a TUN device in each namespace and"
  echo "forwards every IP packet from one to the other after RTT/2, in order, in both directions."
  echo "TCP stays end to end between the frontend and storage nodes (no proxy terminates or"
  echo "re-segments connections); only the path gets longer, as netem would make it. The TUN devices"
  echo "carry segmentation-offload packets (up to 64 KiB with a virtio_net_hdr, as a veth pair hands"
  echo "them to netem), so TCP still segments at the ${mtu}-byte MTU and counts its windows in"
  echo "MTU-sized segments, but the delay line moves few large units. In each namespace"
  echo "\`tcp_slow_start_after_idle=0\`, so an idle pooled connection keeps its congestion window"
  echo "(the Linux default restarts slow start after an RTO of idleness, which at 20 ms would cost"
  echo "several round trips per request and hide the window effect). Namespaces, devices and"
  echo "processes are created per run under unique names and removed on any exit."
  echo
  echo "## Machine"
  machine_description "$(dirname "$data")"
  echo "- go: $(go version | cut -d' ' -f3); MTU $mtu; TCP congestion control $cc; tcp_rmem max $(sysctl -n net.ipv4.tcp_rmem | awk '{print $3}'), tcp_wmem max $(sysctl -n net.ipv4.tcp_wmem | awk '{print $3}')"
  echo
  echo "## Command"
  echo '```'
  echo "DURATION=$duration RTTS=\"$rtts\" WINDOWS_KIB=\"$windows\" CONCURRENCY=\"$concurrency\" MTU=$mtu STORAGE_DATA=$medium TCP_CC=$cc benchmarks/b3-flow-control-windows/run.sh"
  echo '```'
  echo
  echo "## The delay line itself"
  echo
  echo "Measured RTT: median of $rtt_probes TCP connects to a closed port (SYN out, RST back) from the"
  echo "frontend's namespace. iperf3: one TCP stream, ${iperf_seconds} s, frontend namespace -> storage"
  echo "namespace, through the delay line; the reference row is a plain veth pair between the same"
  echo "namespaces (no delay line). This is the ceiling of any single connection on the path."
  echo
  echo "| path | added RTT | measured RTT ms | iperf3 MB/s (one TCP stream) | packets dropped by the delay line |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  echo "| veth pair, no delay line | - | - | $veth_iperf | - |"
  for rtt in $rtts; do
    echo "| delay line | $rtt ms | ${rtt_measured[$rtt]} | ${iperf_at[$rtt]} | ${drops[$rtt]} |"
  done
  for c in $concurrency; do
    echo
    echo "## $c stream(s) in flight"
    echo
    echo "Ceiling: what flow control alone allows, one window per round trip per stream and per"
    echo "pool connection (stream window = connection window; 3 nodes x 4 connections = 12):"
    echo "GET min($c, 12) x min(window, 4 MiB) / RTT; a PUT is 3 streams, one per replica, so"
    echo "min(3 x $c, 12) x min(window, 4 MiB) / RTT / 3. RTT is the measured one. iperf3 is one TCP"
    echo "stream; the pool spreads over up to 12, so aggregate GETs can exceed it."
    echo
    echo "| window | added RTT | GET MB/s | GET ceiling | GET p50 ms | GET p99 ms | PUT MB/s | PUT ceiling | PUT p50 ms | PUT p99 ms | iperf3 MB/s | GET / PUT 2xx of sent |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for w in $windows; do
      for rtt in $rtts; do
        read -r gm g50 g99 gok gn <<< "${rows[$c,$w,$rtt,GET]}"
        read -r pm p50 p99 pok pn <<< "${rows[$c,$w,$rtt,PUT]}"
        r=${rtt_measured[$rtt]}
        echo "| $(label "$w") | $rtt ms | $gm | $(ceiling GET "$c" "$w" "$r") | $g50 | $g99 | $pm | $(ceiling PUT "$c" "$w" "$r") | $p50 | $p99 | ${iperf_at[$rtt]} | $gok/$gn / $pok/$pn |"
      done
    done
  done
} > "$out"
cat "$out"
