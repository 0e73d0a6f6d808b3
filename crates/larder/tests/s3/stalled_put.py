"""A signed S3 PUT (a PutObject) whose body stops after 10 of its 100 bytes; prints the status
line and the error code of the answer, or TIMEOUT if none came within argv[5] seconds. With
`delete` after the wait, the same of a POST of a DeleteObjects (an XML body s3s reads whole).

usage: stalled_put.py ENDPOINT ACCESS_KEY SECRET BUCKET WAIT_SECONDS [delete]"""
import re
import socket
import sys
from urllib.parse import urlparse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

endpoint, key, secret, bucket, wait = sys.argv[1:6]
method, path = "PUT", f"/{bucket}/stalled"
if sys.argv[6:7] == ["delete"]:
    method, path = "POST", f"/{bucket}?delete"
url = f"{endpoint}{path}"
request = AWSRequest(method=method, url=url, headers={
    "Content-Length": "100",
    "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
})
S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
host = urlparse(endpoint)
sock = socket.create_connection((host.hostname, host.port))
head = f"{method} {path} HTTP/1.1\r\nHost: {host.netloc}\r\n"
for name, value in request.headers.items():
    if name.lower() != "host":
        head += f"{name}: {value}\r\n"
sock.sendall(head.encode() + b"\r\n" + b"x" * 10)
sock.settimeout(float(wait))
answer = b""
try:
    while b"</Error>" not in answer:
        data = sock.recv(65536)
        if not data:
            break
        answer += data
except socket.timeout:
    print("TIMEOUT")
    sys.exit(0)
status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
code = re.search(rb"<Code>([^<]*)</Code>", answer)
message = re.search(rb"<Message>([^<]*)</Message>", answer)
print(status, code.group(1).decode() if code else "-", message.group(1).decode() if message else "")
