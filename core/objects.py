"""The object store: a tenant's bucket, and one way to build a boto3 S3 client for any S3-compatible
endpoint.

Path-style addressing and SigV4 everywhere, presigning included: boto3 presigns with SigV2 for a
custom endpoint unless told otherwise, and S3-compatible servers (rclone, Garage) refuse SigV2.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

BUCKET_PREFIX = "rt-"
"""A tenant's workspace is the bucket ``rt-<tenant>`` (tenant ids are valid bucket-name material)."""


def bucket_for(tenant: str) -> str:
    """The tenant's bucket name."""
    return f"{BUCKET_PREFIX}{tenant}"


def provision(s3: Any, bucket: str) -> None:
    """Create ``bucket`` if it does not exist (idempotent: a retried tenant creation is fine)."""
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise


def s3_client(
    endpoint: str,
    access_key: str,
    secret_key: str,
    *,
    region: str = "us-east-1",
    retries: int = 3,
    read_timeout: float = 30.0,
) -> Any:
    """A boto3 S3 client for an S3-compatible endpoint.

    Args:
        endpoint: ``http://host:port``.
        access_key / secret_key: the key pair.
        region: the region name sent to the server (and signed into presigned URLs).
        retries: total attempts per call (botocore ``max_attempts``).
        read_timeout: seconds to wait for a response.
    """
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": retries},
        connect_timeout=2,
        read_timeout=read_timeout,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=config,
    )
