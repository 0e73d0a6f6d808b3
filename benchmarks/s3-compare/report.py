#!/usr/bin/env python3
"""Renders benchmarks/s3-compare's RESULTS.md (printed) and its bar chart from run.sh's files.

Usage: report.py RESULTS_TSV MACHINE_TXT READING_MD [PNG]

Tables: ops/s, p50/p99 latency and CPU milliseconds per operation for each server and workload
(the server's; warp's own and the machine's busy share where results.tsv has them);
then, at equal copies (Larder with 1 replica against the better of MinIO and Garage for each
workload), Larder's ops/s ratio and CPU-per-operation ratio with the issue's target beside them
(ops/s >= 1.5x the better peer, CPU per operation <= the peers').
"""

import csv
import sys

SERVERS = [
    ("larder1", "Larder, 1 replica"),
    ("minio", "MinIO, 1 drive"),
    ("garage", "Garage, rf=1"),
    ("larder3", "Larder, 3 replicas"),
]
WORKLOADS = ["put-1KiB", "get-1KiB", "put-64KiB", "get-64KiB", "put-4MiB", "get-4MiB", "list"]
PEERS = ["minio", "garage"]


def load(path):
    with open(path) as f:
        return {(r["server"], r["workload"]): r for r in csv.DictReader(f, delimiter="\t")}


def num(rows, server, workload, column):
    row = rows.get((server, workload))
    try:
        value = row.get(column) if row else None
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def fmt(x, digits=0):
    return "–" if x is None else f"{x:,.{digits}f}"


def table(rows, title, cell):
    print(f"**{title}**")
    print()
    print("| server | " + " | ".join(WORKLOADS) + " |")
    print("| --- |" + " ---: |" * len(WORKLOADS))
    for server, label in SERVERS:
        if any((server, w) in rows for w in WORKLOADS):
            print(f"| {label} | " + " | ".join(cell(server, w) for w in WORKLOADS) + " |")
    print()


def ratios(rows):
    print("**Larder (1 replica) against the better peer at equal copies**")
    print()
    print("| workload | Larder ops/s | better peer | its ops/s | ratio (target ≥ 1.5) "
          "| Larder CPU ms/op | lowest peer CPU ms/op | ratio (target ≤ 1.0) | met |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for w in WORKLOADS:
        ours = num(rows, "larder1", w, "ops_per_s")
        peers = [(num(rows, p, w, "ops_per_s"), p) for p in PEERS]
        peers = [(v, p) for v, p in peers if v is not None]
        if ours is None or not peers:
            continue
        best, best_name = max(peers)
        cpu_ours = num(rows, "larder1", w, "cpu_ms_per_op")
        cpu_peers = [c for c in (num(rows, p, w, "cpu_ms_per_op") for p in PEERS) if c]
        cpu_best = min(cpu_peers) if cpu_peers else None
        ratio = ours / best if best else None
        cpu_ratio = cpu_ours / cpu_best if cpu_ours is not None and cpu_best else None
        met = ratio is not None and ratio >= 1.5 and cpu_ratio is not None and cpu_ratio <= 1.0
        name = dict(SERVERS)[best_name]
        print(f"| {w} | {fmt(ours, 1)} | {name} | {fmt(best, 1)} | {fmt(ratio, 2)} "
              f"| {fmt(cpu_ours, 3)} | {fmt(cpu_best, 3)} | {fmt(cpu_ratio, 2)} | "
              f"{'yes' if met else 'no'} |")
    print()


def plot(rows, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [(s, l) for s, l in SERVERS if any((s, w) in rows for w in WORKLOADS)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(present)
    for ax, column, ylabel in (
        (axes[0], "ops_per_s", "operations per second (log)"),
        (axes[1], "cpu_ms_per_op", "server CPU ms per operation (log)"),
    ):
        for i, (server, label) in enumerate(present):
            values = [num(rows, server, w, column) or 0 for w in WORKLOADS]
            xs = [x + (i - (len(present) - 1) / 2) * width for x in range(len(WORKLOADS))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks(range(len(WORKLOADS)))
        ax.set_xticklabels(WORKLOADS, rotation=30)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("warp against Larder, MinIO and Garage on one machine (fsync on)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


HEADER = """# S3 side by side: Larder, MinIO and Garage under the same warp runs

Issue 18 ("How it must be shown"). One server at a time on 127.0.0.1, data in a fresh directory
under /tmp on the same disk (ext4 on /dev/vda), fsync on for every server:

- **Larder, 1 replica**: `larder dev --nodes 1 --replicas 1` (one storage node, 32 partitions,
  the frontend in the dev process; fsync on, the default), S3 port from `--s3-listen`, a key from
  `larder s3 key create --grant '*:owner'`.
- **MinIO, 1 drive**: `minio server <dir>` (single drive, xl-single). MinIO's defaults write
  object data with O_DIRECT and fdatasync, `xl.meta` with O_DSYNC; nothing changed.
- **Garage, rf=1**: `garage server`, one node, layout zone dc1 capacity 10G, lmdb metadata,
  `replication_factor = 1`, `data_fsync = true`, `metadata_fsync = true` (the config is
  `garage.toml` next to this file).
- **Larder, 3 replicas**: `larder dev --nodes 3 --replicas 3` (three storage nodes on the same
  disk; each write is fsynced on all three): its own row, not compared at equal copies.

The workloads, each one warp command with the same flags for every server (`--duration` and
`--concurrent` as in the command below, `--region us-east-1`, a fresh bucket per workload), warp on the same
2-core machine as the server:

| workload | warp command |
| --- | --- |
| put-1KiB, put-64KiB, put-4MiB | `warp put --obj.size 1KiB` (64KiB, 4MiB) |
| get-1KiB, get-64KiB | `warp get --obj.size 1KiB --objects 1000` (64KiB) |
| get-4MiB | `warp get --obj.size 4MiB --objects 100` |
| list | `warp list --obj.size 1KiB --objects 3200 --max-keys 100` (16 prefixes of 200 names, one per client; one op = a full listing of a prefix, two ListObjectsV2 pages of 100) |

ops/s and p50/p99 are warp's (ops/s over the whole seconds it keeps; latency of whole requests).
CPU per operation: user + system seconds of every server process (`/proc/<pid>/stat`, sampled
every 0.2 s by `measure.py`), from the first operation's start to the last one's end, divided by
the operations in that span; warp's preparation uploads and its cleanup fall outside it.
warp's own CPU per operation is taken the same way, and the machine's busy share from
`/proc/stat` (all cores, time neither idle nor waiting on I/O; a VM's steal counts as busy)
over the same span: a row near 100 % is bound by server and client CPU together.
"""


def main():
    rows = load(sys.argv[1])
    with open(sys.argv[2]) as f:
        machine = f.read().strip()
    with open(sys.argv[3]) as f:
        reading = f.read().strip()
    print(HEADER)
    print("## Machine, command, versions")
    print()
    print("```")
    print(machine)
    print("```")
    print()
    print("## Results")
    print()
    table(rows, "Operations per second", lambda s, w: fmt(num(rows, s, w, "ops_per_s"), 1))
    table(rows, "Latency p50 / p99 (ms)", lambda s, w: (
        f"{fmt(num(rows, s, w, 'p50_ms'), 1)} / {fmt(num(rows, s, w, 'p99_ms'), 1)}"
        if (s, w) in rows else "–"))
    table(rows, "Server CPU per operation (ms; user + system of every server process)",
          lambda s, w: fmt(num(rows, s, w, "cpu_ms_per_op"), 3))
    if any(r.get("client_cpu_ms_per_op") for r in rows.values()):  # since 2026-11-29 03:40
        table(rows, "warp's own CPU per operation (ms; the client shares the 2 cores)",
              lambda s, w: fmt(num(rows, s, w, "client_cpu_ms_per_op"), 3))
        table(rows, "Machine busy in the measured window (% of all cores; near 100: CPU-bound)",
              lambda s, w: fmt(num(rows, s, w, "machine_busy_pct")))
    table(rows, "Errors counted by warp", lambda s, w: fmt(num(rows, s, w, "errors")))
    ratios(rows)
    print("![ops/s and CPU per operation by workload](plot.png)")
    print()
    print(reading)
    if len(sys.argv) > 4:
        plot(rows, sys.argv[4])


if __name__ == "__main__":
    main()
