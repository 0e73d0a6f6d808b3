#!/usr/bin/env bash
# Issue 4: a storage node is SIGKILLed, N MiB of 1 MiB blobs are written while it is down, then it
# restarts; how long until it holds every blob again (pull replication from its two peers), as
# MB/s, next to the disk's own fdatasync'd write rate (dd) measured in the same run.
# Usage: run.sh [--smoke]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh

mib=${MIB:-512}; out="$here/RESULTS.md"
if [ "${1:-}" = "--smoke" ]; then mib=8; out=$(mktemp); fi

# live_keys below curls a storage node's internal health, so this cluster runs unauthenticated.
STORAGE_AUTH=$'[auth]\ninsecure_unauthenticated_internal_api = true'
FRONTEND_AUTH=''
bench_build
work=$(mktemp -d "$root/target/bench-repl.XXXX")
trap 'stop_all "$work"; rm -rf "$work"' EXIT
start_cluster "$work" 3 12
port=$(free_port)
start_frontend "$work" frontend "$port"
s1_addr=$(grep -m1 address "$work/cluster.toml" | cut -d'"' -f2)

dd_rate=$(dd if=/dev/zero of="$work/dd.bin" bs=4M count=$((mib / 4 > 0 ? mib / 4 : 1)) conv=fdatasync 2>&1 | awk -F', ' '/copied/ {print $NF}')
rm -f "$work/dd.bin"

kill -KILL "$(cat "$work/s1.pid")"
wait "$(cat "$work/s1.pid")" 2>/dev/null || true
head -c 1048576 /dev/urandom > "$work/blob"
seq 1 "$mib" | xargs -P 8 -I{} curl -sS -o /dev/null -w '%{http_code}\n' --http2-prior-knowledge \
  --data-binary @"$work/blob" "http://127.0.0.1:$port/v1/blobs" > "$work/codes"
stored=$(grep -c '^201$' "$work/codes")

live_keys() {
  curl -sS --http2-prior-knowledge "http://$s1_addr/internal/v1/health" 2>/dev/null \
    | python3 -c 'import sys,json; print(sum(p["live_keys"] for p in json.load(sys.stdin)["partitions"].values()))' 2>/dev/null || echo 0
}
start=$(date +%s.%N)
start_node "$work" 1
port1=${s1_addr##*:}
wait_port "$port1"
opened=$(date +%s.%N)
until [ "$(live_keys)" -ge "$stored" ]; do sleep 0.05; done
done_at=$(date +%s.%N)

read -r total recovery catchup rate < <(python3 -c "
s,o,d,m=$start,$opened,$done_at,$stored
print(f'{d-s:.2f} {o-s:.2f} {d-o:.2f} {m*1.048576/(d-s):.1f}')")

{
  echo "# Replication catch-up after a node was down"
  echo
  echo "Three storage nodes (12 partitions x 3 replicas, so every partition has a replica on s1)."
  echo "s1 is SIGKILLed; $stored blobs of 1 MiB (quorum 2 of 3, durable) are written through the"
  echo "frontend; s1 restarts and pulls what it missed from s2 and s3 (defaults: 256 changes a page,"
  echo "16 fetched at once, 200 ms between idle rounds). Catch-up is done when s1's replicas hold every"
  echo "blob (sum of live keys from its health endpoint). dd runs in the same run on the same disk."
  echo
  echo "## Machine"
  machine_description "$work"
  echo
  echo "## Command"
  echo '```'
  echo "MIB=$mib benchmarks/replication-catch-up/run.sh"
  echo '```'
  echo
  echo "## Results"
  echo
  echo "| measure | value |"
  echo "| --- | ---: |"
  echo "| data written while s1 was down | $stored MiB |"
  echo "| s1 restart until listening (log recovery) | ${recovery} s |"
  echo "| listening until caught up | ${catchup} s |"
  echo "| restart until caught up | ${total} s |"
  echo "| catch-up rate (restart to caught up) | **$rate MB/s** |"
  echo "| dd bs=4M conv=fdatasync, same disk | $dd_rate |"
} > "$out"
cat "$out"
