"""Gang jobs (``ddp``): every shard is a node of one torchrun world, so the shards live and die together.

A DDP world cannot go on with a rank missing, and a rank cannot join a world already running. So:

* A gang with some shards revoked (worker lost, rejected, preempted) is broken (:func:`partial`):
  the coordinator revokes the assignments it still holds, done ones included, and stops their
  workloads, so that the whole gang is placed again at a new epoch and every rank resumes from the
  last checkpoint. Placement waits until every shard is free, so the ranks of a world always share
  one epoch and one rendezvous.
* When one rank dies the others fail too, within seconds (a collective finds its peer gone), often
  *before* the kernel declares the dead rank's worker lost (three heartbeat intervals). A failed rank
  fails the job only once it cannot be collateral damage (:func:`verdict`): every rank failed (a bug
  in the training code fails them all), or no peer was lost within the grace period
  (:func:`grace_ns`: long enough for the slowest peer's loss to be declared).

:func:`settle` is the coordinator's decision about one gang: the revocations of a restart
(:func:`restart`: every assignment, each with the stop of its workload where its worker lives), the
job's failure, or nothing.

Pure: no I/O, no clock (times are parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from core.clock import LOST_AFTER_INTERVALS, believed_interval_s, seconds_ns
from projections.liveness import LastBeat
from projections.recovery import Revocation, revoked, stop
from projections.registry import WorkerRecord
from projections.schedule import TERMINAL, JobRecord
from schemas.jobs import JobFailed

GANG_KINDS: frozenset[str] = frozenset({"ddp"})
Verdict = Literal["wait", "restart", "fail"]


def is_gang(job: JobRecord) -> bool:
    """True for a job whose shards run as one world (all restart when one is lost)."""
    return job.spec.kind in GANG_KINDS


def partial(job: JobRecord) -> bool:
    """True for a live gang that holds some of its shards but not all: broken, its remaining
    assignments are revoked, and it is not placed until none is left."""
    return is_gang(job) and job.state not in TERMINAL and 0 < len(job.assignments) < job.spec.shards


def verdict(job: JobRecord, *, failing_since_ns: int, now_ns: int, grace_ns: int) -> Verdict | None:
    """What to do about a gang with failed ranks (``None`` when none failed).

    * ``restart``: a rank was stopped by its agent (a retryable failure): the others failed, if at
      all, because it left; revoke the gang and place it again.
    * ``fail``: every rank failed or finished, or ``grace_ns`` passed since the first failure was
      seen (``failing_since_ns``) and no peer was lost meanwhile (a lost peer breaks the gang, which
      :func:`partial` catches first).
    * ``wait``: a peer may still turn out lost.
    """
    if job.state in TERMINAL or not job.failed_slots:
        return None
    if any(job.failed_slots.values()):
        return "restart"
    ended = job.failed_slots.keys() | job.done.keys()
    if len(ended) >= job.spec.shards or now_ns - failing_since_ns >= grace_ns:
        return "fail"
    return "wait"


def grace_ns(job: JobRecord, beats: Mapping[str, LastBeat], tick_s: float) -> int:
    """How long a failed rank waits for a peer to be declared lost: one heartbeat interval more than
    the slowest peer's loss deadline (its latest beat's interval, 1 s when unknown), plus two
    decision ticks of ``tick_s`` seconds."""
    interval = max(
        (
            believed_interval_s(beats[a.worker_id].interval_s)
            for a in job.assignments.values()
            if a.worker_id in beats
        ),
        default=1.0,
    )
    return seconds_ns((LOST_AFTER_INTERVALS + 1) * interval + 2 * tick_s)


def restart(job: JobRecord, reason: str, workers: Mapping[str, WorkerRecord]) -> list[Revocation]:
    """The revocation of every assignment the gang still holds, by slot, to append in one run (each
    expecting the sequence of the one before); each unfinished one whose worker is neither lost nor
    deregistered comes with the stop of its workload (command id ``gang-stop-<assignment>``)."""
    out = []
    for assignment in sorted(job.assignments.values(), key=lambda a: a.slot):
        record = workers.get(assignment.worker_id)
        alive = record is not None and record.state not in ("lost", "deregistered")
        halt = None
        if alive and str(assignment.slot) not in job.done:
            halt = stop(job, assignment, reason, command_id=f"gang-stop-{assignment.assignment_id}")
        out.append(Revocation(job, revoked(assignment, reason), halt))
    return out


def settle(
    job: JobRecord,
    workers: Mapping[str, WorkerRecord],
    *,
    failing_since_ns: int,
    now_ns: int,
    grace_ns: int,
) -> list[Revocation] | JobFailed:
    """What to append about a gang: the revocations of a restart when it is :func:`partial` or its
    :func:`verdict` is ``restart``; ``job.failed`` naming the lowest failed slot when the verdict is
    ``fail``; else nothing (``[]``: a healthy gang, one that waits, a finished job, not a gang).

    Args:
        workers: the registry's workers (a stop goes only to a live one).
        failing_since_ns: when a failure of the gang's current epoch was first seen (Unix ns).
        now_ns: the instant, Unix ns.
        grace_ns: :func:`grace_ns`.
    """
    if job.state in TERMINAL or not is_gang(job):
        return []
    if partial(job):
        return restart(job, f"gang restart: {job.queue_reason or 'a shard was lost'}", workers)
    decided = verdict(job, failing_since_ns=failing_since_ns, now_ns=now_ns, grace_ns=grace_ns)
    if decided == "restart":
        return restart(job, f"gang restart: {job.failure_reason}", workers)
    if decided == "fail":
        slot = min(job.failed_slots, key=int)
        return JobFailed(reason=f"shard {slot} failed: {job.failure_reason}", log_tail=job.log_tail)
    return []
