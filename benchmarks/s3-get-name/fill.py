#!/usr/bin/env python3
"""Fills a bucket with names and prints a presigned (SigV4) GET URL of the middle one, or with
`put`, presigned PUT URLs of 128 of the names spread over the bucket, one per line, or with
`list`, a presigned ListObjectsV2 URL of the bucket's first MAX_KEYS names (environment;
default 1,000).

usage: fill.py ENDPOINT KEY_ID SECRET BUCKET NAMES SIZE [put|list]
NAMES objects of SIZE bytes named name-00000, name-00001, ... are put from 16 threads.
"""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config

endpoint, key_id, secret, bucket, names, size = sys.argv[1:7]
names, size = int(names), int(size)
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                  aws_secret_access_key=secret, region_name="us-east-1",
                  config=Config(signature_version="s3v4", max_pool_connections=32))
s3.create_bucket(Bucket=bucket)
body = b"x" * size
with ThreadPoolExecutor(16) as pool:
    list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"name-{i:05d}", Body=body),
                  range(names)))
if sys.argv[7:] == ["put"]:
    step = max(1, names // 128)
    for i in range(0, min(names, 128 * step), step):
        print(s3.generate_presigned_url("put_object", ExpiresIn=3600,
                                        Params={"Bucket": bucket, "Key": f"name-{i:05d}"}))
elif sys.argv[7:] == ["list"]:
    print(s3.generate_presigned_url("list_objects_v2", ExpiresIn=3600,
                                    Params={"Bucket": bucket,
                                            "MaxKeys": int(os.environ.get("MAX_KEYS", 1000))}))
else:
    print(s3.generate_presigned_url("get_object", ExpiresIn=3600,
                                    Params={"Bucket": bucket, "Key": f"name-{names // 2:05d}"}))
