"""Counts the JSON lines on stdin and when they flowed: prints `lines first_s last_s cpu_s`,
the wall-clock times (time.time()) of the first and the last chunk read, and this reader's own
CPU time (which the caller subtracts from the clients'). B8's client-bound case
uses it so that process start-up, which a CPU quota of a hundredth of a core stretches to about
a second per process, is shown apart from the visiting rate."""
import resource
import sys
import time

count, first, last = 0, None, None
stdin = sys.stdin.buffer
while True:
    chunk = stdin.read1(1 << 20)
    if not chunk:
        break
    now = time.time()
    first = now if first is None else first
    last = now
    count += chunk.count(b"\n")
usage = resource.getrusage(resource.RUSAGE_SELF)
print(count, f"{first or 0:.4f}", f"{last or 0:.4f}", f"{usage.ru_utime + usage.ru_stime:.4f}")
