"""The schedule benchmark's baselines: what the log alone sustains, with raw nats-py and no decision.

Pre-encoded events published with ``js.publish`` awaited in parallel, :data:`APPEND_CHUNK` at a time
(the coordinator's own bound), on the same server as the measured run: the coordinator's
``job.placed`` appends (expected-sequence headers included) with or without their ``start_work``
commands (:func:`raw_placements`), and one heartbeat per worker of a fleet (:func:`raw_beats`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Iterator
from typing import Any

import nats

from agent.simulated import SimulatedFleet
from core.log import new_event_id
from core.streams import command_subject, heartbeat_subject, job_filter, job_subject
from core.wire import EXPECTED_LAST_SUBJECT_SEQ, EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, MSG_ID
from schemas.catalog import encode
from schemas.commands import StartWork, WorkSpec
from schemas.jobs import JobPlaced
from schemas.values import Assignment, Provenance
from schemas.workers import Heartbeat

APPEND_CHUNK = 512
"""Appends in flight per chunk in the raw baseline (the coordinator's own bound)."""


async def bounded(coros: Iterator[Awaitable[Any]], chunk: int = APPEND_CHUNK) -> list[Any]:
    """Await ``coros`` in parallel, ``chunk`` at a time, the next chunk started before the last
    is awaited (at most two chunks in flight)."""
    results: list[Any] = []
    inflight: deque[asyncio.Future[list[Any]]] = deque()
    batch: list[Awaitable[Any]] = []
    for coro in coros:
        batch.append(coro)
        if len(batch) == chunk:
            inflight.append(asyncio.gather(*batch))
            batch = []
            if len(inflight) > 1:
                results += await inflight.popleft()
    if batch:
        inflight.append(asyncio.gather(*batch))
    while inflight:
        results += await inflight.popleft()
    return results


async def raw_placements(url: str, count: int, *, commands: bool) -> float:
    """Jobs per second whose ``job.placed`` (and, with ``commands``, ``start_work`` command) raw
    nats-py appends, expected-sequence headers included and no decision: what the log alone
    sustains for the coordinator's appends on this server."""
    nc = await nats.connect(url, name="bench-raw")
    js = nc.jetstream(timeout=60.0)
    provenance = Provenance(candidates=10_000, filtered={"gpu_type": 7_000, "pruned": 2_995}, top=[])
    spec = WorkSpec(runtime="process", command=["true"], gpus=1, vram_mb=24_000, cpus=2.0)
    payloads = []
    for i in range(count):
        tenant, job_id = f"tenant{i % 20}", f"raw{i}{'c' if commands else ''}"
        worker_id = f"sim-7-{i % 10_000:06d}"
        a = Assignment(assignment_id=f"{job_id}-s0-e1", worker_id=worker_id, slot=0, epoch=1, gpus=1)
        event = JobPlaced(assignments=[a], provenance=provenance)
        headers = {
            MSG_ID: new_event_id(),
            EXPECTED_LAST_SUBJECT_SEQ: "0",
            EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: job_filter(tenant, job_id),
        }
        payloads.append((job_subject(tenant, job_id, event), encode(event), headers))
        if commands:
            start = StartWork(
                tenant=tenant,
                work_id=job_id,
                work_kind="job",
                assignment_id=a.assignment_id,
                slot=0,
                epoch=1,
                spec=spec,
                price_micros_per_gpu_hour=2_000_000,
            )
            payloads.append((command_subject(worker_id), encode(start), {MSG_ID: f"start-{a.assignment_id}"}))
    started = time.perf_counter()
    await bounded(js.publish(s, d, headers=h) for s, d, h in payloads)
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def raw_beats(url: str, fleet: SimulatedFleet) -> float:
    """Heartbeats per second the server stores from raw nats-py ``js.publish`` of pre-encoded beats,
    one per worker of ``fleet``, awaited in parallel: the ceiling of ingest on this server."""
    payloads = [
        (heartbeat_subject(w.worker_id), encode(Heartbeat(interval_s=1.0, gpus=w.telemetry, cpu_pct=12.5)))
        for w in fleet.workers
    ]
    nc = await nats.connect(url.split(","), name="bench-raw-beats")
    js = nc.jetstream(timeout=60.0)
    started = time.perf_counter()
    await bounded(js.publish(s, d, headers={MSG_ID: new_event_id()}) for s, d in payloads)
    elapsed = time.perf_counter() - started
    await nc.close()
    return len(payloads) / elapsed
