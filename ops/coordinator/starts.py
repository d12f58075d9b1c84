"""Start commands: the ``start_work`` each placed shard's agent receives, and their sending.

Kept apart from :mod:`ops.coordinator.service` (which calls :meth:`Starts.send` once per step). A
shard's command carries its job's spec, its inputs presigned (:mod:`ops.coordinator.inputs`), the
worker's tier and the list price, and resumes from the job's last checkpoint; a ``ddp`` shard's adds
its rendezvous and checkpoint URLs, a federated one's its site (:mod:`ops.coordinator.workspecs`).

Sending is idempotent: the command id is derived from the assignment id, so a command sent twice is
stored once. A command that could not go out (the object store or the log did not answer) is tried
again the next step; a job whose inputs are gone, or whose spec cannot be made, fails.

It is built from what it uses: the appender, read-only views of the schedule and the registry, the
presigner and the clock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection, Iterator
from typing import Any

import msgspec

from core.pricing import list_price_micros
from ops.coordinator.appender import Appender
from ops.coordinator.inputs import InputError, Presigner
from ops.coordinator.pipeline import pipelined
from ops.coordinator.views import SYSTEM_CLOCK, Clock, View, jobs_in_order
from ops.coordinator.workspecs import WorkSpecError, ddp_spec, federated_spec
from projections.candidates import tier_of
from projections.registry import RegistryState
from projections.schedule import TERMINAL, JobRecord, ScheduleState
from schemas.commands import StartWork, WorkSpec
from schemas.jobs import JobFailed
from schemas.values import Assignment

log = logging.getLogger("resontech.coordinator")

RUNTIME_OF_KIND = {"process": "process", "federated": "nvflare-client", "ddp": "torchrun"}
"""The agent runtime that runs each job kind."""


def start_command(
    job: JobRecord, assignment: Any, tier: str = "unverified", downloads: dict[str, str] | None = None
) -> StartWork:
    """The ``start_work`` command for one assignment of ``job``; resumes from its last checkpoint.
    ``downloads`` are the job's inputs, presigned (:mod:`ops.coordinator.inputs`)."""
    resources = job.spec.resources
    return StartWork(
        tenant=job.tenant,
        work_id=job.job_id,
        work_kind="job",
        assignment_id=assignment.assignment_id,
        slot=assignment.slot,
        epoch=assignment.epoch,
        spec=WorkSpec(
            runtime=RUNTIME_OF_KIND.get(job.spec.kind, job.spec.kind),
            command=list(job.spec.command),
            env=dict(job.spec.env),
            downloads=dict(downloads or {}),
            gpus=resources.gpus,
            vram_mb=resources.vram_mb,
            cpus=resources.cpus,
            memory_mb=resources.memory_mb,
            pool=job.spec.pool,
            tier=tier,
            shards=job.spec.shards,
            resume_from=job.last_checkpoint.object_key if job.last_checkpoint else None,
            image=job.spec.image,
            options={"strategy": job.spec.strategy or "ddp"} if job.spec.kind == "ddp" else {},
        ),
        price_micros_per_gpu_hour=list_price_micros(resources.gpu_type, job.spec.pool),
    )


class Starts:
    """The start commands of a :class:`~ops.coordinator.Coordinator`'s jobs (see the module docstring).

    Args:
        appender: where its appends and commands go.
        schedule: the jobs, read-only.
        registry: the workers (their tiers and addresses), read-only.
        presigner: signs the jobs' inputs and a ``ddp`` job's checkpoint URLs.
        clock: the wall clock a worker's tier is read at.

    Attributes:
        commanded: assignments whose ``start_work`` this process sent.
    """

    def __init__(
        self,
        *,
        appender: Appender,
        schedule: View[ScheduleState],
        registry: View[RegistryState],
        presigner: Presigner,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.appender, self.schedule, self.registry = appender, schedule, registry
        self.presigner, self.clock = presigner, clock
        self.commanded: set[str] = set()
        self._unsent: set[str] = set()  # jobs whose start command failed to go out

    async def send(self, jobs: Collection[str] | None = None) -> None:
        """Send ``start_work`` for every current assignment not yet started (idempotent by id), of
        the jobs that changed (``None``: all) and those whose command failed to go out."""
        keys = None if jobs is None else set(jobs) | self._unsent
        self._unsent = set()
        await pipelined(self._starts(keys))

    def _starts(self, keys: Collection[str] | None) -> Iterator[Awaitable[None]]:
        for key, job in jobs_in_order(self.schedule.state, keys):
            if job.state in TERMINAL:
                continue
            for slot, assignment in job.assignments.items():
                if slot not in job.started and assignment.assignment_id not in self.commanded:
                    yield self._send_start(key, job, assignment)

    async def _send_start(self, key: str, job: JobRecord, assignment: Assignment) -> None:
        downloads = await self._downloads(key, job, assignment)
        if downloads is None:
            return
        record = self.registry.state.workers.get(assignment.worker_id)
        tier = tier_of(record, self.clock.wall_ns()) if record else "unverified"
        command = await self._command(job, assignment, start_command(job, assignment, tier, downloads))
        if command is None:
            return
        if not await self.appender.send(assignment.worker_id, command, f"start-{assignment.assignment_id}"):
            self._unsent.add(key)
            return
        self.commanded.add(assignment.assignment_id)

    async def _downloads(self, key: str, job: JobRecord, assignment: Assignment) -> dict[str, str] | None:
        """The job's inputs, presigned; ``None`` when the job failed for want of one, or the object
        store did not answer (tried again next step)."""
        if not job.spec.inputs or job.spec.kind == "federated":  # a federated shard gets its own shard
            return {}
        try:
            return await self.presigner.downloads_async(job.tenant, job.spec.inputs)
        except InputError as exc:
            reason = f"input missing at start: {exc}"
            await self.appender.append_job(job, JobFailed(reason=reason, retryable=False))
        except Exception as exc:  # the object store is unreachable: try again next step
            log.warning("inputs of %s not presigned yet: %s", assignment.assignment_id, exc)
            self._unsent.add(key)
        return None

    async def _command(self, job: JobRecord, assignment: Assignment, command: StartWork) -> StartWork | None:
        """``command`` with the spec of its job's kind; ``None`` when it cannot be sent (yet)."""
        if job.spec.kind == "ddp":
            workers = self.registry.state.workers
            try:
                spec = ddp_spec(job, assignment, command.spec, self.presigner, workers)
            except WorkSpecError as exc:
                failed = JobFailed(reason=f"cannot start: {exc.message}", retryable=False)
                await self.appender.append_job(job, failed)
                return None
            return msgspec.structs.replace(command, spec=spec)
        if job.spec.kind == "federated":
            federated = federated_spec(job, assignment, command.spec, self.presigner)
            if federated is None:  # sent once the job's federation is ready (a new event of the job)
                return None
            return msgspec.structs.replace(command, spec=federated)
        return command
