"""The coordinator with real agent processes against a real nats-server."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from agent.simulated import SimulatedFleet
from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, worker_subject
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobQueued,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.workers import Heartbeat, WorkerCordoned, WorkerLost
from tests.support import AgentProcess, coordinator, of, records, registered, until, wait_records
from tests.support.work import py, submit

CHECKPOINT_THEN_SLEEP = """
import os, time
resume = os.environ.get("RESONTECH_RESUME_FROM", "")
print('RESONTECH_CHECKPOINT {"object_key": "jobs/long/checkpoints/long/ckpt-1", "round": 1}', flush=True)
resumed = int(resume == "jobs/long/checkpoints/long/ckpt-1")
print('RESONTECH_PROGRESS {"step": 2, "metrics": {"resumed": %d}}' % resumed, flush=True)
time.sleep(0 if resume else 120)
"""


async def test_a_submitted_job_runs_on_an_agent_and_completes(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    await registered(log, agents("a1"))
    await registered(log, agents("a2"))
    async with coordinator(log):
        await submit(log, "hello", py('print(\'RESONTECH_PROGRESS {"step": 1, "loss": 0.5}\')'), shards=2)
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobCompleted), "job.completed")
    [placed] = of(jobs, JobPlaced)
    assert sorted(a.slot for a in placed.assignments) == [0, 1]
    assert len({a.worker_id for a in placed.assignments}) == 2  # spread over both agents
    assert placed.provenance.candidates == 2 and placed.provenance.top
    assert len(of(jobs, JobShardCompleted)) == 2


async def test_sigkill_of_an_agent_moves_its_work_and_resumes_from_the_checkpoint(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    first, second = agents("k1"), agents("k2")
    ids = {await registered(log, first): first, await registered(log, second): second}
    checkpoint_then_sleep = py(CHECKPOINT_THEN_SLEEP)
    async with coordinator(log):
        await submit(log, "long", checkpoint_then_sleep)
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "the job started")
        await wait_records(
            log, "JOBS", lambda rs: any(r.subject.endswith(".checkpointed") for r in rs), "a checkpoint"
        )
        [placed] = of(jobs, JobPlaced)
        victim = placed.assignments[0].worker_id
        killed_at = time.monotonic()
        ids[victim].kill()
        await wait_records(log, "WORKERS", lambda rs: of(rs, WorkerLost), "worker.lost")
        detected = time.monotonic() - killed_at
        jobs = await wait_records(
            log, "JOBS", lambda rs: of(rs, JobCompleted), "the replacement completed the job"
        )
    assert detected < 4.0, f"lost after {detected:.1f}s"
    [revoked] = of(jobs, JobAssignmentRevoked)
    assert (revoked.worker_id, revoked.reason) == (victim, "worker lost")
    replacement = of(jobs, JobPlaced)[1].assignments[0]
    assert replacement.worker_id != victim and replacement.epoch == 2
    resumed = [r.event for r in jobs if r.subject.endswith(".progress") and r.event.epoch == 2]
    assert resumed and resumed[0].metrics == {"resumed": 1.0}


async def test_a_job_that_has_to_wait_says_why(log: EventLog, agents: Callable[..., AgentProcess]) -> None:
    worker_id = await registered(log, agents("only"))
    await log.append(
        worker_subject(worker_id, WorkerCordoned), WorkerCordoned(reason="maintenance", by="ops")
    )
    async with coordinator(log):
        await submit(log, "patient", py("print(1)"))
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobQueued), "job.queued with a reason")
    [queued] = of(jobs, JobQueued)
    assert "cordoned" in queued.reason
    assert not of(jobs, JobPlaced)


async def test_two_coordinators_never_place_the_same_job_twice(log: EventLog) -> None:
    fleet = SimulatedFleet(log, 50, interval_s=30.0, seed=3)
    await fleet.register()
    await fleet.beat()
    await log.append_many(
        (job_subject("acme", f"j{i}", JobSubmitted), JobSubmitted(name=f"j{i}", kind="process", shards=1))
        for i in range(1000)
    )
    async with coordinator(log, "c1") as one, coordinator(log, "c2") as two:
        await until(lambda: one.placements + two.placements >= 1000, "1000 placements", timeout=120)
    placed = Counter(r.subject for r in await records(log, "JOBS") if isinstance(r.event, JobPlaced))
    assert len(placed) == 1000
    assert max(placed.values()) == 1, "a job was placed twice"


async def test_a_worker_whose_work_keeps_failing_is_cordoned(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    worker_id = await registered(log, agents("flaky"))
    async with coordinator(log):
        for n in range(3):
            await submit(log, f"crash{n}", py("import sys; sys.exit(7)"))
        workers = await wait_records(log, "WORKERS", lambda rs: of(rs, WorkerCordoned), "worker.cordoned")
    [cordoned] = of(workers, WorkerCordoned)
    assert "3" in cordoned.reason and cordoned.by == "coordinator"
    assert workers[-1].subject == f"worker.{worker_id}.cordoned"


async def test_a_shard_its_agent_stopped_three_times_fails_its_job(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("restarting", "--heartbeat", "10")  # lost after 30 s: a restart under load is well within
    await registered(log, agent)
    async with coordinator(log):
        await submit(log, "fragile", ["sleep", "60"])
        for epoch in (1, 2, 3):
            await wait_records(
                log, "JOBS", lambda rs, epoch=epoch: of(rs, JobStarted, epoch=epoch), f"epoch {epoch} started"
            )
            assert agent.stop() == 0  # SIGTERM: the agent reports its shard failed, retryable
            if epoch < 3:
                agent.start()
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobFailed, retryable=False), "job.failed")
    [failed] = of(jobs, JobFailed, retryable=False)
    assert failed.slot is None and failed.reason == "shard 0 was stopped 3 times, the last: agent stopped"
    assert [a.epoch for e in of(jobs, JobPlaced) for a in e.assignments] == [1, 2, 3]  # no 4th attempt
    assert len(of(jobs, JobFailed, retryable=True)) == 3


async def test_heartbeats_of_an_unknown_worker_are_ignored_and_counted(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    await registered(log, agents("known"))
    await log.append(heartbeat_subject("w-stranger"), Heartbeat(cpu_pct=1.0))
    async with coordinator(log) as instance:
        await until(lambda: instance.unknown_heartbeats == 1, "the stranger counted")
        await submit(log, "fine", py("print(1)"))
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobCompleted), "job.completed")
    [placed] = of(jobs, JobPlaced)
    assert placed.assignments[0].worker_id != "w-stranger"
