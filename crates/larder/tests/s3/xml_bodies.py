"""Faulty request bodies, sent signed over HTTP/1.1 with http.client: the XML bodies s3s reads
whole (here DeleteObjects) at and past Larder's bound, and wrong `x-amz-content-sha256`s on
a DeleteObjects and a PutObject. Prints one line per case (its name, the status and the error
code, or OK) and whether what the bodies would have deleted or stored is there.

usage: xml_bodies.py ENDPOINT ACCESS_KEY SECRET READER_KEY READER_SECRET BUCKET"""
import http.client
import re
import sys
from urllib.parse import urlparse

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

endpoint, key, secret, reader_key, reader_secret, bucket = sys.argv[1:7]
BOUND = 8 << 20
host = urlparse(endpoint)
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                  aws_secret_access_key=secret, region_name="us-east-1",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
s3.put_object(Bucket=bucket, Key="kept", Body=b"still here")


def delete_body(size):
    """A DeleteObjects of `kept`, padded with whitespace to `size` bytes (XML allows it)."""
    xml = b"<Delete><Object><Key>kept</Key></Object></Delete>"
    return xml + b" " * (size - len(xml))


def send(name, body, chunked=False, creds=(key, secret), signed=None, method="POST",
         path=f"/{bucket}?delete"):
    """Sends `body`, signed as if it were `signed` (botocore signs the SHA-256 of the body
    over plain HTTP), and prints the case's line."""
    headers = {} if chunked else {"Content-Length": str(len(body))}
    data = body if signed is None else signed
    request = AWSRequest(method=method, url=f"{endpoint}{path}", headers=headers, data=data)
    S3SigV4Auth(Credentials(*creds), "s3", "us-east-1").add_auth(request)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    sent = dict(request.headers)
    if chunked:
        sent["Transfer-Encoding"] = "chunked"
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host.netloc)
    for header, value in sent.items():
        if header.lower() != "host":
            conn.putheader(header, value)
    conn.endheaders()
    try:
        if chunked:
            for i in range(0, len(body), 1 << 20):
                piece = body[i:i + (1 << 20)]
                conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            for i in range(0, len(body), 1 << 20):
                conn.send(body[i:i + (1 << 20)])
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered and closed before the whole body was sent
    answer = conn.getresponse()
    text = answer.read()
    code = re.search(rb"<Code>([^<]*)</Code>", text)
    print(name, answer.status, code.group(1).decode() if code else "OK", flush=True)


def exists(name):
    try:
        s3.head_object(Bucket=bucket, Key=name)
        return True
    except s3.exceptions.ClientError:
        return False


send("over", delete_body(BOUND + 1))
send("over_by_a_reader", delete_body(BOUND + 1), creds=(reader_key, reader_secret))
send("chunked", delete_body(1024), chunked=True)
send("whitespace", b" " * (1 << 20))
send("wrong_hash", delete_body(1024), signed=b"other")
send("wrong_hash_put", b"x" * 100_000, signed=b"other", method="PUT", path=f"/{bucket}/put")
print("put_stored", exists("put"))
print("kept", s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"still here")
send("at", delete_body(BOUND))
print("kept_after_the_bound", exists("kept"))
