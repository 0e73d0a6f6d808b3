#!/usr/bin/env bash
# Cold 4 MiB GETs through a storage node, its large records read past the page cache
# (`[store] direct_cold_reads_from`, the default 1 MiB) and through it (0), alternating: a
# `larder dev --nodes 1 --replicas 1` cluster made once and filled with BLOBS blobs of 4 MiB,
# then per cell its storage node (with the setting) and its frontend started by hand from the
# dev cluster's configs (`larder dev` writes its node configs anew at every start), every
# segment dropped from the page cache, and every blob GET once with h2load (4 clients, one
# stream each). Prints the node's CPU per GET and what the page cache holds after.
# Usage: benchmarks/store/cold-reads-node.sh [BLOBS] [ROUNDS]   (LARDER_BIN: another build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
blobs=${1:-160}
rounds=${2:-3}
bench_build
bench_workdir cold-reads-node
port=$(free_port)
dev_up "$port" --nodes 1 --replicas 1
head -c $((4 << 20)) /dev/urandom > "$work/blob"
for _ in $(seq "$blobs"); do
  curl -sS --data-binary @"$work/blob" "http://127.0.0.1:$port/v1/blobs" |
    python3 -c "import json,sys; print('http://127.0.0.1:$port/v1/blobs/' + json.load(sys.stdin)['id'])"
done > "$work/uris"
bench_cleanup_dev() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
bench_cleanup_dev
data=$work/data

drop_segments() {
  python3 - "$data" <<'PY'
import glob, os, sys
for f in glob.glob(os.path.join(sys.argv[1], "s1", "*", "*", "seg-*.log")):
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

cached_mib() {
  # shellcheck disable=SC2046 # one argument per segment
  fincore --bytes --noheadings $(find "$data/s1" -name 'seg-*.log') | awk '{s += $1} END {print int(s / 1048576)}'
}

cell() { # SETTING
  { cat "$data/s1.toml"; printf '\n[store]\ndirect_cold_reads_from = %s\n' "$1"; } > "$data/s1-cell.toml"
  LARDER_LOG=warn "$LARDER" storage --config "$data/s1-cell.toml" > /dev/null 2>&1 &
  local node=$!
  pids+=("$node")
  sleep 2
  LARDER_LOG=warn "$LARDER" frontend --config "$data/frontend-dc1.toml" > /dev/null 2>&1 &
  pids+=($!)
  wait_port "$port"
  drop_segments
  local t0 t1 out
  t0=$(awk '{print $14 + $15}' "/proc/$node/stat")
  out=$(h2load -i "$work/uris" -n "$blobs" -c 4 -m 1 2>&1)
  t1=$(awk '{print $14 + $15}' "/proc/$node/stat")
  local rate ok
  rate=$(grep -o '[0-9.]* req/s, [0-9.]*[MG]B/s' <<< "$out")
  ok=$(grep -o '[0-9]* succeeded' <<< "$out")
  local us=$(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) / blobs ))
  echo "| $1 | $rate | $ok | $us | $(cached_mib) |"
  bench_cleanup_dev
}

echo "## Machine"
machine_description "$work"
echo
echo '```'
echo "benchmarks/store/cold-reads-node.sh $blobs $rounds"
echo '```'
echo
echo "| direct_cold_reads_from | h2load | GETs | storage node CPU µs per GET | segments cached after (MiB) |"
echo "| --- | --- | ---: | ---: | ---: |"
for _ in $(seq "$rounds"); do
  cell '"1 MiB"'
  cell 0
done
