#!/usr/bin/env bash
# The foreground PUT load of run.sh's section 2 alone, with compaction off: 1 KiB PUTs at RPS
# (default 300) for D seconds (default 8) through a frontend to 3 storage nodes (12 partitions),
# data under target/. Prints the p50, p90 and p99 in ms. To tell a build's PUT latency from the
# disk's, run it alternately with two builds: LARDER=<binary> put-probe.sh (default: this
# checkout's release build).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/benchmarks/lib.sh"
source "$root/benchmarks/lib-cluster.sh"
[ -n "${LARDER:-}" ] || bench_build
rps=${RPS:-300}; duration=${D:-8}
STORAGE_EXTRA=$'[compaction]\nenabled = false'
work=$(mktemp -d "${CARGO_TARGET_DIR:-$root/target}/put-probe.XXXX")
trap 'stop_all "$work"; rm -rf "$work"' EXIT
start_cluster "$work" 3 12
port=$(free_port)
start_frontend "$work" frontend "$port"
url="http://127.0.0.1:$port"
head -c 1024 /dev/urandom > "$work/1k"
sync; sleep 2
h2load -c 1 -m 64 --rps "$rps" -D "$duration" --log-file "$work/put.log" -d "$work/1k" "$url/v1/blobs" > "$work/put.out" 2>&1 || true
python3 - "$work/put.log" <<'PY'
import math, sys
lat = sorted(int(c[2]) / 1000 for c in (l.split("\t") for l in open(sys.argv[1]) if l.strip()) if c[1].startswith("2"))
q = lambda f: lat[min(len(lat) - 1, max(0, math.ceil(f * len(lat)) - 1))]
print(f"n={len(lat)} p50={q(0.5):.2f} p90={q(0.9):.2f} p99={q(0.99):.2f} ms")
PY
