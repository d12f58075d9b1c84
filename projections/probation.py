"""Workers on probation: which need a verification job now, and whose job went unanswered.

A pure decision over a registry record (the intake applies it, :mod:`ops.services.verifier`). A worker is on
probation while the registry shows it ``unverified`` (so not lost, cordoned or deregistered: a
worker whose heartbeats stopped is marked lost by the coordinator and is not challenged). It gets a
challenge when it has none open and either never failed one or failed its last more than
:data:`RETRY_AFTER_S` ago; an open challenge past its deadline has failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.clock import NS_PER_S
from projections.registry import WorkerRecord

RETRY_AFTER_S = 300.0
"""A worker whose verification failed gets a new challenge after this long (a host that lies fails
every time; one that was merely busy or restarting passes the next)."""

Action = Literal["challenge", "expire"]


@dataclass(frozen=True, slots=True)
class Due:
    """What to do about one worker on probation."""

    worker: WorkerRecord
    action: Action


def due(worker: WorkerRecord, now_ns: int) -> Due | None:
    """What ``worker`` needs now, if anything."""
    if worker.state != "unverified":
        return None
    challenge = worker.challenge
    if challenge is not None:
        expired = now_ns > challenge.requested_ns + int(challenge.request.deadline_s * NS_PER_S)
        return Due(worker, "expire") if expired else None
    failed = worker.verification_failed_ns
    if failed is not None and now_ns - failed < RETRY_AFTER_S * NS_PER_S:
        return None
    return Due(worker, "challenge")
