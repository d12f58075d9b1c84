"""The coordinator's recovery decisions (:mod:`projections.recovery`), without a server: each folds real
events through the schedule and registry reducers, then asks what the kernel should append."""

from __future__ import annotations

from projections import REGISTRY, SCHEDULE, recovery
from projections.liveness import LastBeat
from projections.recovery import MAX_SHARD_ATTEMPTS
from projections.schedule import JobRecord, job_key
from schemas.jobs import JobAssignmentRevoked, JobFailed, JobRejected, JobSubmitted
from schemas.values import Assignment
from schemas.workers import WorkerLost, WorkerRecovered
from tests.support.reducer_builders import Job, Log, asg, register, verify

S = 1_000_000_000


def _process_job(log: Log, shards: int = 2) -> Job:
    job = Job(log)
    job(JobSubmitted(name="j1", kind="process", shards=shards))
    return job


def _record(log: Log) -> JobRecord:
    return log.state.jobs[job_key("acme", "j1")]


def _fail(job: Job, a: Assignment, *, retryable: bool, reason: str = "boom") -> None:
    job(
        JobFailed(
            reason=reason, slot=a.slot, epoch=a.epoch, retryable=retryable, assignment_id=a.assignment_id
        )
    )


def test_a_shard_stopped_by_its_agent_is_retried_until_its_third_stop_fails_the_job() -> None:
    log = Log(SCHEDULE)
    job = _process_job(log, shards=1)
    for epoch in range(1, MAX_SHARD_ATTEMPTS + 1):
        a = asg(0, epoch)
        job.place(a)
        _fail(job, a, retryable=True, reason=f"agent stopped ({epoch})")
        decided = recovery.settle_failures(_record(log))
        if epoch < MAX_SHARD_ATTEMPTS:
            assert decided == [recovery.revoked(a, f"retry: agent stopped ({epoch})")]
            job(decided[0])
        else:
            [failed] = decided
            assert isinstance(failed, JobFailed) and not failed.retryable
            assert failed.reason == "shard 0 was stopped 3 times, the last: agent stopped (3)"


def test_a_shard_that_failed_on_its_own_fails_the_job_at_once_naming_the_lowest_slot() -> None:
    log = Log(SCHEDULE)
    job = _process_job(log, shards=3)
    a0, a1, a2 = asg(0, 1), asg(1, 1, "w2"), asg(2, 1, "w3")
    job.place(a0, a1, a2)
    _fail(job, a2, retryable=False, reason="Traceback: KeyError")
    _fail(job, a0, retryable=True, reason="agent stopped")
    [failed] = recovery.settle_failures(_record(log))
    assert isinstance(failed, JobFailed) and failed.reason.startswith("shard 2 failed: ")


def test_nothing_to_settle_for_a_healthy_job_a_finished_one_or_a_gang() -> None:
    log = Log(SCHEDULE)
    job = _process_job(log, shards=1)
    a = asg(0, 1)
    job.place(a)
    assert recovery.settle_failures(_record(log)) == []
    _fail(job, a, retryable=True)
    assert recovery.settle_failures(_record(log), gang=True) == []  # gangs: projections.gangs


def test_a_lost_worker_gives_back_its_unfinished_assignments_and_rejected_ones_are_placed_elsewhere() -> None:
    log = Log(SCHEDULE)
    job = _process_job(log, shards=2)
    a0, a1 = asg(0, 1, "w1"), asg(1, 1, "w2")
    job.place(a0, a1)
    assert recovery.revocations_on(_record(log), "w1", "worker lost") == [recovery.revoked(a0, "worker lost")]
    assert recovery.revocations_on(_record(log), "w9", "worker lost") == []
    job(JobRejected(assignment_id=a1.assignment_id, worker_id="w2", epoch=1, reason="busy"))
    [revocation] = recovery.rejected_revocations(_record(log))
    assert isinstance(revocation, JobAssignmentRevoked)
    assert (revocation.worker_id, revocation.reason) == ("w2", "rejected by the worker: busy")


def test_loss_and_recovery_of_a_worker() -> None:
    log = Log(REGISTRY)
    register(log, "w1", 0.0)
    verify(log, "w1", 1.0)
    record = log.state.workers["w1"]
    beat = LastBeat(seq=7, time_ns=10 * S, interval_s=1.0)
    lost = recovery.lost(record, beat, now_ns=14 * S)
    assert lost == WorkerLost(silent_s=4.0, last_heartbeat_seq=7)
    log("worker.w1.lost", lost, 14.0)
    assert recovery.lost(log.state.workers["w1"], beat, now_ns=15 * S) is None  # already lost
    assert recovery.lost(None, beat, now_ns=15 * S) is None
    old = LastBeat(seq=7, time_ns=10 * S, interval_s=1.0)
    assert recovery.recovered(log.state.workers["w1"], old, silent=False) is None  # the beat before
    back = LastBeat(seq=9, time_ns=20 * S, interval_s=1.0)
    assert recovery.recovered(log.state.workers["w1"], back, silent=True) is None
    assert recovery.recovered(log.state.workers["w1"], back, silent=False) == WorkerRecovered(down_s=6.0)
