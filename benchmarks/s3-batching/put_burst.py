#!/usr/bin/env python3
"""Concurrent PutObject of small objects into one bucket (boto3), for a fixed time.

usage: put_burst.py ENDPOINT KEY_ID SECRET BUCKET THREADS SECONDS SIZE
Prints one line of JSON: ops, ops/s, p50 and p99 latency (ms), errors.
"""
import json
import sys
import threading
import time

import boto3
from botocore.config import Config


def main():
    endpoint, key_id, secret, bucket = sys.argv[1:5]
    threads, seconds, size = int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
    config = Config(max_pool_connections=threads * 2, retries={"max_attempts": 1})
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                      aws_secret_access_key=secret, region_name="us-east-1", config=config)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    body = b"x" * size
    latencies, errors = [], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(w):
        n = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                s3.put_object(Bucket=bucket, Key=f"w{w}/o{n}", Body=body)
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
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)
    print(json.dumps({"ops": len(latencies), "ops_per_s": round(len(latencies) / elapsed, 1),
                      "p50_ms": pick(0.5) if latencies else None,
                      "p99_ms": pick(0.99) if latencies else None, "errors": len(errors)}))


if __name__ == "__main__":
    main()
