"""``resontech why TENANT/JOB``: why a job is pending, or why it runs where it runs.

Everything comes from the job's own events: its state folded by the schedule reducer, the reason of
its latest ``job.queued``, and the provenance recorded on its latest ``job.placed`` (how many
workers were considered, how many each filter removed, the winners' score terms). The explanation
itself is :func:`projections.why.explain_job`, which the gateway's job view shares.
"""

from __future__ import annotations

from typing import Any

from core.errors import InvalidInput, NotFound
from core.log import EventLog
from core.settings import Settings
from core.streams import job_filter
from projections import SCHEDULE
from projections.schedule import job_key
from projections.why import explain_job
from schemas import JobPlaced


def parse_job(ref: str) -> tuple[str, str]:
    """``tenant/job`` -> ``(tenant, job)``."""
    tenant, sep, job_id = ref.partition("/")
    if not sep or not tenant or not job_id:
        raise InvalidInput(f"name the job as TENANT/JOB, got {ref!r}")
    return tenant, job_id


async def why(settings: Settings, ref: str) -> dict[str, Any]:
    """The explanation of one job, as a dict (``lines`` is the human version)."""
    tenant, job_id = parse_job(ref)
    async with await EventLog.connect(settings, name="why") as event_log:
        records = [r async for r in event_log.replay("JOBS", subjects=job_filter(tenant, job_id))]
    if not records:
        raise NotFound(f"no job {tenant}/{job_id}")
    job = SCHEDULE.fold(records).jobs.get(job_key(tenant, job_id))
    if job is None:
        raise NotFound(f"job {tenant}/{job_id} has events but no submission")
    placements = [r.event for r in records if isinstance(r.event, JobPlaced)]
    return {
        "job": f"{tenant}/{job_id}",
        "state": job.state,
        "queue_reason": job.queue_reason,
        "assignments": {k: a.worker_id for k, a in job.assignments.items()},
        "rejected_by": job.rejected_by,
        "lines": explain_job(job, placements[-1].provenance if placements else None),
    }
