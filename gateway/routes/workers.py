"""Workers, for the providers who own them: health, tier, uptime, current work, earnings.

A provider key sees the workers registered under its provider id (``worker.registered``'s
``provider``); another provider's worker is not found. The operator sees every worker. Everything
is read from live projections: the registry (state, hardware, uptime bookkeeping), liveness (the
latest heartbeat), the schedule and endpoint table (current assignments) and the ledger (earnings).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from core.clock import lost_after_s
from gateway.api import Call, Router
from gateway.bodies import carried
from gateway.errors import not_found
from gateway.paging import decode_cursor, encode_cursor
from gateway.routes.billing import paid
from gateway.scope import iso
from projections import ENDPOINTS, LEDGER, LIVENESS, REGISTRY, SCHEDULE
from projections.candidates import tier_of, uptime_30d
from projections.endpoints import EndpointsState
from projections.ledger import WorkerEarnings, earnings
from projections.liveness import LastBeat, silent_for
from projections.registry import WorkerRecord
from projections.schedule import TERMINAL, ScheduleState
from schemas.api.workers import (
    Earnings,
    GpuReading,
    GpuView,
    Telemetry,
    Worker,
    WorkerListQuery,
    WorkerPage,
    WorkerWork,
)

router = Router("workers")


def work_by_worker(schedule: ScheduleState, endpoints: EndpointsState) -> dict[str, list[WorkerWork]]:
    """Every live job shard and endpoint replica, grouped by the worker it runs on (one pass)."""
    found: dict[str, list[WorkerWork]] = {}
    for job in schedule.jobs.values():
        if job.state in TERMINAL:
            continue
        for slot, a in job.assignments.items():
            state = "done" if slot in job.done else "running" if slot in job.started else "placed"
            work = carried(WorkerWork, a, kind="job", work_id=job.job_id, state=state, tenant=job.tenant)
            found.setdefault(a.worker_id, []).append(work)
    for endpoint in endpoints.endpoints.values():
        if endpoint.state == "deleted":
            continue
        for r in endpoint.replicas.values():
            work = carried(
                WorkerWork, r, kind="endpoint", work_id=endpoint.endpoint_id, tenant=endpoint.tenant
            )
            found.setdefault(r.worker_id, []).append(work)
    for listed in found.values():
        listed.sort(key=lambda w: (w.kind, w.work_id, w.slot))
    return found


def telemetry(beat: LastBeat) -> Telemetry:
    return carried(Telemetry, beat, at=iso(beat.time_ns), gpus=[carried(GpuReading, g) for g in beat.gpus])


def worker_view(
    call: Call[Any, Any], record: WorkerRecord, work: list[WorkerWork], now_ns: int, *, detail: bool = False
) -> Worker:
    """The API body of a worker; tenants of its work are shown to the operator only."""
    beat: LastBeat | None = call.kernel.state(LIVENESS).beats.get(record.worker_id)
    silent = silent_for(call.kernel.state(LIVENESS), record.worker_id, now_ns)
    earned = earnings(call.kernel.state(LEDGER), record.worker_id)
    if call.principal.kind != "operator":
        work = [msgspec.structs.replace(w, tenant=None) for w in work]
    registered = record.registration
    return carried(
        Worker,
        registered,
        worker_id=record.worker_id,
        state=record.state,
        online=beat is not None and silent is not None and silent <= lost_after_s(beat.interval_s),
        cordon_reason=record.cordon_reason,
        gpus=[carried(GpuView, g) for g in registered.gpus],
        tier=tier_of(record, now_ns),
        uptime_30d=round(uptime_30d(record, now_ns), 6),
        lost_count=record.lost_count,
        first_seen_at=iso(record.since_ns),
        registered_at=iso(record.registered_ns),
        last_heartbeat_at=iso(beat.time_ns) if beat is not None else None,
        silent_s=None if silent is None else round(silent, 3),
        work=work,
        earnings=paid(Earnings, earned or WorkerEarnings(provider=registered.provider)),
        telemetry=telemetry(beat) if detail and beat is not None else None,
    )


def _owns(call: Call[Any, Any], record: WorkerRecord) -> bool:
    principal = call.principal
    return principal.kind == "operator" or record.registration.provider == principal.account


@router.get("/v1/workers", access="provider", query=WorkerListQuery, response=WorkerPage)
async def list_workers(call: Call[None, WorkerListQuery]) -> WorkerPage:
    """The caller's workers by id (every worker for the operator, ?provider= to narrow it)."""
    q = call.query
    after = decode_cursor("workers", q.after) if q.after is not None else None
    records = [
        r
        for r in call.kernel.state(REGISTRY).workers.values()
        if _owns(call, r)
        and (q.provider is None or r.registration.provider == q.provider)
        and (q.state is None or r.state == q.state)
        and (after is None or r.worker_id > after)
    ]
    records.sort(key=lambda r: r.worker_id)
    page = records[: q.limit]
    work = work_by_worker(call.kernel.state(SCHEDULE), call.kernel.state(ENDPOINTS))
    now_ns = time.time_ns()
    return WorkerPage(
        items=[worker_view(call, r, work.get(r.worker_id, []), now_ns) for r in page],
        next=encode_cursor("workers", page[-1].worker_id) if len(records) > q.limit else None,
    )


@router.get("/v1/workers/{worker_id}", access="provider", response=Worker)
async def get_worker(call: Call[None, None]) -> Worker:
    """One worker with its latest heartbeat's telemetry."""
    worker_id = call.params["worker_id"]
    record = call.kernel.state(REGISTRY).workers.get(worker_id)
    if record is None or not _owns(call, record):
        raise not_found(f"worker {worker_id}")
    work = work_by_worker(call.kernel.state(SCHEDULE), call.kernel.state(ENDPOINTS)).get(worker_id, [])
    return worker_view(call, record, work, time.time_ns(), detail=True)
