"""What the S3 client scripts share: a boto3 client for the endpoint and key their command
line names (path-style, SigV4, no retries: a refusal must show, not be retried away), a step
marker for their output, and the status and code of a call that must fail; and an unsigned
client for anonymous requests to the same endpoint."""

import sys

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError


def client_from_argv():
    """The client for ENDPOINT KEY_ID SECRET, the script's first three arguments."""
    endpoint, key_id, secret = sys.argv[1:4]
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}))


def anonymous_from_argv():
    """An unsigned (anonymous) client for ENDPOINT, the script's first argument."""
    return boto3.client(
        "s3", endpoint_url=sys.argv[1], region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}))


def step(name):
    print(f"== {name}", flush=True)


def error_of(call):
    """(HTTP status, S3 error code) of a call that must fail."""
    try:
        call()
    except ClientError as err:
        return err.response["ResponseMetadata"]["HTTPStatusCode"], err.response["Error"]["Code"]
    raise AssertionError("the call succeeded")
