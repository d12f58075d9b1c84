"""The kind-specific part of a job's ``start_work``: what :func:`ops.coordinator.start_command` adds to
the spec every job gets.

A federated shard runs the ``nvflare-client`` runtime (:mod:`agent.runtimes.nvflare`). It can start
only once the job's federation is provisioned (``job.federation_ready``): until then there is no spec
and the coordinator sends nothing. Its spec carries the slot's NVFlare identity and two presigned GETs,
made when the command is sent, valid for an hour and usable without any credential: the slot's
client startup kit (from the kernel's kit bucket, fetched as ``startup-kit.zip``) and the slot's shard
ZIP (from the tenant's workspace, fetched under its workspace key, as every job input is). Not the
job's other inputs: a federated shard sees its own shard and nothing else of the workspace (its
training code reaches it through NVFlare). A replacement for a lost worker gets the same identity
and shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from agent.runtimes.nvflare import KIT_FILE
from gateway.workspace import bucket_for
from projections.schedule import JobRecord
from schemas import WorkSpec

Presign = Callable[[str, str], str]
"""``presign(bucket, key)`` -> a GET URL valid for an hour (:meth:`ops.inputs.Presigner.url`)."""


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
            KIT_FILE: presign(federation.kit_bucket, federation.kits[slot]),
            shard: presign(bucket_for(job.tenant), shard),
        },
        options={
            "site": federation.sites[slot],
            "server": federation.server,
            "shard": shard,
            "rounds": str(job.rounds or 0),
            "local_epochs": str(job.local_epochs or 1),
        },
    )
