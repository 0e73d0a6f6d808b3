"""What ceph's s3-tests found (benchmarks/s3/CEPH-S3-TESTS.md), with boto3 and curl: listing
details (an empty delimiter left out, v1's Marker always there and its Prefix as given, owners,
an empty continuation token), ListObjectVersions of an unversioned bucket (the cleanup path
of many tools), a 304 with its ETag, presigned URLs past seven days refused, GetBucketLocation,
CopyObject onto itself, Content-MD5, CompleteMultipartUpload sent again, and ListBuckets
pages (max-buckets, continuation token, prefix).

Usage: listing_details.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

import subprocess

from botocore.exceptions import ClientError
from s3test import client_from_argv, error_of, step

s3 = client_from_argv()


s3.create_bucket(Bucket="details")
for key in ("a", "b/c", "\nline"):
    s3.put_object(Bucket="details", Key=key, Body=b"x")

step("an empty delimiter is left out of the answer (v1 and v2)")
assert "Delimiter" not in s3.list_objects(Bucket="details", Delimiter="")
assert "Delimiter" not in s3.list_objects_v2(Bucket="details", Delimiter="")

step("v1: Marker always there, Prefix as given, owners listed")
v1 = s3.list_objects(Bucket="details")
assert v1["Marker"] == "", v1
assert all("Owner" in o for o in v1["Contents"]), v1
assert s3.list_objects(Bucket="details", Prefix="\n")["Prefix"] == "\n"

step("v2: owners with FetchOwner, an empty continuation token lists from the start")
v2 = s3.list_objects_v2(Bucket="details", FetchOwner=True)
assert all("Owner" in o for o in v2["Contents"]), v2
assert "Owner" not in s3.list_objects_v2(Bucket="details")["Contents"][0]
assert s3.list_objects_v2(Bucket="details", ContinuationToken="")["KeyCount"] == 3

step("ListObjectVersions: each object is its one version, null; deleting them empties")
versions = s3.list_object_versions(Bucket="details", MaxKeys=2)
assert [v["VersionId"] for v in versions["Versions"]] == ["null", "null"], versions
assert versions["IsTruncated"] and versions["NextKeyMarker"] == "a", versions
rest = s3.list_object_versions(Bucket="details", KeyMarker="a", VersionIdMarker="null")
assert [v["Key"] for v in rest["Versions"]] == ["b/c"], rest
everything = versions["Versions"] + rest["Versions"]
s3.delete_objects(Bucket="details", Delete={
    "Objects": [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in everything]})
assert "Contents" not in s3.list_objects_v2(Bucket="details")

step("a 304 carries the ETag and Last-Modified")
etag = s3.put_object(Bucket="details", Key="k", Body=b"v")["ETag"]
try:
    s3.get_object(Bucket="details", Key="k", IfNoneMatch=etag)
    raise AssertionError("not a 304")
except ClientError as err:
    headers = err.response["ResponseMetadata"]["HTTPHeaders"]
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 304, err.response
    assert headers["etag"] == etag and "last-modified" in headers, headers

step("a presigned URL living longer than seven days is refused, 403")
for expires in (604800, 604801):
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "details", "Key": "k"},
                                    ExpiresIn=expires)
    out = subprocess.run(["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}", url],
                         capture_output=True, check=True)
    body, _, status = out.stdout.rpartition(b"\n")
    if expires == 604800:
        assert (int(status), body) == (200, b"v"), (status, body)
    else:
        assert int(status) == 403 and b"AuthorizationQueryParametersError" in body, body


step("GetBucketLocation: the one region, no constraint")
assert s3.get_bucket_location(Bucket="details").get("LocationConstraint") is None

step("CopyObject onto itself without new metadata is refused; with REPLACE it is a copy")
itself = {"Bucket": "details", "Key": "k"}
assert error_of(lambda: s3.copy_object(Bucket="details", Key="k", CopySource=itself)) == \
    (400, "InvalidRequest")
s3.copy_object(Bucket="details", Key="k", CopySource=itself, MetadataDirective="REPLACE",
               Metadata={"m": "1"})
assert s3.head_object(Bucket="details", Key="k")["Metadata"] == {"m": "1"}

step("Content-MD5 is checked: a wrong one is BadDigest, a malformed one InvalidDigest")
import base64, hashlib
good = base64.b64encode(hashlib.md5(b"body").digest()).decode()
wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
s3.put_object(Bucket="details", Key="md5", Body=b"body", ContentMD5=good)
assert error_of(lambda: s3.put_object(Bucket="details", Key="md5", Body=b"new",
                                      ContentMD5=wrong)) == (400, "BadDigest")
assert error_of(lambda: s3.put_object(Bucket="details", Key="md5", Body=b"new",
                                      ContentMD5="nope")) == (400, "InvalidDigest")


def empty_md5(params, **_):
    params["headers"]["Content-MD5"] = ""  # sent, and signed, as an empty header


s3.meta.events.register("before-call.s3.PutObject", empty_md5)
assert error_of(lambda: s3.put_object(Bucket="details", Key="md5", Body=b"new")) == \
    (400, "InvalidDigest")
s3.meta.events.unregister("before-call.s3.PutObject", empty_md5)
assert s3.get_object(Bucket="details", Key="md5")["Body"].read() == b"body"

step("CompleteMultipartUpload sent again after it succeeded answers the object again")
upload = s3.create_multipart_upload(Bucket="details", Key="mp")["UploadId"]
part = s3.upload_part(Bucket="details", Key="mp", UploadId=upload, PartNumber=1, Body=b"p")
parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
first = s3.complete_multipart_upload(Bucket="details", Key="mp", UploadId=upload,
                                     MultipartUpload=parts)
again = s3.complete_multipart_upload(Bucket="details", Key="mp", UploadId=upload,
                                     MultipartUpload=parts)
assert first["ETag"] == again["ETag"], (first, again)
s3.put_object(Bucket="details", Key="mp", Body=b"replaced")
assert error_of(lambda: s3.complete_multipart_upload(
    Bucket="details", Key="mp", UploadId=upload, MultipartUpload=parts)) == \
    (404, "NoSuchUpload")
step("ListBuckets pages with max-buckets and a continuation token, and filters by prefix")
for name in ("page-a", "page-b", "page-c"):
    s3.create_bucket(Bucket=name)
first = s3.list_buckets(MaxBuckets=2, Prefix="page-")
assert [b["Name"] for b in first["Buckets"]] == ["page-a", "page-b"], first
assert first["Prefix"] == "page-", first
rest = s3.list_buckets(MaxBuckets=2, Prefix="page-", ContinuationToken=first["ContinuationToken"])
assert [b["Name"] for b in rest["Buckets"]] == ["page-c"], rest
assert "ContinuationToken" not in rest, rest
assert error_of(lambda: s3.list_buckets(MaxBuckets=10001)) == (400, "InvalidArgument")
print("all passed")
