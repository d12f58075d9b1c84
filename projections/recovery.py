"""What the kernel does when work or workers go wrong: pure decisions that return the events to append.

The coordinator reads its projections, calls these, and appends what they return (with the expected
sequence of the job or worker, so that two coordinators never both win); each rule lives here once and
is tested without a server:

* a worker is **lost** when it is available and its heartbeats ran out (:func:`lost`), and
  **recovered** when a lost worker beats again after it was declared lost (:func:`recovered`);
* every current assignment on a lost worker is **revoked**, so that it is placed again
  (:func:`revocations_on`), and so is one its agent **rejected** (:func:`rejected_revocations`);
* a shard that **failed** fails its job (the tenant's code crashed); one **stopped** by its agent
  (``retryable``: the agent stopped, a start failed for want of a port) is revoked and placed again,
  until it was stopped :data:`MAX_SHARD_ATTEMPTS` times: then the job fails with the last reason
  (:func:`settle_failures`). Gangs (DDP) have rules of their own (:mod:`projections.gangs`).

A revocation whose workload may still run comes with the :class:`Stop` to send its worker once it is
appended (:class:`Revocation`): preemption (:mod:`projections.lifecycle`) and gang restarts do that.

Pure: no I/O, no clock (times are parameters).
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from core.clock import NS_PER_S
from projections.liveness import LastBeat
from projections.registry import WorkerRecord
from projections.schedule import TERMINAL, JobRecord
from schemas.commands import StopWork
from schemas.endpoints import EndpointReplicaRevoked
from schemas.jobs import JobAssignmentRevoked, JobFailed
from schemas.values import Assignment
from schemas.workers import WorkerLost, WorkerRecovered

MAX_SHARD_ATTEMPTS = 3
"""A shard stopped this many times (by its agent, not by its own failure) fails its job."""


class Stop(NamedTuple):
    """A ``stop_work`` for ``worker_id``, sent under ``command_id`` (its message id: sent twice, it is
    stored once)."""

    worker_id: str
    command: StopWork
    command_id: str


class Revocation(NamedTuple):
    """A revocation to append about ``job`` (at its expected sequence) and, once it is appended, the
    ``stop`` to send the worker that may still run it (``None``: nothing to stop)."""

    job: JobRecord
    event: JobAssignmentRevoked
    stop: Stop | None = None


def stop(
    job: JobRecord, assignment: Assignment, reason: str, *, command_id: str, checkpoint: bool = False
) -> Stop:
    """The stop of ``assignment`` of ``job`` (``checkpoint``: checkpoint first, then stop); it names
    the job's tenant, so that the agent stops only the workload of that tenant's job."""
    command = StopWork(
        work_id=job.job_id,
        assignment_id=assignment.assignment_id,
        epoch=assignment.epoch,
        reason=reason,
        checkpoint=checkpoint,
        tenant=job.tenant,
        work_kind="job",
    )
    return Stop(assignment.worker_id, command, command_id)


R = TypeVar("R", JobAssignmentRevoked, EndpointReplicaRevoked)


def revoked_as(kind: type[R], assignment: Assignment, reason: str) -> R:
    """The revocation of ``assignment``, as an event of ``kind`` (a job's or a replica's)."""
    return kind(
        assignment_id=assignment.assignment_id,
        worker_id=assignment.worker_id,
        slot=assignment.slot,
        epoch=assignment.epoch,
        reason=reason,
    )


def revoked(assignment: Assignment, reason: str) -> JobAssignmentRevoked:
    """The revocation of a job's ``assignment`` (its slot is placed again, at a new epoch)."""
    return revoked_as(JobAssignmentRevoked, assignment, reason)


def lost(record: WorkerRecord | None, beat: LastBeat, now_ns: int) -> WorkerLost | None:
    """``worker.lost`` for a worker whose heartbeats ran out at ``now_ns`` (the caller knows they
    did), unless it is unknown or already lost or gone."""
    if record is None or record.state in ("lost", "deregistered"):
        return None
    return WorkerLost(silent_s=(now_ns - beat.time_ns) / NS_PER_S, last_heartbeat_seq=beat.seq)


def recovered(record: WorkerRecord | None, beat: LastBeat | None, *, silent: bool) -> WorkerRecovered | None:
    """``worker.recovered`` for a lost worker whose latest beat came after it was declared lost and
    is not itself overdue (``silent``)."""
    if record is None or record.state != "lost" or beat is None or silent:
        return None
    if beat.time_ns <= (record.lost_since_ns or 0):
        return None
    return WorkerRecovered(down_s=(beat.time_ns - (record.lost_since_ns or beat.time_ns)) / NS_PER_S)


def revocations_on(job: JobRecord, worker_id: str, reason: str) -> list[JobAssignmentRevoked]:
    """The revocations of ``job``'s current, unfinished assignments on ``worker_id``."""
    if job.state in TERMINAL:
        return []
    return [
        revoked(assignment, reason)
        for slot, assignment in job.assignments.items()
        if assignment.worker_id == worker_id and slot not in job.done
    ]


def rejected_revocations(job: JobRecord) -> list[JobAssignmentRevoked]:
    """The revocations of ``job``'s assignments their agent rejected."""
    return [
        revoked(assignment, f"rejected by the worker: {reason}")
        for assignment in job.assignments.values()
        if (reason := job.rejected_by.get(assignment.worker_id)) is not None
    ]


def settle_failures(job: JobRecord, *, gang: bool = False) -> list[JobFailed | JobAssignmentRevoked]:
    """What ``job``'s failed shards call for: ``job.failed`` when one failed on its own or was stopped
    :data:`MAX_SHARD_ATTEMPTS` times (the lowest such slot names the reason), else the revocation of
    every failed slot's assignment (a retry). Nothing for a finished job or a gang (``gang``: its
    rules are :mod:`projections.gangs`)."""
    if job.state in TERMINAL or not job.failed_slots or gang:
        return []
    fatal = sorted(slot for slot, retryable in job.failed_slots.items() if not retryable)
    spent = sorted(s for s in job.failed_slots if job.retries.get(s, 0) >= MAX_SHARD_ATTEMPTS)
    if fatal or spent:
        slot = (fatal or spent)[0]
        how = "failed" if fatal else f"was stopped {job.retries[slot]} times, the last"
        reason = f"shard {slot} {how}: {job.failure_reason}"
        return [JobFailed(reason=reason, log_tail=job.log_tail, retryable=False)]
    return [
        revoked(assignment, f"retry: {job.failure_reason}")
        for slot in job.failed_slots
        if (assignment := job.assignments.get(slot)) is not None
    ]
