"""The intake's verification of new hardware: every new worker (and every worker whose GPUs changed)
gets its verification job before it takes tenant work.

On every round of the intake, for each worker on probation (:mod:`projections.probation`):

* ``challenge``: append ``worker.verification_requested`` (a fresh random seed, the benchmark's size
  and rounds, a deadline) at the worker's expected sequence, then send the agent a ``verify``
  command (its id derived from the challenge, so it is stored and run once);
* ``expire``: append ``worker.verification_failed`` ("no answer within ..."); the worker is
  challenged again :data:`projections.probation.RETRY_AFTER_S` later.

The agent's answer is a claim like any other, judged by the intake (:meth:`ops.services.intake.Intake`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

import msgspec

from core import verification
from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.log import EventLog
from core.streams import command_subject, worker_filter, worker_subject
from projections.probation import due
from projections.registry import RegistryState
from projections.runner import ProjectionRunner
from schemas._base import Event
from schemas.commands import VerifyWorker
from schemas.envelope import Recorded
from schemas.workers import WorkerVerificationFailed

log = logging.getLogger("resontech.intake")


class Verifier:
    """Challenges the workers on probation (see the module docstring).

    Args:
        registry: the registry runner it follows (its listeners keep the probation set).
        name: recorded as ``requested_by`` / ``by``.
    """

    def __init__(self, event_log: EventLog, registry: ProjectionRunner[RegistryState], name: str) -> None:
        self.log = event_log
        self.registry = registry
        self.name = name
        self.probation: set[str] = set()  # workers the registry shows unverified
        registry.listeners.append(self._on_worker)

    def _on_worker(self, record: Recorded[Any]) -> None:
        worker = self.registry.state.workers.get(record.token(1))
        if worker is None:
            return
        if worker.state == "unverified":
            self.probation.add(worker.worker_id)
        else:
            self.probation.discard(worker.worker_id)

    async def step(self, now_ns: int) -> None:
        """Challenge or expire what is due."""
        for worker_id in sorted(self.probation):
            worker = self.registry.state.workers.get(worker_id)
            found = None if worker is None else due(worker, now_ns)
            if found is None:
                continue
            if found.action == "expire":
                assert found.worker.challenge is not None
                challenge = found.worker.challenge.request
                failed = WorkerVerificationFailed(
                    reason=f"no answer within {challenge.deadline_s:g}s",
                    challenge_id=challenge.challenge_id,
                    by=self.name,
                )
                await self._append(worker_id, failed)
                continue
            await self._challenge(worker_id)

    async def _challenge(self, worker_id: str) -> None:
        request = verification.new_challenge(
            f"vc-{secrets.token_hex(6)}", secrets.token_hex(16), requested_by=self.name
        )
        if not await self._append(worker_id, request):
            return
        command = msgspec.convert(request, VerifyWorker, from_attributes=True)  # the request, less who asked
        try:
            await self.log.append(
                command_subject(worker_id), command, event_id=f"verify-{request.challenge_id}"
            )
        except (AppendTimeout, AppendRejected) as exc:  # it expires unanswered and is tried again
            log.warning("verification job for %s not sent: %s", worker_id, exc)
            return
        log.info("worker %s: verification job %s sent", worker_id, request.challenge_id)

    async def _append(self, worker_id: str, event: Event) -> bool:
        """Append about the worker at its expected sequence; ``False`` when something else got there
        first (another intake, a registration): the next round decides again."""
        record = self.registry.state.workers.get(worker_id)
        try:
            position = await self.log.append(
                worker_subject(worker_id, event),
                event,
                expected_seq=record.last_seq if record else 0,
                expected_filter=worker_filter(worker_id),
            )
        except ConcurrencyConflict:
            return False
        with contextlib.suppress(TimeoutError):
            await self.registry.wait_for(position.seq)  # the next round sees its own change
        return True
