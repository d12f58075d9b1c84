"""The kind-specific part of a job's ``start_work``: what :func:`ops.coordinator.start_command` adds to
the spec every job gets.

A federated shard runs the ``nvflare-client`` runtime (:mod:`agent.runtimes.nvflare`). It can start
only once the job's federation is provisioned (``job.federation_ready``): until then there is no spec
and the coordinator sends nothing. Its spec carries the slot's NVFlare identity and two presigned GETs,
made when the command is sent, valid for an hour and usable without any credential: the slot's
client startup kit (from the kernel's kit bucket) and the slot's shard ZIP (from the tenant's
workspace). A replacement for a lost worker gets the same identity and shard. Nothing else of the
tenant's workspace is reachable from the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from core.objects import s3_client
from core.settings import Settings
from gateway.workspace import DOWNLOAD_URL_TTL_S, bucket_for
from projections.schedule import JobRecord
from schemas import WorkSpec

Presign = Callable[[str, str], str]
"""``presign(bucket, key)`` -> a GET URL valid for an hour."""


def presigner(settings: Settings) -> Presign:
    """A :data:`Presign` for the object store of ``settings`` (signing is local: no request is made)."""
    s3 = s3_client(
        settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, region=settings.s3_region
    )

    def presign(bucket: str, key: str) -> str:
        params = {"Bucket": bucket, "Key": key}
        url: str = s3.generate_presigned_url("get_object", Params=params, ExpiresIn=DOWNLOAD_URL_TTL_S)
        return url

    return presign


def federated_spec(job: JobRecord, assignment: Any, base: WorkSpec, presign: Presign) -> WorkSpec | None:
    """The spec of one federated shard, or ``None`` while the job's federation is not ready."""
    federation = job.federation
    if federation is None or assignment.slot >= len(federation.sites):
        return None
    slot = assignment.slot
    shard = federation.shards[slot]
    return msgspec.structs.replace(
        base,
        runtime="nvflare-client",
        command=[],
        resume_from=None,
        downloads={
            "kit.zip": presign(federation.kit_bucket, federation.kits[slot]),
            "shard.zip": presign(bucket_for(job.tenant), shard),
        },
        options={
            "site": federation.sites[slot],
            "server": federation.server,
            "shard": shard,
            "rounds": str(job.rounds or 0),
            "local_epochs": str(job.local_epochs or 1),
        },
    )
