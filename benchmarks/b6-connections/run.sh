#!/usr/bin/env bash
# B6 (issue 13; the Netty seed's experiment): the frontend's memory per client connection and its
# allocations per connection and per request at 1,024, 4,096 and 16,384 concurrent connections,
# HTTP/1.1 and h2c, idle and active, next to nginx holding the same connections in the same run.
#
# The client (crates/larder/examples/conn_hold.rs, one thread) opens N connections from 16
# loopback source addresses (127.0.0.2-17: never short of ephemeral ports, whatever TIME_WAIT a
# previous case left), sends one GET on each, and holds them idle; the script then reads the
# server's RSS and, for Larder, the counting allocator's totals (src/alloc_count.rs, switched
# on by LARDER_ALLOC_COUNT_FILE). Then every connection sends GETs of 1 KiB one after another for a
# few seconds, then PUTs of 1 KiB, while the script samples RSS. Each (server, protocol, N) case
# starts a fresh server process; Larder's three storage nodes (durable, data under target/) stay
# up throughout. Larder's frontend gets limits that let N connections live (no per-IP cap, idle
# and header timeouts of 10 minutes); nginx gets worker_connections and keepalive to match.
#
# Usage: run.sh [--smoke]   (--smoke: 64 connections, 1 s loads, results to a temp file)
# Knobs (environment): CONNECTIONS ("1024 4096 16384"), SECONDS_OF_LOAD (5), OUT. The servers'
# and the client's logs of the last run are kept in target/bench-b6-logs/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/../lib.sh"
source "$here/../lib-cluster.sh"

counts=${CONNECTIONS:-"1024 4096 16384"}
seconds=${SECONDS_OF_LOAD:-5}
out=${OUT:-$here/RESULTS.md}
if [ "${1:-}" = "--smoke" ]; then counts=64; seconds=1; out=$(mktemp); fi
sources=16

# File descriptors: the client, the frontend and each nginx worker hold one per connection.
largest=$(echo "$counts" | tr ' ' '\n' | sort -n | tail -1)
[ "$(id -u)" = 0 ] && ulimit -Hn 1048576 2>/dev/null || true
ulimit -n "$(( $(ulimit -Hn) < 65536 ? $(ulimit -Hn) : 65536 ))"
if [ "$(ulimit -n)" -lt $((largest + 256)) ]; then
  echo "B6 needs $((largest + 256)) file descriptors; the hard limit is $(ulimit -Hn)" >&2
  exit 1
fi

profile=$(bench_profile)
profile_dir=$([ "$profile" = dev ] && echo debug || echo release)
target=${CARGO_TARGET_DIR:-$root/target}
bench_workdir b6
bench_cargo -p larder --bin larder --example conn_hold
conn_hold="$target/$profile_dir/examples/conn_hold"
LARDER="$target/$profile_dir/larder"
export LARDER
# The servers count their allocations (every process started from here, the storage nodes too).
export LARDER_ALLOC_COUNT_FILE="$work/alloc" LARDER_ALLOC_COUNT_INTERVAL_MS=100
# The logs outlive the run (bench_cleanup removes $work): a case with failed requests can be
# looked into afterwards.
keep_logs() {
  mkdir -p "$target/bench-b6-logs"
  cp "$work"/*.log "$work"/cluster/*.log "$target/bench-b6-logs/" 2>/dev/null || true
}
trap 'keep_logs; cluster_down; bench_cleanup' EXIT

results=$work/results
: > "$results"
record() { echo "$1 $2" >> "$results"; }

rss_kib() { # PIDS joined with '+': summed VmRSS in KiB
  local total=0 p
  for p in ${1//+/ }; do total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done
  echo "$total"
}
alloc_counter() { # PID NAME: one counter of the counting allocator (written every 100 ms)
  sleep 0.3
  awk -v n="$2" '$1 == n {print $2}' "$work/alloc.$1"
}

# Storage nodes of the counting build (their allocations are not measured), 32 partitions.
cluster_up "$work/cluster" 3 32 "" ""
kill "$FRONTEND_PID"; wait "$FRONTEND_PID" 2>/dev/null || true # each case starts its own
head -c 1024 /dev/urandom > "$work/1k"
frontend_toml=$(cat "$work/cluster/frontend.toml")

larder_frontend_up() {
  local port; port=$(free_port)
  {
    echo "$frontend_toml" | sed "s/^listen = .*/listen = \"127.0.0.1:$port\"/"
    printf '[limits]\nmax_connections_per_ip = 0\nidle_timeout = "10m"\nheader_read_timeout = "10m"\n'
  } > "$work/cluster/frontend-b6.toml"
  echo "--- $key" >> "$work/frontend.log"
  LARDER_LOG=warn "$LARDER" frontend --config "$work/cluster/frontend-b6.toml" >/dev/null 2>>"$work/frontend.log" &
  server_pid=$!; pids+=("$server_pid"); server_all=$server_pid
  wait_port "$port"
  server_addr="127.0.0.1:$port"
  id=$(upload_blob "$work/1k" "http://$server_addr/v1/blobs")
  get_path="/v1/blobs/$id"; put_path="/v1/blobs"; put_method=POST
  # Warm-up on one connection: the pool's connections to the storage nodes are opened now, not
  # counted against the client connections.
  h2load -n 200 -c 1 -m 16 "http://$server_addr$get_path" >/dev/null 2>&1 || true
  h2load -n 50 -c 1 -m 16 -d "$work/1k" "http://$server_addr$put_path" >/dev/null 2>&1 || true
}

nginx_up() { # PROTOCOL
  local port; port=$(free_port)
  mkdir -p "$work/www/up" "$work/nginx"
  cp "$work/1k" "$work/www/1k"
  local listen="127.0.0.1:$port"; [ "$1" = 2 ] && listen="$listen http2"
  cat > "$work/nginx/nginx.conf" <<NGINX
$nginx_user
worker_processes auto;
worker_rlimit_nofile 65536;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 40000; }
http {
  access_log off;
  keepalive_timeout 600s;
  keepalive_requests 1000000;
  http2_max_requests 1000000;
  client_body_temp_path $work/nginx/body;
  server {
    listen $listen;
    root $work/www;
    location /up/ { dav_methods PUT; }
  }
}
NGINX
  nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' 2>/dev/null &
  server_pid=$!; pids+=("$server_pid")
  wait_port "$port"
  server_addr="127.0.0.1:$port"
  get_path=/1k; put_path=/up/blob; put_method=PUT
  h2load -n 200 -c 1 -m 16 "http://$server_addr$get_path" >/dev/null 2>&1 || true
  server_all=$(pid_and_children "$server_pid")
}

server_down() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
}

# drive OP KEY: every held connection sends OP requests for SECONDS_OF_LOAD; records the rate,
# the peak RSS sampled meanwhile and, for Larder, what the load allocated.
drive() {
  local op=$1 key=$2 before_bytes="" before_count="" peak=0 line="" rss started
  if [ "$server" = larder ]; then
    before_bytes=$(alloc_counter "$server_pid" allocated_bytes)
    before_count=$(alloc_counter "$server_pid" allocations)
  fi
  started=$(date +%s.%N)
  echo "$op $seconds" >&"${CLIENT[1]}"
  until read -r -t 0.25 -u "${CLIENT[0]}" line; do
    rss=$(rss_kib "$server_all"); [ "$rss" -gt "$peak" ] && peak=$rss
  done
  local elapsed; elapsed=$(python3 -c "import time; print(time.time() - $started)")
  read -r _ ok other errors <<< "$line"
  record "$key.$op.ok" "$ok"; record "$key.$op.not_ok" $((other + errors))
  record "$key.$op.rps" "$(python3 -c "print(round($ok / $elapsed))")"
  record "$key.$op.peak_rss_kib" "$peak"
  if [ "$server" = larder ]; then
    record "$key.$op.allocated_bytes" $(($(alloc_counter "$server_pid" allocated_bytes) - before_bytes))
    record "$key.$op.allocations" $(($(alloc_counter "$server_pid" allocations) - before_count))
  fi
}

for server in larder nginx; do
  for protocol in 1 2; do
    for n in $counts; do
      key="$server.h$protocol.$n"
      if [ "$server" = larder ]; then larder_frontend_up; else nginx_up "$protocol"; fi
      sleep 0.5
      record "$key.rss_base_kib" "$(rss_kib "$server_all")"
      if [ "$server" = larder ]; then
        record "$key.live_base" "$(alloc_counter "$server_pid" live_bytes)"
        record "$key.allocated_base" "$(alloc_counter "$server_pid" allocated_bytes)"
      fi
      echo "--- $key" >> "$work/client.log"
      coproc CLIENT { "$conn_hold" --connect "$server_addr" --connections "$n" --http "$protocol" \
        --sources "$sources" --get-path "$get_path" --put-path "$put_path" \
        --put-method "$put_method" --put-size 1024 2>>"$work/client.log"; }
      client_pid=$CLIENT_PID; pids+=("$client_pid")
      read -r -u "${CLIENT[0]}" _ opened failed
      record "$key.opened" "$opened"; record "$key.failed" "$failed"
      sleep 1 # let the server settle (and the allocation counters be written)
      record "$key.rss_idle_kib" "$(rss_kib "$server_all")"
      if [ "$server" = larder ]; then
        record "$key.live_idle" "$(alloc_counter "$server_pid" live_bytes)"
        record "$key.allocated_idle" "$(alloc_counter "$server_pid" allocated_bytes)"
      fi
      # Each load is preceded by one second of the same requests, not counted: the first request
      # on a connection after it idled regrows its buffers, and at 16,384 connections a few
      # seconds give each connection only about one request, which would charge those per
      # connection costs to the requests.
      for op in get put; do
        echo "$op 1" >&"${CLIENT[1]}"
        read -r -u "${CLIENT[0]}" _
        drive "$op" "$key"
      done
      echo close >&"${CLIENT[1]}"
      wait "$client_pid" 2>/dev/null || true
      server_down
    done
  done
done

command_line="CONNECTIONS=\"$counts\" SECONDS_OF_LOAD=$seconds benchmarks/b6-connections/run.sh"
python3 "$here/report.py" "$results" "$command_line" "$(machine_description "$work")" "$counts" > "$out"
cat "$out"
