"""The workspace objects a job or endpoint references: are the keys well formed, do they exist?

A submission is refused (422 ``missing_objects``) while any object it names is absent from the
tenant's bucket: a job must not wait in a queue for an hour and then fail on a typo. A key ending in
``/`` names a prefix, which must hold at least one object (``jobs/mnist/shards/``). boto3 blocks, so
every check runs in a thread, a few at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gateway.errors import ApiError

CONCURRENT_CHECKS = 16
LISTED_IN_ERROR = 50
"""At most this many missing keys are named in the error message (the count is always given)."""
_MISSING = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})


def key_problem(key: str) -> str | None:
    """What is wrong with ``key`` as a workspace object key, or ``None``."""
    if key.startswith("/"):
        return f"{key!r} starts with '/': workspace keys are relative (scripts/train.py)"
    if any(part in ("", ".", "..") for part in key.rstrip("/").split("/")):
        return f"{key!r} has an empty, '.' or '..' path segment"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        return f"{key!r} contains a control character"
    if len(key.encode()) > 1024:
        return f"{key[:40]!r}... is longer than 1024 bytes"
    return None


def _exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        if key.endswith("/"):
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
            return bool(listed.get("KeyCount", 0))
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in _MISSING:
            return False
        raise


async def missing_objects(s3: Any, bucket: str, keys: Sequence[str]) -> list[str]:
    """The keys of ``keys`` that are not in ``bucket``, in the order given (duplicates once).

    Raises:
        ApiError: 503 when the object store cannot answer.
    """
    unique = list(dict.fromkeys(keys))
    gate = asyncio.Semaphore(CONCURRENT_CHECKS)

    async def check(key: str) -> bool:
        async with gate:
            return await asyncio.to_thread(_exists, s3, bucket, key)

    try:
        found = await asyncio.gather(*(check(key) for key in unique))
    except (ClientError, BotoCoreError) as exc:
        raise ApiError(503, "object_store_unavailable", f"cannot check the workspace: {exc}") from None
    return [key for key, there in zip(unique, found, strict=True) if not there]


def missing_error(bucket: str, missing: Sequence[str]) -> ApiError:
    """422 ``missing_objects`` naming the missing keys."""
    shown = ", ".join(missing[:LISTED_IN_ERROR])
    more = f" and {len(missing) - LISTED_IN_ERROR} more" if len(missing) > LISTED_IN_ERROR else ""
    noun = "object is" if len(missing) == 1 else "objects are"
    return ApiError(
        422,
        "missing_objects",
        f"{len(missing)} referenced {noun} not in your workspace (bucket {bucket}): {shown}{more}; "
        "upload them first (a key ending in '/' needs at least one object under it)",
    )
