# Shared helpers for benchmark scripts (sourced). Every benchmark records the machine it ran on.

machine_description() {
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "- memory: $(free -g | awk '/Mem:/ {print $2}') GiB; kernel $(uname -r)"
  echo "- disk under the data dir: $(df -h "${1:-.}" | awk 'NR==2 {print $1, $2}')"
  echo "- tools: $(h2load --version 2>/dev/null | head -1); $(nginx -v 2>&1); $(rustc --version)"
}

# The cargo profile benchmarks build with: release for real runs; the smoke runs in the test
# command set BENCH_PROFILE=dev to reuse the tests' build instead of compiling everything twice.
bench_profile() {
  echo "${BENCH_PROFILE:-release}"
}

# bench_cargo ARGS...: `cargo build ARGS` with the benchmark profile. The smoke runs (dev) come
# after the test suite and use its build instead: `cargo test --workspace --no-run` made every
# binary and example and has nothing left to do, where `cargo build -p ...` resolves the
# dependencies' features without the dev-dependencies and compiles crates again (the first
# smoke run took 109 s in CI, 5 s without that).
bench_cargo() {
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ "$(bench_profile)" = dev ]; then
    cargo test -q --workspace --no-run --locked --manifest-path "$root/Cargo.toml"
  else
    cargo build -q --profile "$(bench_profile)" --manifest-path "$root/Cargo.toml" "$@"
  fi
}

# bench_build: builds the larder binary with the benchmark profile and sets LARDER to its path.
bench_build() {
  # LARDER_BIN: a binary built elsewhere (another commit, for a before/after in one session).
  if [ -n "${LARDER_BIN:-}" ]; then LARDER=$LARDER_BIN; export LARDER; return; fi
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local profile; profile=$(bench_profile)
  bench_cargo -p larder
  local dir; dir=$([ "$profile" = dev ] && echo debug || echo release)
  LARDER="${CARGO_TARGET_DIR:-$root/target}/$dir/larder"
  export LARDER
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# free_ports_in_a_row N: the first of N consecutive ports that are all free now (`cluster init
# --base-port` gives node i the port base + i; checking only the first let a node of a
# benchmark find its port taken now and then).
free_ports_in_a_row() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    # Below the kernel's ephemeral range (32768-60999 here), which outgoing connections use.
    base = random.randint(20000, 32000 - n)
    held = []
    try:
        for port in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            held.append(s)
    except OSError:
        continue
    finally:
        for s in held:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no run of free ports found")
PY
}

wait_port() {
  for _ in $(seq 1 300); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 never opened" >&2
  return 1
}

# h2load's requests per second from its summary line.
h2load_rps() {
  awk '/^finished in/ {for (i=1;i<=NF;i++) if ($i ~ /req\/s/) {gsub(",","",$(i-1)); print $(i-1)}}'
}

# pid_and_children PID: "PID+child+child..." (the form the CPU counters take) once PID has
# children: nginx listens before it forks its workers, whose CPU is most of its own. Asking once
# too early found none, and `ps` finding none exits 1, which ended a script under `set -e -o
# pipefail` without a word (CI's cpu-per-request smoke run, 2026-11-27).
pid_and_children() {
  local children=""
  for _ in $(seq 50); do
    children=$(ps -o pid= --ppid "$1" | awk '{printf "+%s", $1}' || true)
    [ -n "$children" ] && break
    sleep 0.1
  done
  [ -n "$children" ] || { echo "process $1 started no children" >&2; return 1; }
  echo "$1$children"
}

# h2load's count of 2xx answers.
h2load_2xx() {
  awk '/^status codes:/ {gsub(",","",$3); print $3}'
}

# Every internal hop proves the cluster secret that `cluster init` writes next to the map
# (a benchmark that curls a storage node directly sets both to the insecure mode instead).
STORAGE_AUTH=${STORAGE_AUTH:-$'[auth]\nsecret_file = "cluster.secret"'}
FRONTEND_AUTH=${FRONTEND_AUTH-$'[auth]\nsecret_file = "cluster.secret"'}

# start_cluster WORK NODES PARTITIONS: writes a cluster map, its secret and storage configs under
# WORK and starts the storage nodes (release build), recording each pid in WORK/sN.pid.
start_cluster() {
  local work=$1 nodes=$2 partitions=$3 larder=${LARDER:-target/release/larder}
  local base; base=$(free_ports_in_a_row "$nodes")
  "$larder" cluster init --nodes "$nodes" --partitions "$partitions" --replicas 3 \
    --base-port "$base" -o "$work/cluster.toml" --force >/dev/null
  for i in $(seq 1 "$nodes"); do
    printf 'node_id = "s%s"\ncluster_map = "cluster.toml"\ndata_dir = "s%s"\n%s\n%s\n' "$i" "$i" "${STORAGE_EXTRA:-}" "$STORAGE_AUTH" > "$work/s$i.toml"
    start_node "$work" "$i"
  done
  for i in $(seq 1 "$nodes"); do wait_port $((base + i - 1)); done
}

start_node() { # WORK I   (NODE_LOG: its log filter, default warn)
  LARDER_LOG=${NODE_LOG:-warn} "${LARDER:-target/release/larder}" storage --config "$1/s$2.toml" >>"$1/s$2.log" 2>&1 &
  echo $! > "$1/s$2.pid"
}

# start_frontend WORK NAME PORT [extra TOML]: a frontend in dc1 with its own config file.
start_frontend() {
  printf 'listen = "127.0.0.1:%s"\ncluster_map = "cluster.toml"\ndatacenter = "dc1"\n%s\n%s\n' "$3" "${4:-}" "$FRONTEND_AUTH" > "$1/$2.toml"
  LARDER_LOG=warn "${LARDER:-target/release/larder}" frontend --config "$1/$2.toml" >>"$1/$2.log" 2>&1 &
  echo $! > "$1/$2.pid"
  wait_port "$3"
}

# stop_all WORK: SIGCONT then SIGTERM every process recorded under WORK, and wait for them.
stop_all() {
  for f in "$1"/*.pid; do
    [ -e "$f" ] || continue
    kill -CONT "$(cat "$f")" 2>/dev/null || true
    kill "$(cat "$f")" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}

# upload COUNT SIZE URL IDS_FILE: uploads COUNT random blobs of SIZE bytes, appending IDs.
upload() {
  local f; f=$(mktemp)
  head -c "$2" /dev/urandom > "$f"
  for _ in $(seq 1 "$1"); do
    curl -sS --http2-prior-knowledge --data-binary @"$f" "$3/v1/blobs" \
      | python3 -c 'import sys,json; print(json.load(sys.stdin)["id"])' >> "$4"
  done
  rm -f "$f"
}

# bench_workdir NAME: a scratch folder $work under the target dir, and an EXIT trap that stops
# every process whose pid the script adds to `pids` and removes $work.
bench_workdir() {
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local target=${CARGO_TARGET_DIR:-$root/target}
  mkdir -p "$target"
  work=$(mktemp -d "$target/bench-$1.XXXX")
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

# dev_up PORT [ARGS...]: `larder dev` listening on 127.0.0.1:PORT, data in $work/data, started
# in the background (added to `pids`) and waited for.
dev_up() {
  local port=$1; shift
  LARDER_LOG=warn "$LARDER" dev --data-dir "$work/data" --listen "127.0.0.1:$port" "$@" >/dev/null &
  pids+=($!)
  wait_port "$port"
}

# upload_blob FILE URL: POSTs FILE to URL (a frontend's /v1/blobs) and prints the new blob's ID.
upload_blob() {
  curl -sS --data-binary @"$1" "$2" | python3 -c 'import sys,json; print(json.load(sys.stdin)["id"])'
}

# The `user` line of a benchmark's nginx.conf: started as root, nginx runs its workers as nobody,
# who can neither read nor write a scratch folder made by mktemp -d (mode 0700).
nginx_user=$([ "$(id -u)" = 0 ] && echo "user $(id -un) $(id -gn);" || true)
