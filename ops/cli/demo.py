"""``resontech demo``: append a small, realistic history so there is something to look at.

A provider's worker registers and heartbeats, a tenant's two-shard job is submitted, placed, runs
two rounds with progress and a checkpoint, completes, and is metered. Until the agent and the
coordinator exist these are the events they will write; afterwards the demo still shows the shape of
a lifecycle without any GPU.
"""

from __future__ import annotations

import time
import uuid

from core.log import EventLog
from core.settings import Settings
from core.streams import (
    heartbeat_subject,
    job_subject,
    metering_subject,
    tenant_subject,
    worker_subject,
)
from schemas._base import Event
from schemas.jobs import (
    JobCheckpointed,
    JobCompleted,
    JobPlaced,
    JobProgress,
    JobResources,
    JobRoundCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.tenants import TenantCreated
from schemas.values import Assignment, Gpu, Provenance, ScoreCard
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified

Entry = tuple[str, Event]
"""An event and the subject it goes to."""


async def append_demo(settings: Settings, *, tenant: str = "demo") -> dict[str, int]:
    """Append the demo history; returns how many events went to each stream."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    workers = [f"demo-{tenant}-w{i}" for i in range(2)]
    now_ms = int(time.time() * 1000)
    events: list[Entry] = [
        (tenant_subject(tenant, TenantCreated), TenantCreated(display_name=tenant, bucket=f"rt-{tenant}"))
    ]
    for w in workers:
        events += _worker_joins(w)
    assignments = [
        Assignment(assignment_id=f"{job}-a{i}", worker_id=w, slot=i, epoch=1, gpus=1)
        for i, w in enumerate(workers)
    ]
    events += _job_placed(tenant, job, assignments)
    for rnd in (1, 2):
        events += _job_round(tenant, job, assignments, rnd)
        start = now_ms - (3 - rnd) * 10_000
        events += [_metered(tenant, job, a, start) for a in assignments]
    events.append(
        (job_subject(tenant, job, JobCompleted), JobCompleted(outputs=[f"jobs/{job}/model_out/final.pt"]))
    )
    counts: dict[str, int] = {}
    async with await EventLog.connect(settings, name="demo") as event_log:
        await event_log.ensure_streams()
        for position in await event_log.append_many(events):
            counts[position.stream] = counts.get(position.stream, 0) + 1
    return counts


def _worker_joins(w: str) -> list[Entry]:
    """A provider's worker registers (one A100), is verified, and sends its first heartbeat."""
    gpu = Gpu(index=0, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81920, vram_free_mb=81000)
    registered = WorkerRegistered(
        provider="demo-provider",
        hostname=w,
        region="eu-west",
        gpus=[gpu],
        cpus=32,
        memory_mb=256_000,
    )
    return [
        (worker_subject(w, WorkerRegistered), registered),
        (worker_subject(w, WorkerVerified), WorkerVerified(by="demo")),
        (heartbeat_subject(w), Heartbeat(cpu_pct=3.0)),
    ]


def _job_placed(tenant: str, job: str, assignments: list[Assignment]) -> list[Entry]:
    """The two-shard federated job is submitted, placed on the workers, and each shard starts."""
    cards = [
        ScoreCard(worker_id=a.worker_id, score=0.9, terms={"uptime": 1.0, "tier": 0.9}) for a in assignments
    ]
    events: list[Entry] = [
        (
            job_subject(tenant, job, JobSubmitted),
            JobSubmitted(
                name="demo-fedavg",
                kind="federated",
                shards=2,
                rounds=2,
                resources=JobResources(gpus=1, vram_mb=16_000),
            ),
        ),
        (
            job_subject(tenant, job, JobPlaced),
            JobPlaced(assignments=assignments, provenance=Provenance(candidates=2, top=cards)),
        ),
    ]
    for a in assignments:
        events.append(
            (
                job_subject(tenant, job, JobStarted),
                JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=1),
            )
        )
    return events


def _job_round(tenant: str, job: str, assignments: list[Assignment], rnd: int) -> list[Entry]:
    """Round ``rnd``: each shard's progress (a falling loss), the round's metrics, a checkpoint."""
    events: list[Entry] = []
    for a in assignments:
        events.append(
            (
                job_subject(tenant, job, JobProgress),
                JobProgress(
                    epoch=1,
                    slot=a.slot,
                    assignment_id=a.assignment_id,
                    round=rnd,
                    loss=1.0 / (rnd + a.slot + 1),
                ),
            )
        )
    events.append(
        (
            job_subject(tenant, job, JobRoundCompleted),
            JobRoundCompleted(round=rnd, metrics={"loss": 0.5 / rnd}),
        )
    )
    events.append(
        (
            job_subject(tenant, job, JobCheckpointed),
            JobCheckpointed(epoch=1, round=rnd, object_key=f"jobs/{job}/model_out/round-{rnd}.pt"),
        )
    )
    return events


def _metered(tenant: str, job: str, a: Assignment, start_ms: int) -> Entry:
    """Ten GPU-seconds of one assignment from ``start_ms`` (milliseconds since the epoch)."""
    tick = UsageTick(
        work_id=job,
        work_kind="job",
        assignment_id=a.assignment_id,
        epoch=1,
        provider="demo-provider",
        gpu_type="A100",
        pool="shared",
        start_ms=start_ms,
        end_ms=start_ms + 10_000,
        gpu_ms=10_000,
        tier="gold",
    )
    return (metering_subject(tenant, a.worker_id, a.assignment_id, UsageTick), tick)
