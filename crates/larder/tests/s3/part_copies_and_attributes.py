"""UploadPartCopy (whole sources and byte ranges, the range forms S3 refuses, a source whose
key holds an encoded '?', a source rewritten after its bytes were copied), GetObjectAttributes
(a single PUT's and a multipart object's, with pages of parts) and request IDs on answers and
in error bodies.

Usage: part_copies_and_attributes.py ENDPOINT KEY_ID SECRET WRITER_ID WRITER_SECRET
(the second key may write in bucket dst only)
Every check asserts; the first failure exits non-zero with its message.
"""

import hashlib
import os
import sys
import xml.etree.ElementTree as ET

import boto3
from botocore.config import Config

from s3test import client_from_argv, error_of, step

s3 = client_from_argv()
MIB = 1 << 20

s3.create_bucket(Bucket="src")
s3.create_bucket(Bucket="dst")
source = os.urandom(12 * MIB + 12345)
s3.put_object(Bucket="src", Key="big", Body=source)


def copy_in_parts(part_size, key="copied"):
    """A multipart upload of src/big into dst/<key>, every part copied by range."""
    upload = s3.create_multipart_upload(Bucket="dst", Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(source), part_size), start=1):
        end = min(start + part_size, len(source)) - 1
        answer = s3.upload_part_copy(
            Bucket="dst", Key=key, UploadId=upload, PartNumber=number,
            CopySource={"Bucket": "src", "Key": "big"}, CopySourceRange=f"bytes={start}-{end}")
        etag = answer["CopyPartResult"]["ETag"]
        assert etag.strip('"') == hashlib.md5(source[start:end + 1]).hexdigest(), etag
        parts.append({"ETag": etag, "PartNumber": number})
    s3.complete_multipart_upload(Bucket="dst", Key=key, UploadId=upload,
                                 MultipartUpload={"Parts": parts})
    return len(parts)


step("a multipart object copied by ranges of another reads back byte for byte")
count = copy_in_parts(5 * MIB)
got = s3.get_object(Bucket="dst", Key="copied")["Body"].read()
assert got == source, (len(got), len(source))

step("a part copied without a range takes the whole source")
upload = s3.create_multipart_upload(Bucket="dst", Key="whole")["UploadId"]
s3.put_object(Bucket="src", Key="small", Body=b"0123456789")
etag = s3.upload_part_copy(Bucket="dst", Key="whole", UploadId=upload, PartNumber=1,
                           CopySource={"Bucket": "src", "Key": "small"})["CopyPartResult"]["ETag"]
s3.complete_multipart_upload(Bucket="dst", Key="whole", UploadId=upload,
                             MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]})

step("the copied part owns its bytes: rewriting and deleting the source changes nothing")
s3.put_object(Bucket="src", Key="small", Body=b"rewritten")
s3.delete_object(Bucket="src", Key="big")
assert s3.get_object(Bucket="dst", Key="whole")["Body"].read() == b"0123456789"
assert s3.get_object(Bucket="dst", Key="copied")["Body"].read() == source

step("ranges S3 refuses: 400 InvalidArgument for malformed, InvalidRange past the end")
upload = s3.create_multipart_upload(Bucket="dst", Key="bad")["UploadId"]


def copy_range(text):
    return lambda: s3.upload_part_copy(
        Bucket="dst", Key="bad", UploadId=upload, PartNumber=1,
        CopySource={"Bucket": "src", "Key": "small"}, CopySourceRange=text)


for bad in ["0-2", "bytes=0", "bytes=hello-world", "bytes=0-bar", "bytes=-3", "bytes=0-2,3-5"]:
    assert error_of(copy_range(bad)) == (400, "InvalidArgument"), bad
status, code = error_of(copy_range("bytes=0-21"))
assert code == "InvalidRange" and status in (400, 416), (status, code)
assert s3.list_parts(Bucket="dst", Key="bad", UploadId=upload).get("Parts", []) == []
assert error_of(lambda: s3.upload_part_copy(
    Bucket="dst", Key="bad", UploadId=upload, PartNumber=1,
    CopySource={"Bucket": "src", "Key": "absent"})) == (404, "NoSuchKey")
assert error_of(lambda: s3.upload_part_copy(
    Bucket="dst", Key="bad", UploadId="A" * 32, PartNumber=1,
    CopySource={"Bucket": "src", "Key": "small"})) == (404, "NoSuchUpload")

step("a key that may not read the source bucket copies nothing from it")
writer = boto3.client(
    "s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[4],
    aws_secret_access_key=sys.argv[5], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}))
assert error_of(lambda: writer.upload_part_copy(
    Bucket="dst", Key="bad", UploadId=upload, PartNumber=1,
    CopySource={"Bucket": "src", "Key": "small"})) == (403, "AccessDenied")
assert s3.list_parts(Bucket="dst", Key="bad", UploadId=upload).get("Parts", []) == []

step("a source condition that fails is 412 and copies nothing")
assert error_of(lambda: s3.upload_part_copy(
    Bucket="dst", Key="bad", UploadId=upload, PartNumber=1,
    CopySource={"Bucket": "src", "Key": "small"},
    CopySourceIfMatch='"00000000000000000000000000000000"')) == (412, "PreconditionFailed")
s3.abort_multipart_upload(Bucket="dst", Key="bad", UploadId=upload)

step("a source key with an encoded '?' is that key, for UploadPartCopy and CopyObject")
s3.put_object(Bucket="src", Key="?versionId", Body=b"question")
s3.copy_object(Bucket="dst", Key="q", CopySource={"Bucket": "src", "Key": "?versionId"})
assert s3.get_object(Bucket="dst", Key="q")["Body"].read() == b"question"
upload = s3.create_multipart_upload(Bucket="dst", Key="q2")["UploadId"]
etag = s3.upload_part_copy(Bucket="dst", Key="q2", UploadId=upload, PartNumber=1,
                           CopySource={"Bucket": "src", "Key": "?versionId"},
                           CopySourceRange="bytes=0-3")["CopyPartResult"]["ETag"]
s3.complete_multipart_upload(Bucket="dst", Key="q2", UploadId=upload,
                             MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]})
assert s3.get_object(Bucket="dst", Key="q2")["Body"].read() == b"ques"

ALL = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]

step("GetObjectAttributes of a single PUT: ETag unquoted, size, class, its checksum, no parts")
put = s3.put_object(Bucket="src", Key="attrs", Body=b"foo", ChecksumAlgorithm="SHA256")
got = s3.get_object_attributes(Bucket="src", Key="attrs", ObjectAttributes=ALL)
assert got["ETag"] == put["ETag"].strip('"'), got
assert got["ObjectSize"] == 3 and got["StorageClass"] == "STANDARD", got
assert got["Checksum"]["ChecksumSHA256"] == put["ChecksumSHA256"], got
assert "ObjectParts" not in got and "LastModified" in got, got
only_size = s3.get_object_attributes(Bucket="src", Key="attrs", ObjectAttributes=["ObjectSize"])
assert only_size["ObjectSize"] == 3 and "ETag" not in only_size, only_size

step("GetObjectAttributes of a multipart object: its parts, paged")
whole = s3.get_object_attributes(Bucket="dst", Key="copied", ObjectAttributes=ALL)
assert whole["ObjectSize"] == len(source), whole
assert whole["ETag"].endswith(f"-{count}"), whole
parts = whole["ObjectParts"]
assert parts["TotalPartsCount"] == count and parts["IsTruncated"] is False, parts
assert [p["PartNumber"] for p in parts["Parts"]] == list(range(1, count + 1)), parts
assert [p["Size"] for p in parts["Parts"]][:-1] == [5 * MIB] * (count - 1), parts
page = s3.get_object_attributes(Bucket="dst", Key="copied", ObjectAttributes=ALL,
                                MaxParts=1, PartNumberMarker=1)["ObjectParts"]
assert [p["PartNumber"] for p in page["Parts"]] == [2], page
assert page["IsTruncated"] is True and page["NextPartNumberMarker"] == 2, page
assert error_of(lambda: s3.get_object_attributes(
    Bucket="dst", Key="absent", ObjectAttributes=ALL)) == (404, "NoSuchKey")

step("every answer names its request; an error's body names the same one")
ok = s3.head_object(Bucket="src", Key="attrs")["ResponseMetadata"]
assert len(ok["HTTPHeaders"]["x-amz-request-id"]) == 16, ok
raw = {}
s3.meta.events.register("after-call.s3.GetObject",
                        lambda http_response, **_: raw.update(body=http_response.content))
try:
    s3.get_object(Bucket="src", Key="absent")
    raise AssertionError("the GET of an absent key succeeded")
except s3.exceptions.NoSuchKey as err:
    header_id = err.response["ResponseMetadata"]["RequestId"]
body_id = ET.fromstring(raw["body"]).find("RequestId").text
assert header_id and body_id == header_id, (header_id, raw["body"])
second = s3.head_object(Bucket="src", Key="attrs")["ResponseMetadata"]["RequestId"]
assert second != ok["RequestId"], "two requests with one ID"

print("all checks passed")
