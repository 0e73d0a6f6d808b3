"""Larder's S3 API through real clients: boto3, curl with presigned URLs, and the aws cli.

Usage: clients.py ENDPOINT OWNER_ID OWNER_SECRET READER_ID READER_SECRET WORKDIR
Every check asserts; the first failure exits non-zero with its message.
"""

import hashlib
import json
import os
import subprocess
import sys
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, owner_id, owner_secret, reader_id, reader_secret, workdir = sys.argv[1:7]


def client(key_id, secret, **config):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}, **config),
    )


def error_of(call):
    """The S3 error code and HTTP status of a call that must fail."""
    try:
        call()
    except ClientError as err:
        return err.response["Error"]["Code"], err.response["ResponseMetadata"]["HTTPStatusCode"]
    raise AssertionError("the call succeeded")


def curl(*args):
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}", *args],
                         capture_output=True, check=True)
    body, _, status = out.stdout.rpartition(b"\n")
    return int(status), body


def step(name):
    print(f"== {name}", flush=True)


s3 = client(owner_id, owner_secret)

step("buckets")
s3.create_bucket(Bucket="photos")
assert error_of(lambda: s3.create_bucket(Bucket="photos")) == ("BucketAlreadyOwnedByYou", 409)
s3.head_bucket(Bucket="photos")
assert error_of(lambda: s3.head_bucket(Bucket="nothere"))[1] == 404
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
assert names == ["photos"], names

step("put and get with metadata")
put = s3.put_object(Bucket="photos", Key="hello.txt", Body=b"hello, larder",
                    ContentType="text/plain", Metadata={"Camera": "x100"})
assert put["ETag"] == '"%s"' % hashlib.md5(b"hello, larder").hexdigest(), put["ETag"]
got = s3.get_object(Bucket="photos", Key="hello.txt")
assert got["Body"].read() == b"hello, larder"
assert got["ContentType"] == "text/plain", got["ContentType"]
assert got["Metadata"] == {"camera": "x100"}, got["Metadata"]
assert got["ETag"] == put["ETag"]
head = s3.head_object(Bucket="photos", Key="hello.txt")
assert head["ContentLength"] == 13
assert error_of(lambda: s3.get_object(Bucket="photos", Key="nothing")) == ("NoSuchKey", 404)
assert error_of(lambda: s3.put_object(Bucket="nothere", Key="k", Body=b"x")) == ("NoSuchBucket", 404)

step("a large object in chunks, and ranges across chunk boundaries")
big = os.urandom(5 * 1024 * 1024 + 123)
put = s3.put_object(Bucket="photos", Key="big.bin", Body=big)
assert put["ETag"] == '"%s"' % hashlib.md5(big).hexdigest()
got = s3.get_object(Bucket="photos", Key="big.bin")["Body"].read()
assert hashlib.sha256(got).digest() == hashlib.sha256(big).digest()
part = s3.get_object(Bucket="photos", Key="big.bin", Range="bytes=1048570-1048589")
assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
assert part["ContentRange"] == "bytes 1048570-1048589/%d" % len(big), part["ContentRange"]
assert part["Body"].read() == big[1048570:1048590]
tail = s3.get_object(Bucket="photos", Key="big.bin", Range="bytes=-7")["Body"].read()
assert tail == big[-7:]
assert error_of(lambda: s3.get_object(Bucket="photos", Key="big.bin",
                                      Range="bytes=%d-" % len(big)))[1] == 416

step("If-None-Match: * only creates")
assert error_of(lambda: s3.put_object(Bucket="photos", Key="hello.txt", Body=b"no",
                                      IfNoneMatch="*")) == ("PreconditionFailed", 412)
s3.put_object(Bucket="photos", Key="fresh.txt", Body=b"yes", IfNoneMatch="*")
assert s3.get_object(Bucket="photos", Key="hello.txt")["Body"].read() == b"hello, larder"

step("listing: prefix, delimiter, pages")
for key in ["a/1", "a/2", "a/b/3", "b/1", "c", "d"]:
    s3.put_object(Bucket="photos", Key=key, Body=key.encode())
listed = s3.list_objects_v2(Bucket="photos", Prefix="a/")
assert [o["Key"] for o in listed["Contents"]] == ["a/1", "a/2", "a/b/3"], listed
listed = s3.list_objects_v2(Bucket="photos", Delimiter="/")
assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["a/", "b/"], listed
assert [o["Key"] for o in listed["Contents"]] == ["big.bin", "c", "d", "fresh.txt", "hello.txt"]
seen, token = [], None
while True:
    args = {"Bucket": "photos", "MaxKeys": 2}
    if token:
        args["ContinuationToken"] = token
    page = s3.list_objects_v2(**args)
    seen += [o["Key"] for o in page.get("Contents", [])]
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
everything = ["a/1", "a/2", "a/b/3", "b/1", "big.bin", "c", "d", "fresh.txt", "hello.txt"]
assert seen == everything, seen
paginated = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
    Bucket="photos", PaginationConfig={"PageSize": 3}) for o in p.get("Contents", [])]
assert paginated == everything, paginated
assert error_of(lambda: s3.list_objects_v2(Bucket="photos", ContinuationToken="%%bad"))[1] == 400

step("names: long and unusual")
assert error_of(lambda: s3.put_object(Bucket="photos", Key="k" * 1025, Body=b"x"))[0] == "KeyTooLongError"
odd = "dir with space/ünïcødé+plus?&=.txt"
s3.put_object(Bucket="photos", Key=odd, Body=b"odd")
assert s3.get_object(Bucket="photos", Key=odd)["Body"].read() == b"odd"
s3.delete_object(Bucket="photos", Key=odd)

step("presigned GET and PUT through curl")
url = s3.generate_presigned_url("get_object", Params={"Bucket": "photos", "Key": "hello.txt"},
                                ExpiresIn=300)
assert curl(url) == (200, b"hello, larder")
url = s3.generate_presigned_url("put_object", Params={"Bucket": "photos", "Key": "up.txt"},
                                ExpiresIn=300)
status, _ = curl("-X", "PUT", "--data-binary", "uploaded by curl", url)
assert status == 200, status
assert s3.get_object(Bucket="photos", Key="up.txt")["Body"].read() == b"uploaded by curl"

step("an expired presigned URL is refused")
url = s3.generate_presigned_url("get_object", Params={"Bucket": "photos", "Key": "hello.txt"},
                                ExpiresIn=1)
time.sleep(2.5)
status, body = curl(url)
assert status == 403 and b"AccessDenied" in body, (status, body)

step("a wrong secret, an unknown key and no signature are refused")
wrong = client(owner_id, owner_secret[:-1] + ("A" if owner_secret[-1] != "A" else "B"))
assert error_of(lambda: wrong.get_object(Bucket="photos", Key="hello.txt")) == ("SignatureDoesNotMatch", 403)
stranger = client("LKNOSUCHKEY000000000", owner_secret)
assert error_of(lambda: stranger.list_buckets()) == ("InvalidAccessKeyId", 403)
status, body = curl(endpoint + "/photos/hello.txt")
assert status == 403 and b"AccessDenied" in body, (status, body)

step("a read-only key reads, and may not write")
reader = client(reader_id, reader_secret)
assert reader.get_object(Bucket="photos", Key="hello.txt")["Body"].read() == b"hello, larder"
assert error_of(lambda: reader.put_object(Bucket="photos", Key="x", Body=b"x")) == ("AccessDenied", 403)
assert error_of(lambda: reader.delete_bucket(Bucket="photos")) == ("AccessDenied", 403)

step("the aws cli")
env = dict(os.environ, AWS_ACCESS_KEY_ID=owner_id, AWS_SECRET_ACCESS_KEY=owner_secret,
           AWS_DEFAULT_REGION="us-east-1")
aws = [os.path.join(os.path.dirname(sys.executable), "aws"), "--endpoint-url", endpoint]
odd = "cli/odd name+plus%.bin"
s3.put_object(Bucket="photos", Key=odd, Body=b"odd")
ls = subprocess.run(aws + ["s3api", "list-objects-v2", "--bucket", "photos", "--prefix", "cli/"],
                    env=env, check=True, capture_output=True).stdout.decode()
assert [o["Key"] for o in json.loads(ls)["Contents"]] == [odd], ls
s3.delete_object(Bucket="photos", Key=odd)
source = os.path.join(workdir, "cli-upload.bin")
with open(source, "wb") as f:
    f.write(os.urandom(300 * 1024))
subprocess.run(aws + ["s3", "cp", source, "s3://photos/cli/upload.bin"], env=env, check=True,
               capture_output=True)
ls = subprocess.run(aws + ["s3", "ls", "s3://photos/cli/"], env=env, check=True,
                    capture_output=True).stdout.decode()
assert "upload.bin" in ls and str(300 * 1024) in ls, ls
back = os.path.join(workdir, "cli-download.bin")
subprocess.run(aws + ["s3", "cp", "s3://photos/cli/upload.bin", back], env=env, check=True,
               capture_output=True)
assert open(back, "rb").read() == open(source, "rb").read()

step("copy, list v1, delete many")
s3.copy_object(Bucket="photos", Key="copy.txt", CopySource={"Bucket": "photos", "Key": "hello.txt"})
got = s3.get_object(Bucket="photos", Key="copy.txt")
assert got["Body"].read() == b"hello, larder" and got["ContentType"] == "text/plain"
assert got["Metadata"] == {"camera": "x100"}, got["Metadata"]
s3.copy_object(Bucket="photos", Key="copy2.txt", CopySource="photos/hello.txt",
               MetadataDirective="REPLACE", ContentType="text/x-other", Metadata={"a": "b"})
head = s3.head_object(Bucket="photos", Key="copy2.txt")
assert head["ContentType"] == "text/x-other" and head["Metadata"] == {"a": "b"}, head
assert error_of(lambda: reader.copy_object(Bucket="photos", Key="x",
                                           CopySource="photos/hello.txt")) == ("AccessDenied", 403)
assert error_of(lambda: s3.copy_object(Bucket="photos", Key="x",
                                       CopySource="photos/nothing")) == ("NoSuchKey", 404)
page = s3.list_objects(Bucket="photos", Prefix="a/", MaxKeys=2)
assert [o["Key"] for o in page["Contents"]] == ["a/1", "a/2"] and page["IsTruncated"], page
page = s3.list_objects(Bucket="photos", Prefix="a/", Marker=page["NextMarker"])
assert [o["Key"] for o in page["Contents"]] == ["a/b/3"] and not page["IsTruncated"], page
v1 = [o["Key"] for p in s3.get_paginator("list_objects").paginate(
    Bucket="photos", Delimiter="/", PaginationConfig={"PageSize": 2})
      for o in p.get("Contents", []) + p.get("CommonPrefixes", [])
      for o in [{"Key": o.get("Key", o.get("Prefix"))}]]
assert sorted(v1) == ["a/", "b/", "big.bin", "c", "cli/", "copy.txt", "copy2.txt", "d",
                      "fresh.txt", "hello.txt", "up.txt"], v1
deleted = s3.delete_objects(Bucket="photos", Delete={"Objects": [
    {"Key": "copy.txt"}, {"Key": "copy2.txt"}, {"Key": "never-was"}]})
assert sorted(d["Key"] for d in deleted["Deleted"]) == ["copy.txt", "copy2.txt", "never-was"]
assert error_of(lambda: s3.head_object(Bucket="photos", Key="copy.txt"))[1] == 404

step("delete objects, then the bucket")
assert error_of(lambda: s3.delete_bucket(Bucket="photos")) == ("BucketNotEmpty", 409)
s3.delete_object(Bucket="photos", Key="c")
assert error_of(lambda: s3.get_object(Bucket="photos", Key="c")) == ("NoSuchKey", 404)
s3.delete_object(Bucket="photos", Key="c")  # absent: still 204
for o in everything + ["up.txt", "cli/upload.bin"]:
    s3.delete_object(Bucket="photos", Key=o)
assert s3.list_objects_v2(Bucket="photos")["KeyCount"] == 0
s3.delete_bucket(Bucket="photos")
assert error_of(lambda: s3.head_bucket(Bucket="photos"))[1] == 404
assert s3.list_buckets()["Buckets"] == []
s3.create_bucket(Bucket="photos")  # a deleted bucket's name can be taken again
step("multipart: 100 MiB through boto3's transfer manager, checked by SHA-256")
from boto3.s3.transfer import TransferConfig
s3.create_bucket(Bucket="big")
source = os.path.join(workdir, "hundred.bin")
digest = hashlib.sha256()
with open(source, "wb") as f:
    for _ in range(100):
        block = os.urandom(1 << 20)
        digest.update(block)
        f.write(block)
transfer = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4)
s3.upload_file(source, "big", "hundred.bin", Config=transfer)
head = s3.head_object(Bucket="big", Key="hundred.bin")
assert head["ContentLength"] == 100 << 20, head
assert head["ETag"].endswith('-13"'), head["ETag"]
back = os.path.join(workdir, "hundred.back")
s3.download_file("big", "hundred.bin", back, Config=TransferConfig(multipart_threshold=1 << 40))
check = hashlib.sha256()
with open(back, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        check.update(block)
assert check.digest() == digest.digest()
with open(source, "rb") as f:
    f.seek((8 << 20) - 5)
    expected = f.read(10)
got = s3.get_object(Bucket="big", Key="hundred.bin", Range="bytes=%d-%d" % ((8 << 20) - 5, (8 << 20) + 4))
assert got["Body"].read() == expected  # across the boundary of parts 1 and 2

step("multipart: bad requests change nothing")
upload = s3.create_multipart_upload(Bucket="big", Key="parts.bin", ContentType="application/x-test")["UploadId"]
small = s3.upload_part(Bucket="big", Key="parts.bin", UploadId=upload, PartNumber=1, Body=b"a" * 100)
second = s3.upload_part(Bucket="big", Key="parts.bin", UploadId=upload, PartNumber=2, Body=b"b" * 100)
listed = s3.list_parts(Bucket="big", Key="parts.bin", UploadId=upload)["Parts"]
assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, 100), (2, 100)], listed
parts = [{"PartNumber": 1, "ETag": small["ETag"]}, {"PartNumber": 2, "ETag": second["ETag"]}]
assert error_of(lambda: s3.complete_multipart_upload(
    Bucket="big", Key="parts.bin", UploadId=upload,
    MultipartUpload={"Parts": parts})) == ("EntityTooSmall", 400)
assert error_of(lambda: s3.complete_multipart_upload(
    Bucket="big", Key="parts.bin", UploadId=upload,
    MultipartUpload={"Parts": parts[::-1]})) == ("InvalidPartOrder", 400)
assert error_of(lambda: s3.complete_multipart_upload(
    Bucket="big", Key="parts.bin", UploadId=upload,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00"'}]})) == ("InvalidPart", 400)
assert error_of(lambda: s3.complete_multipart_upload(
    Bucket="big", Key="parts.bin", UploadId="x" * 32,
    MultipartUpload={"Parts": parts[:1]})) == ("NoSuchUpload", 404)
assert error_of(lambda: s3.upload_part(Bucket="big", Key="parts.bin", UploadId="../../etc",
                                       PartNumber=1, Body=b"x")) == ("NoSuchUpload", 404)
url = s3.generate_presigned_url("complete_multipart_upload", ExpiresIn=300,
                                Params={"Bucket": "big", "Key": "parts.bin", "UploadId": upload})
status, body = curl("-X", "POST", "--data-binary", "<CompleteMultipartUpload><Part>", url)
assert status == 400 and b"MalformedXML" in body, (status, body)
assert error_of(lambda: s3.head_object(Bucket="big", Key="parts.bin"))[1] == 404
# One part (the last may be small): completes, with S3's multipart ETag.
done = s3.complete_multipart_upload(Bucket="big", Key="parts.bin", UploadId=upload,
                                    MultipartUpload={"Parts": parts[:1]})
assert done["ETag"].endswith('-1"'), done
got = s3.get_object(Bucket="big", Key="parts.bin")
assert got["Body"].read() == b"a" * 100 and got["ContentType"] == "application/x-test"
assert error_of(lambda: s3.list_parts(Bucket="big", Key="parts.bin", UploadId=upload)) == ("NoSuchUpload", 404)
aborted = s3.create_multipart_upload(Bucket="big", Key="gone.bin")["UploadId"]
s3.upload_part(Bucket="big", Key="gone.bin", UploadId=aborted, PartNumber=1, Body=b"x")
s3.abort_multipart_upload(Bucket="big", Key="gone.bin", UploadId=aborted)
assert error_of(lambda: s3.list_parts(Bucket="big", Key="gone.bin", UploadId=aborted)) == ("NoSuchUpload", 404)
assert error_of(lambda: s3.head_object(Bucket="big", Key="gone.bin"))[1] == 404
print(json.dumps({"ok": True}))
