#!/usr/bin/env bash
# Builds the log store benchmark in release mode and runs it on a directory of the real disk
# (not /tmp, which may be tmpfs), printing the machine description and the markdown tables.
# Usage: benchmarks/store/run.sh [DATA_DIR] [SECONDS_PER_CELL] [REPETITIONS]
#        benchmarks/store/run.sh --smoke    (tiny run in target/, to keep the script working)
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
if [ "${1:-}" = "--smoke" ]; then
  set -- "$PWD/target/store-bench-smoke" 0.2 1
  export LARDER_BENCH_SIZES=1024 LARDER_BENCH_RECOVERY_RECORDS=5000 LARDER_BENCH_DD_COUNT=4
fi
DATA_DIR="${1:-$PWD/target/store-bench-data}"
SECONDS_PER_CELL="${2:-3}"
REPS="${3:-3}"
profile=$(bench_profile)
cargo build -q --profile "$profile" -p larder-store --example store_bench
bench=target/$( [ "$profile" = dev ] && echo debug || echo release )/examples/store_bench
mkdir -p "$DATA_DIR"
trap 'rm -rf "$DATA_DIR"' EXIT
echo "## Machine"
echo '```'
echo "\$ nproc"; nproc
echo "\$ free -g"; free -g
echo "\$ df -h $DATA_DIR"; df -h "$DATA_DIR"
echo "\$ uname -r"; uname -r
echo "\$ uptime   # before"; uptime
echo '```'
echo
echo "## Results"
echo
"$bench" "$DATA_DIR" "$SECONDS_PER_CELL" "$REPS"
echo
echo '```'
echo "\$ uptime   # after"; uptime
echo '```'
