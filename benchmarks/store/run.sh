#!/usr/bin/env bash
# Issue 2's log store benchmark: builds crates/larder-store/examples/store_bench.rs and runs it on a
# directory of the real disk (not /tmp, which may be tmpfs); writes RESULTS.md.
# Usage: benchmarks/store/run.sh [DATA_DIR] [SECONDS_PER_CELL] [REPETITIONS]
#        benchmarks/store/run.sh --smoke    (tiny run in target/, results to a temp file)
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
out=benchmarks/store/RESULTS.md
if [ "${1:-}" = "--smoke" ]; then
  set -- "$PWD/target/store-bench-smoke" 0.2 1
  export LARDER_BENCH_SIZES=1024 LARDER_BENCH_RECOVERY_RECORDS=5000 LARDER_BENCH_DD_COUNT=4
  out=$(mktemp)
fi
DATA_DIR="${1:-$PWD/target/store-bench-data}"
SECONDS_PER_CELL="${2:-3}"
REPS="${3:-3}"
profile=$(bench_profile)
bench_cargo -p larder-store --example store_bench
bench=target/$( [ "$profile" = dev ] && echo debug || echo release )/examples/store_bench
mkdir -p "$DATA_DIR"
trap 'rm -rf "$DATA_DIR"' EXIT
load_before=$(uptime)
# The per-repetition figures go to stderr: keep them for the file.
tables=$("$bench" "$DATA_DIR" "$SECONDS_PER_CELL" "$REPS" 2> "$DATA_DIR.raw")
{
  echo "# larder-store benchmark (issue 2)"
  echo
  echo "What is measured:"
  echo
  echo "* durable puts/s: every \`put_blob\` returns only after \`fdatasync\` covered it (group commit);"
  echo "  writers are OS threads; records per fdatasync = \`records_appended / syncs\` from \`Store::stats\`."
  echo "* dd: \`dd if=/dev/zero of=F bs=4M count=256 conv=fdatasync\` in the same directory, same run."
  echo "* 32 stores on one disk: 32 stores opened on one \`Disk\` (one journal, one commit thread, as a"
  echo "  storage node opens its partitions), 256 writer threads spread over them, 1 KiB durable puts;"
  echo "  fdatasyncs/s = the disk's journal and segment fdatasyncs (\`Disk::stats\`) per second."
  echo "* recovery: a replica of 1,000,000 blobs of 100 bytes (~165 MB of log) is written, closed, then"
  echo "  opened three times with its checkpoint and three times after deleting \`index.ckpt\` (full"
  echo "  replay, every record's CRCs verified); median wall time, and the process CPU time of that open."
  echo "  Page cache is warm (the process-crash case)."
  echo
  echo "dd and every cell run $REPS times; the median is reported, every repetition is listed below."
  echo
  echo "## Machine"
  machine_description "$DATA_DIR"
  echo "- load before: \`$load_before\`"
  echo "- load after: \`$(uptime)\`"
  echo
  echo "## Command"
  echo '```'
  echo "benchmarks/store/run.sh $DATA_DIR $SECONDS_PER_CELL $REPS"
  echo '```'
  echo
  echo "## Results"
  echo
  echo "$tables"
  echo
  echo "Every repetition:"
  echo '```'
  cat "$DATA_DIR.raw"
  echo '```'
} > "$out"
rm -f "$DATA_DIR.raw"
cat "$out"
