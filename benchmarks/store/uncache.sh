#!/usr/bin/env bash
# Durable 4 MiB puts into one store with synced large records dropped from the page cache
# (`[store] uncache_synced_from`, the default) and kept cached, alternating, on the real disk
# (not /tmp, which may be tmpfs). Writes benchmarks/store/UNCACHE.md.
# Usage: benchmarks/store/uncache.sh [DATA_DIR] [SECONDS_PER_CELL] [ROUNDS] [WRITERS]
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
DATA_DIR="${1:-$PWD/target/uncache-bench-data}"
SECONDS_PER_CELL="${2:-5}"
ROUNDS="${3:-3}"
WRITERS="${4:-4}"
bench_cargo -p larder-store --example uncache_bench
bench=target/$( [ "$(bench_profile)" = dev ] && echo debug || echo release )/examples/uncache_bench
mkdir -p "$DATA_DIR"
trap 'rm -rf "$DATA_DIR"' EXIT
table=$("$bench" "$DATA_DIR" "$SECONDS_PER_CELL" "$ROUNDS" "$WRITERS")
# The notes written by hand (from "## Reading" on) stay; re-read them when the numbers change.
out=benchmarks/store/UNCACHE.md
notes=$( [ -f "$out" ] && sed -n '/^## Reading/,$p' "$out" || true)
{
  echo "# Synced large records dropped from the page cache, or kept"
  echo
  echo "One store (\`larder-store\`, durable), $WRITERS writer threads putting 4 MiB blobs (as"
  echo "64 KiB pieces) for $SECONDS_PER_CELL s per cell on a fresh store, each store deleted after"
  echo "its cell; the two settings alternate, which goes first alternating by round. CPU is the"
  echo "process's user and system time (getrusage) over the cell, per put."
  echo
  echo "## Machine"
  machine_description "$DATA_DIR"
  echo "- memory: $(grep -c . /sys/module/page_reporting/parameters/page_reporting_order 2>/dev/null >/dev/null && echo "free page reporting to the host on (order $(cat /sys/module/page_reporting/parameters/page_reporting_order))" || echo "no free page reporting module")"
  echo
  echo "## Command"
  echo '```'
  echo "benchmarks/store/uncache.sh $DATA_DIR $SECONDS_PER_CELL $ROUNDS $WRITERS"
  echo '```'
  echo
  echo "## Results"
  echo
  echo "$table"
  if [ -n "$notes" ]; then echo; echo "$notes"; fi
} > "$out.new"
mv "$out.new" "$out"
cat "$out"
