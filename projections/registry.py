"""The worker registry: the WORKERS stream folded into one record per worker.

A worker's ``state`` is derived from four independent facts, strongest first: deregistered, lost
(no heartbeat; set and cleared by the coordinator's ``lost`` / ``recovered`` events), cordoned (an
operator or the health controller), unverified (it has not passed its verification job yet). So a
cordoned worker that is lost and then recovers is cordoned again, and a re-registration (an agent
restart with the same id) refreshes the hardware but keeps the cordon and the lost flag: only
``recovered`` clears lost. A registration after ``deregistered`` brings the worker back.

Verification (:mod:`core.verification`): a worker is ``unverified`` from its first registration
until a ``verified`` event; ``verification_requested`` opens a challenge, ``verification_failed``
closes it with the reason (the worker stays unverified and is tried again later). A re-registration
that changes the GPUs (count, models, VRAM) makes a verified worker unverified again. An agent's
``verification_reported`` claim never reaches WORKERS; the registry ignores it.

Uptime bookkeeping, all from envelope times: ``since_ns`` (first registration) starts the observed
window; ``downtime_ns`` sums closed lost intervals and ``lost_since_ns`` holds the open one;
``excluded_ns`` sums deregistered intervals (not counted either way) and ``deregistered_ns`` holds
the open one. :func:`uptime` turns them into a ratio at a given instant. The closed intervals are
also kept per UTC day (``down_days``, ``absent_days``: the last :data:`~projections.days.DAYS_KEPT`
days), so that :func:`daily_uptime` gives each day's ratio exactly.
"""

from __future__ import annotations

from typing import Any

import msgspec

from projections.base import Projection
from projections.days import NS_PER_DAY, add_days, overlap
from schemas.envelope import Recorded
from schemas.values import Gpu, WorkerState
from schemas.workers import (
    WorkerCordoned,
    WorkerDeregistered,
    WorkerLost,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRecovered,
    WorkerRegistered,
    WorkerUncordoned,
    WorkerVerificationFailed,
    WorkerVerificationRequested,
    WorkerVerified,
)


class Challenge(msgspec.Struct, frozen=True, kw_only=True):
    """An open verification challenge: its ``worker.verification_requested`` whole (``request``) and
    that event's envelope time (``requested_ns``)."""

    request: WorkerVerificationRequested
    requested_ns: int


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One worker as the registry knows it: its latest registration whole (``registration``: the
    hardware, provider, pool, address and sandbox it registered with) and what has happened to it
    since. Times are envelope times in Unix nanoseconds.

    Attributes:
        state: derived: ``deregistered`` > ``lost`` > ``cordoned`` > ``unverified`` > ``available``.
        verified: passed its verification job (for its current GPUs).
        verification_reason: why it is not verified (awaiting, failed with what, hardware changed).
        challenge: the open verification challenge, if any.
        verification_failures / verification_failed_ns: failed challenges and when the last failed.
        verified_ns: when it was last verified.
        cordoned / cordon_reason / cordoned_by: the cordon, independent of lost.
        lost: no heartbeat, per the coordinator; ``lost_since_ns`` is when it was declared lost.
        registered_ns: the latest (re-)registration; ``since_ns`` the first one.
        downtime_ns: total of closed lost intervals.
        excluded_ns: total of closed deregistered intervals.
        lost_count: how many times the worker was declared lost.
        down_days / absent_days: UTC day number -> nanoseconds of closed lost / deregistered intervals
            in that day (:mod:`projections.days`).
        last_change_seq: the WORKERS sequence of the last event that changed this record.
        last_seq: the WORKERS sequence of the worker's latest event, whether it changed the
            record or not: the expected sequence for appends about the worker.
    """

    worker_id: str
    registration: WorkerRegistered
    state: WorkerState = "available"
    cordoned: bool = False
    cordon_reason: str = ""
    cordoned_by: str = ""
    lost: bool = False
    policy: WorkerPolicy = WorkerPolicy()
    registered_ns: int = 0
    since_ns: int = 0
    lost_since_ns: int | None = None
    downtime_ns: int = 0
    lost_count: int = 0
    deregistered_ns: int | None = None
    excluded_ns: int = 0
    down_days: dict[str, int] = {}
    absent_days: dict[str, int] = {}
    verified: bool = False
    verification_reason: str = "awaiting its verification job"
    challenge: Challenge | None = None
    verification_failures: int = 0
    verification_failed_ns: int | None = None
    verified_ns: int | None = None
    last_change_seq: int = 0
    last_seq: int = 0


class RegistryState(msgspec.Struct, kw_only=True):
    """Every worker ever registered, by worker id; ``seq`` is the last WORKERS sequence applied."""

    seq: int = 0
    workers: dict[str, WorkerRecord] = {}


def _derive(record: WorkerRecord) -> WorkerRecord:
    state: WorkerState
    if record.deregistered_ns is not None:
        state = "deregistered"
    elif record.lost:
        state = "lost"
    elif record.cordoned:
        state = "cordoned"
    elif not record.verified:
        state = "unverified"
    else:
        state = "available"
    return record if record.state == state else msgspec.structs.replace(record, state=state)


def _registered(
    old: WorkerRecord | None, worker_id: str, e: WorkerRegistered, seq: int, t: int
) -> WorkerRecord:
    changes: dict[str, Any] = {"registration": e, "registered_ns": t, "last_change_seq": seq}
    if old is None:
        return _derive(WorkerRecord(worker_id=worker_id, since_ns=t, **changes))
    if old.verified and gpu_signature(old.registration.gpus) != gpu_signature(e.gpus):
        changes.update(verified=False, verification_reason="its GPUs changed: awaiting verification")
    if old.deregistered_ns is not None:
        changes["excluded_ns"] = old.excluded_ns + (t - old.deregistered_ns)
        changes["absent_days"] = add_days(old.absent_days, old.deregistered_ns, t)
        changes["deregistered_ns"] = None
    return _derive(msgspec.structs.replace(old, **changes))


def _changed(old: WorkerRecord, event: Any, seq: int, t: int) -> WorkerRecord | None:
    """The record after a non-registration event, or ``None`` when the event changes nothing."""
    replace = msgspec.structs.replace
    match event:
        case WorkerPolicySet(policy=policy):
            return replace(old, policy=policy, last_change_seq=seq)
        case WorkerCordoned(reason=reason, by=by):
            return replace(old, cordoned=True, cordon_reason=reason, cordoned_by=by, last_change_seq=seq)
        case WorkerUncordoned():
            if not old.cordoned:
                return None
            return replace(old, cordoned=False, cordon_reason="", cordoned_by="", last_change_seq=seq)
        case WorkerLost():
            if old.lost or old.deregistered_ns is not None:
                return None
            return replace(
                old, lost=True, lost_since_ns=t, lost_count=old.lost_count + 1, last_change_seq=seq
            )
        case WorkerRecovered():
            if not old.lost or old.lost_since_ns is None:
                return None
            down = old.downtime_ns + max(0, t - old.lost_since_ns)
            days = add_days(old.down_days, old.lost_since_ns, t)
            return replace(
                old, lost=False, lost_since_ns=None, downtime_ns=down, down_days=days, last_change_seq=seq
            )
        case WorkerVerificationRequested():
            return replace(old, challenge=Challenge(request=event, requested_ns=t), last_change_seq=seq)
        case WorkerVerified():
            return replace(
                old, verified=True, verification_reason="", challenge=None, verified_ns=t, last_change_seq=seq
            )
        case WorkerVerificationFailed(reason=reason):
            return replace(
                old,
                verified=False,
                verification_reason=f"verification failed: {reason}",
                challenge=None,
                verification_failures=old.verification_failures + 1,
                verification_failed_ns=t,
                last_change_seq=seq,
            )
        case WorkerDeregistered():
            if old.deregistered_ns is not None:
                return None
            down, days = old.downtime_ns, old.down_days
            if old.lost_since_ns is not None:
                down += max(0, t - old.lost_since_ns)
                days = add_days(days, old.lost_since_ns, t)
            return replace(
                old,
                lost=False,
                lost_since_ns=None,
                downtime_ns=down,
                down_days=days,
                deregistered_ns=t,
                last_change_seq=seq,
            )
    return None


def evolve(state: RegistryState, recorded: Recorded[Any]) -> RegistryState:
    """Apply one WORKERS event (``worker.<worker_id>.<event>``); records at or below ``state.seq``
    are already applied and ignored; events about an unregistered worker are ignored."""
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    event = recorded.event
    worker_id = recorded.token(1)
    old = state.workers.get(worker_id)
    if isinstance(event, WorkerRegistered):
        new: WorkerRecord | None = _registered(old, worker_id, event, seq, recorded.time_ns)
    elif old is not None:
        changed = _changed(old, event, seq, recorded.time_ns)
        new = old if changed is None else _derive(changed)
    else:
        return state
    assert new is not None
    # Every event of the worker advances last_seq, changed or not: it is the expected sequence of
    # the next decision about this worker (``worker.<id>.>``).
    state.workers[worker_id] = msgspec.structs.replace(new, last_seq=seq)
    return state


REGISTRY: Projection[RegistryState] = Projection(
    name="registry", stream="WORKERS", version=7, state_type=RegistryState, evolve=evolve
)


def gpu_signature(gpus: list[Gpu]) -> list[tuple[str, int]]:
    """What verification vouches for: the model and VRAM total of each GPU, in index order."""
    return [(g.model, g.vram_total_mb) for g in sorted(gpus, key=lambda g: g.index)]


def available(state: RegistryState) -> list[WorkerRecord]:
    """Workers that take new work (not cordoned, lost or deregistered), by worker id."""
    return [state.workers[w] for w in sorted(state.workers) if state.workers[w].state == "available"]


def downtime(record: WorkerRecord, now_ns: int) -> int:
    """Nanoseconds the worker was lost, the open interval up to ``now_ns`` included."""
    open_ns = 0 if record.lost_since_ns is None else max(0, now_ns - record.lost_since_ns)
    return record.downtime_ns + open_ns


def uptime(record: WorkerRecord, now_ns: int) -> float:
    """The fraction of observed time (first registration to ``now_ns``, deregistered time excluded)
    the worker was not lost; 1.0 before any time was observed."""
    end = record.deregistered_ns if record.deregistered_ns is not None else now_ns
    observed = end - record.since_ns - record.excluded_ns
    if observed <= 0:
        return 1.0
    return max(0.0, 1.0 - downtime(record, end) / observed)


def daily_uptime(record: WorkerRecord, first_day: int, last_day: int, now_ns: int) -> list[float | None]:
    """The fraction of each UTC day from ``first_day`` to ``last_day`` (day numbers, inclusive) that
    the worker was observed and not lost, as of ``now_ns``; ``None`` for a day it was not observed
    (before its first registration, after ``now_ns``, deregistered all day). Exact for the last
    :data:`~projections.days.DAYS_KEPT` days; a day whose record was dropped reads as fully up."""
    end = record.deregistered_ns if record.deregistered_ns is not None else now_ns
    lost_since = record.lost_since_ns
    out: list[float | None] = []
    for day in range(first_day, last_day + 1):
        lo, hi = day * NS_PER_DAY, (day + 1) * NS_PER_DAY
        observed = overlap(record.since_ns, end, lo, hi) - record.absent_days.get(str(day), 0)
        down = record.down_days.get(str(day), 0)
        if lost_since is not None:
            down += overlap(lost_since, end, lo, hi)
        out.append(None if observed <= 0 else max(0.0, 1.0 - down / observed))
    return out
