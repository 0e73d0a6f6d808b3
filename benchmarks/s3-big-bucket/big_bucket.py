#!/usr/bin/env python3
"""PUT, GET and list against a bucket that already holds many names (boto3).

usage: big_bucket.py ENDPOINT KEY_ID SECRET BUCKET PRELOAD THREADS SECONDS SIZE
Fills BUCKET with PRELOAD names (64 threads), then for SECONDS each: PutObject of new names
from THREADS threads, GetObject of random preloaded names from THREADS threads; then lists
the first page (1,000 keys) ten times. Prints one line of JSON.
"""
import json
import random
import sys
import threading
import time

import boto3
from botocore.config import Config


def client(endpoint, key_id, secret, threads):
    config = Config(max_pool_connections=threads * 2, retries={"max_attempts": 1})
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                        aws_secret_access_key=secret, region_name="us-east-1", config=config)


def run(threads, work, seconds=None, items=None):
    """Runs work(w, n) from `threads` threads for `seconds`, or over `items` split among them."""
    latencies, errors = [], []
    lock = threading.Lock()
    deadline = time.monotonic() + (seconds or 1e9)

    def worker(w):
        n = 0
        mine = items[w::threads] if items is not None else None
        while time.monotonic() < deadline:
            if mine is not None and n >= len(mine):
                return
            started = time.monotonic()
            try:
                work(w, mine[n] if mine is not None else n)
                with lock:
                    latencies.append(time.monotonic() - started)
            except Exception as e:  # counted, not fatal: the rate is what is measured
                with lock:
                    errors.append(type(e).__name__)
            n += 1

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None
    return {"ops_per_s": round(len(latencies) / elapsed, 1), "p50_ms": pick(0.5),
            "p99_ms": pick(0.99), "errors": len(errors)}


def main():
    endpoint, key_id, secret, bucket = sys.argv[1:5]
    preload, threads = int(sys.argv[5]), int(sys.argv[6])
    seconds, size = float(sys.argv[7]), int(sys.argv[8])
    s3 = client(endpoint, key_id, secret, max(threads, 64))
    s3.create_bucket(Bucket=bucket)
    body = b"x" * size
    names = [f"p/{i:07d}" for i in range(preload)]
    put = lambda w, name: s3.put_object(Bucket=bucket, Key=name, Body=body)
    filled = run(64, put, items=names)
    new = lambda w, n: s3.put_object(Bucket=bucket, Key=f"w{w}/o{n}", Body=body)
    puts = run(threads, new, seconds=seconds)
    get = lambda w, n: s3.get_object(Bucket=bucket, Key=random.choice(names))["Body"].read()
    gets = run(threads, get, seconds=seconds)
    lists = []
    for _ in range(10):
        started = time.monotonic()
        s3.list_objects_v2(Bucket=bucket, MaxKeys=1000)
        lists.append((time.monotonic() - started) * 1000)
    print(json.dumps({"preload_per_s": filled["ops_per_s"], "preload_errors": filled["errors"],
                      "put": puts, "get": gets, "list_ms": round(sorted(lists)[5], 1)}))


if __name__ == "__main__":
    main()
