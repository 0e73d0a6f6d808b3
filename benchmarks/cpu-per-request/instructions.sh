#!/usr/bin/env bash
# Work per 1 KiB GET, per process, counted by `perf stat`: syscalls (by kind), context switches
# and, with ALLOCS=1, heap allocations (uprobes on mimalloc's entry points): counts, unlike CPU
# time, barely move when other work shares the machine (task-clock is shown too, for what it is
# worth there). Hardware counters (instructions) are used when the machine has them. `larder dev` (3 storage nodes,
# 32 partitions, frontend in the dev process), one 1 KiB blob, h2load 1 connection x 256 streams.
#   LARDER=target/release/larder REQUESTS=200000 benchmarks/cpu-per-request/instructions.sh
# DEV_ARGS adds arguments to `larder dev` (for example `--node-threads 2`).
# Prints per-GET figures for the frontend and the storage nodes (summed), with syscalls and
# context switches per GET.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
source "$here/../lib.sh"
larder=${LARDER:?set LARDER to a release build of larder}
requests=${REQUESTS:-200000}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$(free_port)
# shellcheck disable=SC2086 # DEV_ARGS is a list of arguments
LARDER_LOG=warn "$larder" dev --data-dir "$work/data" --listen "127.0.0.1:$port" --partitions 32 \
  ${DEV_ARGS:-} >"$work/dev.log" 2>&1 &
dev=$!
pids+=("$dev")
wait_port "$port"
mapfile -t nodes < <(ps -o pid= --ppid "$dev" | awk '{print $1}' | sort -n)
pids+=("${nodes[@]}")
head -c 1024 /dev/urandom > "$work/1k"
id=""
for _ in $(seq 50); do
  id=$(curl -sf --data-binary @"$work/1k" "http://127.0.0.1:$port/v1/blobs" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])') && break
  sleep 0.2
done
url="http://127.0.0.1:$port/v1/blobs/$id"
h2load -n 4000 -c 1 -m 256 "$url" >/dev/null 2>&1 # warm-up: pool connections, caches

events=task-clock,context-switches,raw_syscalls:sys_enter
for call in pread64 writev write sendto recvfrom read epoll_wait futex; do
  events+=",syscalls:sys_enter_$call"
done
if perf stat -e instructions:u true >/dev/null 2>&1 &&
  ! perf stat -e instructions:u true 2>&1 | grep -q 'not supported'; then
  events+=",instructions:u,instructions:k"
fi
if [ "${ALLOCS:-0}" = 1 ]; then
  for f in mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned; do
    perf probe -q -x "$larder" --add "$f" 2>/dev/null || true
  done
  events+=",probe_larder:mi_malloc_aligned,probe_larder:mi_zalloc_aligned,probe_larder:mi_realloc_aligned"
fi
stats=()
for who in frontend:"$dev" s1:"${nodes[0]}" s2:"${nodes[1]}" s3:"${nodes[2]}"; do
  perf stat -x, -e "$events" -p "${who#*:}" -o "$work/${who%%:*}.stat" &
  stats+=($!)
done
sleep 0.5
h2load -n "$requests" -c 1 -m 256 "$url" > "$work/h2load.out" 2>&1
for p in "${stats[@]}"; do kill -INT "$p"; done
wait "${stats[@]}" 2>/dev/null || true
ok=$(h2load_2xx < "$work/h2load.out")
echo "GETs answered 2xx: $ok of $requests; $(grep '^finished in' "$work/h2load.out")"
python3 - "$ok" "$work" <<'PY'
import sys
ok, work = int(sys.argv[1]), sys.argv[2]
def read(who):
    out = {}
    for line in open(f"{work}/{who}.stat"):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
            out[parts[2].replace("syscalls:sys_enter_", "").replace("probe_larder:", "")] = float(parts[0])
    return out
stats = {w: read(w) for w in ["frontend", "s1", "s2", "s3"]}
storage = {k: sum(stats[s].get(k, 0) for s in ["s1", "s2", "s3"]) for k in stats["frontend"]}
names = list(stats["frontend"])
print("per GET".ljust(20) + "".join(n.replace("raw_syscalls:sys_enter", "syscalls")[:13].rjust(14) for n in names))
for name, s in [("frontend", stats["frontend"]), ("storage (3 summed)", storage)] + [(w, stats[w]) for w in ["s1", "s2", "s3"]]:
    cells = []
    for n in names:
        v = s.get(n, 0) / ok
        cells.append((f"{v * 1000:.2f}us" if n == "task-clock" else f"{v:.3f}").rjust(14))
    print(name.ljust(20) + "".join(cells))
PY
