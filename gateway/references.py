"""The workspace objects a job or endpoint references: are the keys well formed, do they exist?

A submission is refused (422 ``missing_objects``) while any object it names is absent from the
tenant's bucket: a job must not wait in a queue for an hour and then fail on a typo. A key ending in
``/`` names a prefix, which must hold at least one object (``jobs/mnist/shards/``). boto3 blocks, so
every check runs in a thread, a few at once.

An object seen to exist is remembered for :data:`SEEN_TTL_S` (:class:`SeenObjects`): a sweep of a
thousand jobs naming the same script checks it once, not a thousand times (a boto3 HEAD costs about
5 ms of CPU, which capped submissions at a few dozen a second on two cores). Deletes through the API
forget the key at once; an object deleted behind the API's back is caught by the job itself, which
fails naming the key, as it would if it were deleted a second after an uncached check.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gateway.errors import ApiError

CONCURRENT_CHECKS = 16
SEEN_TTL_S = 30.0
SEEN_MAX = 100_000
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


class SeenObjects:
    """Objects (or prefixes) recently seen to exist: ``(bucket, key)`` -> when that expires."""

    def __init__(self, ttl_s: float = SEEN_TTL_S, max_entries: int = SEEN_MAX) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._until: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __contains__(self, item: tuple[str, str]) -> bool:
        until = self._until.get(item)
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[item]
            return False
        return True

    def add(self, bucket: str, key: str) -> None:
        self._until[(bucket, key)] = time.monotonic() + self.ttl_s
        self._until.move_to_end((bucket, key))
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def forget(self, bucket: str, key: str) -> None:
        """``key`` was deleted: forget it, and every prefix it made non-empty."""
        self._until.pop((bucket, key), None)
        parts = key.split("/")
        for n in range(1, len(parts)):
            self._until.pop((bucket, "/".join(parts[:n]) + "/"), None)


async def missing_objects(
    s3: Any, bucket: str, keys: Sequence[str], seen: SeenObjects | None = None
) -> list[str]:
    """The keys of ``keys`` that are not in ``bucket``, in the order given (duplicates once).

    Raises:
        ApiError: 503 when the object store cannot answer.
    """
    unique = list(dict.fromkeys(keys))
    gate = asyncio.Semaphore(CONCURRENT_CHECKS)

    async def check(key: str) -> bool:
        if seen is not None and (bucket, key) in seen:
            return True
        async with gate:
            there = await asyncio.to_thread(_exists, s3, bucket, key)
        if there and seen is not None:
            seen.add(bucket, key)
        return there

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


async def require_objects(s3: Any, bucket: str, keys: Sequence[str], seen: SeenObjects | None = None) -> None:
    """422 ``missing_objects`` unless every key of ``keys`` is in ``bucket``."""
    missing = await missing_objects(s3, bucket, keys, seen)
    if missing:
        raise missing_error(bucket, missing)


def _list(s3: Any, bucket: str, prefix: str, limit: int) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.extend((item["Key"], int(item["Size"])) for item in page.get("Contents", []))
        if len(found) > limit:
            break
    return found


async def listing(s3: Any, bucket: str, prefix: str, limit: int) -> list[tuple[str, int]]:
    """``(key, size)`` of the objects under ``prefix``: all of them, or more than ``limit``.

    Raises:
        ApiError: 503 when the object store cannot answer.
    """
    try:
        return await asyncio.to_thread(_list, s3, bucket, prefix, limit)
    except (ClientError, BotoCoreError) as exc:
        raise ApiError(503, "object_store_unavailable", f"cannot list the workspace: {exc}") from None
