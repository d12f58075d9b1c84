"""Helpers of the trust tests that attack the kernel with an enrolled agent's own credentials:
:class:`Mallory` makes the claims (raw bytes on the intake), :func:`place_on` gives it a tenant's work as
the coordinator would, and the checks read what the kernel did with them: claims quarantined, every
kernel projection rebuilt and hashed, a projection waited on (:func:`wait_for_state`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from core.log import EventLog, Quarantined
from core.streams import intake_subject, job_subject, worker_subject
from projections import ENDPOINTS, LEDGER, PROVIDERS, REGISTRY, SCHEDULE, TENANTS
from projections.base import Projection, state_hash
from projections.runner import rebuild
from schemas._base import Event
from schemas.api.providers import Enrolled
from schemas.catalog import encode
from schemas.jobs import JobPlaced, JobSubmitted
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerRegistered
from tests.support.secured import Stack

KERNEL_PROJECTIONS: tuple[Projection[Any], ...] = (TENANTS, PROVIDERS, REGISTRY, SCHEDULE, ENDPOINTS, LEDGER)
"""Every projection a claim could change (liveness folds heartbeats, which agents publish directly)."""


async def projection_hashes(log: EventLog, *, stored: bool = True) -> dict[str, str]:
    """Every kernel projection rebuilt from sequence 1 of the log, hashed; with ``stored``, with the
    last sequence of its stream too (nothing was stored there meanwhile)."""
    out = {}
    for p in KERNEL_PROJECTIONS:
        state, seq = await rebuild(log, p)
        out[p.name] = f"{state_hash(state)}@{seq}" if stored else state_hash(state)
    return out


async def quarantined(log: EventLog, sender: str, count: int) -> list[Quarantined]:
    """The claims of ``sender`` in QUARANTINE, once there are ``count`` of them, in the order sent."""
    found: list[Quarantined] = []

    async def enough() -> bool:
        nonlocal found
        found = [q for q in await log.quarantined(limit=10_000) if q.sender == sender]
        return len(found) >= count

    for _ in range(200):
        if await enough():
            return sorted(found, key=lambda q: q.origin_seq)  # in the order they were sent
        await asyncio.sleep(0.1)
    raise AssertionError(f"{len(found)} of {count} claims of {sender} quarantined: {found}")


class Mallory:
    """An enrolled agent's own credentials, used as an attacker would: claims it is allowed to make,
    saying what it likes."""

    def __init__(self, stack: Stack, enrolled: Enrolled, own: EventLog) -> None:
        self.stack = stack
        self.enrolled = enrolled
        self.worker_id = enrolled.worker_id
        self.log = own
        self.sent = 0

    async def claim(self, subject: str, event: Event) -> None:
        """Claim ``event`` on the intake about ``subject``, as raw bytes (an attacker does not use our
        client's checks): stored on INTAKE, since NATS lets its user publish there."""
        await self.log.publish_raw(intake_subject(self.worker_id, subject), encode(event))
        self.sent += 1

    async def register(self, **fields: Any) -> None:
        """Claim a registration; what its enrollment says unless ``fields`` say otherwise."""
        e = self.enrolled
        identity = {
            "provider": e.provider,
            "pool": e.pool,
            "region": e.region,
            "owner_tenant": e.owner_tenant,
        }
        said = {"hostname": "mallory-host", "address": "10.66.0.7", "cpus": 64, **identity, **fields}
        event = WorkerRegistered(**said)
        await self.claim(worker_subject(self.worker_id, event), event)


async def enroll_mallory(stack: Stack) -> Mallory:
    enrolled, state_dir = await stack.enroll("mallory")
    return Mallory(stack, enrolled, await stack.as_agent(enrolled, state_dir))


async def wait_for_state(
    log: EventLog, projection: Projection[Any], predicate: Callable[[Any], Any], what: str
) -> Any:
    """The state of ``projection`` rebuilt from the log, once ``predicate`` holds for it."""
    for _ in range(300):
        state, _ = await rebuild(log, projection)
        if found := predicate(state):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def place_on(
    log: EventLog, worker_id: str, tenant: str, *, gpus: int = 0
) -> tuple[str, Assignment, int]:
    """Submit a job for ``tenant`` and place it on ``worker_id`` as the coordinator would (no agent
    process: the worker's agent is the attacker's own client). Returns the job id, the assignment and
    the placement's store time in ms."""
    job = JobSubmitted(name="fine-tune", kind="process", shards=1, command=["train"])
    job_id = f"j-{worker_id[-6:]}-{gpus}"
    await log.append(job_subject(tenant, job_id, job), job)
    assignment = Assignment(assignment_id=f"{job_id}-s0-e1", worker_id=worker_id, slot=0, epoch=1, gpus=gpus)
    placed = JobPlaced(assignments=[assignment], provenance=Provenance(candidates=1))
    await log.append(job_subject(tenant, job_id, placed), placed)
    last = await log.get_last("JOBS", job_subject(tenant, job_id, placed))
    assert last is not None
    return job_id, assignment, last.time_ns // 1_000_000
