"""Conditional CopyObject (x-amz-copy-source-if-*), If-Match and If-None-Match: * on PutObject
and CompleteMultipartUpload, with boto3.

Usage: conditional_writes.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

from datetime import timedelta

from s3test import client_from_argv, error_of, step

s3 = client_from_argv()


FAILED = (412, "PreconditionFailed")

s3.create_bucket(Bucket="cond")
s3.put_object(Bucket="cond", Key="src", Body=b"source")
head = s3.head_object(Bucket="cond", Key="src")
etag, modified = head["ETag"], head["LastModified"]
later, earlier = modified + timedelta(seconds=1), modified - timedelta(seconds=1)
source = {"Bucket": "cond", "Key": "src"}

step("CopyObject with x-amz-copy-source-if-* that fail: 412, nothing written")
for condition in ({"CopySourceIfMatch": '"0123"'}, {"CopySourceIfNoneMatch": etag},
                  {"CopySourceIfModifiedSince": later},
                  {"CopySourceIfUnmodifiedSince": earlier}):
    got = error_of(lambda: s3.copy_object(Bucket="cond", Key="dst", CopySource=source,
                                          **condition))
    assert got == FAILED, (condition, got)
    assert error_of(lambda: s3.head_object(Bucket="cond", Key="dst"))[0] == 404, condition

step("CopyObject with x-amz-copy-source-if-* that hold: copied")
for condition in ({"CopySourceIfMatch": etag}, {"CopySourceIfNoneMatch": '"0123"'},
                  {"CopySourceIfModifiedSince": earlier},
                  {"CopySourceIfUnmodifiedSince": later}):
    s3.copy_object(Bucket="cond", Key="dst", CopySource=source, **condition)
    assert s3.get_object(Bucket="cond", Key="dst")["Body"].read() == b"source", condition

step("An unquoted ETag in a condition is an ETag, as S3 takes it (not 400 InvalidArgument)")
bare = etag.strip('"')
assert bare != etag
assert error_of(lambda: s3.get_object(Bucket="cond", Key="src", IfNoneMatch=bare))[0] == 304
assert s3.get_object(Bucket="cond", Key="src", IfMatch=bare)["Body"].read() == b"source"
assert s3.get_object(Bucket="cond", Key="src", IfNoneMatch="ABCORZ")["Body"].read() == b"source"
for condition in ({"CopySourceIfMatch": "ABCORZ"}, {"CopySourceIfNoneMatch": bare}):
    got = error_of(lambda: s3.copy_object(Bucket="cond", Key="bare", CopySource=source,
                                          **condition))
    assert got == FAILED, (condition, got)
    assert error_of(lambda: s3.head_object(Bucket="cond", Key="bare"))[0] == 404, condition

step("PutObject If-Match: the current ETag writes, another is 412, an absent name 404")
put = s3.put_object(Bucket="cond", Key="src", Body=b"v2", IfMatch=etag)
assert error_of(lambda: s3.put_object(Bucket="cond", Key="src", Body=b"v3",
                                      IfMatch=etag)) == FAILED
assert s3.get_object(Bucket="cond", Key="src")["Body"].read() == b"v2"
assert error_of(lambda: s3.put_object(Bucket="cond", Key="none", Body=b"x",
                                      IfMatch=etag)) == (404, "NoSuchKey")
s3.put_object(Bucket="cond", Key="src", Body=b"v3", IfMatch=put["ETag"])
assert error_of(lambda: s3.put_object(Bucket="cond", Key="src", Body=b"v4",
                                      IfNoneMatch="*")) == FAILED


def multipart(key, **conditions):
    upload = s3.create_multipart_upload(Bucket="cond", Key=key)["UploadId"]
    part = s3.upload_part(Bucket="cond", Key=key, UploadId=upload, PartNumber=1, Body=b"mp")
    parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    call = lambda: s3.complete_multipart_upload(Bucket="cond", Key=key, UploadId=upload,
                                                MultipartUpload=parts, **conditions)
    return upload, call


step("CompleteMultipartUpload If-None-Match: * over an existing name: 412, upload kept")
upload, complete = multipart("src", IfNoneMatch="*")
assert error_of(complete) == FAILED
assert s3.get_object(Bucket="cond", Key="src")["Body"].read() == b"v3"
assert len(s3.list_parts(Bucket="cond", Key="src", UploadId=upload)["Parts"]) == 1
s3.abort_multipart_upload(Bucket="cond", Key="src", UploadId=upload)

step("CompleteMultipartUpload If-None-Match: * of a new name, If-Match with the wrong tag")
_, complete = multipart("new", IfNoneMatch="*")
complete()
assert s3.get_object(Bucket="cond", Key="new")["Body"].read() == b"mp"
upload, complete = multipart("new", IfMatch='"0123"')
assert error_of(complete) == FAILED
s3.abort_multipart_upload(Bucket="cond", Key="new", UploadId=upload)
current = s3.head_object(Bucket="cond", Key="new")["ETag"]
_, complete = multipart("new", IfMatch=current)
complete()

print("all passed")
