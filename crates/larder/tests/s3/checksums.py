"""S3's additional checksums (x-amz-checksum-*) with boto3, and an aws-chunked upload whose
checksum comes in the trailer (what boto3 sends over HTTPS), signed by hand.

Usage: checksums.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

import base64
import hashlib
import hmac
import http.client
import sys
import zlib
from datetime import datetime, timezone
from urllib.parse import urlparse

from s3test import client_from_argv, error_of

endpoint, key_id, secret = sys.argv[1:4]  # for the hand-signed aws-chunked request below
s3 = client_from_argv()


def b64(digest):
    return base64.b64encode(digest).decode()


def crc32(data):
    return b64(zlib.crc32(data).to_bytes(4, "big"))


s3.create_bucket(Bucket="sums")
body = b"checked bytes " * 1000

# Asked by algorithm: computed by the client and checked by the server; returned by PutObject,
# and by GetObject/HeadObject when asked for, of the whole object only.
put = s3.put_object(Bucket="sums", Key="sha", Body=body, ChecksumAlgorithm="SHA256")
assert put["ChecksumSHA256"] == b64(hashlib.sha256(body).digest()), put
got = s3.get_object(Bucket="sums", Key="sha", ChecksumMode="ENABLED")
assert got["Body"].read() == body
assert got["ChecksumSHA256"] == put["ChecksumSHA256"], got
head = s3.head_object(Bucket="sums", Key="sha", ChecksumMode="ENABLED")
assert head["ChecksumSHA256"] == put["ChecksumSHA256"], head
ranged = s3.get_object(Bucket="sums", Key="sha", ChecksumMode="ENABLED", Range="bytes=0-9")
assert "ChecksumSHA256" not in ranged, ranged
assert ranged["Body"].read() == body[:10]
plain = s3.head_object(Bucket="sums", Key="sha")
assert "ChecksumSHA256" not in plain, "only when asked"

# A copy keeps the checksum (the same bytes).
s3.copy_object(Bucket="sums", Key="sha-copy", CopySource={"Bucket": "sums", "Key": "sha"})
copied = s3.head_object(Bucket="sums", Key="sha-copy", ChecksumMode="ENABLED")
assert copied["ChecksumSHA256"] == put["ChecksumSHA256"], copied

# A value that does not match the body: BadDigest, and nothing is stored under the name.
assert error_of(lambda: s3.put_object(
    Bucket="sums", Key="wrong", Body=body, ChecksumCRC32=crc32(b"other"))) == (400, "BadDigest")
assert error_of(lambda: s3.head_object(Bucket="sums", Key="wrong"))[0] == 404
# Nor does a failed overwrite replace what was there.
assert error_of(lambda: s3.put_object(
    Bucket="sums", Key="sha", Body=b"new", ChecksumCRC32=crc32(b"old"))) == (400, "BadDigest")
assert s3.get_object(Bucket="sums", Key="sha")["Body"].read() == body
# A value that is no CRC32 at all (five bytes).
assert error_of(lambda: s3.put_object(
    Bucket="sums", Key="bad", Body=body, ChecksumCRC32="bm9wZSE=")) == (400, "InvalidRequest")

# The right value, given by the caller.
good = s3.put_object(Bucket="sums", Key="crc", Body=body, ChecksumCRC32=crc32(body))
assert good["ChecksumCRC32"] == crc32(body), good

# Multipart: each part is checked.
upload = s3.create_multipart_upload(Bucket="sums", Key="parts", ChecksumAlgorithm="CRC32")
upload_id = upload["UploadId"]
part = b"p" * (5 << 20)
assert error_of(lambda: s3.upload_part(
    Bucket="sums", Key="parts", UploadId=upload_id, PartNumber=1, Body=part,
    ChecksumCRC32=crc32(b"q"))) == (400, "BadDigest")
sent = s3.upload_part(Bucket="sums", Key="parts", UploadId=upload_id, PartNumber=1, Body=part,
                      ChecksumAlgorithm="CRC32")
assert sent["ChecksumCRC32"] == crc32(part), sent
parts = s3.list_parts(Bucket="sums", Key="parts", UploadId=upload_id)["Parts"]
assert [p["PartNumber"] for p in parts] == [1], "the refused part was not kept"
s3.abort_multipart_upload(Bucket="sums", Key="parts", UploadId=upload_id)


def sign_v4(method, path, headers, payload_hash):
    """Headers with a SigV4 Authorization for the request (region us-east-1, service s3)."""
    now = datetime.now(timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = dict(headers, **{"x-amz-date": amz_date, "x-amz-content-sha256": payload_hash})
    names = sorted(h.lower() for h in headers)
    canonical_headers = "".join(f"{n}:{headers[n].strip()}\n" for n in names)
    signed = ";".join(names)
    canonical = "\n".join([method, path, "", canonical_headers, signed, payload_hash])
    scope = f"{day}/us-east-1/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in [day, "us-east-1", "s3", "aws4_request"]:
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, "
                                f"SignedHeaders={signed}, Signature={signature}")
    return headers


def chunked_put(key, data, trailer_value):
    """An aws-chunked PutObject (STREAMING-UNSIGNED-PAYLOAD-TRAILER) whose CRC32 is in the
    trailer: (status, body of the answer)."""
    url = urlparse(endpoint)
    encoded = (f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n"
               + f"x-amz-checksum-crc32:{trailer_value}\r\n\r\n".encode())
    headers = sign_v4("PUT", f"/sums/{key}", {
        "host": url.netloc,
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
        "content-length": str(len(encoded)),
    }, "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("PUT", f"/sums/{key}", body=encoded, headers=headers)
    answer = conn.getresponse()
    result = answer.status, answer.read().decode(errors="replace"), dict(answer.getheaders())
    conn.close()
    return result


status, text, headers = chunked_put("trailed", b"hello", crc32(b"hello"))
assert status == 200, (status, text)
assert headers.get("x-amz-checksum-crc32") == crc32(b"hello"), headers
assert s3.get_object(Bucket="sums", Key="trailed")["Body"].read() == b"hello"
status, text, _ = chunked_put("trailed-wrong", b"hello", crc32(b"hellp"))
assert status == 400 and "BadDigest" in text, (status, text)
assert error_of(lambda: s3.head_object(Bucket="sums", Key="trailed-wrong"))[0] == 404

print("checksums: all checks passed")
