"""Jobs: submit, list, get (with why it waits), cancel, the job's own events and its GPU telemetry.

A submission is checked (:mod:`gateway.jobspec`), its input objects looked up in the tenant's bucket
(:mod:`gateway.references`), then ``job.submitted`` is appended with expected sequence 0 on the
job's subjects (:mod:`gateway.resources`: a job id is taken once, a retried request with the same
``Idempotency-Key`` answers with the job it created, and an acknowledged submission or
cancellation that this gateway's schedule has not applied yet is a ``202 Accepted`` with the job as
the schedule will hold it). Reads come from the live schedule projection; a job's events are read
back from the JOBS stream, its GPU telemetry from HEARTBEATS (:mod:`gateway.job_telemetry`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgspec

from core import flarejob
from core.objects import bucket_for
from core.streams import job_filter, job_subject
from gateway.api import Call, Router, respond
from gateway.bodies import carried
from gateway.errors import ApiError
from gateway.job_telemetry import job_telemetry as read_telemetry
from gateway.jobspec import (
    check_admission,
    check_job_folder,
    check_shards,
    idle_fleet,
    job_event,
    shards_prefix,
)
from gateway.paging import decode_seq_cursor, encode_cursor
from gateway.references import listing, require_objects
from gateway.resources import Resource, stop_work
from gateway.scope import iso
from projections import REGISTRY, SCHEDULE, TENANTS
from projections.schedule import TERMINAL, JobRecord, ScheduleState, job_key
from projections.tenants import quotas
from projections.why import explain_job, pending_reason
from schemas.api.jobs import (
    HIDDEN,
    CheckpointView,
    EventsQuery,
    Job,
    JobAssignment,
    JobEventItem,
    JobEventPage,
    JobListQuery,
    JobPage,
    JobProgressView,
    JobTelemetry,
    SubmitJob,
    TelemetryQuery,
    TenantQuery,
)
from schemas.jobs import JobCancelled, JobPlaced, JobSubmitted

router = Router("jobs")
CANCEL_ATTEMPTS = 5
ACCEPTED = (
    "stored, but this gateway has not applied it yet: the body is the job as it will read once applied "
    "(GET it shortly; a retry with the same Idempotency-Key answers with the same job)"
)


def job_view(job: JobRecord, why: list[str] | None = None) -> Job:
    """The API body of a job record."""
    p, c = job.progress, job.last_checkpoint
    assignments = [
        carried(JobAssignment, a, started=slot in job.started, done=slot in job.done)
        for slot, a in sorted(job.assignments.items(), key=lambda item: int(item[0]))
    ]
    return carried(
        Job,
        job,
        spec=msgspec.structs.replace(job.spec, env=dict.fromkeys(job.spec.env, HIDDEN)),
        submitted_at=iso(job.submitted_ns),
        ended_at=iso(job.ended_ns) if job.ended_ns is not None else None,
        pending_reason=pending_reason(job),
        assignments=assignments,
        progress=None if p is None else carried(JobProgressView, p, epoch=p.train_epoch),
        last_checkpoint=None if c is None else carried(CheckpointView, c),
        rounds_completed=job.round,
        why=why,
    )


JOB: Resource[JobRecord] = Resource(
    noun="job",
    id_prefix="job",
    projection=SCHEDULE,
    subject=job_subject,
    subjects=job_filter,
    key=job_key,
    table=lambda state: state.jobs,
    alone=lambda seq, jobs: ScheduleState(seq=seq, jobs=jobs),
    view=job_view,
    sender="submitted_by",
    exists="choose another job_id, or leave it out to get a new one",
    reused="this Idempotency-Key was used for a different job spec; send a new key for a new job",
)
"""Jobs in the log: submitted once, cancelled with the job's expected sequence."""


@router.post(
    "/v1/jobs",
    role="member",
    body=SubmitJob,
    query=TenantQuery,
    response=Job,
    status=201,
    errors={
        409: "the job id is taken",
        422: "the spec cannot run: missing_objects (the keys are listed), kind_unavailable, "
        "invalid_spec, invalid_key, invalid_job_folder, over_quota, unplaceable, idempotency_key_reused",
        503: "the log or the object store is unavailable; retry with the same Idempotency-Key",
    },
    accepted=f"the job.submitted event is {ACCEPTED}",
)
async def submit_job(call: Call[SubmitJob, TenantQuery]) -> Any:
    """Submit a job; every workspace object it references must exist.

    Send an ``Idempotency-Key`` header to retry safely: a retry answers with the job it created. A
    202 means the job is stored but this gateway has not applied it yet: do not submit it again.
    """
    kernel = call.kernel
    tenant, job_id, eid = JOB.named(call, call.body.job_id)
    event = job_event(call.body, call.principal.label)
    if job_key(tenant, job_id) in kernel.state(SCHEDULE).jobs:
        return await JOB.replay(call, tenant, job_id, event, eid)
    now_ns = time.time_ns()
    hosts = idle_fleet(call).hosts(kernel.state(REGISTRY), now_ns)
    check_admission(tenant, job_id, event, quotas(kernel.state(TENANTS)), hosts, now_ns)
    await require_objects(kernel.s3, bucket_for(tenant), event.inputs, kernel.seen_objects)
    if event.federated is not None:
        shards = shards_prefix(event.name)
        check_shards(event, await listing(kernel.s3, bucket_for(tenant), shards, flarejob.MAX_FILES))
    if event.federated is not None and event.federated.job_folder:
        folder = event.federated.job_folder
        check_job_folder(folder, await listing(kernel.s3, bucket_for(tenant), folder, flarejob.MAX_FILES))
    return await JOB.create(call, tenant, job_id, event, eid)


@router.get("/v1/jobs", query=JobListQuery, response=JobPage)
async def list_jobs(call: Call[None, JobListQuery]) -> JobPage:
    """The tenant's jobs, newest first, filtered by state, kind and name prefix (cursor-paginated)."""
    q = call.query

    def keep(job: JobRecord) -> bool:
        return (
            (q.state is None or job.state == q.state)
            and (q.kind is None or job.spec.kind == q.kind)
            and (q.name_prefix is None or job.spec.name.startswith(q.name_prefix))
        )

    page, next_cursor = JOB.listed(call, keep, lambda job: job.submitted_seq)
    return JobPage(items=[job_view(job) for job in page], next=next_cursor)


@router.get("/v1/jobs/{job_id}", query=TenantQuery, response=Job)
async def get_job(call: Call[None, TenantQuery]) -> Job:
    """One job: state, assignments, progress, latest checkpoint, and why it waits or runs where it runs."""
    job = JOB.visible(call)
    placed = await call.kernel.event_log.get_last("JOBS", job_subject(job.tenant, job.job_id, JobPlaced))
    return job_view(job, explain_job(job, placed.event.provenance if placed is not None else None))


async def _stop_work(call: Call[Any, Any], job: JobRecord) -> None:
    """Tell each agent running a shard of the cancelled job to stop it (idempotent by command id)."""
    reason = f"job cancelled by {job.cancelled_by or call.principal.label}"
    await stop_work(call, (job.tenant, "job", job.job_id), job.assignments.values(), reason, "cancel")


@router.post(
    "/v1/jobs/{job_id}/cancel",
    role="member",
    query=TenantQuery,
    response=Job,
    errors={409: "the job already ended (completed, failed or cancelled)"},
    accepted=f"the job.cancelled event is {ACCEPTED}",
)
async def cancel_job(call: Call[None, TenantQuery]) -> Any:
    """Cancel a queued, placed or running job; its running shards are told to stop."""
    job = JOB.visible(call)
    call.resource = job.job_id
    for _ in range(CANCEL_ATTEMPTS):
        if job.state in TERMINAL:
            if job.state == "cancelled":
                await _stop_work(call, job)  # a retry after a lost answer still stops every shard
            raise ApiError(
                409,
                "job_ended",
                f"job {job.job_id} already {job.state}; only queued, placed or running jobs can be cancelled",
            )
        event = JobCancelled(by=call.principal.label, reason="cancelled through the API")
        changed = await JOB.change(call, job, job.tenant, job.job_id, event)
        if changed is None:  # the coordinator or an agent appended first: re-decide
            job = await JOB.fresh(call, job.tenant, job.job_id)
            continue
        job, status = changed  # stored (202: not applied here yet): stop it all the same
        await _stop_work(call, job)
        return respond(job_view(job), status)
    raise ApiError(503, "busy", f"job {job.job_id} changed {CANCEL_ATTEMPTS} times while cancelling; retry")


REDACTED = "<redacted>"


def shown(event: Any) -> dict[str, Any]:
    """An event as the API shows it: as stored, but environment values redacted (a viewer key must
    not read the secrets a member passed to the workload)."""
    body: dict[str, Any] = msgspec.to_builtins(event)
    if isinstance(event, JobSubmitted):
        body["env"] = dict.fromkeys(event.env, REDACTED)
    return body


@router.get("/v1/jobs/{job_id}/events", query=EventsQuery, response=JobEventPage)
async def job_events(call: Call[None, EventsQuery]) -> JobEventPage:
    """The job's events in log order (each with its JOBS sequence; environment values redacted),
    cursor-paginated."""
    job = JOB.visible(call)
    q = call.query
    start = max(decode_seq_cursor("job-events", q.after) + 1, job.submitted_seq)
    items: list[JobEventItem] = []
    more = False
    if start <= await call.kernel.event_log.last_seq("JOBS"):
        replay = call.kernel.event_log.replay(
            "JOBS", start_seq=start, subjects=job_filter(job.tenant, job.job_id)
        )
        async with contextlib.aclosing(replay) as records:
            async for record in records:
                if len(items) == q.limit:
                    more = True
                    break
                items.append(
                    JobEventItem(
                        seq=record.seq,
                        time=iso(record.time_ns),
                        type=type(record.event).event_tag(),
                        event=shown(record.event),
                    )
                )
    next_cursor = encode_cursor("job-events", items[-1].seq) if more else None
    return JobEventPage(items=items, next=next_cursor)


@router.get("/v1/jobs/{job_id}/telemetry", query=TelemetryQuery, response=JobTelemetry)
async def job_telemetry(call: Call[None, TelemetryQuery]) -> JobTelemetry:
    """GPU utilisation and memory of the job's workers over time, only while each held the job's
    assignments, at most ``points`` samples per worker (a heartbeat of a host that also ran other work
    is left out: its readings are the whole host's)."""
    job = JOB.visible(call)
    registry = call.kernel.state(REGISTRY)  # readings only of the GPUs each worker registered
    return await read_telemetry(call.kernel.event_log, job, call.query.points, time.time_ns(), registry)
