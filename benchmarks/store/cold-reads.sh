#!/usr/bin/env bash
# Reads of large records the page cache does not hold, past it (O_DIRECT, `[store]
# direct_cold_reads_from`, the default) and through it, taking turns on one store on the real
# disk (not /tmp, which may be tmpfs): crates/larder-store/examples/cold_read_bench.rs.
# Prints the table that benchmarks/store/COLD-READS.md holds.
# Usage: benchmarks/store/cold-reads.sh [DATA_DIR] [RECORDS] [ROUNDS] [READERS]
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
DATA_DIR="${1:-$PWD/target/cold-read-bench-data}"
RECORDS="${2:-256}"
ROUNDS="${3:-3}"
READERS="${4:-4}"
bench_cargo -p larder-store --example cold_read_bench
bench=target/$( [ "$(bench_profile)" = dev ] && echo debug || echo release )/examples/cold_read_bench
trap 'rm -rf "$DATA_DIR"' EXIT
echo "## Machine"
machine_description "$(dirname "$DATA_DIR")"
echo
echo '```'
echo "benchmarks/store/cold-reads.sh $DATA_DIR $RECORDS $ROUNDS $READERS"
echo '```'
echo
"$bench" "$DATA_DIR" "$RECORDS" "$ROUNDS" "$READERS"
