"""How long an assignment held its worker: what the intake checks a usage tick against.

The schedule and the endpoint table keep, beside each current assignment, when it was placed, and
for a while after an assignment ended (revoked, superseded, scaled away) a :class:`Tenure` of it:
its agent's last usage tick arrives after the end (the workload is stopped after the revocation and
metered until it exits). Tenures are dropped :data:`RETIRED_KEEP_NS` after they ended (by envelope
time, at the next event of the same job or endpoint: :func:`forget_old`), so the state stays bounded.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from schemas.values import Assignment

RETIRED_KEEP_NS = 15 * 60 * 1_000_000_000
"""How long an ended assignment is remembered: longer than any stop grace plus the intake's
tolerance for late ticks (:data:`projections.claims.END_GRACE_MS`)."""


class Tenure(msgspec.Struct, frozen=True, kw_only=True):
    """One assignment's time on its worker (envelope times, Unix ns).

    Attributes:
        gpus: GPUs it held (0: CPU work).
        placed_ns: when the kernel placed it.
        ended_ns: when it ended (revoked, superseded, its work ended); ``None`` while current.
    """

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int
    gpus: int = 0
    placed_ns: int = 0
    ended_ns: int | None = None


def tenure(assignment: Assignment, placed_ns: int, ended_ns: int | None) -> Tenure:
    """The tenure of ``assignment``, placed at ``placed_ns`` (ended at ``ended_ns``, if it ended)."""
    return Tenure(**msgspec.structs.asdict(assignment), placed_ns=placed_ns, ended_ns=ended_ns)


H = TypeVar("H", bound=msgspec.Struct)


def seen(record: H, retired: list[Tenure], seq: int, now_ns: int) -> H:
    """``record`` (a job or an endpoint, whose tenures are ``retired``) after an event of it at
    ``seq``, changed or not: ``last_seq`` is ``seq``, and tenures that ended long before ``now_ns``
    are forgotten (:func:`forget_old`)."""
    kept = forget_old(retired, now_ns)
    if kept is None:
        return msgspec.structs.replace(record, last_seq=seq)
    return msgspec.structs.replace(record, last_seq=seq, retired=kept)


def forget_old(retired: list[Tenure], now_ns: int) -> list[Tenure] | None:
    """``retired`` without the tenures that ended more than :data:`RETIRED_KEEP_NS` before
    ``now_ns``, or ``None`` when there are none to drop (the common case costs one comparison)."""
    if not retired or (retired[0].ended_ns or 0) >= now_ns - RETIRED_KEEP_NS:
        return None
    return retire(retired, [], now_ns)


def retire(retired: list[Tenure], ended: list[Tenure], now_ns: int) -> list[Tenure]:
    """``retired`` plus ``ended`` (each with ``ended_ns`` set to ``now_ns``), without those that
    ended more than :data:`RETIRED_KEEP_NS` before ``now_ns``."""
    horizon = now_ns - RETIRED_KEEP_NS
    kept = [t for t in retired if t.ended_ns is not None and t.ended_ns >= horizon]
    return kept + [msgspec.structs.replace(t, ended_ns=now_ns) for t in ended]
