"""Conditional GET and HEAD by date and ETag, ListMultipartUploads (boto3 and the aws cli),
multipart uploads' checksums (COMPOSITE and FULL_OBJECT),
presigned URLs from `larder s3 presign` fetched with curl, and public-read buckets (PutBucketAcl)
read by curl without a signature.

Usage: operations.py ENDPOINT KEY_ID SECRET LARDER FRONTEND_CONFIG
Every check asserts; the first failure exits non-zero with its message.
"""

import base64
import json
import os
import subprocess
import sys
import time
import zlib
from datetime import timedelta

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, key_id, secret, larder, config = sys.argv[1:6]
s3 = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}))


def status_of(call):
    try:
        call()
        return 200
    except ClientError as err:
        return err.response["ResponseMetadata"]["HTTPStatusCode"]


def curl(*args):
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}", *args],
                         capture_output=True, check=True)
    body, _, status = out.stdout.rpartition(b"\n")
    return int(status), body


def step(name):
    print(f"== {name}", flush=True)


s3.create_bucket(Bucket="ops")
s3.put_object(Bucket="ops", Key="k", Body=b"v1")
head = s3.head_object(Bucket="ops", Key="k")
modified, etag = head["LastModified"], head["ETag"]
later, earlier = modified + timedelta(seconds=1), modified - timedelta(seconds=1)

step("If-Modified-Since and If-Unmodified-Since on GET and HEAD")
for call in (s3.get_object, s3.head_object):
    assert status_of(lambda: call(Bucket="ops", Key="k", IfModifiedSince=later)) == 304
    assert status_of(lambda: call(Bucket="ops", Key="k", IfModifiedSince=modified)) == 304
    assert status_of(lambda: call(Bucket="ops", Key="k", IfModifiedSince=earlier)) == 200
    assert status_of(lambda: call(Bucket="ops", Key="k", IfUnmodifiedSince=earlier)) == 412
    assert status_of(lambda: call(Bucket="ops", Key="k", IfUnmodifiedSince=later)) == 200
    # S3's precedence: an ETag condition decides over the date beside it.
    assert status_of(lambda: call(Bucket="ops", Key="k", IfMatch=etag,
                                  IfUnmodifiedSince=earlier)) == 200
    assert status_of(lambda: call(Bucket="ops", Key="k", IfNoneMatch=etag,
                                  IfModifiedSince=earlier)) == 304
    assert status_of(lambda: call(Bucket="ops", Key="k", IfNoneMatch='"other"',
                                  IfModifiedSince=later)) == 200

step("GetBucketVersioning and GetObjectLockConfiguration: a bucket with neither")
assert "Status" not in s3.get_bucket_versioning(Bucket="ops")
try:
    s3.get_object_lock_configuration(Bucket="ops")
    raise AssertionError("an Object Lock configuration was answered")
except ClientError as err:
    assert err.response["Error"]["Code"] == "ObjectLockConfigurationNotFoundError", err.response
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 404
for call in (s3.get_bucket_versioning, s3.get_object_lock_configuration):
    try:
        call(Bucket="ops-never-made")
        raise AssertionError(f"{call.__name__} of a missing bucket answered")
    except ClientError as err:
        assert err.response["Error"]["Code"] == "NoSuchBucket", err.response

step("ListMultipartUploads: every upload in progress, paged, by prefix and delimiter")
started = [(k, s3.create_multipart_upload(Bucket="ops", Key=k)["UploadId"])
           for k in ["a/1", "a/2", "b", "b", "c"]]
pages = s3.get_paginator("list_multipart_uploads").paginate(
    Bucket="ops", PaginationConfig={"PageSize": 2})
listed = [(u["Key"], u["UploadId"]) for p in pages for u in p.get("Uploads", [])]
assert listed == sorted(started), (listed, started)
folded = s3.list_multipart_uploads(Bucket="ops", Delimiter="/")
assert [p["Prefix"] for p in folded["CommonPrefixes"]] == ["a/"], folded
assert [u["Key"] for u in folded["Uploads"]] == ["b", "b", "c"], folded
under = s3.list_multipart_uploads(Bucket="ops", Prefix="a/")
assert [u["Key"] for u in under["Uploads"]] == ["a/1", "a/2"], under

step("a completed or aborted upload is no longer listed")
by_key = dict(started[:2] + started[4:])
s3.abort_multipart_upload(Bucket="ops", Key="c", UploadId=by_key["c"])
b_id = started[2][1]
part = s3.upload_part(Bucket="ops", Key="b", UploadId=b_id, PartNumber=1, Body=b"part")
s3.complete_multipart_upload(Bucket="ops", Key="b", UploadId=b_id,
                             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
aws = [os.path.join(os.path.dirname(sys.executable), "aws"), "--endpoint-url", endpoint]
env = dict(os.environ, AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret,
           AWS_DEFAULT_REGION="us-east-1")
out = subprocess.run(aws + ["s3api", "list-multipart-uploads", "--bucket", "ops"], env=env,
                     check=True, capture_output=True).stdout
remaining = sorted((u["Key"], u["UploadId"]) for u in json.loads(out)["Uploads"])
assert remaining == sorted([started[0], started[1], started[3]]), remaining

step("a part number listed twice in a row counts as its last listing")
# A client that sent a part again while the first upload ran lists both answers (ceph's
# test_multipart_resend_first_finishes_last); the part kept is the upload that ended last.
upload = s3.create_multipart_upload(Bucket="ops", Key="twice")["UploadId"]
first = s3.upload_part(Bucket="ops", Key="twice", UploadId=upload, PartNumber=1, Body=b"first")
again = s3.upload_part(Bucket="ops", Key="twice", UploadId=upload, PartNumber=1, Body=b"again")
stale_last = [{"PartNumber": 1, "ETag": again["ETag"]}, {"PartNumber": 1, "ETag": first["ETag"]}]
assert status_of(lambda: s3.complete_multipart_upload(
    Bucket="ops", Key="twice", UploadId=upload,
    MultipartUpload={"Parts": stale_last})) == 400
s3.complete_multipart_upload(Bucket="ops", Key="twice", UploadId=upload,
                             MultipartUpload={"Parts": stale_last[::-1]})
assert s3.get_object(Bucket="ops", Key="twice")["Body"].read() == b"again"

step("multipart checksums: COMPOSITE and FULL_OBJECT, checked part by part and whole")
# A client that sends no checksum unless one is required: the server computes the parts'.
plain = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}, request_checksum_calculation="when_required",
                  response_checksum_validation="when_required"))


def crc32_b64(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


big, small = os.urandom(5 << 20), b"tail of the object"
upload = s3.create_multipart_upload(Bucket="ops", Key="sum", ChecksumAlgorithm="CRC32")
assert upload["ChecksumAlgorithm"] == "CRC32" and upload["ChecksumType"] == "COMPOSITE", upload
uid = upload["UploadId"]
one = s3.upload_part(Bucket="ops", Key="sum", UploadId=uid, PartNumber=1, Body=big,
                     ChecksumAlgorithm="CRC32")
assert one["ChecksumCRC32"] == crc32_b64(big), one
two = plain.upload_part(Bucket="ops", Key="sum", UploadId=uid, PartNumber=2, Body=small)
assert two["ChecksumCRC32"] == crc32_b64(small), two  # computed by the server
assert status_of(lambda: s3.upload_part(Bucket="ops", Key="sum", UploadId=uid, PartNumber=3,
                                        Body=b"x", ChecksumAlgorithm="SHA256")) == 400
listed = s3.list_parts(Bucket="ops", Key="sum", UploadId=uid)
assert [p["ChecksumCRC32"] for p in listed["Parts"]] == [crc32_b64(big), crc32_b64(small)]
parts = [{"PartNumber": 1, "ETag": one["ETag"], "ChecksumCRC32": crc32_b64(big)},
         {"PartNumber": 2, "ETag": two["ETag"], "ChecksumCRC32": crc32_b64(b"other")}]
assert status_of(lambda: s3.complete_multipart_upload(
    Bucket="ops", Key="sum", UploadId=uid, MultipartUpload={"Parts": parts})) == 400
parts[1]["ChecksumCRC32"] = crc32_b64(small)
done = s3.complete_multipart_upload(Bucket="ops", Key="sum", UploadId=uid,
                                    MultipartUpload={"Parts": parts})
joined = base64.b64decode(crc32_b64(big)) + base64.b64decode(crc32_b64(small))
composite = crc32_b64(joined) + "-2"
assert done["ChecksumCRC32"] == composite and done["ChecksumType"] == "COMPOSITE", done
head = s3.head_object(Bucket="ops", Key="sum", ChecksumMode="ENABLED")
assert head["ChecksumCRC32"] == composite, head
# Each part keeps its own (the parts record, version 3): boto3 checks the part's bytes by it.
part = s3.get_object(Bucket="ops", Key="sum", PartNumber=2, ChecksumMode="ENABLED")
assert part["ChecksumCRC32"] == crc32_b64(small) and part["ChecksumType"] == "COMPOSITE", part
assert part["Body"].read() == small
attrs = s3.get_object_attributes(Bucket="ops", Key="sum", ObjectAttributes=["ObjectParts"])
listed = [p["ChecksumCRC32"] for p in attrs["ObjectParts"]["Parts"]]
assert listed == [crc32_b64(big), crc32_b64(small)], attrs

whole = big + small
upload = s3.create_multipart_upload(Bucket="ops", Key="full", ChecksumAlgorithm="CRC32",
                                    ChecksumType="FULL_OBJECT")
uid = upload["UploadId"]
one = plain.upload_part(Bucket="ops", Key="full", UploadId=uid, PartNumber=1, Body=big)
two = plain.upload_part(Bucket="ops", Key="full", UploadId=uid, PartNumber=2, Body=small)
parts = [{"PartNumber": 1, "ETag": one["ETag"]}, {"PartNumber": 2, "ETag": two["ETag"]}]
assert status_of(lambda: s3.complete_multipart_upload(
    Bucket="ops", Key="full", UploadId=uid, MultipartUpload={"Parts": parts},
    ChecksumCRC32=crc32_b64(small), ChecksumType="FULL_OBJECT")) == 400
done = s3.complete_multipart_upload(Bucket="ops", Key="full", UploadId=uid,
                                    MultipartUpload={"Parts": parts},
                                    ChecksumCRC32=crc32_b64(whole), ChecksumType="FULL_OBJECT")
assert done["ChecksumCRC32"] == crc32_b64(whole) and done["ChecksumType"] == "FULL_OBJECT", done
got = s3.get_object(Bucket="ops", Key="full", ChecksumMode="ENABLED")
assert got["ChecksumCRC32"] == crc32_b64(whole) and got["Body"].read() == whole
part = s3.head_object(Bucket="ops", Key="full", PartNumber=1, ChecksumMode="ENABLED")
assert part["ChecksumCRC32"] == crc32_b64(big) and part["ChecksumType"] == "FULL_OBJECT", part
assert status_of(lambda: s3.create_multipart_upload(
    Bucket="ops", Key="no", ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT")) == 400

step("larder s3 presign: GET and PUT through curl; an expired URL is refused")


def presign(*args):
    out = subprocess.run([larder, "s3", "presign", "--config", config, "--access-key-id", key_id,
                          *args], check=True, capture_output=True)
    return out.stdout.decode().strip()


assert curl(presign("s3://ops/k")) == (200, b"v1")
status, _ = curl("-X", "PUT", "--data-binary", "by presigned PUT", presign("--method", "PUT",
                                                                            "ops/put by curl"))
assert status == 200, status
assert s3.get_object(Bucket="ops", Key="put by curl")["Body"].read() == b"by presigned PUT"
expired = presign("--expires-in", "1", "ops/k")
time.sleep(2.5)
status, body = curl(expired)
assert status == 403 and b"AccessDenied" in body, (status, body)
url = presign("ops/k")
status, body = curl(url[:-1] + ("0" if url[-1] != "0" else "1"))
assert status == 403 and b"SignatureDoesNotMatch" in body, (status, body)

step("a public-read bucket serves anonymous GET, HEAD and listings; nothing else")
s3.create_bucket(Bucket="public")
s3.put_object(Bucket="public", Key="open.txt", Body=b"for all")
assert curl(f"{endpoint}/public/open.txt")[0] == 403
s3.put_bucket_acl(Bucket="public", ACL="public-read")
assert curl(f"{endpoint}/public/open.txt") == (200, b"for all")
assert curl("-I", f"{endpoint}/public/open.txt")[0] == 200
status, body = curl(f"{endpoint}/public?list-type=2")
assert status == 200 and b"<Key>open.txt</Key>" in body, (status, body)
assert curl("-X", "PUT", "--data-binary", "x", f"{endpoint}/public/new.txt")[0] == 403
assert curl("-X", "DELETE", f"{endpoint}/public/open.txt")[0] == 403
assert curl(f"{endpoint}/ops/k")[0] == 403
assert curl(f"{endpoint}/")[0] == 403
s3.put_bucket_acl(Bucket="public", ACL="private")
assert curl(f"{endpoint}/public/open.txt")[0] == 403
print("ok")
