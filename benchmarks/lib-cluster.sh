# A cluster written by hand for the pool benchmarks (sourced after lib.sh and bench_build):
# `cluster_up DIR NODES PARTITIONS "FRONTEND_TOML" "STORAGE_TOML" [HOST]` starts NODES storage
# nodes and one frontend; sets FRONTEND (host:port) and FRONTEND_PID; `cluster_down` stops all.
# STORAGE_NETNS / FRONTEND_NETNS (optional, root only) run the storage nodes / the frontend in
# those network namespaces; HOST must then be an address of the storage namespace, and FRONTEND
# (127.0.0.1:port) is reachable only inside the frontend's (benchmarks/b3-flow-control-windows).
CLUSTER_PIDS=()

cluster_up() {
  local dir=$1 nodes=$2 partitions=$3 frontend_extra=$4 storage_extra=$5 host=${6:-127.0.0.1}
  local in_storage_ns=() in_frontend_ns=()
  [ -z "${STORAGE_NETNS:-}" ] || in_storage_ns=(ip netns exec "$STORAGE_NETNS")
  [ -z "${FRONTEND_NETNS:-}" ] || in_frontend_ns=(ip netns exec "$FRONTEND_NETNS")
  mkdir -p "$dir"
  local base; base=$(free_ports_in_a_row "$nodes")
  "$LARDER" cluster init --nodes "$nodes" --partitions "$partitions" --host "$host" \
    --base-port "$base" -o "$dir/cluster.toml" --force >/dev/null
  for i in $(seq 1 "$nodes"); do
    printf 'node_id = "s%s"\ncluster_map = "cluster.toml"\ndata_dir = "s%s"\n%s\n%s\n' "$i" "$i" "$storage_extra" "$STORAGE_AUTH" > "$dir/s$i.toml"
    "${in_storage_ns[@]}" ${STORAGE_WRAPPER:-} env LARDER_LOG=warn "$LARDER" storage --config "$dir/s$i.toml" >/dev/null 2>"$dir/s$i.log" &
    CLUSTER_PIDS+=($!)
  done
  local port; port=$(free_port)
  FRONTEND="127.0.0.1:$port"
  printf 'listen = "%s"\ncluster_map = "cluster.toml"\ndatacenter = "dc1"\n%s\n%s\n' "$FRONTEND" "$frontend_extra" "$FRONTEND_AUTH" > "$dir/frontend.toml"
  sleep 0.5
  "${in_frontend_ns[@]}" ${FRONTEND_WRAPPER:-} env LARDER_LOG=warn "$LARDER" frontend --config "$dir/frontend.toml" >/dev/null 2>"$dir/frontend.log" &
  FRONTEND_PID=$! # `ip netns exec` execs the command: this is the frontend's own pid
  CLUSTER_PIDS+=("$FRONTEND_PID")
  if [ -n "${FRONTEND_NETNS:-}" ]; then
    ip netns exec "$FRONTEND_NETNS" bash -c "$(declare -f wait_port); wait_port $port"
  else
    wait_port "$port"
  fi
}

cluster_down() {
  for p in "${CLUSTER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${CLUSTER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  CLUSTER_PIDS=()
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

# Peak RSS (VmHWM) of a process in MiB.
peak_rss_mib() {
  awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"
}
