"""Holds N GETs of one blob open without reading their bodies, and reports the memory of a
`larder dev` (its process, the frontend, and its children, the storage nodes) while they are
held and after they are gone, and how long a normal GET of the same blob takes meanwhile.

Usage: stalled.py DEV_PID PORT BLOB_ID READERS HOLD_SECONDS
Prints one JSON object.
"""

import json
import socket
import subprocess
import sys
import time

dev_pid, port, blob, readers, hold = sys.argv[1:6]
readers, hold = int(readers), float(hold)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def memory():
    children = subprocess.run(["pgrep", "-P", dev_pid], capture_output=True, text=True)
    nodes = [p for p in children.stdout.split()]
    return {"frontend": rss_mib(dev_pid), "storage": sum(rss_mib(p) for p in nodes)}


def timed_get():
    started = time.monotonic()
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30",
         f"http://127.0.0.1:{port}/v1/blobs/{blob}"], capture_output=True, text=True)
    return out.stdout, time.monotonic() - started


idle = memory()
held = []
for _ in range(readers):
    s = socket.create_connection(("127.0.0.1", int(port)))
    # A small receive buffer: the client takes a few KiB and then nothing.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"GET /v1/blobs/{blob} HTTP/1.1\r\nHost: larder\r\n\r\n".encode())
    held.append(s)
time.sleep(hold)
stalled = memory()
status, seconds = timed_get()
for s in held:
    s.close()
time.sleep(3)
after = memory()
print(json.dumps({"readers": readers, "idle": idle, "stalled": stalled, "after": after,
                  "get_status": status, "get_seconds": seconds}))
