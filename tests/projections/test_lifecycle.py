"""A job's way through the queue (:mod:`projections.lifecycle`), without a server: each folds real events
through the schedule reducer, then asks what the coordinator should append."""

from __future__ import annotations

from core.placement.values import Placed, Unplaceable
from projections import SCHEDULE, lifecycle, recovery
from projections.admission import Victim, Wait
from projections.recovery import Revocation, Stop
from projections.schedule import JobRecord, ScheduleState, job_key
from schemas.commands import StopWork
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobQueued,
    JobResources,
    JobShardCompleted,
    JobSubmitted,
)
from schemas.values import Provenance
from tests.support.reducer_builders import Job, Log, asg

PROV = Provenance(candidates=2)


def _submit(log: Log, job_id: str, *, gpus: int = 1, shards: int = 1, priority: int = 0) -> Job:
    job = Job(log, job_id)
    resources = JobResources(gpus=gpus, cpus=0.0, memory_mb=0)
    job(JobSubmitted(name=job_id, kind="process", shards=shards, priority=priority, resources=resources))
    return job


def _record(log: Log, job_id: str) -> JobRecord:
    state: ScheduleState = log.state
    return state.jobs[job_key("acme", job_id)]


def test_a_job_waiting_for_quota_is_rejected_when_it_never_fits_else_queued_once_per_reason() -> None:
    log = Log(SCHEDULE)
    _submit(log, "j1")
    job = _record(log, "j1")
    assert lifecycle.waiting(job, Wait(reason="over quota", permanent=True)) == JobFailed(
        reason="rejected: over quota", retryable=False
    )
    assert lifecycle.waiting(job, Wait(reason="over quota")) == JobQueued(reason="over quota")
    Job(log, "j1")(JobQueued(reason="over quota"))
    assert lifecycle.waiting(_record(log, "j1"), Wait(reason="over quota")) is None  # said already


def test_admission_orders_the_admitted_and_says_why_the_others_wait() -> None:
    log = Log(SCHEDULE)
    _submit(log, "fits", gpus=3)
    _submit(log, "waits", gpus=2)  # 3 + 2 > 4: waits, and blocks the tenant's pool behind it
    _submit(log, "never", gpus=5)  # over the quota itself: rejected
    _submit(log, "behind", gpus=1)  # would fit, but queues behind "waits"
    reason = "queued behind job waits, which waits for quota"
    Job(log, "behind")(JobQueued(reason=reason))  # already says so: nothing to append
    admission = lifecycle.admission(log.state, {"acme": {"shared": 4}}, usage={})
    assert [job.job_id for job in admission.order] == ["fits"]
    said = {job.job_id: event for job, event in admission.waits}
    assert set(said) == {"waits", "never"}
    assert isinstance(said["waits"], JobQueued) and said["waits"].reason.startswith("over quota: ")
    never = said["never"]
    assert isinstance(never, JobFailed) and never.reason.startswith("rejected: over quota: ")
    assert not never.retryable


def test_a_placement_is_appended_whole() -> None:
    a0, a1 = asg(0, 1, "w1"), asg(1, 1, "w2")
    placed = lifecycle.placed(Placed(assignments=[a0, a1], provenance=PROV))
    assert placed == JobPlaced(assignments=[a0, a1], provenance=PROV)


def test_a_job_that_never_fits_and_holds_nothing_is_rejected_whatever_it_could_preempt() -> None:
    log = Log(SCHEDULE)
    _submit(log, "big", gpus=8)
    victim = Victim(job_key("acme", "small"), asg(0, 1, "w1", "small"), "job")
    never = Unplaceable(reason="no worker has 8 GPUs", provenance=PROV, permanent=True)
    outcome = lifecycle.unplaced(_record(log, "big"), never, [victim], log.state)
    assert outcome == lifecycle.Unplaced(
        event=JobFailed(reason="rejected: no worker has 8 GPUs", retryable=False)
    )
    assert lifecycle.rejects(_record(log, "big"), never)


def test_a_job_that_holds_shards_is_never_rejected_but_queued_with_why_once() -> None:
    log = Log(SCHEDULE)
    job = _submit(log, "j1", shards=2)
    job.place(asg(0, 1))
    never = Unplaceable(reason="no room", provenance=PROV, permanent=True)
    assert not lifecycle.rejects(_record(log, "j1"), never)
    outcome = lifecycle.unplaced(_record(log, "j1"), never, [], log.state)
    assert outcome == lifecycle.Unplaced(event=JobQueued(reason="no room"))
    job(JobQueued(reason="no room"))
    assert lifecycle.unplaced(_record(log, "j1"), never, [], log.state) == lifecycle.Unplaced()


def test_preemption_revokes_each_job_victim_and_checkpoints_and_stops_it() -> None:
    log = Log(SCHEDULE)
    small = _submit(log, "small", priority=0)
    held = asg(0, 1, "w1", "small")
    small.place(held)
    _submit(log, "urgent", priority=5)
    victims = [
        Victim(job_key("acme", "small"), held, "job", 0),
        Victim("acme/e1", asg(0, 1, "w2", "e1"), "endpoint"),  # the autoscaler's, never preempted
        Victim(job_key("acme", "gone"), asg(0, 1, "w3", "gone"), "job"),  # not in the schedule
    ]
    busy = Unplaceable(reason="no GPU free", provenance=PROV)
    outcome = lifecycle.unplaced(_record(log, "urgent"), busy, victims, log.state)
    stop = StopWork(
        work_id="small",
        assignment_id=held.assignment_id,
        epoch=1,
        reason="preempted by acme/urgent",
        checkpoint=True,
        tenant="acme",
        work_kind="job",
    )
    revocation = recovery.revoked(held, "preempted by acme/urgent")
    sent = Stop("w1", stop, f"preempt-{held.assignment_id}")
    expected = Revocation(_record(log, "small"), revocation, sent)
    assert outcome == lifecycle.Unplaced(preempt=[expected])  # and its own queue reason stays as it is


def test_a_live_job_completes_once_every_shard_is_done() -> None:
    log = Log(SCHEDULE)
    job = _submit(log, "j1", shards=2)
    a0, a1 = asg(0, 1, "w1"), asg(1, 1, "w2")
    job.place(a0, a1)
    for a in (a0, a1):
        job.start(a)
    job(JobShardCompleted(assignment_id=a0.assignment_id, worker_id="w1", slot=0, epoch=1))
    assert lifecycle.completed(_record(log, "j1")) is None
    job(JobShardCompleted(assignment_id=a1.assignment_id, worker_id="w2", slot=1, epoch=1))
    assert lifecycle.completed(_record(log, "j1")) == JobCompleted()
    job(JobCompleted())
    assert lifecycle.completed(_record(log, "j1")) is None  # completed once
