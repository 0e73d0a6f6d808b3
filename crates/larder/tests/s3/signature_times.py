"""Signed requests and time: a request signed more than 15 minutes from the server's clock is
refused (403 RequestTimeTooSkewed) whether SigV4 or SigV2 signed it, so a captured request
cannot be replayed later, and nothing it asked for happens; a SigV2 request needs a date
(403 AccessDenied without one); SigV2 clients work for buckets as well as objects.

Usage: signature_times.py ENDPOINT KEY_ID SECRET
Every check asserts; the first failure exits non-zero with its message.
"""

import datetime
import hashlib
import sys
import urllib.error
import urllib.request

import boto3
import botocore.auth
from botocore.auth import HmacV1Auth, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from s3test import client_from_argv, error_of, step

endpoint, key_id, secret = sys.argv[1:4]
s3 = client_from_argv()
credentials = Credentials(key_id, secret)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def send(request):
    """(status, body) of a prepared AWSRequest, sent as it is."""
    data = request.body if request.body else None
    sent = urllib.request.Request(request.url, data=data, method=request.method,
                                  headers=dict(request.headers))
    try:
        with urllib.request.urlopen(sent, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def sigv4_at(when, method, path, body=b""):
    """A SigV4 header-signed request as a client whose clock reads `when` signs it."""
    real = botocore.auth.datetime.datetime

    class Clock(real):
        @classmethod
        def utcnow(cls):
            return when.replace(tzinfo=None)

        @classmethod
        def now(cls, tz=None):
            return when if tz else when.replace(tzinfo=None)

    request = AWSRequest(method=method, url=endpoint + path, data=body,
                         headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
    botocore.auth.datetime.datetime = Clock
    try:
        S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
    finally:
        botocore.auth.datetime.datetime = real
    return request


def sigv2_dated(date, method, path):
    """A SigV2 header-signed request whose Date is `date` (None: no date at all)."""
    request = AWSRequest(method=method, url=endpoint + path)
    signer = HmacV1Auth(credentials)
    signer._get_date = lambda: date or ""
    signer.add_auth(request)
    if date is None:
        del request.headers["Date"]
    return request


now = datetime.datetime.now(datetime.timezone.utc)
s3.create_bucket(Bucket="times")
s3.put_object(Bucket="times", Key="here", Body=b"present")

step("a SigV4 request signed now is served; one signed 20 minutes ago or ahead is not")
assert send(sigv4_at(now, "GET", "/times/here")) == (200, b"present")
for skew in (datetime.timedelta(minutes=-20), datetime.timedelta(minutes=20),
             datetime.timedelta(days=-365)):
    status, body = send(sigv4_at(now + skew, "GET", "/times/here"))
    assert status == 403 and b"<Code>RequestTimeTooSkewed</Code>" in body, (skew, status, body)

step("a stale SigV4 PUT and DELETE change nothing")
status, body = send(sigv4_at(now - datetime.timedelta(hours=1), "PUT", "/times/new", b"late"))
assert status == 403 and b"RequestTimeTooSkewed" in body, (status, body)
assert error_of(lambda: s3.head_object(Bucket="times", Key="new"))[0] == 404
status, _ = send(sigv4_at(now - datetime.timedelta(hours=1), "DELETE", "/times/here"))
assert status == 403, status
assert s3.get_object(Bucket="times", Key="here")["Body"].read() == b"present"

step("SigV2: a stale date is skewed, a missing or unreadable one is refused")
fresh = now.strftime("%a, %d %b %Y %H:%M:%S GMT")
assert send(sigv2_dated(fresh, "GET", "/times/here")) == (200, b"present")
stale = (now - datetime.timedelta(days=365)).strftime("%a, %d %b %Y %H:%M:%S GMT")
status, body = send(sigv2_dated(stale, "GET", "/times/here"))
assert status == 403 and b"<Code>RequestTimeTooSkewed</Code>" in body, (status, body)
for date in (None, "Bad Date"):
    status, body = send(sigv2_dated(date, "GET", "/times/here"))
    assert status == 403 and b"<Code>AccessDenied</Code>" in body, (date, status, body)

step("a SigV2 client makes, fills, lists, empties and deletes a bucket")
v2 = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(signature_version="s3", s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}))
v2.create_bucket(Bucket="old-client")
v2.put_object(Bucket="old-client", Key="a", Body=b"v2")
assert v2.get_object(Bucket="old-client", Key="a")["Body"].read() == b"v2"
assert [o["Key"] for o in v2.list_objects(Bucket="old-client")["Contents"]] == ["a"]
v2.delete_object(Bucket="old-client", Key="a")
v2.delete_bucket(Bucket="old-client")
assert error_of(lambda: s3.head_bucket(Bucket="old-client"))[0] == 404
print("ok")
