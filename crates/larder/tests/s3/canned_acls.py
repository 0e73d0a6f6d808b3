"""Canned ACLs: buckets made public-read when created, objects that say for themselves
(public-read in a private bucket, private in a public one) through PutObject, CopyObject,
multipart uploads and PutObjectAcl, anonymous requests of a bucket that does not exist (404), and the ACLs
Larder does not take (501, nothing made or stored).

Usage: canned_acls.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

import subprocess

from s3test import anonymous_from_argv, client_from_argv, error_of, step

s3 = client_from_argv()
anonymous = anonymous_from_argv()


def anonymous_get(bucket, key):
    return anonymous.get_object(Bucket=bucket, Key=key)["Body"].read()


step("a bucket created public-read: anyone reads and lists it, nobody anonymous writes")
s3.create_bucket(Bucket="open", ACL="public-read")
s3.put_object(Bucket="open", Key="shared", Body=b"for all")
assert anonymous_get("open", "shared") == b"for all"
assert [o["Key"] for o in anonymous.list_objects_v2(Bucket="open")["Contents"]] == ["shared"]
assert error_of(lambda: anonymous_get("open", "absent")) == (404, "NoSuchKey")
assert error_of(lambda: anonymous.put_object(Bucket="open", Key="x", Body=b"x")) == \
    (403, "AccessDenied")

step("an object put private in a public-read bucket is closed to anonymous reads")
s3.put_object(Bucket="open", Key="closed", Body=b"mine", ACL="private")
assert error_of(lambda: anonymous_get("open", "closed")) == (403, "AccessDenied")
assert error_of(lambda: anonymous.head_object(Bucket="open", Key="closed"))[0] == 403
assert s3.get_object(Bucket="open", Key="closed")["Body"].read() == b"mine"

step("replacing it without an ACL leaves it to the bucket again")
s3.put_object(Bucket="open", Key="closed", Body=b"now open")
assert anonymous_get("open", "closed") == b"now open"

step("a private bucket: closed, but for an object put public-read")
s3.create_bucket(Bucket="shut")
s3.put_object(Bucket="shut", Key="poster", Body=b"public", ACL="public-read")
s3.put_object(Bucket="shut", Key="diary", Body=b"private")
assert anonymous_get("shut", "poster") == b"public"
assert anonymous.head_object(Bucket="shut", Key="poster")["ContentLength"] == 6
assert error_of(lambda: anonymous_get("shut", "diary")) == (403, "AccessDenied")
assert error_of(lambda: anonymous_get("shut", "absent")) == (403, "AccessDenied")
assert error_of(lambda: anonymous.list_objects_v2(Bucket="shut")) == (403, "AccessDenied")

step("a copy takes the request's ACL, not its source's")
s3.copy_object(Bucket="shut", Key="poster-copy", CopySource={"Bucket": "shut", "Key": "poster"})
assert error_of(lambda: anonymous_get("shut", "poster-copy")) == (403, "AccessDenied")
s3.copy_object(Bucket="shut", Key="diary-copy", CopySource={"Bucket": "shut", "Key": "diary"},
               ACL="public-read")
assert anonymous_get("shut", "diary-copy") == b"private"

step("a multipart upload created public-read completes into a public object")
upload = s3.create_multipart_upload(Bucket="shut", Key="big", ACL="public-read")["UploadId"]
etag = s3.upload_part(Bucket="shut", Key="big", UploadId=upload, PartNumber=1,
                      Body=b"parts")["ETag"]
s3.complete_multipart_upload(Bucket="shut", Key="big", UploadId=upload,
                             MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]})
assert anonymous_get("shut", "big") == b"parts"

step("GetBucketAcl and GetObjectAcl answer the grants the canned ACLs stand for")
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"


def public(acl):
    everyone = [g for g in acl["Grants"] if g["Grantee"].get("URI") == ALL_USERS]
    owner = [g for g in acl["Grants"] if g["Grantee"]["Type"] == "CanonicalUser"]
    assert [g["Permission"] for g in owner] == ["FULL_CONTROL"], acl
    assert acl["Owner"]["ID"] == owner[0]["Grantee"]["ID"], acl
    assert [g["Permission"] for g in everyone] in ([], ["READ"]), acl
    return bool(everyone)


assert public(s3.get_bucket_acl(Bucket="open")) is True
assert public(s3.get_bucket_acl(Bucket="shut")) is False
assert public(s3.get_object_acl(Bucket="shut", Key="poster")) is True
assert public(s3.get_object_acl(Bucket="shut", Key="diary")) is False
assert public(s3.get_object_acl(Bucket="open", Key="shared")) is True
s3.put_object(Bucket="open", Key="closed", Body=b"mine again", ACL="private")
assert public(s3.get_object_acl(Bucket="open", Key="closed")) is False
assert error_of(lambda: s3.get_object_acl(Bucket="shut", Key="absent")) == (404, "NoSuchKey")
assert error_of(lambda: anonymous.get_object_acl(Bucket="open", Key="shared"))[0] == 403

step("PutObjectAcl opens and closes one object, and keeps its bytes")
s3.put_object(Bucket="shut", Key="later", Body=b"made public afterwards")
assert error_of(lambda: anonymous_get("shut", "later")) == (403, "AccessDenied")
before = s3.head_object(Bucket="shut", Key="later")
s3.put_object_acl(Bucket="shut", Key="later", ACL="public-read")
assert anonymous_get("shut", "later") == b"made public afterwards"
assert public(s3.get_object_acl(Bucket="shut", Key="later")) is True
after = s3.head_object(Bucket="shut", Key="later")
assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])
s3.put_object_acl(Bucket="shut", Key="later", ACL="private")
assert error_of(lambda: anonymous_get("shut", "later")) == (403, "AccessDenied")
s3.put_object_acl(Bucket="open", Key="shared", ACL="private")
assert error_of(lambda: anonymous_get("open", "shared")) == (403, "AccessDenied")
s3.put_object_acl(Bucket="open", Key="shared", ACL="bucket-owner-full-control")
assert anonymous_get("open", "shared") == b"for all"
assert s3.get_object(Bucket="shut", Key="later")["Body"].read() == b"made public afterwards"
assert error_of(lambda: s3.put_object_acl(Bucket="shut", Key="absent", ACL="public-read")) == \
    (404, "NoSuchKey")
assert error_of(lambda: s3.put_object_acl(Bucket="shut", Key="later",
                                          ACL="public-read-write")) == (501, "NotImplemented")
assert error_of(lambda: s3.put_object_acl(
    Bucket="shut", Key="later",
    GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')) == (501, "NotImplemented")
assert error_of(lambda: s3.put_object_acl(Bucket="shut", Key="later", ACL="public-read",
                                          VersionId="v1")) == (404, "NoSuchVersion")
assert error_of(lambda: s3.put_object_acl(Bucket="shut", Key="later")) == \
    (400, "MissingSecurityHeader")
assert error_of(lambda: anonymous.put_object_acl(Bucket="open", Key="shared",
                                                 ACL="public-read"))[0] == 403
assert error_of(lambda: anonymous_get("shut", "later")) == (403, "AccessDenied")

step("anonymous requests of a bucket that does not exist: 404 NoSuchBucket")
assert error_of(lambda: anonymous_get("never-made", "k")) == (404, "NoSuchBucket")
assert error_of(lambda: anonymous.delete_object(Bucket="never-made", Key="k")) == \
    (404, "NoSuchBucket")
assert error_of(lambda: anonymous.create_bucket(Bucket="never-made")) == (403, "AccessDenied")
assert error_of(lambda: s3.head_bucket(Bucket="never-made"))[0] == 404

step("ACLs Larder does not take: 501, and nothing is made or stored")
assert error_of(lambda: s3.create_bucket(Bucket="wide", ACL="public-read-write")) == \
    (501, "NotImplemented")
assert error_of(lambda: s3.head_bucket(Bucket="wide"))[0] == 404
assert error_of(lambda: s3.put_object(Bucket="shut", Key="odd", Body=b"x",
                                      ACL="authenticated-read")) == (501, "NotImplemented")
assert error_of(lambda: s3.put_object(Bucket="shut", Key="odd", Body=b"x",
                                      GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')) \
    == (501, "NotImplemented")
assert error_of(lambda: s3.head_object(Bucket="shut", Key="odd"))[0] == 404
s3.put_object(Bucket="shut", Key="owner", Body=b"x", ACL="bucket-owner-full-control")
assert error_of(lambda: anonymous_get("shut", "owner")) == (403, "AccessDenied")

step("OPTIONS (a CORS preflight; no CORS rules are served): 400 without Origin, else 403")
url = s3.generate_presigned_url("get_object", Params={"Bucket": "open", "Key": "shared"},
                                ExpiresIn=60)
for extra, status in (([], "400"), (["-H", "Origin: https://example.com"], "403")):
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "OPTIONS",
                          *extra, url], capture_output=True, text=True, check=True).stdout
    assert out == status, (extra, out)

print("all checks passed")
