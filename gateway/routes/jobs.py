"""Jobs: submit, list, get (with why it waits), cancel, and the job's own events.

A submission is checked (:mod:`gateway.jobspec`), its input objects looked up in the tenant's bucket
(:mod:`gateway.references`), then ``job.submitted`` is appended with expected sequence 0 on the
job's subjects, so a job id is taken once: a duplicate is a 409, and a retried request with the
same ``Idempotency-Key`` answers with the job it created (:mod:`gateway.idempotency`). Reads come
from the live schedule projection; a job's events are read back from the JOBS stream.

Once the log has acknowledged a ``job.submitted`` (or a cancellation) the answer is never a 5xx,
which would invite a retry and, without an ``Idempotency-Key``, a second job: if this gateway's
schedule has not applied the event within :data:`gateway.kernel.READ_YOUR_WRITES_S`, the answer is
``202 Accepted`` with the job as the schedule will hold it (:func:`as_applied`: the pure reducer,
on the one record), and a retry with the same key answers with the same job, 202 or 201.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgspec

from core import flarejob
from core.errors import ConcurrencyConflict
from core.objects import bucket_for
from core.streams import command_subject, job_filter, job_subject
from core.wire import Position
from gateway.api import Call, Router, respond
from gateway.errors import ApiError, NotYetVisible, conflict, not_found
from gateway.idempotency import REPLAYED_HEADER, event_id, idempotency_key, resource_id
from gateway.jobspec import (
    check_admission,
    check_job_folder,
    check_shards,
    idle_fleet,
    job_event,
    same_submission,
    shards_prefix,
)
from gateway.paging import decode_seq_cursor, encode_cursor
from gateway.references import listing, require_objects
from gateway.scope import iso, scoped_tenant
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
    SubmitJob,
    TenantQuery,
)
from schemas.commands import StopWork
from schemas.envelope import Recorded
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
        JobAssignment(
            slot=a.slot,
            worker_id=a.worker_id,
            assignment_id=a.assignment_id,
            epoch=a.epoch,
            gpus=a.gpus,
            started=slot in job.started,
            done=slot in job.done,
        )
        for slot, a in sorted(job.assignments.items(), key=lambda item: int(item[0]))
    ]
    return Job(
        job_id=job.job_id,
        tenant=job.tenant,
        spec=msgspec.structs.replace(job.spec, env=dict.fromkeys(job.spec.env, HIDDEN)),
        state=job.state,
        submitted_at=iso(job.submitted_ns),
        ended_at=iso(job.ended_ns) if job.ended_ns is not None else None,
        pending_reason=pending_reason(job),
        assignments=assignments,
        progress=None
        if p is None
        else JobProgressView(
            round=p.round,
            epoch=p.train_epoch,
            step=p.step,
            loss=p.loss,
            gpu_util_pct=p.gpu_util_pct,
            metrics=p.metrics,
        ),
        last_checkpoint=None
        if c is None
        else CheckpointView(object_key=c.object_key, round=c.round, step=c.step),
        rounds_completed=job.round,
        failures=job.failures,
        failure_reason=job.failure_reason,
        log_tail=job.log_tail,
        rejected_by=job.rejected_by,
        outputs=job.outputs,
        cancelled_by=job.cancelled_by,
        why=why,
    )


def visible_job(call: Call[Any, Any]) -> JobRecord:
    """The job named in the path, in the caller's tenant; 404 otherwise."""
    tenant = scoped_tenant(call, call.query.tenant)
    job_id = call.params["job_id"]
    job: JobRecord | None = call.kernel.state(SCHEDULE).jobs.get(job_key(tenant, job_id))
    if job is None:
        raise not_found(f"job {job_id}")
    return job


def as_applied(job: JobRecord | None, record: Recorded[Any]) -> JobRecord:
    """The job as the schedule will hold it once it applies ``record``, from ``job`` as known (or
    ``None`` for a submission): the pure reducer, on a state holding that job alone. Exact when
    ``record`` was appended with the job's expected sequence (nothing of the job came in between)."""
    key = job_key(record.token(1), record.token(2))
    state = ScheduleState(seq=job.last_seq if job else 0, jobs={key: job} if job else {})
    return SCHEDULE.evolve(state, record).jobs[key]


async def _replay(
    call: Call[Any, Any], tenant: str, job_id: str, event: JobSubmitted, eid: str | None
) -> Any:
    """The answer when the job id is taken: the same job again for a retry of the request that
    created it (same ``Idempotency-Key``, same spec; 202 while the schedule has not applied it),
    else a 409."""
    stored = await call.kernel.event_log.get_last("JOBS", job_subject(tenant, job_id, JobSubmitted))
    if eid is None or stored is None or stored.msg_id != eid:
        raise conflict(f"job {job_id} exists; choose another job_id, or leave it out to get a new one")
    if not same_submission(stored.event, event):
        raise ApiError(
            422,
            "idempotency_key_reused",
            "this Idempotency-Key was used for a different job spec; send a new key for a new job",
        )
    call.resource = job_id
    try:
        await call.kernel.visible(SCHEDULE, Position(stored.stream, stored.seq))
        response = respond(job_view(call.kernel.state(SCHEDULE).jobs[job_key(tenant, job_id)]), 201)
    except NotYetVisible:
        response = respond(job_view(as_applied(None, stored)), 202)
    response.headers[REPLAYED_HEADER] = "true"
    return response


async def _store_submission(
    call: Call[Any, Any], tenant: str, job_id: str, event: JobSubmitted, eid: str | None
) -> Any:
    """Append ``job.submitted`` (job id taken once) and answer: 201 with the job, 202 while this
    gateway has not applied it, or the replay of an earlier attempt of the same request."""
    subject = job_subject(tenant, job_id, event)
    try:
        position = await call.kernel.append(
            subject, event, event_id=eid, expected_seq=0, expected_filter=job_filter(tenant, job_id),
            visible_in=SCHEDULE,
        )  # fmt: skip
    except ConcurrencyConflict:
        return await _replay(call, tenant, job_id, event, eid)
    except NotYetVisible as pending:
        if pending.position.duplicate:  # a retry's first attempt stored it: same checks as any replay
            return await _replay(call, tenant, job_id, event, eid)
        call.resource = job_id
        stored = await call.kernel.stored_record(pending.position, subject, event, eid)
        return respond(job_view(as_applied(None, stored)), 202)
    if position.duplicate:
        return await _replay(call, tenant, job_id, event, eid)
    call.resource = job_id
    return job_view(call.kernel.state(SCHEDULE).jobs[job_key(tenant, job_id)])


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
    tenant = scoped_tenant(call, call.query.tenant)
    key = idempotency_key(call.request)
    job_id = call.body.job_id or resource_id("job", tenant, key)
    eid = event_id("job", tenant, job_id, key)
    event = job_event(call.body, call.principal.label)
    if job_key(tenant, job_id) in kernel.state(SCHEDULE).jobs:
        return await _replay(call, tenant, job_id, event, eid)
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
    return await _store_submission(call, tenant, job_id, event, eid)


@router.get("/v1/jobs", query=JobListQuery, response=JobPage)
async def list_jobs(call: Call[None, JobListQuery]) -> JobPage:
    """The tenant's jobs, newest first, filtered by state, kind and name prefix (cursor-paginated)."""
    q = call.query
    tenant = scoped_tenant(call, q.tenant)
    before = decode_seq_cursor("jobs", q.after) if q.after is not None else None
    found = [
        job
        for job in call.kernel.state(SCHEDULE).jobs.values()
        if job.tenant == tenant
        and (before is None or job.submitted_seq < before)
        and (q.state is None or job.state == q.state)
        and (q.kind is None or job.spec.kind == q.kind)
        and (q.name_prefix is None or job.spec.name.startswith(q.name_prefix))
    ]
    found.sort(key=lambda job: job.submitted_seq, reverse=True)
    page = found[: q.limit]
    more = len(found) > q.limit
    return JobPage(
        items=[job_view(job) for job in page],
        next=encode_cursor("jobs", page[-1].submitted_seq) if more else None,
    )


@router.get("/v1/jobs/{job_id}", query=TenantQuery, response=Job)
async def get_job(call: Call[None, TenantQuery]) -> Job:
    """One job: state, assignments, progress, latest checkpoint, and why it waits or runs where it runs."""
    job = visible_job(call)
    placed = await call.kernel.event_log.get_last("JOBS", job_subject(job.tenant, job.job_id, JobPlaced))
    return job_view(job, explain_job(job, placed.event.provenance if placed is not None else None))


async def _stop_work(call: Call[Any, Any], job: JobRecord) -> None:
    """Tell each agent running a shard of the cancelled job to stop it (idempotent by command id)."""
    for assignment in job.assignments.values():
        stop = StopWork(
            work_id=job.job_id,
            assignment_id=assignment.assignment_id,
            epoch=assignment.epoch,
            reason=f"job cancelled by {job.cancelled_by or call.principal.label}",
        )
        await call.kernel.event_log.append(
            command_subject(assignment.worker_id), stop, event_id=f"cancel-{assignment.assignment_id}"
        )


async def _fresh(call: Call[Any, Any], job: JobRecord) -> JobRecord:
    """The job once the schedule has applied everything the JOBS stream holds now (503 when it lags:
    nothing of this request is stored)."""
    last = await call.kernel.event_log.last_seq("JOBS")
    try:
        await call.kernel.visible(SCHEDULE, Position("JOBS", last))
    except NotYetVisible:
        raise ApiError(503, "busy", f"job {job.job_id} is changing and this gateway lags; retry") from None
    fresh: JobRecord = call.kernel.state(SCHEDULE).jobs[job_key(job.tenant, job.job_id)]
    return fresh


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
    job = visible_job(call)
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
        subject = job_subject(job.tenant, job.job_id, event)
        status = 200
        try:
            await call.kernel.append(
                subject,
                event,
                expected_seq=job.last_seq,
                expected_filter=job_filter(job.tenant, job.job_id),
                visible_in=SCHEDULE,
            )
        except ConcurrencyConflict:
            job = await _fresh(call, job)  # the coordinator or an agent appended first: re-decide
            continue
        except NotYetVisible as pending:  # stored: answer with the job as it will read, and stop it
            stored = await call.kernel.stored_record(pending.position, subject, event)
            job, status = as_applied(job, stored), 202
        else:
            job = call.kernel.state(SCHEDULE).jobs[job_key(job.tenant, job.job_id)]
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
    job = visible_job(call)
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
