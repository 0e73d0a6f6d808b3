"""`[s3] signature_v2 = false`: every SigV2 request (header or presigned URL) is refused with
400 InvalidRequest before anything is looked up or stored; SigV4 goes on as before.

Usage: signature_v2_off.py ENDPOINT KEY_ID SECRET
"""

import sys
import urllib.error
import urllib.request

import boto3
from botocore.config import Config

from s3test import client_from_argv, error_of, step

endpoint, key_id, secret = sys.argv[1:4]
s3 = client_from_argv()
v2 = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(signature_version="s3", s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}))

step("SigV4 works")
s3.create_bucket(Bucket="v4only")
s3.put_object(Bucket="v4only", Key="kept", Body=b"v4")

step("SigV2 headers are refused, whatever the operation, and store nothing")
assert error_of(lambda: v2.list_buckets()) == (400, "InvalidRequest")
assert error_of(lambda: v2.create_bucket(Bucket="v2made")) == (400, "InvalidRequest")
assert error_of(lambda: v2.put_object(Bucket="v4only", Key="v2", Body=b"x")) == (400, "InvalidRequest")
assert error_of(lambda: v2.delete_object(Bucket="v4only", Key="kept")) == (400, "InvalidRequest")
assert error_of(lambda: s3.head_bucket(Bucket="v2made"))[0] == 404
assert error_of(lambda: s3.head_object(Bucket="v4only", Key="v2"))[0] == 404
assert s3.get_object(Bucket="v4only", Key="kept")["Body"].read() == b"v4"

step("a SigV2 presigned URL is refused; a SigV4 one is served")
url = v2.generate_presigned_url("get_object", Params={"Bucket": "v4only", "Key": "kept"})
assert "AWSAccessKeyId=" in url, url
try:
    urllib.request.urlopen(url)
    raise AssertionError("a SigV2 presigned URL was served")
except urllib.error.HTTPError as err:
    body = err.read()
    assert err.code == 400 and b"<Code>InvalidRequest</Code>" in body, (err.code, body)
url = s3.generate_presigned_url("get_object", Params={"Bucket": "v4only", "Key": "kept"})
assert urllib.request.urlopen(url).read() == b"v4"
print("ok")
