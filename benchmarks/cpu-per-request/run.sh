#!/usr/bin/env bash
# Issue 13: the CPU cost of one request, process by process, for GET and PUT of 1 KiB and 1 MiB
# through `larder dev` (3 storage nodes, 32 partitions, frontend in the dev process, data on the
# real disk under target/), next to a bare hyper server (crates/larder/examples/hello_h2.rs) and
# nginx moving the same bytes, and next to a baseline build of Larder (today's main, built by this
# script) in the same run, so that every figure has a ratio to the baseline measured beside it.
#
# Also: p50/p99 at a fixed offered load (half of the baseline's maximum rate), fdatasync/fsync
# calls per second per storage node (perf's syscall tracepoints on each node, which cost nothing
# measurable; strace would stop the node at every syscall), frontend and storage-node RSS idle and
# after load, flame graphs of the frontend and one storage node under GET and PUT 1 KiB
# (perf record + inferno, SVG committed in flamegraphs/) with the share of `clear_page_erms`, and
# the 4 MiB PUT end-to-end rate on tmpfs (vs iperf3's one stream) and on disk (vs dd's synced
# write rate divided by the 3 replicas that share the disk).
#
# Usage: run.sh [--smoke]
#   --smoke: the current build only (no baseline), 1 s loads, no perf, no 4 MiB rows; results to
#   a temp file. Knobs (environment): BASELINE (commit, default 81108da), DURATION (s per load,
#   default 10), ROUNDS (default 3; the report gives each figure's median over rounds), PERF (1/0), PERF_SECONDS, PERF_CALL_GRAPH (default dwarf,16384: Rust's release
#   code has no frame pointers), OUT.
# Needs: h2load, nginx, perf (for flame graphs and sync counts), iperf3, python3; inferno
# (`cargo install inferno`, done by the script into target/bench-tools if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/../lib.sh"

baseline=${BASELINE:-81108da}
duration=${DURATION:-10}
rounds=${ROUNDS:-3}
perf_on=${PERF:-1}
perf_seconds=${PERF_SECONDS:-8}
call_graph=${PERF_CALL_GRAPH:-dwarf,16384}
out=${OUT:-$here/RESULTS.md}
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1; baseline=""; duration=1; rounds=1; perf_on=0; out=$(mktemp)
fi
command -v perf >/dev/null || perf_on=0
sync_count=$([ "$smoke" = 0 ] && command -v perf >/dev/null && echo 1 || echo 0)
target=${CARGO_TARGET_DIR:-$root/target}

bench_build
current_larder=$LARDER
bench_cargo -p larder --example hello_h2
hello="$target/$([ "$(bench_profile)" = dev ] && echo debug || echo release)/examples/hello_h2"

# The baseline: BASELINE's tree exported under target/, built in its own target dir (its
# dependencies copied from ours the first time, so only the workspace crates compile), reused
# when its binary is already there.
build_baseline() {
  local commit; commit=$(git -C "$root" rev-parse --short=12 "$1^{commit}")
  local dir="$target/bench-baseline-$commit"
  if [ ! -x "$dir/target/release/larder" ]; then
    if [ ! -d "$dir/src" ]; then # a plain export: no worktree to register or clean up
      mkdir -p "$dir/src.partial"
      git -C "$root" archive "$commit" | tar -x -C "$dir/src.partial"
      mv "$dir/src.partial" "$dir/src"
    fi
    if [ ! -d "$dir/target/release" ] && [ -d "$target/release/deps" ]; then
      mkdir -p "$dir/target" && cp -a "$target/release" "$dir/target/release"
    fi
    echo "building the baseline $commit (release) in $dir" >&2
    CARGO_TARGET_DIR="$dir/target" cargo build -q --release -p larder --manifest-path "$dir/src/Cargo.toml"
  fi
  echo "$dir/target/release/larder"
}
builds=(current)
declare -A binary=([current]=$current_larder)
if [ -n "$baseline" ]; then
  binary[baseline]=$(build_baseline "$baseline")
  builds=(baseline current)
fi

if [ "$perf_on" = 1 ]; then
  export PATH="$PATH:$target/bench-tools/bin"
  command -v inferno-flamegraph >/dev/null ||
    cargo install -q inferno --root "$target/bench-tools" >&2
fi

bench_workdir cpu-per-request
shm=/dev/shm/bench-cpu-per-request.$$ # 4 MiB PUTs on tmpfs; removed on any exit
trap 'bench_cleanup; rm -rf "$shm"' EXIT
# `key value` lines, one file per round (and one for the references); the report is rendered
# from them at the end.
results=$work/results.references
: > "$results"
record() { echo "$1 $2" >> "$results"; }

head -c 1024 /dev/urandom > "$work/1k"
head -c $((1 << 20)) /dev/urandom > "$work/1m"
head -c $((4 << 20)) /dev/urandom > "$work/4m"

# CPU milliseconds (user + system) used so far by one or more pids joined with '+'.
cpu_ms() {
  local total=0 p
  for p in ${1//+/ }; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo $((total * 1000 / $(getconf CLK_TCK)))
}
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# h2load's log file -> "p50_ms p99_ms".
percentiles() {
  python3 - "$1" <<'PY'
import math, sys
lat = sorted(int(l.split("\t")[2]) / 1000 for l in open(sys.argv[1]) if l.strip())
pct = lambda q: lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))] if lat else 0
print(f"{pct(0.5):.2f} {pct(0.99):.2f}")
PY
}

# measure KEY "name=pid[+pid] ..." h2load-args...: one load of DURATION seconds; records the rate,
# the 2xx and done counts, and each named process's CPU milliseconds during the load.
measure() {
  local key=$1 procs=$2; shift 2
  local -A before=()
  local np
  for np in $procs; do before[$np]=$(cpu_ms "${np#*=}"); done
  h2load -D "$duration" "$@" > "$work/$key.out" 2>&1 || true
  for np in $procs; do record "$key.cpu_ms.${np%%=*}" $(($(cpu_ms "${np#*=}") - ${before[$np]})); done
  record "$key.rps" "$(h2load_rps < "$work/$key.out")"
  record "$key.ok" "$(h2load_2xx < "$work/$key.out")"
  record "$key.done" "$(awk '/^requests:/ {print $6}' "$work/$key.out")"
}

# The four loads, by name: h2load settings (the same for every server) and what each sends.
load_args() { # LOAD
  case $1 in
    get1k|put1k) echo "-c 1 -m 256" ;;
    get1m|put1m) echo "-c 1 -m 16 -w 22 -W 26" ;; # 4 MiB windows: h2load's 64 KiB would measure h2load
    put4m) echo "-c 1 -m 8 -w 22 -W 26" ;;
  esac
}
loads=(get1k put1k get1m put1m)

larder_up() { # BINARY DATA_DIR
  local port; port=$(free_port)
  LARDER_LOG=warn "$1" dev --data-dir "$2" --listen "127.0.0.1:$port" --partitions 32 >"$2.log" 2>&1 &
  dev_pid=$!
  pids+=("$dev_pid")
  wait_port "$port"
  larder="http://127.0.0.1:$port"
  mapfile -t nodes < <(ps -o pid= --ppid "$dev_pid" | awk '{print $1}' | sort -n)
  [ "${#nodes[@]}" = 3 ] || { echo "expected 3 storage nodes under larder dev, found ${#nodes[@]}" >&2; exit 1; }
  pids+=("${nodes[@]}")
  # The storage nodes may still be opening their stores: the first upload retries.
  for _ in $(seq 50); do
    curl -sf --data-binary @"$work/1k" "$larder/v1/blobs" >/dev/null && return 0
    sleep 0.2
  done
  echo "larder dev never accepted an upload" >&2; exit 1
}

larder_down() {
  kill "$dev_pid" 2>/dev/null || true
  wait "$dev_pid" 2>/dev/null || true
  for p in "${nodes[@]}"; do # normally gone with larder dev; never left behind
    kill "$p" 2>/dev/null || true
  done
}

processes() { # the "name=pid" list of the running larder dev
  echo "frontend=$dev_pid s1=${nodes[0]} s2=${nodes[1]} s3=${nodes[2]}"
}

# fdatasync and fsync calls of each storage node while COMMAND runs: perf records the two
# syscall tracepoints system-wide (one cheap event per call) and the calls are counted by process
# id. (`perf stat -p` would miss the threads a node starts after it attaches.) Syncs submitted
# through io_uring would not show here.
count_syncs() { # KEY COMMAND...
  local key=$1; shift
  local recorder="" i
  if [ "$sync_count" = 1 ]; then
    perf record -q -a -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync \
      -o "$work/$key.syncs.data" 2>/dev/null &
    recorder=$!; pids+=("$recorder")
    sleep 0.5
  fi
  "$@"
  [ -n "$recorder" ] || return 0
  kill -INT "$recorder" 2>/dev/null || true
  wait "$recorder" 2>/dev/null || true
  record "$key.sync_seconds" "$duration" # the load's length: no PUT, no sync outside it
  perf script -i "$work/$key.syncs.data" -F pid 2>/dev/null | awk '{n[$1]++} END {for (p in n) print p, n[p]}' \
    > "$work/$key.syncs"
  for i in 0 1 2; do
    record "$key.syncs.s$((i + 1))" "$(awk -v p="${nodes[$i]}" '$1 == p {print $2}' "$work/$key.syncs" | grep . || echo 0)"
  done
}

# A flame graph of the frontend and of the first storage node under LOAD (get1k or put1k). perf
# records the whole machine and the samples are split by process afterwards: `perf record -p`
# would miss threads started after it attaches (the store's blocking threads come and go).
profile() { # BUILD LOAD URL-or-args...
  local build=$1 load=$2; shift 2
  local svgs="$here/flamegraphs" recorder who pid
  mkdir -p "$svgs"
  perf record -q -a -F 199 --call-graph "$call_graph" -o "$work/perf.data" 2>/dev/null &
  recorder=$!; pids+=("$recorder")
  sleep 0.5
  # shellcheck disable=SC2046
  h2load -D "$perf_seconds" $(load_args "$load") "$@" > /dev/null 2>&1 || true
  kill -INT "$recorder" 2>/dev/null || true
  wait "$recorder" 2>/dev/null || true
  for who in frontend storage; do
    pid=$dev_pid; [ "$who" = storage ] && pid=${nodes[0]}
    local name="$build-$who-${load%1k}"
    perf script -i "$work/perf.data" --pid "$pid" 2>/dev/null | inferno-collapse-perf > "$work/$name.folded"
    inferno-flamegraph --title "$build: $who under ${load%1k} 1 KiB (h2load 1 x 256)" \
      < "$work/$name.folded" > "$svgs/$name.svg" 2>/dev/null || true
    record "$build.$load.samples.$who" "$(awk '{n += $NF} END {print n + 0}' "$work/$name.folded")"
    record "$build.$load.clear_page.$who" "$(awk '/clear_page_erms/ {n += $NF} END {print n + 0}' "$work/$name.folded")"
  done
  rm -f "$work/perf.data"
}

# --- Larder: each build in turn, on the real disk under target/ ---
declare -A fixed_ref=()
measure_larder() {
  # Odd rounds measure the baseline first, even rounds the current build first, so that neither
  # always inherits the other's disk state; and every cluster starts after the disk has written
  # back what came before (`sync`).
  local order=("${builds[@]}")
  if [ $((round % 2)) = 0 ] && [ "${#builds[@]}" = 2 ]; then order=("${builds[1]}" "${builds[0]}"); fi
  for build in "${order[@]}"; do
    sync; sleep 1
    larder_up "${binary[$build]}" "$work/$build-data"
    get1k="$larder/v1/blobs/$(upload_blob "$work/1k" "$larder/v1/blobs")"
    get1m="$larder/v1/blobs/$(upload_blob "$work/1m" "$larder/v1/blobs")"
    record "$build.rss_idle.frontend" "$(rss_mib "$dev_pid")"
    record "$build.rss_idle.s1" "$(rss_mib "${nodes[0]}")"
    # Warm-up (pool connections open, caches warm), not measured.
    h2load -n 2000 -c 1 -m 256 "$get1k" >/dev/null 2>&1 || true
    for load in "${loads[@]}"; do
      case $load in
        get1k) what=("$get1k") ;; get1m) what=("$get1m") ;;
        put1k) what=(-d "$work/1k" "$larder/v1/blobs") ;; put1m) what=(-d "$work/1m" "$larder/v1/blobs") ;;
      esac
      if [ "$load" = put1k ]; then
        # shellcheck disable=SC2046
        count_syncs "$build.put1k" measure "$build.$load" "$(processes)" $(load_args "$load") "${what[@]}"
      else
        # shellcheck disable=SC2046
        measure "$build.$load" "$(processes)" $(load_args "$load") "${what[@]}"
      fi
    done
    record "$build.rss_loaded.frontend" "$(rss_mib "$dev_pid")"
    record "$build.rss_loaded.s1" "$(rss_mib "${nodes[0]}")"
    # Latency at a fixed offered load: half of the baseline's maximum rate (of this build's own
    # when there is no baseline), for every build, so p50/p99 compare at the same load.
    for load in get1k put1k; do
      # One offered load for every build and round: half of the baseline's rate in the first
      # round (which measures the baseline first).
      if [ -z "${fixed_ref[$load]:-}" ]; then
        fixed_ref[$load]=$(awk -v k="$build.$load.rps" '$1 == k {print $2}' "$results")
      fi
      rate=$(python3 -c "print(max(1, int(float('${fixed_ref[$load]:-0}' or 0) / 2)))")
      what=("$get1k"); [ "$load" = put1k ] && what=(-d "$work/1k" "$larder/v1/blobs")
      h2load -c 1 -m 256 --rps "$rate" -D "$duration" --log-file "$work/$build.$load.fixed.log" \
        "${what[@]}" > "$work/$build.$load.fixed.out" 2>&1 || true
      touch "$work/$build.$load.fixed.log"
      record "$build.$load.fixed.offered" "$rate"
      record "$build.$load.fixed.achieved" "$(h2load_rps < "$work/$build.$load.fixed.out")"
      read -r p50 p99 <<< "$(percentiles "$work/$build.$load.fixed.log")"
      record "$build.$load.fixed.p50" "$p50"; record "$build.$load.fixed.p99" "$p99"
    done
    if [ "$perf_on" = 1 ] && [ "$round" = 1 ]; then # profiles are not timings: one round's do
      profile "$build" get1k "$get1k"
      profile "$build" put1k -d "$work/1k" "$larder/v1/blobs"
    fi
    if [ "$smoke" = 0 ]; then
      # shellcheck disable=SC2046
      measure "$build.put4m_disk" "$(processes)" $(load_args put4m) -d "$work/4m" "$larder/v1/blobs"
    fi
    larder_down
    rm -rf "$work/$build-data"
    if [ "$smoke" = 0 ]; then
      mkdir -p "$shm"
      larder_up "${binary[$build]}" "$shm/data"
      h2load -n 8 -c 1 -m 8 -w 22 -W 26 -d "$work/4m" "$larder/v1/blobs" >/dev/null 2>&1 || true
      # shellcheck disable=SC2046
      measure "$build.put4m_tmpfs" "$(processes)" $(load_args put4m) -d "$work/4m" "$larder/v1/blobs"
      larder_down
      rm -rf "$shm"
    fi
  done
}

# --- The floor: a bare hyper server and nginx, the same bytes and h2load settings ---
measure_floor() {
  hello_port=$(free_port)
  "$hello" "127.0.0.1:$hello_port" &
  hello_pid=$!
  pids+=("$hello_pid")
  mkdir -p "$work/www/up" "$work/nginx"
  cp "$work/1k" "$work/www/1k"; cp "$work/1m" "$work/www/1m"
  nginx_port=$(free_port)
  # h2c with prior knowledge (as h2load speaks it); PUT through the DAV module, which reads the
  # whole body into a file and renames it into place (no fsync), as close to an upload as nginx goes.
  cat > "$work/nginx/nginx.conf" <<NGINX
  $nginx_user
  worker_processes auto;
  pid $work/nginx/nginx.pid;
  error_log $work/nginx/error.log;
  events { worker_connections 4096; }
  http {
    access_log off;
    keepalive_requests 1000000;
    http2_max_concurrent_streams 256;
    http2_max_requests 1000000;
    client_max_body_size 8m;
    client_body_buffer_size 1m;
    client_body_temp_path $work/nginx/body;
    server {
      listen 127.0.0.1:$nginx_port http2;
      root $work/www;
      location /up/ { dav_methods PUT; }
    }
  }
NGINX
  nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' 2>/dev/null &
  nginx_pid=$!
  pids+=("$nginx_pid")
  wait_port "$hello_port"; wait_port "$nginx_port"
  nginx_all=$(pid_and_children "$nginx_pid")
  for load in "${loads[@]}"; do
    size=1024; [[ $load == *1m ]] && size=$((1 << 20))
    file=$work/1k; [[ $load == *1m ]] && file=$work/1m
    if [[ $load == get* ]]; then
      hello_what=("http://127.0.0.1:$hello_port/$size")
      nginx_what=("http://127.0.0.1:$nginx_port/${load#get}")
    else
      hello_what=(-d "$file" "http://127.0.0.1:$hello_port/up")
      nginx_what=(-H ':method: PUT' -d "$file" "http://127.0.0.1:$nginx_port/up/blob")
    fi
    # shellcheck disable=SC2046
    measure "hello.$load" "server=$hello_pid" $(load_args "$load") "${hello_what[@]}"
    # shellcheck disable=SC2046
    measure "nginx.$load" "server=$nginx_all" $(load_args "$load") "${nginx_what[@]}"
  done
  kill "$hello_pid" "$nginx_pid" 2>/dev/null || true
  wait "$hello_pid" "$nginx_pid" 2>/dev/null || true
}

# Each round measures every build and the floor in turn; the report takes each figure's median
# over the rounds, so that one slow moment of the machine does not decide a ratio.
for round in $(seq "$rounds"); do
  results=$work/results.$round
  : > "$results"
  measure_larder
  measure_floor
done
results=$work/results.references

# dd's stderr -> its rate in MB/s.
dd_rate() {
  python3 -c "
import re, sys; t = open(sys.argv[1]).read()
m = re.search(r'(\d+) bytes.*?, ([0-9.]+) s,', t); print(round(int(m.group(1)) / float(m.group(2)) / 1e6))" "$1"
}

# --- References for the 4 MiB row: iperf3's one stream, dd's synced write rate, tmpfs's ---
if [ "$smoke" = 0 ]; then
  iport=$(free_port)
  iperf3 -s -1 -p "$iport" >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  record iperf3_mbps "$(iperf3 -c 127.0.0.1 -p "$iport" -t 5 -J |
    python3 -c 'import sys,json; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))')"
  dd if=/dev/zero of="$work/dd" bs=4M count=128 conv=fdatasync 2> "$work/dd.out"
  record dd_mbps "$(dd_rate "$work/dd.out")"
  rm -f "$work/dd"
  # tmpfs itself: 512 MiB into new pages (as every byte a storage node appends there is), then
  # over the same pages again. On a VM whose free memory goes back to the host, new pages cost
  # far more than reused ones; iperf3 reuses its socket buffers.
  shm_dd=/dev/shm/larder-bench-dd.$$
  dd if=/dev/zero of="$shm_dd" bs=4M count=128 2> "$work/dd-shm-new.out"
  record dd_tmpfs_new_mbps "$(dd_rate "$work/dd-shm-new.out")"
  dd if=/dev/zero of="$shm_dd" bs=4M count=128 conv=notrunc 2> "$work/dd-shm-reused.out"
  record dd_tmpfs_reused_mbps "$(dd_rate "$work/dd-shm-reused.out")"
  rm -f "$shm_dd"
fi

command_line="ROUNDS=$rounds DURATION=$duration BASELINE=${baseline:-none} PERF=$perf_on benchmarks/cpu-per-request/run.sh"
python3 "$here/report.py" "$command_line" "$(machine_description "$work")" "$work"/results.* > "$out"
cat "$out"
