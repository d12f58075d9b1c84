"""Work written to a real log as the kernel's clients would for process-level tests: a job submitted
(:func:`submit`), a command sent to an agent (:func:`send`, built by :func:`start_work`), and a Python
one-liner as a workload's command (:func:`py`)."""

from __future__ import annotations

import sys
from typing import Any

from core.log import EventLog
from core.streams import command_subject, job_subject
from schemas.commands import StartWork, WorkSpec
from schemas.jobs import JobResources, JobSubmitted
from tests.support import place


def start_work(
    command: list[str], *, work_id: str = "j1", assignment_id: str = "j1-s0-e1", epoch: int = 1, **kw: Any
) -> StartWork:
    options = kw.pop("options", {})
    return StartWork(
        tenant=kw.pop("tenant", "acme"),
        work_id=work_id,
        work_kind="job",
        assignment_id=assignment_id,
        slot=kw.pop("slot", 0),
        epoch=epoch,
        spec=WorkSpec(
            runtime="process",
            command=command,
            options=options,
            env=kw.pop("env", {}),
            tier=kw.pop("tier", "unverified"),
            gpus=kw.pop("gpus", 0),
            image=kw.pop("image", None),
        ),
        **kw,
    )


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def send(log: EventLog, worker_id: str, command: Any, event_id: str | None = None) -> None:
    """Send a command as the coordinator would: a start only once its work is placed in the log."""
    if isinstance(command, StartWork):
        await place(log, worker_id, command)
    await log.append(command_subject(worker_id), command, event_id=event_id)


async def submit(
    log: EventLog, job_id: str, command: list[str], *, shards: int = 1, tenant: str = "acme"
) -> None:
    event = JobSubmitted(
        name=job_id, kind="process", shards=shards, command=command, resources=JobResources()
    )
    await log.append(job_subject(tenant, job_id, event), event, event_id=f"submit-{tenant}-{job_id}")
