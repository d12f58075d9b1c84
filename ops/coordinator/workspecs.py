"""The kind-specific part of an assignment's ``start_work``: what the coordinator adds to the spec
every job gets (the command, the environment and the presigned inputs of :mod:`ops.coordinator.inputs`):
:func:`ddp_spec` for a ``ddp`` shard, :func:`federated_spec` for a ``federated`` one.

A ``ddp`` shard runs the ``torchrun`` runtime (:mod:`agent.runtimes.torchrun`), one node per shard,
and its spec carries:

* the rendezvous (:func:`core.rendezvous.rendezvous`): node 0 listens at the registered address of
  the worker holding shard 0 (its host name when it registered none);
* ``resume_url``: a presigned GET (one hour) of the job's last checkpoint, when there is one;
* for shard 0 only (its rank 0 writes the checkpoints of the world): ``checkpoint_urls``, presigned
  PUTs of two keys under ``jobs/{name}/checkpoints/{job_id}/``, which the agent uses in turn, so
  that the upload in flight never overwrites the checkpoint a restart would resume from;
* for every shard: ``part_urls``, presigned PUTs of its own keys for the parts of sharded
  checkpoints (:func:`projections.checkpoints.part_keys`); and, when the checkpoint to resume from
  is a set of parts, ``resume_parts`` (a GET of every part, one hour) and ``resume_step``.

The agent gets URLs for these keys alone, never credentials, and the workload gets neither.
Presigning is local computation: no request is made.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from core.errors import ResontechError
from core.flare import KIT_FILE
from core.objects import bucket_for
from core.rendezvous import rendezvous
from ops.coordinator.inputs import Presigner
from projections.checkpoints import checkpoint_prefix, part_keys
from projections.registry import WorkerRecord
from projections.schedule import JobRecord
from schemas.commands import WorkSpec
from schemas.values import Assignment

CHECKPOINT_URL_TTL_S = 24 * 60 * 60
"""Checkpoint uploads happen all along a placement: a placement longer than this checkpoints no more
(the agent logs the refused upload) until it is placed again."""
CHECKPOINT_SLOTS = 2


class WorkSpecError(ResontechError):
    """An assignment's work cannot be described; the job fails with the message."""

    code = "work_spec"


def checkpoint_keys(job: JobRecord, epoch: int) -> list[str]:
    """The keys the checkpoints of one placement of ``job`` are uploaded to, in turn."""
    return [f"{checkpoint_prefix(job)}e{epoch}-{n}.ckpt" for n in range(CHECKPOINT_SLOTS)]


def ddp_spec(
    job: JobRecord,
    assignment: Assignment,
    base: WorkSpec,
    presigner: Presigner,
    workers: Mapping[str, WorkerRecord],
) -> WorkSpec:
    """The spec of one ``ddp`` shard: ``base`` plus its rendezvous and checkpoint URLs.

    Raises:
        WorkSpecError: the worker holding shard 0 is unknown (no address to meet at).
    """
    holder = job.assignments.get("0")
    record = workers.get(holder.worker_id) if holder is not None else None
    if record is None:
        raise WorkSpecError("the worker holding shard 0 is unknown: no rendezvous address")
    uploads = checkpoint_keys(job, assignment.epoch) if assignment.slot == 0 else []
    bucket, resume, last = bucket_for(job.tenant), base.resume_from, job.last_checkpoint
    parts = last.parts if last is not None and resume == last.object_key else []

    def put(key: str) -> str:
        return presigner.url(bucket, key, put=True, ttl_s=CHECKPOINT_URL_TTL_S)

    return msgspec.structs.replace(
        base,
        resume_url=presigner.url(bucket, resume) if resume and not parts else None,
        resume_parts={key: presigner.url(bucket, key) for key in parts},
        resume_step=last.step if parts and last is not None else None,
        checkpoint_urls={key: put(key) for key in uploads},
        part_urls={key: put(key) for key in part_keys(job, assignment.epoch, assignment.slot)},
        rendezvous=rendezvous(
            tenant=job.tenant,
            job_id=job.job_id,
            epoch=assignment.epoch,
            master_addr=record.registration.address or record.registration.hostname,
            nnodes=job.spec.shards,
            node_rank=assignment.slot,
            gpus=job.spec.resources.gpus,
        ),
    )


def federated_spec(
    job: JobRecord, assignment: Assignment, base: WorkSpec, presigner: Presigner
) -> WorkSpec | None:
    """The spec of one ``federated`` shard, or ``None`` while the job's federation is not ready.

    It runs the ``nvflare-client`` runtime (:mod:`agent.runtimes.nvflare`) with the slot's NVFlare
    identity (``options["site"]``) and presigned GETs, one hour each: the slot's client startup kit
    from the kernel's kit bucket (fetched as :data:`agent.runtimes.nvflare.KIT_FILE`) and, when the
    job has shards, the slot's shard ZIP from the tenant's workspace (fetched under its workspace
    key, named by ``options["shard"]``; a job without shards has neither, and its sites start with an
    empty data folder). Not the job's other inputs: a federated shard sees its own shard and nothing
    else of the workspace (its training code reaches it through NVFlare). A replacement for a lost
    worker gets the same identity and shard.
    """
    federation = job.federation
    if federation is None or assignment.slot >= len(federation.sites):
        return None
    slot = assignment.slot
    shard = federation.shards[slot] if federation.shards else None
    downloads = {KIT_FILE: presigner.url(federation.kit_bucket, federation.kits[slot])}
    options = {
        "site": federation.sites[slot],
        "server": federation.server,
        "rounds": str(job.spec.rounds or 0),
        "local_epochs": str(job.spec.local_epochs or 1),
    }
    if shard is not None:
        downloads[shard] = presigner.url(bucket_for(job.tenant), shard)
        options["shard"] = shard
    return msgspec.structs.replace(
        base, runtime="nvflare-client", command=[], resume_from=None, downloads=downloads, options=options
    )
