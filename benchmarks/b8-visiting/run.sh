#!/usr/bin/env bash
# B8 (issue 16): visiting throughput (Gbps and docs/s) of `larder visit` for 1, 2, 4 and 8
# slices, streamed (stream=true) and not, at 0 and 20 ms of added round-trip time between the
# client and the frontend, and of Vespa's own `vespa visit` (Go, from the PyPI package vespacli)
# against the same server, one process per slice (it visits one slice per invocation).
#
# Topology: `larder dev` (3 storage nodes + 1 frontend, data under the target dir) runs in one
# network namespace, the visiting clients in another; the only path between them is B3's delay
# line (benchmarks/lib-delay.sh), also at 0 ms, so both RTTs cross the same path. The corpus is
# fed with `larder feed` inside the server's namespace (on its loopback, not through the delay).
#
# Needs root (namespaces, TUN), Go (builds the delay line), python3; `vespa visit` is skipped
# when the vespacli package is not in the test venv.
# Usage: run.sh [--smoke]   (--smoke: 300 documents, 0 ms, 2 slices, results to a temp file)
# Knobs (environment): DOCS (corpus size), SIZE (bytes of text per document), RTTS, SLICES,
# OUT, VESPA (path of the vespa binary), LARDER (a larder binary to use instead of building),
# CLIENT_CPU (share of a core per client process in the client-bound case, 0.01), BOUND_SLICES.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh
source benchmarks/lib-delay.sh

docs=${DOCS:-100000}
size=${SIZE:-1024}
rtts=${RTTS:-"0 20"}
slice_counts=${SLICES:-"1 2 4 8"}
out=${OUT:-$here/RESULTS.md}
plot="$(dirname "$out")/b8-visiting.svg"
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1; docs=300; rtts=0; slice_counts=2; out=$(mktemp); plot=$(mktemp --suffix .svg)
fi

if [ "$(id -u)" != 0 ]; then
  echo "B8 needs root: it creates network namespaces and TUN devices" >&2
  [ "$smoke" = 1 ] && { echo "B8 smoke run skipped (not root)" >&2; exit 0; }
  exit 1
fi
[ -n "${LARDER:-}" ] || bench_build
larder=$LARDER

# Vespa's CLI: the Go binary inside the vespacli package (its pip wrapper always exits 0).
vespa=${VESPA:-}
if [ -z "$vespa" ]; then
  for py in "${LARDER_TEST_PYTHON:-}" "${CARGO_TARGET_DIR:-$root/target}/test-venv/bin/python"; do
    [ -n "$py" ] && [ -x "$py" ] || continue
    vespa=$("$py" -c 'import vespacli; print(vespacli.get_binary_path())' 2>/dev/null) && break
  done
fi
[ -n "$vespa" ] && [ -x "$vespa" ] || { echo "vespa CLI not found: \`vespa visit\` is skipped" >&2; vespa=""; }

bench_workdir b8
trap 'delay_cleanup; bench_cleanup; rmdir /sys/fs/cgroup/cpu/larder-b8-$$-* /sys/fs/cgroup/larder-b8-$$-* 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
delay_setup "$work"

# The server, in the storage-side namespace, on every address of it (its loopback for feeding,
# $addr_s for the client once the delay line is up).
port=$(free_port)
ip netns exec "$ns_s" env LARDER_LOG=warn "$larder" dev --data-dir "$work/data" \
  --listen "0.0.0.0:$port" >"$work/dev.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  ip netns exec "$ns_s" bash -c "echo > /dev/tcp/127.0.0.1/$port" 2>/dev/null && break
  sleep 0.1
done

python3 - "$work/corpus.jsonl" "$docs" "$size" <<'PY'
import json, sys
path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
text = ("abcdefghij" * (size // 10 + 1))[:size]
with open(path, "w") as f:
    for i in range(count):
        f.write(json.dumps({"put": f"id:bench:doc::{i}", "fields": {"n": i, "text": text}}) + "\n")
PY
feed_started=$SECONDS
ip netns exec "$ns_s" "$larder" feed --endpoint "http://127.0.0.1:$port/" \
  --file "$work/corpus.jsonl" --json >"$work/feed.json"
feed_seconds=$((SECONDS - feed_started))
rm -f "$work/corpus.jsonl"

# Bytes the client's namespace received on the delay line's device (IP level, both clients alike).
rx_bytes() {
  ip -n "$ns_f" -j -s link show dev "$delay_dev" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'
}

endpoint="http://$addr_s:$port/"
results="$work/results.jsonl"
: > "$results"

# One measured visit: CLIENT STREAM SLICES RTT. Prints nothing; appends a JSON line to $results.
# Wall time covers the whole client run (start-up included) for both clients.
visit_once() {
  local client=$1 stream=$2 slices=$3 rtt=$4 rx0 rx1 t0 t1 docs_seen
  rx0=$(rx_bytes); t0=$(date +%s.%N)
  times > "$work/times.0" # the shell's builtin: CPU of its waited-for children so far
  if [ "$client" = larder ]; then
    docs_seen=$(ip netns exec "$ns_f" "$larder" visit --endpoint "$endpoint" --slices "$slices" \
      --stream "$stream" --json 2>"$work/summary.json" | wc -l) ||
      { cat "$work/summary.json" >&2; return 1; }
  else
    local flag=(); [ "$stream" = true ] && flag=(--stream)
    docs_seen=$(
      {
      for i in $(seq 0 $((slices - 1))); do
        local sl=(); [ "$slices" -gt 1 ] && sl=(--slices "$slices" --slice-id "$i")
        ip netns exec "$ns_f" env VESPA_CLI_HOME="$work/vespa-home" VESPA_CLI_CACHE_DIR="$work/vespa-home" \
          NO_COLOR=1 "$vespa" visit -t "${endpoint%/}" "${sl[@]}" "${flag[@]}" 2>>"$work/vespa.log" &
      done
      wait # so that their CPU counts as this subshell's children's
      } | wc -l)
    # The Go binary's exit statuses are lost in the background; a short count shows a failure.
    [ "$docs_seen" = "$docs" ] || cat "$work/vespa.log" >&2
  fi
  times > "$work/times.1"
  t1=$(date +%s.%N); rx1=$(rx_bytes)
  local cpu; cpu=$(awk 'FNR == 2 {
      for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s[FILENAME] += t[1] * 60 + t[2] } }
    END { printf "%.3f", s[ARGV[2]] - s[ARGV[1]] }' "$work/times.0" "$work/times.1")
  local seconds; seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}')
  local body=null
  [ "$client" = larder ] && body=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$work/summary.json")
  echo "{\"client\":\"$client\",\"stream\":$stream,\"slices\":$slices,\"rtt\":$rtt,\"docs\":$docs_seen,\"seconds\":$seconds,\"cpu\":$cpu,\"wire\":$((rx1 - rx0)),\"body\":$body}" >> "$results"
  echo "  $client stream=$stream slices=$slices rtt=$rtt: $docs_seen docs in $seconds s" >&2
}

mkdir -p "$work/vespa-home"
declare -A rtt_measured
for rtt in $rtts; do
  delay_up "$rtt"
  rtt_measured[$rtt]=$(measure_rtt)
  echo "added RTT $rtt ms (measured ${rtt_measured[$rtt]} ms)" >&2
  for slices in $slice_counts; do
    for stream in true false; do
      visit_once larder "$stream" "$slices" "$rtt"
      [ -z "$vespa" ] || visit_once vespa "$stream" "$slices" "$rtt"
    done
  done
  delay_down
done

# Client-bound: every client process in its own CPU cgroup (v1 `cpu`, or v2) holding CLIENT_CPU of
# one core, as if each ran on its own small machine (the Vespa article's client containers). Each
# slice is one process (`--slices N --slice-id i`, streamed), for both clients: what slices buy when
# the client is the bottleneck, and what each client gets out of the same CPU.
client_cpu=${CLIENT_CPU:-0.01}
bound_slices=${BOUND_SLICES:-"1 4"}
[ "$smoke" = 1 ] && bound_slices=2
bound="$work/bound.jsonl"
: > "$bound"
cgroup_root=/sys/fs/cgroup/cpu
[ -d "$cgroup_root" ] || cgroup_root=/sys/fs/cgroup

# Makes cgroup NAME with CLIENT_CPU of a core; prints its directory.
cpu_cgroup() {
  local dir="$cgroup_root/$1" period=100000 quota
  quota=$(awk -v c="$client_cpu" 'BEGIN {printf "%d", c * 100000}')
  mkdir -p "$dir"
  if [ -f "$dir/cpu.cfs_quota_us" ]; then
    echo "$period" > "$dir/cpu.cfs_period_us"; echo "$quota" > "$dir/cpu.cfs_quota_us"
  else
    echo "$quota $period" > "$dir/cpu.max"
  fi
  echo "$dir"
}

# Runs COMMAND... in the client namespace, in cgroup DIR. `nsenter --net` rather than `ip netns
# exec`, which remounts /sys (the cgroup files would not be found there) and, run inside the
# cgroup, would spend a second of the quota on its own start-up.
client_in_cgroup() {
  nsenter --net="/run/netns/$ns_f" sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$@"
}

# One client-bound visit: CLIENT SLICES; appends a JSON line to $bound.
visit_bound() {
  local client=$1 slices=$2 t0 t1 flow docs_seen first last reader_cpu cgroups=()
  for i in $(seq 0 $((slices - 1))); do cgroups+=("$(cpu_cgroup "larder-b8-$$-$i")"); done
  t0=$(date +%s.%N)
  times > "$work/times.0"
  flow=$(
    {
    for i in $(seq 0 $((slices - 1))); do
      local sl=(); [ "$slices" -gt 1 ] && sl=(--slices "$slices" --slice-id "$i")
      if [ "$client" = larder ]; then
        client_in_cgroup "${cgroups[$i]}" "$larder" visit --endpoint "$endpoint" --connections 1 --slices "$slices" ${sl[@]:2} \
          2>>"$work/bound.log" &
      else
        client_in_cgroup "${cgroups[$i]}" env VESPA_CLI_HOME="$work/vespa-home" VESPA_CLI_CACHE_DIR="$work/vespa-home" NO_COLOR=1 \
          "$vespa" visit -t "${endpoint%/}" "${sl[@]}" --stream 2>>"$work/bound.log" &
      fi
    done
    wait
    } | python3 "$here/flow.py")
  times > "$work/times.1"
  t1=$(date +%s.%N)
  read -r docs_seen first last reader_cpu <<< "$flow"
  for dir in "${cgroups[@]}"; do rmdir "$dir" 2>/dev/null || true; done
  [ "$docs_seen" = "$docs" ] || cat "$work/bound.log" >&2
  local cpu; cpu=$(awk -v r="$reader_cpu" 'FNR == 2 {
      for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s[FILENAME] += t[1] * 60 + t[2] } }
    END { printf "%.3f", s[ARGV[2]] - s[ARGV[1]] - r }' "$work/times.0" "$work/times.1")
  local seconds; seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}')
  local flowing; flowing=$(awk -v a="$first" -v b="$last" 'BEGIN {printf "%.4f", b - a}')
  echo "{\"client\":\"$client\",\"slices\":$slices,\"docs\":$docs_seen,\"seconds\":$seconds,\"flowing\":$flowing,\"cpu\":$cpu}" >> "$bound"
  echo "  client-bound ($client_cpu core each) $client slices=$slices: $docs_seen docs in $seconds s" >&2
}

delay_up 0
for slices in $bound_slices; do
  visit_bound larder "$slices"
  [ -z "$vespa" ] || visit_bound vespa "$slices"
done
delay_down

rtt_rows=$(for rtt in $rtts; do echo "| $rtt ms | ${rtt_measured[$rtt]} ms |"; done)
table=$(python3 "$here/report.py" "$results" "$docs" "$plot")
bound_table=$(python3 "$here/report.py" --bound "$bound" "$docs")

{
  echo "# B8: visiting throughput, \`larder visit\` by slices, streamed or not, and \`vespa visit\`"
  echo
  echo "One \`larder dev\` (3 storage nodes + 1 frontend, 32 partitions x 3 replicas, data under the"
  echo "target dir) holds $docs documents of $size bytes of text each (fed with \`larder feed\` in"
  echo "${feed_seconds} s). It runs in one network namespace, the clients in another; every packet"
  echo "between them crosses B3's user-space delay line (\`benchmarks/lib-delay.sh\`), which adds the"
  echo "given RTT (0 ms too: both RTTs take the same path). Each case visits the whole corpus once."
  echo "\`larder visit\` runs N slices in one process (its defaults: min(N, 4) HTTP/2 connections,"
  echo "the server's page size; \`--stream\` true or false); \`vespa visit\` (Go, vespacli) visits one slice per"
  echo "process, so N slices are N processes at once (\`--slices N --slice-id i\`, \`--stream\` or"
  echo "not, its default \`--chunk-count 1000\`). Both clients' JSON lines go to \`wc -l\`."
  echo
  echo "- seconds: wall time of the whole client run (process start-up included);"
  echo "- docs/s: documents printed / seconds;"
  echo "- wire Gbps: IP bytes the client namespace received on the delay line's device / seconds"
  echo "  (the same measure for both clients); body Gbps: response-body bytes \`larder visit\` counts."
  echo
  echo "Targets (issue 16): streaming >= 1.5x non-streamed at 20 ms; 4 slices >= 3x one slice where"
  echo "the client is the bottleneck; \`larder visit\` >= 2x \`vespa visit\` on the same server."
  echo
  echo "**The machine was shared and busy** (2 cores, other engineers building and testing at the"
  echo "same time, and client, delay line and server share those cores): absolute figures are low"
  echo "and noisy; read the ratios."
  echo
  echo "## Machine"
  machine_description "$work"
  echo "- vespa CLI: ${vespa:-not installed}"
  echo
  echo "## Command"
  echo '```'
  echo "DOCS=$docs SIZE=$size RTTS=\"$rtts\" SLICES=\"$slice_counts\" benchmarks/b8-visiting/run.sh"
  echo '```'
  echo
  echo "## Path"
  echo
  echo "| added RTT | measured RTT (median TCP connect to a closed port) |"
  echo "| --- | ---: |"
  echo "$rtt_rows"
  echo
  echo "## Results"
  echo
  echo "$table"
  echo
  echo "## Client-bound: each client process holds $client_cpu of a core"
  echo
  echo "Each slice is one client process (\`--slices N --slice-id i\`, streamed, one connection) in"
  echo "its own CPU cgroup limited to $client_cpu of a core (\`cpu.cfs_quota_us\`), as if each ran on"
  echo "its own small machine; 0 ms added RTT, same server. Client CPU is what the processes used."
  echo "\"seconds\" is the whole run; \"flowing\" is from the first document line any process wrote"
  echo "to the last (\`flow.py\`): process start-up, about 10 ms of CPU for either client, takes"
  echo "about a second at a hundredth of a core, and would otherwise weigh on the many-process runs."
  echo "Ratios are of docs/s while flowing."
  echo
  echo "$bound_table"
  echo
  if [ "$smoke" = 0 ] && [ -s "$plot" ]; then echo "![B8 plot](b8-visiting.svg)"; fi
} > "$out"
cat "$out"
if [ "$smoke" = 1 ]; then rm -f "$out" "$plot"; fi
