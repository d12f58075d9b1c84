"""The coordinator's gang decisions (:func:`projections.gangs.settle`, :func:`projections.gangs.restart`),
without a server: each folds real events through the schedule and registry reducers, then asks what
the kernel should append (``gangs.partial`` and ``gangs.verdict`` are in
tests/agent/runtimes/test_torchrun.py)."""

from __future__ import annotations

from typing import Any

from projections import REGISTRY, SCHEDULE, gangs, recovery
from projections.liveness import LastBeat
from projections.recovery import Revocation, Stop
from projections.registry import WorkerRecord
from projections.schedule import JobRecord, job_key
from schemas.commands import StopWork
from schemas.jobs import JobFailed, JobShardCompleted, JobSubmitted
from schemas.values import Assignment
from schemas.workers import WorkerLost
from tests.support.reducer_builders import Job, Log, asg, register, verify

S = 1_000_000_000
GRACE = 4 * S


def _workers(*lost: str) -> dict[str, WorkerRecord]:
    """w1..w3 registered and verified; ``lost`` declared lost."""
    log = Log(REGISTRY)
    for worker in ("w1", "w2", "w3"):
        register(log, worker)
        verify(log, worker)
    for worker in lost:
        log(f"worker.{worker}.lost", WorkerLost(silent_s=3.0, last_heartbeat_seq=1), 5.0)
    workers: dict[str, WorkerRecord] = log.state.workers
    return workers


def _gang(log: Log, shards: int = 2) -> tuple[Job, list[Assignment]]:
    job = Job(log)
    job.submit(shards=shards)
    held = [asg(slot, 1, f"w{slot + 1}") for slot in range(shards)]
    job.place(*held)
    for a in held:
        job.start(a)
    return job, held


def _record(log: Log) -> JobRecord:
    record: JobRecord = log.state.jobs[job_key("acme", "j1")]
    return record


def _fail(job: Job, a: Assignment, *, retryable: bool = False, reason: str = "boom") -> None:
    job(
        JobFailed(
            reason=reason,
            slot=a.slot,
            epoch=a.epoch,
            retryable=retryable,
            assignment_id=a.assignment_id,
            log_tail="Traceback",
        )
    )


def _settle(log: Log, workers: dict[str, WorkerRecord], since_s: int = 0, now_s: int = 0) -> Any:
    return gangs.settle(_record(log), workers, failing_since_ns=since_s * S, now_ns=now_s * S, grace_ns=GRACE)


def _stop(a: Assignment, reason: str) -> Stop:
    command = StopWork(
        work_id="j1",
        assignment_id=a.assignment_id,
        epoch=a.epoch,
        reason=reason,
        tenant="acme",
        work_kind="job",
    )
    return Stop(a.worker_id, command, f"gang-stop-{a.assignment_id}")


def test_a_restart_revokes_every_shard_in_slot_order_and_stops_only_live_unfinished_ones() -> None:
    log = Log(SCHEDULE)
    job, (a0, a1, a2) = _gang(log, shards=3)
    job(JobShardCompleted(assignment_id=a2.assignment_id, worker_id="w3", slot=2, epoch=1))
    decided = gangs.restart(_record(log), "gang restart: x", _workers("w2"))
    record = _record(log)
    assert decided == [
        Revocation(record, recovery.revoked(a0, "gang restart: x"), _stop(a0, "gang restart: x")),
        Revocation(record, recovery.revoked(a1, "gang restart: x"), None),  # its worker is lost
        Revocation(record, recovery.revoked(a2, "gang restart: x"), None),  # its shard is done
    ]
    assert [r.stop for r in gangs.restart(record, "x", {})] == [None, None, None]  # unknown workers


def test_a_gang_that_lost_a_shard_restarts_whole() -> None:
    log = Log(SCHEDULE)
    job, (a0, a1) = _gang(log)
    job.revoke(a1, "worker lost")
    assert gangs.partial(_record(log))
    reason = "gang restart: worker lost"  # the revocation's reason, which queued the job
    assert _settle(log, _workers("w2")) == [
        Revocation(_record(log), recovery.revoked(a0, reason), _stop(a0, reason))
    ]


def test_a_rank_stopped_by_its_agent_restarts_the_gang() -> None:
    log = Log(SCHEDULE)
    job, (a0, a1) = _gang(log)
    _fail(job, a0, retryable=True, reason="agent stopped")
    _fail(job, a1, reason="peer gone")
    decided = _settle(log, _workers())
    assert [r.event for r in decided] == [
        recovery.revoked(a, "gang restart: peer gone") for a in (a0, a1)
    ]  # the latest failure names the restart
    assert [r.stop is not None for r in decided] == [True, True]


def test_a_failed_rank_waits_out_the_grace_then_fails_the_gang_naming_the_lowest_slot() -> None:
    log = Log(SCHEDULE)
    job, (_, a1) = _gang(log)
    _fail(job, a1, reason="CUDA error")
    assert _settle(log, _workers(), since_s=10, now_s=12) == []  # a peer may still turn out lost
    assert _settle(log, _workers(), since_s=10, now_s=14) == JobFailed(
        reason="shard 1 failed: CUDA error", log_tail="Traceback"
    )


def test_nothing_to_settle_for_a_healthy_gang_a_finished_one_or_a_job_that_is_no_gang() -> None:
    log = Log(SCHEDULE)
    job, (a0, _) = _gang(log)
    assert _settle(log, _workers()) == []
    other = Log(SCHEDULE)
    plain = Job(other)
    plain(JobSubmitted(name="j1", kind="process", shards=2))
    plain.place(a0)
    assert gangs.settle(_record(other), _workers(), failing_since_ns=0, now_ns=0, grace_ns=0) == []
    job(JobFailed(reason="input missing at start", retryable=False))
    assert _record(log).state == "failed" and _settle(log, _workers()) == []


def test_the_grace_outlasts_the_slowest_peers_loss_deadline() -> None:
    log = Log(SCHEDULE)
    _gang(log)
    beats = {
        "w1": LastBeat(seq=1, time_ns=0, interval_s=1.0),
        "w2": LastBeat(seq=2, time_ns=0, interval_s=2.0),
    }
    assert gangs.grace_ns(_record(log), beats, tick_s=0.2) == round((4 * 2.0 + 0.4) * S)
    assert gangs.grace_ns(_record(log), {}, tick_s=0.5) == 5 * S  # unknown intervals: 1 s
