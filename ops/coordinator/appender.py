"""The coordinator's appends: about a job, a worker or an endpoint, each expecting what was read, and
commands to agents; it counts the appends another writer won.

Rules:

* an append about an aggregate carries the expected sequence of the aggregate it decided about (its
  record's ``last_seq``, or the sequence of the append before it in the same run); a
  :class:`ConcurrencyConflict` means another coordinator (or the agent) got there first: it is
  counted in :attr:`Appender.conflicts` and reported as "not appended", and the next step re-reads
  and re-decides;
* a command is stored once under its id (:meth:`Appender.send`); one that the log did not take
  (time-out, refusal) is reported as not sent, to be sent again;
* revocations of one job go in one run, each expecting the one before; a conflict drops the rest of
  that job's, and a revocation's stop goes out only once it is appended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.streams import (
    command_subject,
    endpoint_filter,
    endpoint_subject,
    job_filter,
    job_subject,
    worker_filter,
    worker_subject,
)
from core.wire import Position
from projections.endpoints import EndpointRecord
from projections.recovery import Revocation
from projections.schedule import JobRecord, job_key

log = logging.getLogger("resontech.coordinator")


class AppendLog(Protocol):
    """What the appender needs of the log (:class:`core.log.EventLog` is one)."""

    async def append(
        self,
        subject: str,
        event: Any,
        *,
        event_id: str | None = None,
        expected_seq: int | None = None,
        expected_filter: str | None = None,
    ) -> Position: ...


class Appender:
    """Appends for the coordinator's parts (see the module docstring).

    Args:
        event_log: where the appends go.

    Attributes:
        conflicts: appends refused because another writer got there first.
    """

    def __init__(self, event_log: AppendLog) -> None:
        self.log = event_log
        self.conflicts = 0

    async def append_job(
        self, job: JobRecord, event: Any, *, expected_seq: int | None = None
    ) -> Position | None:
        """Append about ``job``, expecting its last sequence (or ``expected_seq``); ``None`` on a
        conflict."""
        try:
            return await self.log.append(
                job_subject(job.tenant, job.job_id, event),
                event,
                expected_seq=job.last_seq if expected_seq is None else expected_seq,
                expected_filter=job_filter(job.tenant, job.job_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return None

    async def append_worker(self, worker_id: str, event: Any, *, expected_seq: int) -> bool:
        """Append about ``worker_id``, expecting ``expected_seq`` (0: no event yet); whether it was."""
        try:
            await self.log.append(
                worker_subject(worker_id, event),
                event,
                expected_seq=expected_seq,
                expected_filter=worker_filter(worker_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return False
        return True

    async def append_endpoint(self, endpoint: EndpointRecord, event: Any) -> bool:
        """Append about ``endpoint``, expecting its last sequence; whether it was appended."""
        try:
            await self.log.append(
                endpoint_subject(endpoint.tenant, endpoint.endpoint_id, event),
                event,
                expected_seq=endpoint.last_seq,
                expected_filter=endpoint_filter(endpoint.tenant, endpoint.endpoint_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return False
        return True

    async def revoke(self, revocations: Iterable[Revocation]) -> None:
        """Append each revocation, a job's in one run (each expecting the sequence of the one before),
        and send its stop once it is appended. A conflict drops the rest of that job's."""
        seqs: dict[str, int] = {}
        dropped: set[str] = set()  # conflicted: the next step decides again
        for revocation in revocations:
            job = revocation.job
            key = job_key(job.tenant, job.job_id)
            if key in dropped:
                continue
            position = await self.append_job(job, revocation.event, expected_seq=seqs.get(key))
            if position is None:
                dropped.add(key)
                continue
            seqs[key] = position.seq
            if revocation.stop is not None:
                await self.send(*revocation.stop)

    async def send(self, worker_id: str, command: Any, command_id: str) -> bool:
        """Send ``command`` to ``worker_id`` under ``command_id`` (stored once); whether it went out."""
        try:
            await self.log.append(command_subject(worker_id), command, event_id=command_id)
        except (AppendTimeout, AppendRejected) as exc:
            log.warning("%s to %s not sent yet: %s", command_id, worker_id, exc)
            return False
        return True
