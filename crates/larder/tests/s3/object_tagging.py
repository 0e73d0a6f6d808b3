"""Object tags: PutObjectTagging, GetObjectTagging and DeleteObjectTagging; tags given with
PutObject, CopyObject (COPY and REPLACE) and multipart uploads (`x-amz-tagging`); their count
on GetObject and HeadObject; tags that break S3's rules refused with InvalidTag and nothing
changed; an overwrite drops the old object's tags; the object's bytes, ETag and time
untouched by tagging; anonymous readers of a public bucket see no tags. Bucket tags:
PutBucketTagging, GetBucketTagging (404 NoSuchTagSet without any) and DeleteBucketTagging,
up to 50 tags, S3's rules; a bucket's tags and its objects' are apart.

Usage: object_tagging.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

from s3test import anonymous_from_argv, client_from_argv, error_of, step

s3 = client_from_argv()
anonymous = anonymous_from_argv()


def tags_of(key, bucket="tags"):
    answer = s3.get_object_tagging(Bucket=bucket, Key=key)
    return {t["Key"]: t["Value"] for t in answer["TagSet"]}


def tag_set(tags):
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


s3.create_bucket(Bucket="tags")

step("an object put without tags has none, and GetObject counts none")
s3.put_object(Bucket="tags", Key="k", Body=b"tagged body")
assert tags_of("k") == {}
assert "TagCount" not in s3.get_object(Bucket="tags", Key="k")
before = s3.head_object(Bucket="tags", Key="k")

step("PutObjectTagging sets them; GetObjectTagging answers them; GetObject counts them")
wanted = {"Environment": "Test", "Project": "Larder", "path": "a/b c+d=e@f:g_h.i-j", "empty": ""}
s3.put_object_tagging(Bucket="tags", Key="k", Tagging=tag_set(wanted))
assert tags_of("k") == wanted, tags_of("k")
got = s3.get_object(Bucket="tags", Key="k")
assert got["TagCount"] == 4, got.get("TagCount")
head = s3.head_object(Bucket="tags", Key="k")["ResponseMetadata"]["HTTPHeaders"]
assert head["x-amz-tagging-count"] == "4", head
assert got["Body"].read() == b"tagged body"
after = s3.head_object(Bucket="tags", Key="k")
for field in ("ETag", "LastModified", "ContentLength"):
    assert after[field] == before[field], (field, before[field], after[field])

step("PutObjectTagging replaces the whole set")
s3.put_object_tagging(Bucket="tags", Key="k", Tagging=tag_set({"only": "one"}))
assert tags_of("k") == {"only": "one"}

step("tags that break S3's rules are InvalidTag, and the tags stay as they were")
bad_sets = [
    {f"k{i}": "v" for i in range(11)},  # more than 10
    {"k" * 129: "v"},  # key too long
    {"k": "v" * 257},  # value too long
    {"aws:reserved": "v"},  # reserved prefix
    {"k": "<script>"},  # characters outside the allowed set
]
for bad in bad_sets:
    assert error_of(lambda: s3.put_object_tagging(
        Bucket="tags", Key="k", Tagging=tag_set(bad)))[1] == "InvalidTag", bad
duplicate = {"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]}
assert error_of(lambda: s3.put_object_tagging(Bucket="tags", Key="k", Tagging=duplicate))[1] \
    == "InvalidTag"
assert tags_of("k") == {"only": "one"}

step("tagging a missing object is NoSuchKey; another version is NoSuchVersion")
assert error_of(lambda: s3.get_object_tagging(Bucket="tags", Key="missing")) \
    == (404, "NoSuchKey")
assert error_of(lambda: s3.put_object_tagging(
    Bucket="tags", Key="missing", Tagging=tag_set({"a": "b"}))) == (404, "NoSuchKey")
assert error_of(lambda: s3.get_object_tagging(Bucket="tags", Key="k", VersionId="v1")) \
    == (404, "NoSuchVersion")

step("DeleteObjectTagging takes them all off (204)")
answer = s3.delete_object_tagging(Bucket="tags", Key="k")
assert answer["ResponseMetadata"]["HTTPStatusCode"] == 204
assert tags_of("k") == {}
assert "TagCount" not in s3.get_object(Bucket="tags", Key="k")

step("PutObject takes x-amz-tagging; an overwrite without it drops the old tags")
s3.put_object(Bucket="tags", Key="p", Body=b"p", Tagging="a=1&b=two%20words")
assert tags_of("p") == {"a": "1", "b": "two words"}
s3.put_object(Bucket="tags", Key="p", Body=b"p2")
assert tags_of("p") == {}
assert error_of(lambda: s3.put_object(
    Bucket="tags", Key="refused", Body=b"x", Tagging="aws:x=1"))[1] == "InvalidTag"
assert error_of(lambda: s3.head_object(Bucket="tags", Key="refused"))[0] == 404

step("CopyObject copies the source's tags, or replaces them with REPLACE")
s3.put_object(Bucket="tags", Key="src", Body=b"source", Tagging="from=source")
s3.copy_object(Bucket="tags", Key="copy", CopySource={"Bucket": "tags", "Key": "src"})
assert tags_of("copy") == {"from": "source"}
s3.copy_object(Bucket="tags", Key="replaced", CopySource={"Bucket": "tags", "Key": "src"},
               TaggingDirective="REPLACE", Tagging="new=tag")
assert tags_of("replaced") == {"new": "tag"}
s3.copy_object(Bucket="tags", Key="none", CopySource={"Bucket": "tags", "Key": "src"},
               TaggingDirective="REPLACE")
assert tags_of("none") == {}

step("a multipart upload's tags are the object's once it completes")
upload = s3.create_multipart_upload(Bucket="tags", Key="mp", Tagging="part=of%2Fmany")
part = s3.upload_part(Bucket="tags", Key="mp", UploadId=upload["UploadId"], PartNumber=1,
                      Body=b"m" * 1024)
s3.complete_multipart_upload(
    Bucket="tags", Key="mp", UploadId=upload["UploadId"],
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
assert tags_of("mp") == {"part": "of/many"}
assert s3.get_object(Bucket="tags", Key="mp")["TagCount"] == 1

step("anonymous requests read a public-read bucket's objects, never their tags")
s3.create_bucket(Bucket="open-tags", ACL="public-read")
s3.put_object(Bucket="open-tags", Key="o", Body=b"open", Tagging="secret=1")
assert anonymous.get_object(Bucket="open-tags", Key="o")["Body"].read() == b"open"
assert error_of(lambda: anonymous.get_object_tagging(Bucket="open-tags", Key="o"))[0] == 403
assert error_of(lambda: anonymous.put_object_tagging(
    Bucket="open-tags", Key="o", Tagging=tag_set({"a": "b"})))[0] == 403
assert tags_of("o", "open-tags") == {"secret": "1"}

step("a bucket has no tags until PutBucketTagging: GetBucketTagging is 404 NoSuchTagSet")
s3.create_bucket(Bucket="tagged-bucket")
assert error_of(lambda: s3.get_bucket_tagging(Bucket="tagged-bucket")) == (404, "NoSuchTagSet")


def bucket_tags(bucket="tagged-bucket"):
    return {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]}


step("PutBucketTagging takes up to 50 tags; GetBucketTagging answers them")
fifty = {f"{i:02}" + "k" * 126: "v" * 256 for i in range(50)}
s3.put_bucket_tagging(Bucket="tagged-bucket", Tagging=tag_set(fifty))
assert bucket_tags() == fifty
s3.put_bucket_tagging(Bucket="tagged-bucket", Tagging=tag_set({"cost-center": "42 a/b"}))
assert bucket_tags() == {"cost-center": "42 a/b"}

step("bucket tags that break S3's rules are InvalidTag, and the tags stay as they were")
for bad in [{f"k{i}": "v" for i in range(51)}, {"aws:x": "1"}, {"k": "v" * 257}, {"k": "#"}]:
    assert error_of(lambda: s3.put_bucket_tagging(
        Bucket="tagged-bucket", Tagging=tag_set(bad)))[1] == "InvalidTag", bad
assert bucket_tags() == {"cost-center": "42 a/b"}

step("a bucket's tags are not its objects' tags, nor the other way round")
s3.put_object(Bucket="tagged-bucket", Key="o", Body=b"o", Tagging="object=tag")
assert tags_of("o", "tagged-bucket") == {"object": "tag"}
assert bucket_tags() == {"cost-center": "42 a/b"}
s3.put_object(Bucket="tagged-bucket", Key="plain", Body=b"p")
assert tags_of("plain", "tagged-bucket") == {}

step("a missing bucket is NoSuchBucket; anonymous requests are refused")
assert error_of(lambda: s3.get_bucket_tagging(Bucket="no-such-bucket"))[1] == "NoSuchBucket"
assert error_of(lambda: s3.put_bucket_tagging(
    Bucket="no-such-bucket", Tagging=tag_set({"a": "b"})))[1] == "NoSuchBucket"
s3.put_bucket_tagging(Bucket="open-tags", Tagging=tag_set({"visible": "no"}))
assert error_of(lambda: anonymous.get_bucket_tagging(Bucket="open-tags"))[0] == 403
assert error_of(lambda: anonymous.delete_bucket_tagging(Bucket="open-tags"))[0] == 403
assert bucket_tags("open-tags") == {"visible": "no"}

step("DeleteBucketTagging takes them all off (204)")
answer = s3.delete_bucket_tagging(Bucket="tagged-bucket")
assert answer["ResponseMetadata"]["HTTPStatusCode"] == 204
assert error_of(lambda: s3.get_bucket_tagging(Bucket="tagged-bucket")) == (404, "NoSuchTagSet")
assert tags_of("o", "tagged-bucket") == {"object": "tag"}

print("object and bucket tagging: every check passed")
