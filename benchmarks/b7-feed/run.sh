#!/usr/bin/env bash
# B7 (issue 7): feed throughput by document size (10 B, 1 KiB, 10 KiB) for `larder feed` and the
# Java vespa-feed-client (interop/vespa-feed-client) against the same `larder dev` cluster in one
# run, with client CPU seconds per 1,000 operations (getrusage of the client process).
# Usage: run.sh [--smoke]   (DOCS=N sets the 10 B and 1 KiB feed sizes; 10 KiB feeds DOCS/4)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source benchmarks/lib.sh

docs=${DOCS:-40000}
out="$here/RESULTS.md"; plot="$here/b7-feed.png"
if [ "${1:-}" = "--smoke" ]; then docs=300; out=$(mktemp); plot=$(mktemp --suffix .png); fi

bench_build
larder="$LARDER"
interop=interop/vespa-feed-client
java_ok=1
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  java_ok=0; echo "java or mvn missing: the Java client is skipped" >&2
elif [ ! -d "$interop/target/lib" ]; then
  mvn -B -q -f "$interop/pom.xml" package -DskipTests
fi
bench_workdir b7

port=$(free_port)
dev_up "$port" --partitions 32
endpoint="http://127.0.0.1:$port/"

# Feed files: JSON lines of puts, one field of the given size; each client gets its own IDs.
generate() { # file prefix count size
  python3 - "$@" <<'PY'
import json, sys
path, prefix, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
text = ("abcdefghij" * (size // 10 + 1))[:size]
with open(path, "w") as f:
    for i in range(count):
        f.write(json.dumps({"put": f"id:bench:doc::{prefix}-{i}", "fields": {"text": text}}) + "\n")
PY
}

# Runs a client, prints {"wall","cpu","rc","out"}: CPU is user+system of the client process tree.
measure() {
  python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
start = time.time()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
wall = time.time() - start
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": r.ru_utime + r.ru_stime, "rc": p.returncode, "out": p.stdout.decode()}))
PY
}

results="$work/results.jsonl"
: > "$results"
for spec in "10 B:10:$docs" "1 KiB:1024:$docs" "10 KiB:10240:$((docs / 4))"; do
  IFS=: read -r label size count <<< "$spec"
  if [ "$java_ok" = 1 ]; then
    generate "$work/java.jsonl" "java-$size" "$count" "$size"
    m=$(measure java -cp "$interop/target/classes:$interop/target/lib/*" larder.interop.Feed "$endpoint" "$work/java.jsonl")
    echo "{\"size\":\"$label\",\"client\":\"vespa-feed-client 8.700.24 (Java, 8 x 128)\",\"count\":$count,\"m\":$m}" >> "$results"
  fi
  generate "$work/larder.jsonl" "larder-$size" "$count" "$size"
  m=$(measure "$larder" feed --endpoint "$endpoint" --file "$work/larder.jsonl" --json)
  echo "{\"size\":\"$label\",\"client\":\"larder feed (4 x 256)\",\"count\":$count,\"m\":$m}" >> "$results"
done

table=$(python3 - "$results" "$plot" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
print("| document size | client | operations | ok | ops/s | client CPU s | CPU s per 1,000 ops |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    m = r["m"]
    try:
        out = json.loads(m["out"])
    except ValueError:
        try:
            out = json.loads(m["out"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = {}
    ops = out.get("ops_per_sec", out.get("ops_per_second", 0.0))
    ok = out.get("ok", out.get("succeeded", 0))
    per_k = m["cpu"] / r["count"] * 1000
    by.setdefault(r["size"], {})["java" if "Java" in r["client"] else "larder"] = (ops, per_k)
    print(f"| {r['size']} | {r['client']} | {r['count']} | {ok} | {ops:,.0f} | {m['cpu']:.2f} | {per_k:.3f} |")
print()
print("| document size | larder feed / Java ops/s | larder feed CPU per op / Java's |")
print("| --- | ---: | ---: |")
for size, c in by.items():
    if "java" in c and "larder" in c and c["java"][0] and c["java"][1]:
        print(f"| {size} | {c['larder'][0] / c['java'][0]:.2f}x | {c['larder'][1] / c['java'][1]:.2f} |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = list(by)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (key, name) in enumerate([("larder", "larder feed"), ("java", "vespa-feed-client")]):
        xs = [j + i * 0.4 for j in range(len(sizes))]
        a.bar(xs, [by[s].get(key, (0, 0))[0] for s in sizes], 0.4, label=name)
        b.bar(xs, [by[s].get(key, (0, 0))[1] for s in sizes], 0.4, label=name)
    for ax, title in [(a, "throughput (ops/s)"), (b, "client CPU s per 1,000 ops")]:
        ax.set_xticks([j + 0.2 for j in range(len(sizes))], sizes)
        ax.set_title(title); ax.legend()
    fig.suptitle("B7: feeding one larder dev cluster (durable writes, 2 shared cores)")
    fig.tight_layout(); fig.savefig(sys.argv[2], dpi=90)
except ImportError:
    print("\n(matplotlib is not installed: no plot)", file=sys.stderr)
PY
)

{
  echo "# B7: feed throughput, \`larder feed\` vs the Java vespa-feed-client"
  echo
  echo "Both clients feed JSON-lines files of puts (one text field of the given size, fresh IDs per"
  echo "client) into the same \`larder dev\` cluster (3 storage nodes as processes + 1 frontend, 32"
  echo "partitions x 3 replicas, quorum 2, durable fdatasync with group commit) in one run, Java first"
  echo "at each size. Each client runs with its defaults: vespa-feed-client 8 connections x 128"
  echo "streams (driven through \`interop/vespa-feed-client\`, its JsonFeeder, as its CLI does; it gzips"
  echo "bodies over 512 bytes); \`larder feed\` 4 connections x 256 streams with its dynamic throttle."
  echo "ops/s is what each client reports for its feed (JVM start-up excluded); CPU is user+system"
  echo "seconds of the whole client process (getrusage), start-up included. Client, server and"
  echo "storage nodes share the machine's cores, so client CPU also takes from the server."
  echo
  echo "Targets (issue 7): at 1 KiB, \`larder feed\` >= 2x the Java client's ops/s with <= 1/3 of its"
  echo "CPU per operation."
  echo
  echo "## Machine"
  machine_description "$work"
  echo "- java: $(java -version 2>&1 | head -1)"
  echo
  echo "## Command"
  echo '```'
  echo "DOCS=$docs benchmarks/b7-feed/run.sh"
  echo '```'
  echo
  echo "## Results"
  echo
  echo "$table"
  echo
  [ -s "$plot" ] && echo "![B7 plot](b7-feed.png)"
} > "$out"
cat "$out"
