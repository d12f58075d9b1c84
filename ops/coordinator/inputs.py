"""A job's inputs as the agent receives them: presigned GETs, valid one hour, of every workspace
object the job names (a key ending in ``/`` names every object under that prefix).

The coordinator adds them to each ``start_work`` command (``WorkSpec.downloads``: relative path in
the assignment's working dir -> URL), so the agent fetches exactly those objects and holds no
object-store credentials. Objects keep their workspace path: ``scripts/train.py`` is
``<workdir>/scripts/train.py``, as the tenant's command expects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from core.errors import ResontechError
from core.objects import bucket_for, s3_client
from core.settings import Settings

URL_TTL_S = 3600
MAX_PREFIX_OBJECTS = 10_000
"""A prefix with more objects than this is refused: a job is not a bulk copy."""


class InputError(ResontechError):
    """A job's inputs cannot be presigned (the message says which and why)."""

    code = "inputs"


class Presigner:
    """Presigns a tenant's workspace objects with the kernel's object-store credentials."""

    def __init__(self, settings: Settings) -> None:
        self.s3 = s3_client(
            settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, region=settings.s3_region
        )

    def url(self, bucket: str, key: str, *, put: bool = False, ttl_s: int = URL_TTL_S) -> str:
        """A GET (or with ``put`` a PUT) of one object, valid ``ttl_s`` seconds (default
        :data:`URL_TTL_S`; signing is local: no request is made)."""
        method = "put_object" if put else "get_object"
        url: str = self.s3.generate_presigned_url(
            method, Params={"Bucket": bucket, "Key": key}, ExpiresIn=ttl_s
        )
        return url

    def downloads(self, tenant: str, inputs: Sequence[str]) -> dict[str, str]:
        """``{workspace key: presigned GET}`` for every object ``inputs`` names (blocking)."""
        bucket = bucket_for(tenant)
        keys: list[str] = []
        for name in inputs:
            keys += self._expand(bucket, name) if name.endswith("/") else [name]
        return {key: self.url(bucket, key) for key in dict.fromkeys(keys)}

    def _expand(self, bucket: str, prefix: str) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", []) if not item["Key"].endswith("/")]
            if len(keys) > MAX_PREFIX_OBJECTS:
                raise InputError(f"{prefix} holds more than {MAX_PREFIX_OBJECTS:,} objects")
        if not keys:
            raise InputError(f"no objects under {prefix} in the workspace")
        return keys

    async def downloads_async(self, tenant: str, inputs: Sequence[str]) -> dict[str, Any]:
        return await asyncio.to_thread(self.downloads, tenant, inputs)
