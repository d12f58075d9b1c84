"""What the coordinator tells an agent to run for one assignment: its ``start_work``, per job kind.

* ``process``: the submitted command on the ``process`` runtime.
* ``ddp``: the ``torchrun`` runtime, with

  - the rendezvous (:func:`core.rendezvous.rendezvous`): node 0 listens at the registered address of
    the worker holding shard 0 (its host name when it registered none);
  - ``downloads``: a presigned GET (one hour) of every input by its workspace key (an input prefix:
    every object under it), which the agent fetches to that path under the data root; the command's
    first word, the training script, is one of them;
  - ``resume_url``: a presigned GET of the job's last checkpoint, when there is one;
  - for shard 0 only (its rank 0 writes the checkpoints of the world): ``checkpoint_urls``, presigned
    PUTs of two keys under ``jobs/{name}/checkpoints/{job_id}/``, which the agent uses in turn, so
    that the upload in flight never overwrites the checkpoint a restart would resume from.

  The agent gets URLs for these keys alone, never credentials, and the workload gets neither.
* ``federated``: the ``nvflare-client`` runtime (the federated runtime fills in its own spec).

Presigning is local computation; listing an input prefix is one S3 call (run in a thread), made once
per placement and reused for every shard of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec

from core.errors import ResontechError
from core.objects import s3_client
from core.pricing import list_price_micros
from core.rendezvous import rendezvous
from core.settings import Settings
from gateway.workspace import bucket_for
from projections.registry import WorkerRecord
from projections.schedule import JobRecord
from schemas import Assignment, StartWork, WorkSpec

RUNTIME_OF_KIND = {"process": "process", "federated": "nvflare-client", "ddp": "torchrun"}
"""The agent runtime that runs each job kind."""
DOWNLOAD_URL_TTL_S = 60 * 60
"""Inputs and the checkpoint to resume from: fetched once, before the workload starts."""
CHECKPOINT_URL_TTL_S = 24 * 60 * 60
"""Checkpoint uploads happen all along a placement: a placement longer than this checkpoints no more
(the agent logs the refused upload) until it is placed again."""
MAX_DOWNLOADS = 256
"""Files one shard may fetch (each URL is ~0.5 KB of the start command); pack more into an archive."""
CHECKPOINT_SLOTS = 2


class WorkSpecError(ResontechError):
    """An assignment's work cannot be described (too many inputs, no object store); the job fails."""

    code = "work_spec"


def checkpoint_keys(job: JobRecord, epoch: int) -> list[str]:
    """The keys the checkpoints of one placement of ``job`` are uploaded to, in turn."""
    return [f"jobs/{job.name}/checkpoints/{job.job_id}/e{epoch}-{n}.ckpt" for n in range(CHECKPOINT_SLOTS)]


class StartCommands:
    """Builds start commands; presigns with ``s3`` (a boto3 client; ``None``: no object store, so
    only kinds that need no URLs can start).

    Args:
        s3: the kernel's object-store client.
    """

    def __init__(self, s3: Any | None) -> None:
        self.s3 = s3
        self._inputs: dict[tuple[str, str, int], dict[str, str]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> StartCommands:
        """Presigning with the object store of ``settings`` (signing is local: no request is made)."""
        return cls(
            s3_client(
                settings.s3_endpoint,
                settings.s3_access_key,
                settings.s3_secret_key,
                region=settings.s3_region,
                read_timeout=10.0,
            )
        )

    async def command(
        self, job: JobRecord, assignment: Assignment, *, tier: str, workers: Mapping[str, WorkerRecord]
    ) -> StartWork:
        """The ``start_work`` of ``assignment``, resuming from the job's last checkpoint.

        Raises:
            WorkSpecError: the job's work cannot be described; the message says why.
        """
        r = job.resources
        spec = WorkSpec(
            runtime=RUNTIME_OF_KIND.get(job.kind, job.kind),
            command=list(job.command),
            env=dict(job.env),
            gpus=r.gpus,
            vram_mb=r.vram_mb,
            cpus=r.cpus,
            pool=job.pool,
            tier=tier,
            shards=job.shards,
            resume_from=job.last_checkpoint.object_key if job.last_checkpoint else None,
        )
        if job.kind == "ddp":
            spec = await self._ddp(job, assignment, spec, workers)
        return StartWork(
            tenant=job.tenant,
            work_id=job.job_id,
            work_kind="job",
            assignment_id=assignment.assignment_id,
            slot=assignment.slot,
            epoch=assignment.epoch,
            spec=spec,
            price_micros_per_gpu_hour=list_price_micros(r.gpu_type, job.pool),
        )

    async def _ddp(
        self, job: JobRecord, assignment: Assignment, spec: WorkSpec, workers: Mapping[str, WorkerRecord]
    ) -> WorkSpec:
        holder = job.assignments.get("0")
        record = workers.get(holder.worker_id) if holder is not None else None
        if record is None:
            raise WorkSpecError("the worker holding shard 0 is unknown: no rendezvous address")
        s3 = self._s3()
        bucket = bucket_for(job.tenant)
        uploads = checkpoint_keys(job, assignment.epoch) if assignment.slot == 0 else []
        return msgspec.structs.replace(
            spec,
            downloads=await self._downloads(job, assignment.epoch),
            resume_url=_get(s3, bucket, spec.resume_from) if spec.resume_from else None,
            checkpoint_urls={key: _put(s3, bucket, key) for key in uploads},
            rendezvous=rendezvous(
                tenant=job.tenant,
                job_id=job.job_id,
                epoch=assignment.epoch,
                master_addr=record.address or record.hostname,
                nnodes=job.shards,
                node_rank=assignment.slot,
                gpus=job.resources.gpus,
            ),
        )

    async def _downloads(self, job: JobRecord, epoch: int) -> dict[str, str]:
        """Presigned GETs of every input object of one placement, by key (listed once per placement)."""
        cache_key = (job.tenant, job.job_id, epoch)
        if cache_key not in self._inputs:
            s3 = self._s3()
            bucket = bucket_for(job.tenant)
            keys = await asyncio.to_thread(_input_keys, s3, bucket, job.inputs)
            if len(keys) > MAX_DOWNLOADS:
                raise WorkSpecError(
                    f"the job's inputs hold {len(keys)} files, more than the {MAX_DOWNLOADS} a shard may "
                    "fetch: pack them into fewer files (a ZIP of each shard's data)"
                )
            if len(self._inputs) >= 256:
                self._inputs.clear()
            self._inputs[cache_key] = {key: _get(s3, bucket, key) for key in keys}
        return dict(self._inputs[cache_key])

    def _s3(self) -> Any:
        if self.s3 is None:
            raise WorkSpecError("the coordinator has no object store to presign the job's URLs with")
        return self.s3


def _get(s3: Any, bucket: str, key: str) -> str:
    url: str = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=DOWNLOAD_URL_TTL_S
    )
    return url


def _put(s3: Any, bucket: str, key: str) -> str:
    url: str = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=CHECKPOINT_URL_TTL_S
    )
    return url


def _input_keys(s3: Any, bucket: str, inputs: list[str]) -> list[str]:
    """Every object key the inputs name: a key as is, a prefix (ending in ``/``) as what it holds."""
    keys: list[str] = []
    for item in inputs:
        if not item.endswith("/"):
            keys.append(item)
            continue
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=item):
            keys += [str(o["Key"]) for o in page.get("Contents", []) if not str(o["Key"]).endswith("/")]
            if len(keys) > MAX_DOWNLOADS:
                break
    return list(dict.fromkeys(keys))
