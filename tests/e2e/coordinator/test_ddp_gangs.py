"""A real coordinator keeps ddp gangs whole. The workers here are the test itself: it registers them,
heartbeats for them and reports their ranks' starts and failures, so that the order of a peer's
death and its survivors' failures is exact (the end-to-end runs are in ``test_ddp.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, worker_subject
from ops.coordinator import Coordinator
from schemas.envelope import Recorded
from schemas.jobs import JobAssignmentRevoked, JobFailed, JobPlaced, JobResources, JobStarted, JobSubmitted
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified
from tests.support import of, records


class Hosts:
    """Workers played by the test: registered, and beating every ``interval_s`` while alive."""

    def __init__(self, log: EventLog, interval_s: float) -> None:
        self.log = log
        self.interval_s = interval_s
        self.alive: set[str] = set()

    async def register(self, *worker_ids: str) -> None:
        for worker_id in worker_ids:
            event = WorkerRegistered(
                provider="p", hostname=worker_id, cpus=4, memory_mb=8192, address="127.0.0.1"
            )
            await self.log.append(worker_subject(worker_id, event), event)
            await self.log.append(worker_subject(worker_id, WorkerVerified), WorkerVerified(by="test"))
            self.alive.add(worker_id)
        await self.beat()

    async def beat(self) -> None:
        for worker_id in sorted(self.alive):
            await self.log.append(heartbeat_subject(worker_id), Heartbeat(interval_s=self.interval_s))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.beat()


@contextlib.asynccontextmanager
async def fleet(log: EventLog, interval_s: float) -> AsyncIterator[Hosts]:
    """Two beating hosts and a coordinator, until the block ends."""
    hosts = Hosts(log, interval_s)
    await hosts.register("w-a", "w-b")
    beating = asyncio.create_task(hosts.run())
    own = await EventLog.connect(log.settings, name="coordinator")
    stop = asyncio.Event()
    deciding = asyncio.create_task(Coordinator(own, tick_s=0.1).run(stop))
    try:
        yield hosts
    finally:
        stop.set()
        beating.cancel()
        await asyncio.wait_for(deciding, 15)
        await own.close()


async def job_until(
    log: EventLog, predicate: Callable[[list[Recorded[Any]]], Any], what: str, timeout: float = 20.0
) -> list[Recorded[Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await records(log, "JOBS")
        if predicate(found):
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; JOBS holds {[r.event for r in found]}")


async def started_gang(log: EventLog, tenant: str) -> JobPlaced:
    """Submit a 2-shard ddp job, wait for its placement, and report both ranks started."""
    submitted = JobSubmitted(name="g", kind="ddp", shards=2, command=["train.py"], resources=JobResources())
    await log.append(job_subject(tenant, "g1", submitted), submitted)
    [placed] = of(await job_until(log, lambda rs: of(rs, JobPlaced), "the placement"), JobPlaced)
    for a in placed.assignments:
        event = JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch)
        await log.append(job_subject(tenant, "g1", event), event)
    return placed


async def fail(log: EventLog, tenant: str, slot: int, *, retryable: bool = False, tail: str = "") -> None:
    event = JobFailed(reason="exit status 1", epoch=1, slot=slot, retryable=retryable, log_tail=tail)
    await log.append(job_subject(tenant, "g1", event), event)


def job_failed(found: list[Recorded[Any]]) -> list[JobFailed]:
    return [e for e in of(found, JobFailed) if e.slot is None]


@pytest.fixture
def tenant() -> str:
    return f"g{secrets.token_hex(4)}"


async def test_a_rank_failing_because_its_peer_died_waits_for_the_loss_and_the_gang_restarts(
    log: EventLog, tenant: str
) -> None:
    async with fleet(log, 0.5) as hosts:
        placed = await started_gang(log, tenant)
        dead = next(a for a in placed.assignments if a.slot == 0).worker_id
        hosts.alive.discard(dead)  # its host went down: no beat after this
        await fail(log, tenant, 1, tail="RuntimeError: Connection closed by peer")
        jobs = await job_until(log, lambda rs: len(of(rs, JobPlaced)) == 2, "the gang placed again")
    revoked = of(jobs, JobAssignmentRevoked)
    assert sorted((r.slot, r.reason) for r in revoked) == [
        (0, "worker lost"),
        (1, "gang restart: worker lost"),
    ]
    again = of(jobs, JobPlaced)[1].assignments
    assert sorted((a.slot, a.epoch) for a in again) == [(0, 2), (1, 2)]
    assert {a.worker_id for a in again} == hosts.alive  # both ranks on the host left
    assert not job_failed(jobs)


async def test_a_rank_stopped_by_its_agent_restarts_the_whole_gang(log: EventLog, tenant: str) -> None:
    async with fleet(log, 0.5):
        await started_gang(log, tenant)
        await fail(log, tenant, 0, retryable=True)
        jobs = await job_until(log, lambda rs: len(of(rs, JobPlaced)) == 2, "the gang placed again")
    assert sorted(r.slot for r in of(jobs, JobAssignmentRevoked)) == [0, 1]
    assert {a.epoch for a in of(jobs, JobPlaced)[1].assignments} == {2}
    assert not job_failed(jobs)


async def test_every_rank_failing_fails_the_job_at_once(log: EventLog, tenant: str) -> None:
    async with fleet(log, 30.0):  # a peer's loss would take 90 s to show: nothing waits for it
        await started_gang(log, tenant)
        await fail(log, tenant, 0, tail="ValueError: boom")
        await fail(log, tenant, 1, tail="ValueError: boom")
        jobs = await job_until(log, job_failed, "the job failed")
    [failed] = job_failed(jobs)
    assert failed.reason == "shard 0 failed: exit status 1" and failed.log_tail == "ValueError: boom"
    assert not of(jobs, JobAssignmentRevoked)


async def test_one_failed_rank_with_every_peer_alive_fails_the_job_after_the_grace(
    log: EventLog, tenant: str
) -> None:
    # beats a second apart: at 0.5 s, a loaded host (the suite runs engines beside it) delayed the
    # test's own beats past their deadline and lost a peer that was alive
    async with fleet(log, 1.0):
        await started_gang(log, tenant)
        await fail(log, tenant, 1, tail="ValueError: rank 1 only")
        jobs = await job_until(log, job_failed, "the job failed")
    rank = next(r for r in jobs if isinstance(r.event, JobFailed) and r.event.slot == 1)
    job = next(r for r in jobs if isinstance(r.event, JobFailed) and r.event.slot is None)
    waited = (job.time_ns - rank.time_ns) / 1e9
    assert waited >= 4 * 1.0, f"failed after {waited:.2f}s, before a lost peer could have shown"
    assert job.event.reason == "shard 1 failed: exit status 1" and "rank 1 only" in job.event.log_tail
