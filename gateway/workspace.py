"""Each tenant's workspace: a private bucket in the object store.

Blocking boto3 calls; the routes run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

BUCKET_PREFIX = "rt-"


def bucket_for(tenant: str) -> str:
    """The tenant's bucket name (tenant ids are already valid bucket-name material)."""
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
