"""Bodies of the workers routes: a provider's nodes, their health, tier, work and earnings."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.api.billing import Money
from schemas.api.common import Page, PageQuery

WorkerStateName = Literal["available", "cordoned", "lost", "deregistered"]


class WorkerListQuery(PageQuery, frozen=True, kw_only=True):
    """Filters of ``GET /v1/workers`` by worker id; ``provider`` narrows the operator's view."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    provider: str | None = None
    state: WorkerStateName | None = None


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    vram_total_mb: int


class WorkerWork(msgspec.Struct, frozen=True, kw_only=True):
    """One assignment running on the worker: a job's shard or an endpoint's replica.

    ``tenant`` is shown to the operator only; a provider sees the work, not whose it is.
    """

    kind: str
    work_id: str
    assignment_id: str
    slot: int
    epoch: int
    gpus: int
    state: str
    tenant: str | None = None


class Earnings(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker earned its provider to date (unverified workers earn nothing)."""

    gpu_seconds: float
    cpu_seconds: float
    ticks: int
    payout: Money


class GpuReading(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU in the latest heartbeat (``null`` where NVML does not report a value)."""

    index: int
    util_pct: float | None
    mem_used_mb: int | None
    temp_c: float | None
    power_w: float | None
    ecc_errors: int | None
    xid_errors: int | None


class Telemetry(msgspec.Struct, frozen=True, kw_only=True):
    """The worker's latest heartbeat."""

    at: str
    interval_s: float
    cpu_pct: float
    memory_used_mb: int
    gpus: list[GpuReading]
    running: list[str]


class Worker(msgspec.Struct, frozen=True, kw_only=True):
    """A worker as its provider (or the operator) sees it.

    Attributes:
        state: ``available``, ``cordoned``, ``lost`` or ``deregistered``.
        online: heartbeating within 3 of its intervals.
        tier: ``platinum``, ``gold``, ``silver`` or ``unverified`` (30-day uptime and hardware).
        uptime_30d: the fraction of the last 30 days it was not lost, 0..1.
        first_seen_at / registered_at: first and latest registration, ISO 8601 UTC.
        silent_s: seconds since its latest heartbeat (``null``: never beat).
        telemetry: on ``GET /v1/workers/{worker_id}`` only.
        sandbox: how its host isolates workloads (``bubblewrap``; ``off``: unsandboxed, takes only its
            owner's work; ``unavailable``: takes no work, ``sandbox_problem`` says why).
    """

    worker_id: str
    provider: str
    hostname: str
    region: str
    pool: str
    owner_tenant: str | None
    state: str
    online: bool
    cordon_reason: str
    gpus: list[GpuView]
    cpus: int
    memory_mb: int
    agent_version: str
    driver: str
    tier: str
    uptime_30d: float
    lost_count: int
    first_seen_at: str
    registered_at: str
    last_heartbeat_at: str | None
    silent_s: float | None
    work: list[WorkerWork]
    earnings: Earnings
    telemetry: Telemetry | None = None
    sandbox: str = ""
    sandbox_problem: str = ""


WorkerPage = Page[Worker]
