#!/usr/bin/env bash
# Issue 18, "side by side with MinIO and Garage": the same warp runs against Larder (1 replica),
# MinIO (one drive), Garage (replication factor 1) and Larder (3 replicas), one server at a time
# on 127.0.0.1, each with its data in a fresh directory on the same disk and fsync on.
#
# Workloads (each one `warp` command, the same flags for every server): PUT and GET of 1 KiB,
# 64 KiB and 4 MiB objects, and listing (`warp list`). For each: ops/s, p50/p99 latency (warp's
# analysis of its --benchdata), errors, and the servers' CPU seconds per operation (user + system
# from /proc/<pid>/stat of every server process, sampled while warp runs, over the window warp
# measured: preparation uploads and cleanup are not counted), with warp's own CPU and how busy
# the whole machine was over the same window (a 2-core machine shared with the client: a run at
# ~100 % busy is bound by server and client CPU together). measure.py runs each command;
# report.py renders RESULTS.md (machine, versions, tables; then reading.md, the notes written by
# hand after a run: re-read them when the numbers change) and plot.png.
#
# Usage: run.sh [--smoke | SERVER...]   (servers: larder1 minio garage larder3; default all four)
#   --smoke (scripts/bench-smoke, part of the test command): renders the committed results.tsv
#   with report.py into a temp file, and nothing else. The real run is not in the test command:
#   it needs Go builds of MinIO and warp (minutes each) and a quiet machine.
# Knobs (environment): DURATION (warp --duration, default 20s), CONCURRENT (default 16),
#   WORKLOADS (a space-separated subset of the workloads above, e.g. "put-64KiB list"),
#   OUT_DIR (where RESULTS.md, results.tsv, machine.txt, plot.png and runs/ go; default this
#   folder), WARP_SRC (a git directory of
#   github.com/minio/warp, used when `go install` of warp fails: the Go module proxy here refuses
#   warp itself), WAIT_QUIET (1: wait until the 1-minute load average is below 1.0 or
#   QUIET_DEADLINE, a `date -d` time, before measuring; default 0).
# Tools are installed once per machine into ${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}:
#   warp and minio by `go install` (pinned below), garage by `cargo install --locked`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/../lib.sh"

if [ "${1:-}" = "--smoke" ]; then
  smoke_out=$(mktemp)
  python3 "$here/report.py" "$here/results.tsv" "$here/machine.txt" "$here/reading.md" > "$smoke_out"
  rm -f "$smoke_out"
  exit 0
fi

# Pinned versions: each builds with Go 1.26 / Rust 1.95, and each module is served by the proxy.
WARP_VERSION=v1.4.0 # v1.5.0+ need madmin-go v4.6.7 and a minio-go pseudo-version the proxy refuses
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c # the newest commit of github.com/minio/minio
GARAGE_VERSION=2.5.0
tools=${LARDER_TOOLS_DIR:-$HOME/.cache/larder-tools}
duration=${DURATION:-20s}
concurrent=${CONCURRENT:-16}
out_dir=${OUT_DIR:-$here}
mkdir -p "$out_dir"
servers=("$@")
[ ${#servers[@]} -gt 0 ] || servers=(larder1 minio garage larder3)

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# --- tools -------------------------------------------------------------------------------------

install_warp() {
  warp=$tools/warp-$WARP_VERSION/bin/warp
  [ -x "$warp" ] && return
  log "installing warp $WARP_VERSION into $tools"
  if ! GOBIN=$(dirname "$warp") go install "github.com/minio/warp@$WARP_VERSION"; then
    [ -n "${WARP_SRC:-}" ] || { echo "go install warp failed; set WARP_SRC to a git directory of github.com/minio/warp" >&2; exit 1; }
    log "go install failed; building warp $WARP_VERSION from $WARP_SRC"
    local src=$tools/src/warp-$WARP_VERSION
    rm -rf "$src" && mkdir -p "$src"
    git --git-dir="$WARP_SRC" archive "$WARP_VERSION" | tar -x -C "$src"
    (cd "$src" && go build -o "$warp" .)
  fi
}

install_minio() {
  minio=$tools/minio-$MINIO_VERSION/bin/minio
  [ -x "$minio" ] && return
  log "installing minio $MINIO_VERSION into $tools (a few minutes)"
  GOBIN=$(dirname "$minio") go install "github.com/minio/minio@$MINIO_VERSION"
}

# Garage is optional: if it cannot be built here, its row says so and the others go on.
install_garage() {
  garage=$tools/garage-$GARAGE_VERSION/bin/garage
  [ -x "$garage" ] && return
  log "installing garage $GARAGE_VERSION into $tools (cargo install; many minutes)"
  # lmdb (Garage's recommended metadata engine) only: sqlite, k2v and the metrics exporter are
  # not used here and only lengthen the build.
  CARGO_TARGET_DIR=$tools/garage-target cargo install --locked --root "$tools/garage-$GARAGE_VERSION" \
    "garage@$GARAGE_VERSION" --no-default-features --features bundled-libs,lmdb ||
    { log "garage could not be built"; garage=""; }
}

bench_build
install_warp
for s in "${servers[@]}"; do
  case $s in
    minio) install_minio ;;
    garage) install_garage ;;
  esac
done

# --- the machine -------------------------------------------------------------------------------

if [ "${WAIT_QUIET:-0}" = 1 ]; then
  deadline=$(date -d "${QUIET_DEADLINE:-now + 30 min}" +%s)
  while :; do
    load1=$(cut -d' ' -f1 /proc/loadavg)
    python3 -c "import sys; sys.exit(0 if $load1 < 1.0 else 1)" && break
    [ "$(date +%s)" -lt "$deadline" ] || { log "still loaded ($load1) at the deadline; measuring anyway"; break; }
    log "waiting for a quiet machine: load $load1"
    sleep 20
  done
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/s3-compare.XXXX")
failures=()
server_pids=() # every process this script starts; stopped by the trap, even on failure
# stop_servers: SIGTERM to every process started, SIGKILL to any still there after 25 s (larder
# dev gives its storage nodes 20 s to sync and stop).
stop_servers() {
  local p
  for p in "${server_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${server_pids[@]}"; do
    for _ in $(seq 1 250); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  server_pids=()
}
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

results=$work/results.tsv
mkdir -p "$work/runs"
{
  echo "started: $(date -u +%Y-%m-%dT%H:%MZ); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  machine_description "$work"
  echo "- nproc: $(nproc); free -g:"; free -g | sed 's/^/    /'
  echo "- $(go version); $(cargo --version)"
  echo "- warp: $WARP_VERSION (github.com/minio/warp; built from source it prints \"(dev)\")"
  echo "- command: benchmarks/s3-compare/run.sh ${servers[*]} (DURATION=$duration CONCURRENT=$concurrent)"
} > "$work/machine.txt"

# --- servers -----------------------------------------------------------------------------------

# Each start_* sets endpoint, access_key, secret_key and writes the server's pids to $pids_file.

start_larder() { # REPLICAS
  local dir=$work/larder$1 port s3_port
  port=$(free_port) s3_port=$(free_port)
  # One storage node per replica, 32 partitions (the dev default), fsync on (the default).
  LARDER_LOG=warn,s3s=off "$LARDER" dev --data-dir "$dir" --listen "127.0.0.1:$port" \
    --s3-listen "127.0.0.1:$s3_port" --nodes "$1" --replicas "$1" > "$work/larder$1.log" 2>&1 &
  local dev=$!
  server_pids+=("$dev")
  wait_port "$s3_port"
  local key
  key=$("$LARDER" s3 key create --config "$dir/frontend-dc1.toml" --grant '*:owner')
  access_key=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_key_id"])' <<< "$key")
  secret_key=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secret_access_key"])' <<< "$key")
  endpoint=127.0.0.1:$s3_port
  { echo "$dev"; pgrep -P "$dev"; } > "$pids_file"
  mapfile -t -O "${#server_pids[@]}" server_pids < <(pgrep -P "$dev") # the storage nodes
  echo "larder$1: larder dev --nodes $1 --replicas $1 ($(wc -l < "$pids_file") processes); $("$LARDER" --version), commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- crates || echo " with local changes")" >> "$work/versions.txt"
}

start_minio() {
  local port console
  port=$(free_port) console=$(free_port)
  access_key=benchadmin secret_key=benchadmin-secret
  # One drive (xl-single): MinIO writes object data with O_DIRECT + fdatasync and xl.meta with
  # O_DSYNC by default; nothing is changed.
  MINIO_ROOT_USER=$access_key MINIO_ROOT_PASSWORD=$secret_key MINIO_BROWSER=off MINIO_UPDATE=off \
    "$minio" server "$work/minio" --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
    > "$work/minio.log" 2>&1 &
  server_pids+=($!)
  echo $! > "$pids_file"
  wait_port "$port"
  endpoint=127.0.0.1:$port
  for _ in $(seq 1 100); do curl -sf "http://$endpoint/minio/health/ready" >/dev/null && break; sleep 0.2; done
  echo "minio: github.com/minio/minio@$MINIO_VERSION, $("$minio" --version | sed -n 2p) (single drive; a go install build prints its version as DEVELOPMENT.GOGET)" >> "$work/versions.txt"
}

start_garage() {
  local dir=$work/garage base
  base=$(free_ports_in_a_row 3)
  mkdir -p "$dir"
  cat > "$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "lmdb"
replication_factor = 1
# fsync on, as Larder and MinIO: every data block and every metadata transaction.
data_fsync = true
metadata_fsync = true
rpc_bind_addr = "127.0.0.1:$((base + 1))"
rpc_public_addr = "127.0.0.1:$((base + 1))"
rpc_secret = "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"

[s3_api]
s3_region = "us-east-1"
api_bind_addr = "127.0.0.1:$base"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((base + 2))"
EOF
  cp "$dir/garage.toml" "$work/garage.toml"
  local g=("$garage" -c "$dir/garage.toml")
  RUST_LOG=warn "${g[@]}" server > "$work/garage.log" 2>&1 &
  server_pids+=($!)
  echo $! > "$pids_file"
  wait_port "$base"
  for _ in $(seq 1 60); do "${g[@]}" status >/dev/null 2>&1 && break; sleep 0.5; done
  local node; node=$("${g[@]}" node id -q 2>/dev/null | cut -c1-64)
  "${g[@]}" layout assign -z dc1 -c 10G "$node" >/dev/null
  "${g[@]}" layout apply --version 1 >/dev/null
  local key; key=$("${g[@]}" json-api CreateKey '{"name":"warp"}')
  access_key=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["accessKeyId"])' <<< "$key")
  secret_key=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["secretAccessKey"])' <<< "$key")
  # Garage's keys create no buckets unless allowed: the buckets warp_run uses are made here.
  local b
  for b in put-1kib get-1kib put-64kib get-64kib put-4mib get-4mib list; do
    "${g[@]}" bucket create "warp-$b" >/dev/null
    "${g[@]}" bucket allow --read --write --owner "warp-$b" --key "$access_key" >/dev/null
  done
  endpoint=127.0.0.1:$base
  echo "garage: $("$garage" --version 2>&1 | head -n 1) (lmdb, replication_factor 1, data_fsync and metadata_fsync true)" >> "$work/versions.txt"
}

# --- the runs ----------------------------------------------------------------------------------

# warp_run SERVER WORKLOAD warp-subcommand-and-flags...: one measured warp command.
warp_run() {
  local server=$1 workload=$2; shift 2
  local data=$work/runs/$server-$workload
  # A fresh bucket per workload, so no run inherits another's objects (or, in Larder, another's
  # deleted blobs waiting out their grace period in the bucket's index).
  local bucket; bucket=warp-$(tr '[:upper:]' '[:lower:]' <<< "$workload")
  log "$server $workload"
  python3 "$here/measure.py" "$results" "$server" "$workload" "$pids_file" "$data" -- \
    "$warp" "$@" --host "$endpoint" --access-key "$access_key" --secret-key "$secret_key" \
    --bucket "$bucket" --region us-east-1 --duration "$duration" --concurrent "$concurrent" \
    --no-color --benchdata "$data" || { log "$server $workload failed (see runs/$server-$workload.log)"; failures+=("$server $workload"); }
}

# chosen WORKLOAD: whether WORKLOADS (space-separated; default every one) names it.
chosen() { [ -z "${WORKLOADS:-}" ] || [[ " $WORKLOADS " == *" $1 "* ]]; }

workloads() { # SERVER
  local w
  for w in put-1KiB get-1KiB put-64KiB get-64KiB put-4MiB get-4MiB list; do
    chosen "$w" || continue
    case $w in
      put-*) warp_run "$1" "$w" put --obj.size "${w#put-}" ;;
      get-4MiB) warp_run "$1" "$w" get --obj.size 4MiB --objects 100 ;;
      get-*) warp_run "$1" "$w" get --obj.size "${w#get-}" --objects 1000 ;;
      list) warp_run "$1" "$w" list --obj.size 1KiB --objects 3200 --max-keys 100 ;;
    esac
  done
}

for s in "${servers[@]}"; do
  pids_file=$work/$s.pids
  case $s in
    larder1) start_larder 1 ;;
    larder3) start_larder 3 ;;
    minio) start_minio ;;
    garage)
      if [ -z "${garage:-}" ]; then
        echo "garage: not built (cargo install garage@$GARAGE_VERSION failed)" >> "$work/versions.txt"
        continue
      fi
      start_garage ;;
    *) echo "unknown server $s" >&2; exit 2 ;;
  esac
  workloads "$s"
  stop_servers
  rm -rf "$work/larder1" "$work/larder3" "$work/minio" "$work/garage"
done

echo "finished: $(date -u +%Y-%m-%dT%H:%MZ); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$work/machine.txt"
cp "$results" "$out_dir/results.tsv"
# warp's report of every run, for the record (its analysis, runs/*.json, stays in $work).
rm -rf "$out_dir/runs" && mkdir -p "$out_dir/runs" && cp "$work"/runs/*.log "$out_dir/runs/" 2>/dev/null || true
cat "$work/machine.txt" "$work/versions.txt" > "$out_dir/machine.txt"
[ -f "$work/garage.toml" ] && sed 's/^rpc_secret = .*/rpc_secret = "<32 random bytes, hex>"/' "$work/garage.toml" > "$out_dir/garage.toml"
[ ${#failures[@]} -eq 0 ] || log "failed runs: ${failures[*]}"

# RESULTS.md and the plot, with matplotlib from a venv in the tools cache.
venv=$tools/plot-venv
"$venv/bin/python" -c 'import matplotlib' 2>/dev/null ||
  { python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib; }
"$venv/bin/python" "$here/report.py" "$out_dir/results.tsv" "$out_dir/machine.txt" \
  "$here/reading.md" "$out_dir/plot.png" > "$out_dir/RESULTS.md"
log "results in $out_dir: RESULTS.md, results.tsv, machine.txt, plot.png, runs/"
