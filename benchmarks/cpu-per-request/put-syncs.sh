#!/usr/bin/env bash
# Syncs and CPU per durable 1 KiB PUT, per process, for two builds side by side: `larder dev`
# (3 storage nodes, 32 partitions, frontend in the dev process, data on the disk under a fresh
# directory in the target dir), h2load 1 connection x 256 streams sending REQUESTS PUTs, counted by
# `perf stat` on each process: fdatasync, fsync, rename and openat calls (counts barely move
# when other work shares the machine) and task-clock (CPU time, which does). Rounds alternate
# which build goes first.
#   BASE=<larder binary> HEAD=<larder binary> ROUNDS=3 REQUESTS=60000 \
#     benchmarks/cpu-per-request/put-syncs.sh > out.md
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
source "$here/../lib.sh"
base=${BASE:?set BASE to the baseline larder binary}
head=${HEAD:?set HEAD to the larder binary under test}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-60000}
bench_workdir put-syncs # $work, and `pids` stopped at exit
head -c 1024 /dev/urandom > "$work/1k"
events=task-clock,context-switches
for call in fdatasync fsync rename renameat2 openat pwritev; do
  events+=",syscalls:sys_enter_$call"
done

# one BUILD_NAME BINARY ROUND: one measured load on a fresh cluster; leaves per-process stats.
one() {
  local name=$1 larder=$2 round=$3 dir="$work/$1.$3"
  mkdir -p "$dir"
  local port; port=$(free_port)
  LARDER_LOG=warn "$larder" dev --data-dir "$dir/data" --listen "127.0.0.1:$port" \
    --partitions 32 >"$dir/dev.log" 2>&1 &
  local dev=$!
  pids+=("$dev")
  wait_port "$port"
  local nodes; mapfile -t nodes < <(ps -o pid= --ppid "$dev" | awk '{print $1}' | sort -n)
  pids+=("${nodes[@]}")
  local url="http://127.0.0.1:$port/v1/blobs"
  for _ in $(seq 50); do curl -sf --data-binary @"$work/1k" "$url" >/dev/null && break; sleep 0.2; done
  h2load -n 4000 -c 1 -m 256 -d "$work/1k" "$url" >/dev/null 2>&1 # warm-up
  local stats=()
  for who in frontend:"$dev" s1:"${nodes[0]}" s2:"${nodes[1]}" s3:"${nodes[2]}"; do
    perf stat -x, -e "$events" -p "${who#*:}" -o "$dir/${who%%:*}.stat" &
    stats+=($!)
  done
  sleep 0.5
  h2load -n "$requests" -c 1 -m 256 -d "$work/1k" "$url" > "$dir/h2load.out" 2>&1
  for p in "${stats[@]}"; do kill -INT "$p"; done
  wait "${stats[@]}" 2>/dev/null || true
  h2load_2xx < "$dir/h2load.out" > "$dir/ok"
  h2load_rps < "$dir/h2load.out" > "$dir/rps"
  kill "$dev" "${nodes[@]}" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
  sleep 1
}

for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then order="base head"; else order="head base"; fi
  for name in $order; do
    if [ "$name" = base ]; then one base "$base" "$round"; else one head "$head" "$round"; fi
  done
done

python3 - "$work" "$rounds" "$requests" <<'PY'
import statistics, sys
work, rounds, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(path):
    out = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
            out[parts[2].replace("syscalls:sys_enter_", "")] = float(parts[0])
    return out
rows = {}
for name in ["base", "head"]:
    per = []
    for r in range(1, rounds + 1):
        d = f"{work}/{name}.{r}"
        ok = int(open(f"{d}/ok").read().strip() or 0)
        rps = float(open(f"{d}/rps").read().strip() or 0)
        fe, nodes = read(f"{d}/frontend.stat"), [read(f"{d}/s{i}.stat") for i in (1, 2, 3)]
        node = lambda key: sum(n.get(key, 0) for n in nodes) / 3 / ok
        per.append({
            "rps": rps,
            "fe_us": fe["task-clock"] * 1e3 / ok,   # task-clock is in ms
            "node_us": node("task-clock") * 1e3,
            "fdatasync": node("fdatasync"),
            "fsync": node("fsync"),
            "rename": node("rename") + node("renameat2"),
            "openat": node("openat"),
            "cs": node("context-switches"),
            "ok": ok,
        })
    rows[name] = per
keys = ["rps", "fe_us", "node_us", "fdatasync", "fsync", "rename", "openat", "cs"]
print(f"{rounds} rounds, {requests} PUTs each; medians; per PUT, storage figures are per node (mean of 3)\n")
print("| build | PUT/s | frontend CPU µs/PUT | storage CPU µs/PUT/node | fdatasync/PUT/node | fsync/PUT/node | renames/PUT/node | openat/PUT/node | context switches/PUT/node | 2xx |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
med = {n: {k: statistics.median(p[k] for p in rows[n]) for k in keys} for n in rows}
for n in ["base", "head"]:
    m = med[n]
    oks = "/".join(str(p["ok"]) for p in rows[n])
    print(f"| {n} | {m['rps']:,.0f} | {m['fe_us']:.1f} | {m['node_us']:.1f} | {m['fdatasync']:.3f} | {m['fsync']:.3f} | {m['rename']:.3f} | {m['openat']:.3f} | {m['cs']:.2f} | {oks} |")
ratio = lambda k: med["head"][k] / med["base"][k] if med["base"][k] else float("nan")
print(f"| head / base | {ratio('rps'):.2f}× | {ratio('fe_us'):.2f}× | {ratio('node_us'):.2f}× | {ratio('fdatasync'):.2f}× | {ratio('fsync'):.2f}× | - | {ratio('openat'):.2f}× | {ratio('cs'):.2f}× | |")
print("\nEach round (PUT/s, frontend µs, storage µs per node):\n")
for n in ["base", "head"]:
    print(f"- {n}: " + "; ".join(f"{p['rps']:,.0f}/s, {p['fe_us']:.1f}, {p['node_us']:.1f}" for p in rows[n]))
PY
