#!/usr/bin/env python3
"""Listing a bucket most of whose names were deleted (boto3).

usage: deleted_range.py ENDPOINT KEY_ID SECRET NAMES THREADS [KEEP_EVERY]
Makes a bucket, puts NAMES names of 1 KiB from THREADS threads, deletes every name but the
first and last ten with DeleteObjects (1,000 keys each) (with KEEP_EVERY > 0: every name but
one in KEEP_EVERY, spread over the whole bucket), then lists the whole bucket with
ListObjectsV2 (following continuation tokens) three times: at once, 2 s later and 10 s
later. Prints one line of JSON: per listing its pages, keys and milliseconds.
"""
import json
import sys
import threading
import time

import boto3
from botocore.config import Config


def client(endpoint, key_id, secret, threads):
    config = Config(max_pool_connections=threads * 2, retries={"max_attempts": 1})
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                        aws_secret_access_key=secret, region_name="us-east-1", config=config)


def put_all(s3, names, threads):
    body = b"x" * 1024
    errors = []

    def worker(w):
        for name in names[w::threads]:
            try:
                s3.put_object(Bucket="range", Key=name, Body=body)
            except Exception as e:  # counted: a name that failed is simply not there
                errors.append(type(e).__name__)

    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(errors)


def list_all(s3):
    started = time.monotonic()
    pages, keys, token = 0, 0, None
    while True:
        args = {"Bucket": "range", "MaxKeys": 1000}
        if token:
            args["ContinuationToken"] = token
        page = s3.list_objects_v2(**args)
        pages += 1
        keys += len(page.get("Contents", []))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated"):
            break
    return {"pages": pages, "keys": keys, "ms": round((time.monotonic() - started) * 1000, 1)}


def main():
    endpoint, key_id, secret, count, threads = sys.argv[1:6]
    count, threads = int(count), int(threads)
    keep_every = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    s3 = client(endpoint, key_id, secret, threads)
    s3.create_bucket(Bucket="range")
    names = [f"n/{i:07d}" for i in range(count)]
    started = time.monotonic()
    put_errors = put_all(s3, names, threads)
    put_s = time.monotonic() - started
    if keep_every > 0:
        doomed = [name for i, name in enumerate(names) if i % keep_every != 0]
    else:
        doomed = names[10:-10]
    started = time.monotonic()
    for at in range(0, len(doomed), 1000):
        batch = [{"Key": k} for k in doomed[at:at + 1000]]
        s3.delete_objects(Bucket="range", Delete={"Objects": batch, "Quiet": True})
    delete_s = time.monotonic() - started
    at_once = list_all(s3)
    time.sleep(2)
    later = list_all(s3)
    time.sleep(8)
    settled = list_all(s3)
    print(json.dumps({"put_per_s": round(count / put_s, 1), "put_errors": put_errors,
                      "delete_s": round(delete_s, 1), "at_once": at_once, "after_2s": later,
                      "after_10s": settled}))


if __name__ == "__main__":
    main()
