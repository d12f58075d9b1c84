"""A job's way through the queue to its end: pure decisions that return the events to append.

The coordinator tries the queued jobs (:func:`admission`), places each that fits (:func:`placed`) and
appends what these return about the others, each at its job's expected sequence:

* a job that waits for **quota** is rejected when it could never fit the quota as set, else queued
  with the reason, once per reason (:func:`waiting`);
* a job that does **not fit** the fleet (:func:`unplaced`) is rejected when it never can and holds
  nothing, else it **preempts** the victims :func:`projections.admission.preemption_victims` chose
  (:func:`preemptions`: each job victim's assignment is revoked, and its worker told to checkpoint
  and stop), else it is queued with why, once per reason;
* a live job all of whose shards are done **completes** (:func:`completed`).

What goes wrong with running work is :mod:`projections.recovery`; gangs, :mod:`projections.gangs`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from core.placement.values import Placed, Unplaceable
from projections.admission import Quotas, Usage, Victim, Wait, triage
from projections.recovery import Revocation, revoked, stop
from projections.schedule import TERMINAL, JobRecord, ScheduleState
from schemas.jobs import JobCompleted, JobFailed, JobPlaced, JobQueued


class Admission(NamedTuple):
    """The queued jobs to try, in order, and what to append about those that wait for quota."""

    order: list[JobRecord]
    waits: list[tuple[JobRecord, JobFailed | JobQueued]]


class Unplaced(NamedTuple):
    """What a job that did not fit calls for: an event about itself (rejected or queued), or the
    revocations of the work it preempts (both empty: nothing new to say)."""

    event: JobFailed | JobQueued | None = None
    preempt: Sequence[Revocation] = ()


def waiting(job: JobRecord, wait: Wait) -> JobFailed | JobQueued | None:
    """What to append about a job that waits for quota: ``job.failed`` (rejected) when the wait is
    permanent, else ``job.queued`` with its reason unless that is already the job's."""
    if wait.permanent and job.state not in TERMINAL:
        return JobFailed(reason=f"rejected: {wait.reason}", retryable=False)
    if wait.reason != job.queue_reason:
        return JobQueued(reason=wait.reason)
    return None


def admission(queued: ScheduleState, quotas: Quotas, usage: Usage) -> Admission:
    """The jobs of ``queued`` to try, in order, under their tenants' quotas
    (:func:`projections.admission.triage`), and the appends about those that wait (:func:`waiting`)."""
    order, waits = triage(queued, quotas, usage)
    appends = [(job, event) for job, wait in waits if (event := waiting(job, wait)) is not None]
    return Admission(order, appends)


def placed(decision: Placed) -> JobPlaced:
    """The ``job.placed`` that carries out a placement."""
    return JobPlaced(assignments=decision.assignments, provenance=decision.provenance)


def rejects(job: JobRecord, decision: Unplaceable) -> bool:
    """True when a job that did not fit is rejected: it never can, and holds no assignment."""
    return decision.permanent and not job.assignments


def preemptions(victims: Sequence[Victim], schedule: ScheduleState, *, by: str) -> list[Revocation]:
    """Checkpoint-and-requeue of each job victim: its assignment revoked, then its worker told to
    checkpoint and stop (command id ``preempt-<assignment>``), both saying ``preempted by <by>``.
    Endpoint replicas are scaled down by the autoscaler, never preempted here; a victim whose job
    ``schedule`` does not hold is skipped."""
    out = []
    reason = f"preempted by {by}"
    for victim in victims:
        job = schedule.jobs.get(victim.key) if victim.kind == "job" else None
        if job is None:
            continue
        command_id = f"preempt-{victim.assignment.assignment_id}"
        halt = stop(job, victim.assignment, reason, command_id=command_id, checkpoint=True)
        out.append(Revocation(job, revoked(victim.assignment, reason), halt))
    return out


def unplaced(
    job: JobRecord, decision: Unplaceable, victims: Sequence[Victim], schedule: ScheduleState
) -> Unplaced:
    """What a job that did not fit calls for, in this order: rejected (:func:`rejects`); the
    preemption of ``victims`` when there are any (its queue reason is then left as it is); queued
    with the decision's reason unless that is already the job's.

    Args:
        victims: :func:`projections.admission.preemption_victims` for the job (empty: none, or not
            looked for).
        schedule: the schedule that holds the victims' jobs.
    """
    if rejects(job, decision):
        return Unplaced(event=JobFailed(reason=f"rejected: {decision.reason}", retryable=False))
    if victims:
        return Unplaced(preempt=preemptions(victims, schedule, by=f"{job.tenant}/{job.job_id}"))
    if decision.reason != job.queue_reason:
        return Unplaced(event=JobQueued(reason=decision.reason))
    return Unplaced()


def completed(job: JobRecord) -> JobCompleted | None:
    """``job.completed`` for a live job every shard of which is done."""
    if job.state not in TERMINAL and len(job.done) == job.spec.shards:
        return JobCompleted()
    return None
