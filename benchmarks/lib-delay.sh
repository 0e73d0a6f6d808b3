# A longer path between the frontend and the storage nodes (sourced after lib.sh; root only):
# two network namespaces, the storage nodes in one, the frontend and the load generator in the
# other, joined only by B3's user-space delay line (b3-flow-control-windows/delayline, Go), which
# holds every IP packet for half the round-trip time each way. B3's RESULTS.md says why not netem
# (this kernel has no sch_netem). Namespaces, devices and processes are unique per run and removed
# by `delay_cleanup` (call it from the EXIT trap).
#
#   delay_setup WORKDIR     creates the namespaces ($ns_s, $ns_f) and builds the delay line
#   delay_up RTT_MS         starts the delay line; the storage side is $addr_s
#   delay_down              stops it (its TUN devices vanish with it)
#   measure_rtt             median connect() round trip to $addr_s from the frontend side, ms
#   delay_cleanup           stops everything in both namespaces and deletes them

delay_tag="$$-$RANDOM"
ns_s="dl-$delay_tag-storage" ns_f="dl-$delay_tag-frontend"
delay_dev=dldelay addr_s=10.204.0.1 addr_f=10.204.0.2
delay_pid=""

delay_setup() {
  delay_work=$1
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  export PATH="$PATH:/usr/local/go/bin" # where scripts/test may have installed Go
  command -v go >/dev/null || { echo "the delay line needs Go" >&2; return 1; }
  (cd "$here/b3-flow-control-windows/delayline" && go build -o "$delay_work/delayline" .)
  local cc; cc=$(sysctl -n net.ipv4.tcp_congestion_control)
  for ns in "$ns_s" "$ns_f"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # As in B3: no IPv6 chatter, and pooled connections keep their congestion window when idle.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
      net.ipv4.tcp_slow_start_after_idle=0 net.ipv4.tcp_congestion_control="$cc"
  done
}

delay_up() { # RTT_MS
  rm -f "$delay_work/delayline.ready"
  "$delay_work/delayline" -a "$ns_s:$delay_dev" -b "$ns_f:$delay_dev" -rtt "${1}ms" \
    -ready "$delay_work/delayline.ready" 2>>"$delay_work/delayline.log" &
  delay_pid=$!
  for _ in $(seq 100); do
    [ -e "$delay_work/delayline.ready" ] && break
    kill -0 "$delay_pid" 2>/dev/null || { cat "$delay_work/delayline.log" >&2; return 1; }
    sleep 0.05
  done
  ip -n "$ns_s" addr add "$addr_s" peer "$addr_f" dev "$delay_dev"
  ip -n "$ns_f" addr add "$addr_f" peer "$addr_s" dev "$delay_dev"
  ip -n "$ns_s" link set "$delay_dev" up
  ip -n "$ns_f" link set "$delay_dev" up
}

delay_down() {
  [ -n "$delay_pid" ] || return 0
  kill "$delay_pid" 2>/dev/null || true
  wait "$delay_pid" 2>/dev/null || true
  delay_pid=""
}

measure_rtt() {
  ip netns exec "$ns_f" python3 - "$addr_s" <<'EOF'
import socket, statistics, sys, time
samples = []
for _ in range(20):
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

delay_cleanup() {
  delay_down
  for ns in "$ns_s" "$ns_f"; do
    [ -e "/var/run/netns/$ns" ] || continue
    # Whatever still runs in this run's own namespaces was started by this run.
    for p in $(ip netns pids "$ns"); do kill "$p" 2>/dev/null; done
    ip netns del "$ns"
  done
}
