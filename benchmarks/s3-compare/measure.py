#!/usr/bin/env python3
"""One warp run against one server, with the server's CPU time sampled while it runs.

Usage: measure.py RESULTS_TSV SERVER WORKLOAD PIDS_FILE BENCHDATA -- warp ARGS...

PIDS_FILE lists the server's processes (one pid per line; Larder's `larder dev` and its storage
nodes). Their user + system CPU ticks are summed every 0.2 s while warp runs; warp's own analysis
(`warp analyze --json` of the run's --benchdata file) gives the measured window (first start to
last end of the counted operations), and the CPU used in that window (interpolated between
samples) is divided by the operations in it. Warp's preparation (uploads before a GET or list) and
cleanup fall outside the window and are not counted. warp's own CPU (the client shares the
machine) and how busy the whole machine was (from /proc/stat) are taken over the same window:
a run whose machine was busy throughout is bound by the CPU of server and client together, and
its rate says as much about the client's cost per operation as the server's. One row is appended
to RESULTS_TSV.
"""

import bisect
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")
COLUMNS = [
    "server", "workload", "ops", "seconds", "ops_per_s", "mib_per_s", "p50_ms", "p99_ms",
    "errors", "cpu_s", "cpu_ms_per_op", "client_cpu_ms_per_op", "machine_busy_pct",
]


def read_pids(path):
    with open(path) as f:
        return [int(line) for line in f if line.strip()]


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # The command name (field 2) may hold spaces; fields after its ')' are fixed.
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def machine_busy_seconds():
    """CPU seconds every core of the machine spent busy (neither idle nor waiting on I/O; a VM's
    steal, time the host took, counts as busy: it was not there for server or client)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / TICK


def never_falling(read):
    """A counter reader that keeps its highest reading: a process reaped (warp, at its end)
    reads as 0 from then on, which would look like CPU time given back."""
    highest = 0.0

    def reading():
        nonlocal highest
        highest = max(highest, read())
        return highest

    return reading


def sample(sources, samples, stop):
    """Appends (time, [reading of each source]) every 0.2 s until stopped, and once more."""
    while not stop.is_set():
        samples.append((time.time(), [read() for read in sources]))
        stop.wait(0.2)
    samples.append((time.time(), [read() for read in sources]))


def at(samples, source, t):
    """Source's reading at wall time t, interpolated between the samples around it."""
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return samples[0][1][source]
    if i == len(samples):
        return samples[-1][1][source]
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    c0, c1 = c0[source], c1[source]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


def parse_time(text):
    """Go's RFC 3339 time, whose fraction may have nine digits (Python takes six)."""
    whole, frac, zone = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)", text).groups()
    zone = "+00:00" if zone == "Z" else zone
    return datetime.datetime.fromisoformat(f"{whole}.{(frac or '0')[:6]:0<6}{zone}").timestamp()


def millis(text):
    """A Go duration as warp prints it (`850µs`, `5.0ms`, `1.2s`) in milliseconds."""
    for unit, scale in (("µs", 1e-3), ("us", 1e-3), ("ns", 1e-6), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(text)


def percentiles(report):
    """p50 and p99 (ms) from warp's `* Reqs: Avg: .., 50%: .., 90%: .., 99%: ..` line."""
    m = re.search(r"\* Reqs: .*?50%: ([0-9.]+[µumn]?s), .*?99%: ([0-9.]+[µumn]?s)", report)
    return (f"{millis(m[1]):.2f}", f"{millis(m[2]):.2f}") if m else ("", "")


def main():
    results, server, workload, pids_file, benchdata = sys.argv[1:6]
    assert sys.argv[6] == "--"
    warp = sys.argv[7:]
    pids = read_pids(pids_file)
    client = subprocess.Popen(warp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sources = [never_falling(lambda: cpu_seconds(pids)),
               never_falling(lambda: cpu_seconds([client.pid])), machine_busy_seconds]
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=sample, args=(sources, samples, stop))
    sampler.start()
    try:
        stdout = client.communicate()[0]
        stop.set()
        sampler.join()
    finally:
        stop.set()
        client.kill()
        client.wait()
    with open(f"{benchdata}.log", "w") as f:
        f.write(stdout)
    if client.returncode != 0:
        sys.exit(f"{server} {workload}: warp exited {client.returncode}:\n{stdout[-3000:]}")
    analysis = subprocess.run(
        [warp[0], "analyze", "--json", f"{benchdata}.json.zst"],
        stdout=subprocess.PIPE, text=True, check=True,
    ).stdout
    with open(f"{benchdata}.json", "w") as f:
        f.write(analysis)
    by_op = json.loads(analysis)["by_op_type"]
    # The workload's own operation (a GET run against MinIO may also record preparation PUTs).
    wanted = workload.split("-")[0].upper()
    if wanted not in by_op:
        sys.exit(f"{server} {workload}: no {wanted} operations in {list(by_op)}")
    op = by_op[wanted]
    # ops/s as warp reports it: over whole seconds, the partial first and last left out.
    tp = op["throughput"]
    seconds = tp["measure_duration_millis"] / 1000
    n = tp["ops"]
    # CPU per operation: every operation warp timed, over the span from the first one's start
    # to the last one's end.
    start, end = parse_time(op["start_time"]), parse_time(op["end_time"])
    all_ops = op["total_requests"]
    server_cpu, client_cpu, busy = (
        at(samples, i, end) - at(samples, i, start) for i in range(3))
    section = stdout.partition(f"Report: {wanted}.")[2]
    p50, p99 = percentiles(section)
    row = {
        "server": server,
        "workload": workload,
        "ops": n,
        "seconds": f"{seconds:.2f}",
        "ops_per_s": f"{n / seconds:.1f}" if seconds else "0",
        "mib_per_s": f"{tp['bytes'] / seconds / 2**20:.2f}" if seconds else "0",
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": op["total_errors"],
        "cpu_s": f"{server_cpu:.2f}",
        "cpu_ms_per_op": f"{server_cpu * 1000 / all_ops:.3f}" if all_ops else "",
        "client_cpu_ms_per_op": f"{client_cpu * 1000 / all_ops:.3f}" if all_ops else "",
        "machine_busy_pct": f"{100 * busy / (end - start) / os.cpu_count():.0f}"
        if end > start else "",
    }
    new = not os.path.exists(results) or os.path.getsize(results) == 0
    with open(results, "a") as f:
        if new:
            f.write("\t".join(COLUMNS) + "\n")
        f.write("\t".join(str(row[c]) for c in COLUMNS) + "\n")
    print("  " + "  ".join(f"{c}={row[c]}" for c in COLUMNS[2:]))


if __name__ == "__main__":
    main()
