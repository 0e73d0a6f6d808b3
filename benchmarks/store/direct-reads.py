#!/usr/bin/env python3
"""What a 4 MiB read costs here three ways: from the page cache, from disk through the page
cache (buffered, cold), and from disk with O_DIRECT (cold by construction), each at queue
depth 1 and QD concurrent readers (threads; preadv releases the GIL). CPU is this process's
user + system time (getrusage) over the reads, per GiB read. Prints a Markdown table.

Why: MinIO reads object data with O_DIRECT, and S3 get-4MiB (0.6-0.9x MinIO,
benchmarks/s3-compare/RESULTS.md) was read as four kernel copies against MinIO's one. This
measures whether a direct read would take the storage node's `pread` copy off its CPU here.

usage: direct-reads.py [DIR] (default: a temp dir under target/); env FILE_MIB=2048 ROUNDS=2 QD=16
"""
import concurrent.futures
import mmap
import os
import resource
import sys
import tempfile
import time

PIECE = 4 << 20
FILE_MIB = int(os.environ.get("FILE_MIB", "2048"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
QD = int(os.environ.get("QD", "16"))


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fd, pieces, depth):
    """Reads every piece of `fd` with `depth` threads; returns (seconds, CPU seconds)."""
    buffers = [mmap.mmap(-1, PIECE) for _ in range(depth)]  # page-aligned, as O_DIRECT wants

    def read_share(k):
        for i in range(k, pieces, depth):
            if os.preadv(fd, [buffers[k]], i * PIECE) != PIECE:
                raise OSError(f"short read of piece {i}")

    c, t = cpu(), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(depth) as pool:
        list(pool.map(read_share, range(depth)))
    return time.perf_counter() - t, cpu() - c


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(dir=base, prefix="direct-reads.") as d:
        path = os.path.join(d, "data")
        pieces = FILE_MIB * (1 << 20) // PIECE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        block = os.urandom(PIECE)
        for _ in range(pieces):
            os.write(fd, block)
        os.fsync(fd)
        direct = os.open(path, os.O_RDONLY | os.O_DIRECT)
        gib = pieces * PIECE / (1 << 30)

        def drop():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

        print(f"file: {FILE_MIB} MiB on {os.path.realpath(d)}; pieces of 4 MiB; QD {QD}\n")
        print("| round | read | queue depth | MB/s | CPU s per GiB |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for r in range(1, ROUNDS + 1):
            for depth in (1, QD):
                cases = [
                    ("buffered, cold (disk through the page cache)", fd, drop),
                    ("buffered, hot (page cache)", fd, None),
                    ("O_DIRECT (disk)", direct, drop),
                ]
                for name, handle, before in cases:
                    if before:
                        before()
                    secs, cpus = timed(handle, pieces, depth)
                    rate = pieces * PIECE / secs / 1e6
                    print(f"| {r} | {name} | {depth} | {rate:,.0f} | {cpus / gib:.3f} |")
        os.close(direct)
        os.close(fd)


if __name__ == "__main__":
    main()
