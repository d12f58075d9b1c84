"""What one federation tells the log about its job: each round, the job's end, and its own events.

Every global model the FL server writes becomes, in round order, ``checkpointed`` (after the model is
uploaded to the tenant's workspace), ``round_completed`` and ``progress``; the job's end is
``completed`` (with the final model and every round's metrics uploaded) or ``failed``, appended only
against the job's last sequence so that it never overwrites another ending. Every event id is derived
from the job, so that a retried append (or a restarted service) is stored once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import flare
from core.errors import ConcurrencyConflict
from core.log import EventLog
from core.objects import bucket_for
from core.streams import job_filter, job_subject
from ops.federation import workspace as ws
from projections.schedule import JobRecord, job_key
from schemas.jobs import JobCheckpointed, JobCompleted, JobProgress, JobRoundCompleted

log = logging.getLogger("resontech.federation")


@dataclass
class JobReporter:
    """The events of job ``tenant/job_id`` from its federation.

    Attributes:
        rounds_dir: where the FL server writes each round's global model and summary.
        current: returns the job as the live schedule has it now (None if unknown).
        reported: the last round reported (checkpointed, completed, progress).
    """

    event_log: EventLog
    s3: Any
    tenant: str
    job_id: str
    rounds_dir: Path
    current: Callable[[], JobRecord | None]
    reported: int = 0

    @property
    def key(self) -> str:
        return job_key(self.tenant, self.job_id)

    async def collect_rounds(self, job: JobRecord) -> None:
        """Report every global model the server wrote since the last one reported, in order."""
        rounds_dir = self.rounds_dir
        if not rounds_dir.is_dir():
            return
        done = sorted(r for p in rounds_dir.iterdir() if (r := flare.round_of(p.name)) is not None)
        root = ws.output_root(job.spec.name, job.spec.output_prefix)
        for number in done:
            if number <= self.reported or number > (job.spec.rounds or 0):
                continue
            stem = rounds_dir / flare.round_stem(number)
            summary = json.loads(stem.with_suffix(".json").read_text())
            key = await asyncio.to_thread(
                ws.upload_round, self.s3, self.tenant, root, number, stem.with_suffix(".npz"),
                stem.with_suffix(".json"),
            )  # fmt: skip
            metrics = {k: float(v) for k, v in summary.get("metrics", {}).items()}
            epoch = job.epoch
            await self.append(JobCheckpointed(epoch=epoch, object_key=key, round=number), f"ckpt-{number}")
            await self.append(JobRoundCompleted(round=number, metrics=metrics), f"round-{number}")
            progress = JobProgress(epoch=epoch, round=number, loss=metrics.get("loss"), metrics=metrics)
            await self.append(progress, f"progress-{number}")
            self.reported = number
            log.info("%s: round %d done %s", self.key, number, metrics)

    async def complete(self, job: JobRecord) -> bool:
        """Upload the final model (the last round reported) and every round's metrics, and complete
        the job; whether that was appended."""
        assert job.spec.federated is not None
        rounds_dir, last = self.rounds_dir, self.reported
        final = rounds_dir / f"{flare.round_stem(last)}.npz"
        if not final.exists():  # this host lost it: the last checkpoint is in the workspace
            root = ws.output_root(job.spec.name, job.spec.output_prefix)
            await asyncio.to_thread(
                ws.fetch_object, self.s3, bucket_for(self.tenant), ws.checkpoint_key(root, last),
                final, "the last global model",
            )  # fmt: skip
        await asyncio.to_thread(self._fetch_summaries, job, last)
        summaries = sorted(
            p for p in rounds_dir.glob("round-*.json") if (flare.round_of(p.name) or last + 1) <= last
        )
        outputs = await asyncio.to_thread(
            ws.upload_final, self.s3, self.tenant, ws.output_root(job.spec.name, job.spec.output_prefix),
            final, summaries, job.spec.federated.framework,
        )  # fmt: skip
        return await self.append_terminal(JobCompleted(outputs=outputs))

    def _fetch_summaries(self, job: JobRecord, last: int) -> None:
        """Download the metrics of rounds this host did not serve (another instance did, before it
        took the job over): ``metrics.json`` lists every round."""
        root = ws.output_root(job.spec.name, job.spec.output_prefix)
        for number in range(1, last + 1):
            local = self.rounds_dir / f"{flare.round_stem(number)}.json"
            if not local.exists():
                ws.fetch_object(
                    self.s3, bucket_for(self.tenant), ws.metrics_key(root, number), local, "a round's metrics"
                )

    async def append_terminal(self, event: Any) -> bool:
        """Append the job's ending against its last sequence; whether it was appended (False if the
        job is unknown or something else was appended first)."""
        job = self.current()
        if job is None:
            return False
        try:
            await self.event_log.append(
                job_subject(self.tenant, self.job_id, event),
                event,
                event_id=f"fed-{self.tenant}-{self.job_id}-{event.event_name()}",
                expected_seq=job.last_seq,
                expected_filter=job_filter(self.tenant, self.job_id),
            )
        except ConcurrencyConflict:
            return False
        return True

    async def append(self, event: Any, suffix: str) -> None:
        """Append ``event`` to the job with the event id ``fed-<tenant>-<job>-<suffix>``."""
        await self.event_log.append(
            job_subject(self.tenant, self.job_id, event),
            event,
            event_id=f"fed-{self.tenant}-{self.job_id}-{suffix}",
        )


def once(what: str) -> str:
    """An event id suffix for something that happens more than once in a job's life."""
    return f"{what}-{uuid.uuid4().hex[:16]}"
