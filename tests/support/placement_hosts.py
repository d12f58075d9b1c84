"""Hosts and requests for unit tests of placement: :func:`host` is an idle, available gold A100 host
beating at :data:`NOW`; :func:`placement_request` asks for one GPU for slot 0 of ``acme``'s job ``j1``;
:func:`outcome` is the part of a decision two ways of placing must agree on. Times are Unix ns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.placement.values import Candidate, Placed, PlacementRequest, Unplaceable

S = 1_000_000_000


def utc(day: int, hour: int, minute: int = 0) -> int:
    """Unix ns of 2026-03-<day> <hour>:<minute> UTC (March 1st is a Sunday, 2nd a Monday)."""
    return int(datetime(2026, 3, day, hour, minute, tzinfo=UTC).timestamp()) * S


NOW = utc(4, 12)  # a Wednesday, noon


def host(worker_id: str, **kw: Any) -> Candidate:
    """An idle, available, gold A100 host with 4 x 40 GB, beating now."""
    fields: dict[str, Any] = {
        "worker_id": worker_id,
        "gpu_family": "A100",
        "gpus_total": 4,
        "vram_usable_mb": [40960] * 4,
        "vram_limit_mb": [40960] * 4,
        "uptime": 0.97,
        "tier": "gold",
        "last_beat_ns": NOW,
    }
    fields.update(kw)
    return Candidate(**fields)


def placement_request(**kw: Any) -> PlacementRequest:
    fields: dict[str, Any] = {"work_id": "j1", "tenant": "acme", "slots": [0], "gpus": 1, "epoch": 1}
    fields.update(kw)
    return PlacementRequest(**fields)


def outcome(result: Placed | Unplaceable) -> Any:
    """What the index must reproduce: the assignments and the ranking; or whether the failure is
    permanent (then its reason), the workers that fit and how many were filtered."""
    p = result.provenance
    if isinstance(result, Placed):
        return result.assignments, p.top, p.candidates
    reason = result.reason if result.permanent else result.reason.split(";")[0]
    return result.permanent, reason, p.top, p.candidates, sum(p.filtered.values())
