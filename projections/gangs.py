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
  in the training code fails them all), or no peer was lost within the grace period.

Pure: no I/O, no clock (times are parameters).
"""

from __future__ import annotations

from typing import Literal

from projections.schedule import TERMINAL, JobRecord

GANG_KINDS: frozenset[str] = frozenset({"ddp"})
Verdict = Literal["wait", "restart", "fail"]


def is_gang(job: JobRecord) -> bool:
    """True for a job whose shards run as one world (all restart when one is lost)."""
    return job.kind in GANG_KINDS


def partial(job: JobRecord) -> bool:
    """True for a live gang that holds some of its shards but not all: broken, its remaining
    assignments are revoked, and it is not placed until none is left."""
    return is_gang(job) and job.state not in TERMINAL and 0 < len(job.assignments) < job.shards


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
    if len(ended) >= job.shards or now_ns - failing_since_ns >= grace_ns:
        return "fail"
    return "wait"
