#!/usr/bin/env bash
# Builds the log store benchmark in release mode and runs it on a directory of the real disk
# (not /tmp, which may be tmpfs), printing the machine description and the markdown tables.
# Usage: benchmarks/store/run.sh [DATA_DIR] [SECONDS_PER_CELL] [REPETITIONS]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR="${1:-/work/larder-store-bench-data}"
SECONDS_PER_CELL="${2:-3}"
REPS="${3:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-store}"
cargo build --release -p larder-store --example store_bench
mkdir -p "$DATA_DIR"
trap 'rm -rf "$DATA_DIR"' EXIT
echo "## Machine"
echo '```'
echo "\$ nproc"; nproc
echo "\$ free -g"; free -g
echo "\$ df -h $DATA_DIR"; df -h "$DATA_DIR"
echo "\$ uname -r"; uname -r
echo "\$ uptime   # before: other sessions share these 2 cores"; uptime
echo '```'
echo
echo "## Results"
echo
"$CARGO_TARGET_DIR/release/examples/store_bench" "$DATA_DIR" "$SECONDS_PER_CELL" "$REPS"
echo
echo '```'
echo "\$ uptime   # after"; uptime
echo '```'
