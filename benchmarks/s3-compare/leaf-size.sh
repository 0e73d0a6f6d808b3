#!/usr/bin/env bash
# How much of an S3 PutObject's cost is the index leaf it writes: `option-ab.sh` with
# `[s3] index_leaf_entries` at its default (1,000) against LEAF_SMALL (default 50), warp put of
# 1 KiB objects. RESULTS-leaf-size.md was measured with leaves written whole (before
# `index_delta_bytes`); with deltas, add `index_delta_bytes = 0` to both options to measure
# the same again.
#
# usage: LARDER_BIN=<larder> benchmarks/s3-compare/leaf-size.sh
#   env: ROUNDS=2 DURATION=15s LEAF_SMALL=50 OUT=<file> (default: stdout only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OPTION_A="index_leaf_entries = 1000" OPTION_B="index_leaf_entries = ${LEAF_SMALL:-50}" \
  exec "$here/option-ab.sh"
