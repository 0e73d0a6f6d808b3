#!/usr/bin/env python3
"""Lines up one round's slow requests with what the nodes logged, on one time axis.

usage: timeline.py KEEP_DIR ROUND [THRESHOLD_MS]

KEEP_DIR is what `KEEP=<dir> NODE_LOG=warn,larder_store::compact=debug run.sh` left: the
round's h2load request logs (busyR.put.log, busyR.get.log), its window (windowR.log: when the
passes began and when the first ended, in seconds since the epoch) and the nodes' logs
(s1.log...). Prints the p50/p99/max of the requests that started in the window, each request
slower than THRESHOLD_MS (default 10), and every node log line of the window, all in seconds
since the passes began.
"""
import datetime
import glob
import math
import re
import sys

keep, rnd = sys.argv[1], sys.argv[2]
threshold = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
began, ended = map(float, open(f"{keep}/window{rnd}.log").read().split())
span = ended - began
for kind in ["put", "get"]:
    rows = [line.split("\t") for line in open(f"{keep}/busy{rnd}.{kind}.log") if line.strip()]
    # h2load's log: start time (µs since the epoch), status, duration (µs).
    rows = [(int(c[0]) / 1e6 - began, int(c[2]) / 1e3) for c in rows]
    inside = sorted(ms for at, ms in rows if 0 <= at <= span)
    if not inside:
        continue
    p99 = inside[max(0, math.ceil(0.99 * len(inside)) - 1)]
    print(f"{kind}: n={len(inside)} p50={inside[len(inside) // 2]:.2f} p99={p99:.2f} "
          f"max={inside[-1]:.2f} ms, window {span:.2f} s")
    for at, ms in rows:
        if ms > threshold and 0 <= at <= span:
            print(f"  slow {kind} at {at:7.3f} s: {ms:7.2f} ms")
colour = re.compile("\x1b\\[[0-9;]*m")
for path in sorted(glob.glob(f"{keep}/s?.log")):
    node = path.rsplit("/", 1)[1][:-4]
    for line in open(path):
        line = colour.sub("", line.strip())
        stamp = re.match(r"(\S+Z)\s", line)
        if not stamp:
            continue
        at = datetime.datetime.fromisoformat(stamp.group(1).replace("Z", "+00:00")).timestamp()
        if -1 <= at - began <= span + 1:
            print(f"{node} {at - began:7.3f} s {line[len(stamp.group(0)):]}")
