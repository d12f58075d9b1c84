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
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import flare
from core.errors import ConcurrencyConflict
from core.files import TenantTree, UnsafeFile
from core.log import EventLog
from core.placement.placing import work_ref
from core.streams import job_filter, job_subject
from ops.federation import workspace as ws
from ops.federation.server import FederationError
from projections.schedule import JobRecord, job_key
from schemas.jobs import JobCheckpointed, JobCompleted, JobProgress, JobRoundCompleted

log = logging.getLogger("resontech.federation")
ROUNDS = "rounds"
"""The folder of the federation's directory the FL server writes each round's model and summary to."""
MAX_SUMMARY_BYTES = ws.MAX_SUMMARY_BYTES
MAX_METRICS = 256


@dataclass
class JobReporter:
    """The events of job ``tenant/job_id`` from its federation.

    Attributes:
        fed_dir: the federation's directory; the FL server writes each round's global model and
            summary in its ``rounds/``.
        current: returns the job as the live schedule has it now (None if unknown).
        reported: the last round reported (checkpointed, completed, progress).
    """

    event_log: EventLog
    s3: Any
    tenant: str
    job_id: str
    fed_dir: Path
    current: Callable[[], JobRecord | None]
    reported: int = 0

    @property
    def key(self) -> str:
        return job_key(self.tenant, self.job_id)

    def tree(self) -> TenantTree:
        """The federation's directory, held by an fd: the FL server (tenant code) writes in it, so
        every file in it is opened beneath it without following links (:class:`core.files.TenantTree`).
        Its own name is safe to open: it is the sandbox's root, which the sandbox cannot rename."""
        try:
            return TenantTree.open(self.fed_dir)
        except UnsafeFile as exc:
            raise FederationError(f"the federation's directory: {exc.message}") from None

    async def collect_rounds(self, job: JobRecord) -> None:
        """Report every global model the server wrote since the last one reported, in order.

        Raises:
            FederationError: the server wrote something that is not a plain file in its rounds
                folder (a link, a FIFO, a hard link, too large) or an unreadable summary.
        """
        with self.tree() as tree:
            try:
                names = tree.names(ROUNDS)
            except UnsafeFile as exc:
                raise FederationError(f"the FL server's rounds folder: {exc.message}") from None
            done = sorted(r for name in names if (r := flare.round_of(name)) is not None)
            root = ws.output_root(job.spec.name, job.spec.output_prefix)
            for number in done:
                if number <= self.reported or number > (job.spec.rounds or 0):
                    continue
                stem = f"{ROUNDS}/{flare.round_stem(number)}"
                metrics = round_metrics(_read_round(tree, f"{stem}.json", MAX_SUMMARY_BYTES))
                key = await asyncio.to_thread(_upload_round, self.s3, self.tenant, root, number, tree, stem)
                epoch = job.epoch
                await self.append(
                    JobCheckpointed(epoch=epoch, object_key=key, round=number), f"ckpt-{number}"
                )
                await self.append(JobRoundCompleted(round=number, metrics=metrics), f"round-{number}")
                progress = JobProgress(epoch=epoch, round=number, loss=metrics.get("loss"), metrics=metrics)
                await self.append(progress, f"progress-{number}")
                self.reported = number
                log.info("%s: round %d done %s", self.key, number, metrics)

    async def complete(self, job: JobRecord) -> bool:
        """Upload the final model (the last round reported) and every round's metrics, and complete
        the job; whether that was appended. Each round's model and metrics are taken from the
        workspace, where :meth:`collect_rounds` put them (checked): never again from the server's
        folder, and nothing is written there."""
        assert job.spec.federated is not None
        root = ws.output_root(job.spec.name, job.spec.output_prefix)
        outputs = await asyncio.to_thread(
            ws.upload_final, self.s3, self.tenant, root, self.reported, job.spec.federated.framework
        )
        return await self.append_terminal(JobCompleted(outputs=outputs))

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
                event_id=f"fed-{self._ref}-{event.event_name()}",
                expected_seq=job.last_seq,
                expected_filter=job_filter(self.tenant, self.job_id),
            )
        except ConcurrencyConflict:
            return False
        return True

    async def append(self, event: Any, suffix: str) -> None:
        """Append ``event`` to the job with the event id ``fed-<work ref>-<suffix>``."""
        await self.event_log.append(
            job_subject(self.tenant, self.job_id, event),
            event,
            event_id=f"fed-{self._ref}-{suffix}",
        )

    @property
    def _ref(self) -> str:
        """The job in its dedupe ids: :func:`core.placement.placing.work_ref`, not ``<tenant>-<job>``,
        which two tenants can both spell (``a-b``'s ``c`` and ``a``'s ``b-c``)."""
        return work_ref(self.tenant, "job", self.job_id)


def once(what: str) -> str:
    """An event id suffix for something that happens more than once in a job's life."""
    return f"{what}-{uuid.uuid4().hex[:16]}"


def _read_round(tree: TenantTree, relpath: str, max_bytes: int) -> Any:
    """A round's summary, read beneath the federation's directory.

    Raises:
        FederationError: it is not a plain file, is too large, or is not JSON.
    """
    try:
        return json.loads(tree.read_bytes(relpath, max_bytes))
    except UnsafeFile as exc:
        raise FederationError(f"the FL server's {exc.message}") from None
    except ValueError:
        raise FederationError(f"the FL server's {relpath!r} is not JSON") from None


def round_metrics(summary: Any) -> dict[str, float]:
    """A round summary's metrics, as numbers (at most :data:`MAX_METRICS`).

    Raises:
        FederationError: they are not a mapping of names to finite numbers.
    """
    metrics = summary.get("metrics", {}) if isinstance(summary, dict) else None
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        raise FederationError(f"a round summary's metrics must be a mapping of at most {MAX_METRICS}")
    try:
        found = {str(k)[:64]: float(v) for k, v in metrics.items()}
    except (TypeError, ValueError):
        raise FederationError("a round summary's metrics must be numbers") from None
    if not all(math.isfinite(v) for v in found.values()):
        raise FederationError("a round summary's metrics must be finite numbers")
    return found


def _upload_round(s3: Any, tenant: str, root: str, number: int, tree: TenantTree, stem: str) -> str:
    """Upload one round's model and summary, each opened beneath the federation's directory."""
    try:
        with (
            tree.open_file(f"{stem}.npz", ws.MAX_MODEL_BYTES) as npz,
            tree.open_file(f"{stem}.json", MAX_SUMMARY_BYTES) as summary,
        ):
            return ws.upload_round(s3, tenant, root, number, npz, summary)
    except UnsafeFile as exc:
        raise FederationError(f"the FL server's {exc.message}") from None
