"""Why a job is pending, or why it runs where it runs: a pure explanation of one job.

Shared by ``resontech why`` (which folds the job's events itself) and ``GET /v1/jobs/{job_id}``
(which reads the live schedule): both pass the job's record and the provenance of its latest
``job.placed``, and get the same lines.
"""

from __future__ import annotations

from core.placement.explaining import explain
from projections.schedule import JobRecord
from schemas.values import Provenance

WAITING_FOR_COORDINATOR = "waiting for the coordinator"
"""The pending reason of a queued job no coordinator has looked at yet."""


def pending_reason(job: JobRecord) -> str | None:
    """Why a queued job waits (``None`` unless it is queued)."""
    if job.state != "queued":
        return None
    return job.queue_reason or WAITING_FOR_COORDINATOR


def explain_job(job: JobRecord, placement: Provenance | None) -> list[str]:
    """Human lines: the state, why it waits, where each shard runs, who refused it, how the latest
    placement chose (``placement``: the provenance of the job's latest ``job.placed``, if any), and
    why it failed with the end of its log."""
    lines = [f"{job.tenant}/{job.job_id}: {job.state} (epoch {job.epoch}, {job.spec.shards} shard(s))"]
    pending = pending_reason(job)
    if pending is not None:
        lines.append(f"pending: {pending}")
    for slot, assignment in sorted(job.assignments.items(), key=lambda item: int(item[0])):
        lines.append(f"shard {slot} on {assignment.worker_id} (assignment {assignment.assignment_id})")
    lines += replaced(job)
    for worker_id, reason in sorted(job.rejected_by.items()):
        lines.append(f"rejected by {worker_id}: {reason}")
    if placement is not None:
        lines.append("latest placement:")
        lines += [f"  {line}" for line in explain(placement)]
    if job.failure_reason:
        lines.append(f"failed: {job.failure_reason}")
        lines += [f"  | {line}" for line in job.log_tail.splitlines()[-10:]]
    return lines


def replaced(job: JobRecord) -> list[str]:
    """A line for each recently ended assignment of a shard that was placed again (a lost worker, a
    gang restarted, a preemption), with the job's count of revocations."""
    lines = []
    for old in sorted(job.retired, key=lambda t: (t.slot, t.epoch)):
        now = job.assignments.get(str(old.slot))
        if now is not None and now.epoch > old.epoch:
            lines.append(
                f"shard {old.slot}: epoch {old.epoch} on {old.worker_id} ended; placed again at epoch "
                f"{now.epoch} on {now.worker_id}"
            )
    if job.revocations:
        lines.append(f"{job.revocations} assignment(s) revoked so far")
    return lines
