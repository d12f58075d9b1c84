"""Autoscaling: a pure decision from an endpoint's deployment and its recent load to a replica count.

No clock and no I/O: the caller passes the load it measured (:class:`Load`: requests per second
over its window, the mean depth of the endpoint's line, how many replicas serve, their GPUs'
utilisation where NVML reports it) and how long the endpoint has been idle. Rules, in order:

1. An endpoint at zero replicas stays there: it comes back on the first request (:func:`wake`),
   never on a schedule.
2. Idle for ``scale_to_zero_after_s`` or more (and allowed: ``min_replicas == 0``) -> zero.
3. Otherwise the count that keeps each replica at or below ``target_rps_per_replica``:
   ``ceil(rps / target)``, within ``[max(min_replicas, 1), max_replicas]``.
4. Requests waiting in line (a mean depth of :data:`QUEUED_SCALE_OUT` or more) while every wanted
   replica serves at its ``max_concurrency``: as many more replicas as the line would fill
   (``ceil(depth / max_concurrency)``), even under the RPS target (long requests are few per second
   and still queue). Not while a replica is still starting: it is the capacity already asked for.
5. GPUs busy (mean utilisation at or above :data:`GPU_BUSY_PCT`) while every wanted replica serves
   and holds a request the caller sent it (``in_flight >= desired``): one more replica.
6. A scale-in keeps :data:`SCALE_IN_HEADROOM` of spare capacity, so a load hovering at a boundary
   does not flap, and never happens while requests wait, or while the GPUs are busy
   (:data:`GPU_IDLE_PCT` or more) and the caller sees traffic (requests per second or in flight).

A GPU reading is its provider's word (a heartbeat): it never adds a replica, nor keeps one, the
tenant pays for without load the caller measured itself (rules 5 and 6); rules 3 and 4 rest on the
caller's measures alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.endpoints import EndpointDeployed

SCALE_IN_HEADROOM = 0.8
"""Scale in only when the smaller count would run at most this share of its target."""
QUEUED_SCALE_OUT = 1.0
"""Requests waiting in line, on average over the caller's window, that call for more replicas."""
GPU_BUSY_PCT = 90.0
GPU_IDLE_PCT = 50.0
"""Scale in only below this GPU utilisation (where it is known)."""


@dataclass(frozen=True, slots=True)
class Scale:
    """A decision: the new replica count, why, and what it saw."""

    replicas: int
    reason: str
    inputs: dict[str, float]


@dataclass(frozen=True, slots=True)
class Load:
    """What the caller measured of an endpoint, beyond its requests per second.

    Attributes:
        queued: mean number of requests waiting in its line over the caller's window.
        in_flight: requests its replicas hold now.
        ready: replicas that serve now (``None``: as many as it wants).
        gpu_util_pct: mean utilisation of its replicas' GPUs, ``None`` where NVML reports none.
    """

    queued: float = 0.0
    in_flight: int = 0
    ready: int | None = None
    gpu_util_pct: float | None = None


def _inputs(rps: float, idle_s: float, desired: int, load: Load) -> dict[str, float]:
    inputs = {"rps": round(rps, 3), "idle_s": round(idle_s, 3), "desired": float(desired)}
    inputs |= {"queue_depth": round(load.queued, 3), "in_flight": float(load.in_flight)}
    if load.ready is not None:
        inputs["ready"] = float(load.ready)
    if load.gpu_util_pct is not None:
        inputs["gpu_util_pct"] = round(load.gpu_util_pct, 1)
    return inputs


def decide(
    bounds: EndpointDeployed, desired: int, rps: float, idle_s: float, load: Load | None = None
) -> Scale | None:
    """The new replica count for an endpoint that wants ``desired`` now, or ``None`` to keep it.
    ``bounds``: its deployment, with the bounds its tenant set since (``EndpointRecord.spec``)."""
    load = load or Load()
    inputs = _inputs(rps, idle_s, desired, load)
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
    serving = load.ready is None or load.ready >= desired
    queued = load.queued >= QUEUED_SCALE_OUT
    busy = load.gpu_util_pct is not None and load.gpu_util_pct >= GPU_BUSY_PCT
    if serving and queued and desired < bounds.max_replicas:
        more = min(desired + math.ceil(load.queued / bounds.max_concurrency), bounds.max_replicas)
        each = bounds.max_concurrency
        reason = f"{load.queued:.1f} requests wait in line on {desired} replica(s) at {each} each"
        return Scale(more, reason, inputs)
    # rule 5: busy GPUs count only while the caller sees every wanted replica holding a request
    if serving and busy and load.in_flight >= desired and desired < bounds.max_replicas:
        return Scale(desired + 1, f"GPUs {load.gpu_util_pct:.0f}% busy on {desired} replica(s)", inputs)
    # rule 6: GPUs said busy hold a scale-in back only while the caller sees traffic
    seen = rps > 0 or load.in_flight > 0
    gpus_idle = load.gpu_util_pct is None or load.gpu_util_pct < GPU_IDLE_PCT or not seen
    calm = load.queued == 0 and gpus_idle
    if want < desired and calm and rps <= SCALE_IN_HEADROOM * target * want:
        return Scale(want, f"{rps:.2f} rps fits {want} replica(s) at {target:g} each", inputs)
    return None


def first_count(bounds: EndpointDeployed) -> int:
    """How many replicas an endpoint wants when it starts serving: its minimum, at least one."""
    return min(max(bounds.min_replicas, 1), bounds.max_replicas)


def wake(bounds: EndpointDeployed) -> Scale:
    """The scale-up of an endpoint at zero when a request arrives."""
    return Scale(first_count(bounds), "a request arrived at zero replicas", {"desired": 0.0})
