"""The standard headers an object keeps (Cache-Control, Content-Disposition, Content-Encoding,
Content-Language, Expires) through PutObject, CopyObject and multipart uploads, GetObject's
response-* overrides on a presigned URL (curl), reads by partNumber, and the bounds: user
metadata past S3's 2 KiB is MetadataTooLarge, and nothing is stored.

Usage: object_headers.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

import datetime
import subprocess

from s3test import client_from_argv, error_of, step

s3 = client_from_argv()


EXPIRES = datetime.datetime(2037, 10, 21, 7, 28, tzinfo=datetime.timezone.utc)
GIVEN = {
    "CacheControl": "max-age=3600, public",
    "ContentDisposition": 'attachment; filename="report.csv"',
    "ContentEncoding": "gzip",
    "ContentLanguage": "fr-CA",
    "Expires": EXPIRES,
}


def kept(answer):
    return {name: answer.get(name) for name in GIVEN}


s3.create_bucket(Bucket="headers")

step("PutObject keeps the standard headers; GetObject and HeadObject answer with them")
s3.put_object(Bucket="headers", Key="k", Body=b"body", ContentType="text/csv", **GIVEN)
for answer in (s3.get_object(Bucket="headers", Key="k"),
               s3.head_object(Bucket="headers", Key="k")):
    assert kept(answer) == GIVEN, kept(answer)
    assert answer["ContentType"] == "text/csv", answer

step("an object put without them answers none")
s3.put_object(Bucket="headers", Key="plain", Body=b"x")
plain = s3.head_object(Bucket="headers", Key="plain")
assert all(plain.get(name) is None for name in GIVEN), plain

step("response-* overrides on a presigned GET (curl): the overrides win, the rest is kept")
url = s3.generate_presigned_url("get_object", Params={
    "Bucket": "headers", "Key": "k",
    "ResponseContentDisposition": "inline",
    "ResponseContentType": "text/plain",
    "ResponseCacheControl": "no-store"}, ExpiresIn=60)
out = subprocess.run(["curl", "-s", "-D", "-", "-o", "/dev/null", url],
                     capture_output=True, text=True, check=True).stdout.lower()
assert "content-disposition: inline" in out, out
assert "content-type: text/plain" in out, out
assert "cache-control: no-store" in out, out
assert "content-language: fr-ca" in out, out

step("response-* overrides are refused for anonymous reads, even of a public-read bucket")
s3.create_bucket(Bucket="open")
s3.put_object(Bucket="open", Key="o", Body=b"open", **GIVEN)
s3.put_bucket_acl(Bucket="open", ACL="public-read")
base = url.split("/headers/")[0]
plain = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{base}/open/o"],
                       capture_output=True, text=True, check=True).stdout
assert plain == "200", plain
refused = subprocess.run(["curl", "-s", "-w", "\n%{http_code}",
                          f"{base}/open/o?response-content-type=text/html"],
                         capture_output=True, text=True, check=True).stdout
assert refused.endswith("\n400") and "InvalidRequest" in refused, refused

step("HeadObject answers a Range with the range's length and Content-Range")
head = s3.head_object(Bucket="headers", Key="k", Range="bytes=1-2")
# 206, as S3 answers (s3s writes 200; the S3 port's server sets it: server.rs).
assert head["ResponseMetadata"]["HTTPStatusCode"] == 206, head
whole = s3.head_object(Bucket="headers", Key="k")
assert whole["ResponseMetadata"]["HTTPStatusCode"] == 200 and "ContentRange" not in whole, whole
assert head["ContentLength"] == 2 and head["ContentRange"] == "bytes 1-2/4", head

step("CopyObject keeps them (COPY) or takes the request's (REPLACE)")
s3.copy_object(Bucket="headers", Key="copy", CopySource={"Bucket": "headers", "Key": "k"})
assert kept(s3.head_object(Bucket="headers", Key="copy")) == GIVEN
s3.copy_object(Bucket="headers", Key="replaced", CopySource={"Bucket": "headers", "Key": "k"},
               MetadataDirective="REPLACE", CacheControl="no-cache")
replaced = s3.head_object(Bucket="headers", Key="replaced")
assert replaced["CacheControl"] == "no-cache", replaced
assert replaced.get("ContentDisposition") is None, replaced

step("a multipart upload keeps the headers it was created with")
upload = s3.create_multipart_upload(Bucket="headers", Key="mp", **GIVEN)["UploadId"]
part = s3.upload_part(Bucket="headers", Key="mp", UploadId=upload, PartNumber=1, Body=b"p")
s3.complete_multipart_upload(Bucket="headers", Key="mp", UploadId=upload, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
assert kept(s3.get_object(Bucket="headers", Key="mp")) == GIVEN

step("GetObject and HeadObject by partNumber: a multipart object's parts, a PUT's one part")
upload = s3.create_multipart_upload(Bucket="headers", Key="parts")["UploadId"]
first, second = b"a" * (5 << 20), b"b" * 1000
tags = [s3.upload_part(Bucket="headers", Key="parts", UploadId=upload, PartNumber=n,
                       Body=body)["ETag"] for n, body in ((1, first), (2, second))]
s3.complete_multipart_upload(Bucket="headers", Key="parts", UploadId=upload, MultipartUpload={
    "Parts": [{"PartNumber": n + 1, "ETag": tag} for n, tag in enumerate(tags)]})
got = s3.get_object(Bucket="headers", Key="parts", PartNumber=2)
assert got["ResponseMetadata"]["HTTPStatusCode"] == 206, got
assert got["Body"].read() == second
assert got["PartsCount"] == 2, got
size = len(first) + len(second)
assert got["ContentRange"] == f"bytes {len(first)}-{size - 1}/{size}", got
head = s3.head_object(Bucket="headers", Key="parts", PartNumber=1)
assert head["ContentLength"] == len(first) and head["PartsCount"] == 2, head
assert head["ResponseMetadata"]["HTTPStatusCode"] == 206, head
single = s3.get_object(Bucket="headers", Key="k", PartNumber=1)
assert single["Body"].read() == b"body" and "PartsCount" not in single, single
assert error_of(lambda: s3.get_object(Bucket="headers", Key="parts", PartNumber=3)) == \
    (400, "InvalidPart")
assert error_of(lambda: s3.get_object(Bucket="headers", Key="parts", PartNumber=1,
                                      Range="bytes=0-1")) == (400, "InvalidRequest")

step("a streamed upload (aws-chunked) does not keep aws-chunked as the object's encoding")
s3.put_object(Bucket="headers", Key="chunked", Body=b"x" * 10, ChecksumAlgorithm="CRC32")
assert s3.head_object(Bucket="headers", Key="chunked").get("ContentEncoding") is None

step("user metadata past 2 KiB is MetadataTooLarge, and nothing is stored")
big = {"m": "v" * 2048}
assert error_of(lambda: s3.put_object(Bucket="headers", Key="big", Body=b"x", Metadata=big)) \
    == (400, "MetadataTooLarge")
assert error_of(lambda: s3.head_object(Bucket="headers", Key="big"))[0] == 404
assert error_of(lambda: s3.create_multipart_upload(Bucket="headers", Key="big", Metadata=big)) \
    == (400, "MetadataTooLarge")
assert error_of(lambda: s3.copy_object(
    Bucket="headers", Key="big", CopySource={"Bucket": "headers", "Key": "k"},
    MetadataDirective="REPLACE", Metadata=big)) == (400, "MetadataTooLarge")
s3.put_object(Bucket="headers", Key="fits", Body=b"x", Metadata={"m": "v" * 2000})
assert len(s3.head_object(Bucket="headers", Key="fits")["Metadata"]["m"]) == 2000
print("all passed")
