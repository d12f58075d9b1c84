"""Autoscaling: a pure decision from an endpoint's deployment and its recent load to a replica count.

No clock and no I/O: the caller passes the load it measured (requests per second over its window)
and how long the endpoint has been idle. Rules, in order:

1. An endpoint at zero replicas stays there: it comes back on the first request (:func:`wake`),
   never on a schedule.
2. Idle for ``scale_to_zero_after_s`` or more (and allowed: ``min_replicas == 0``) -> zero.
3. Otherwise the count that keeps each replica at or below ``target_rps_per_replica``:
   ``ceil(rps / target)``, within ``[max(min_replicas, 1), max_replicas]``. A scale-in keeps
   :data:`SCALE_IN_HEADROOM` of spare capacity, so a load hovering at a boundary does not flap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.endpoints import EndpointDeployed

SCALE_IN_HEADROOM = 0.8
"""Scale in only when the smaller count would run at most this share of its target."""


@dataclass(frozen=True, slots=True)
class Scale:
    """A decision: the new replica count, why, and what it saw."""

    replicas: int
    reason: str
    inputs: dict[str, float]


def decide(bounds: EndpointDeployed, desired: int, rps: float, idle_s: float) -> Scale | None:
    """The new replica count for an endpoint that wants ``desired`` now, or ``None`` to keep it.
    ``bounds``: its deployment, with the bounds its tenant set since (``EndpointRecord.spec``)."""
    inputs = {"rps": round(rps, 3), "idle_s": round(idle_s, 3), "desired": float(desired)}
    if desired == 0:
        return None
    timeout = bounds.scale_to_zero_after_s
    if bounds.min_replicas == 0 and timeout is not None and idle_s >= timeout:
        return Scale(0, f"idle for {idle_s:.0f}s (scale to zero after {timeout}s)", inputs)
    floor = max(bounds.min_replicas, 1)
    target = max(bounds.target_rps_per_replica, 1e-9)
    want = min(max(math.ceil(rps / target), floor), bounds.max_replicas)
    if want > desired:
        return Scale(want, f"{rps:.2f} rps is above {target:g} per replica on {desired}", inputs)
    if want < desired and rps <= SCALE_IN_HEADROOM * target * want:
        return Scale(want, f"{rps:.2f} rps fits {want} replica(s) at {target:g} each", inputs)
    return None


def first_count(bounds: EndpointDeployed) -> int:
    """How many replicas an endpoint wants when it starts serving: its minimum, at least one."""
    return min(max(bounds.min_replicas, 1), bounds.max_replicas)


def wake(bounds: EndpointDeployed) -> Scale:
    """The scale-up of an endpoint at zero when a request arrives."""
    return Scale(first_count(bounds), "a request arrived at zero replicas", {"desired": 0.0})
