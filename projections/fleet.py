"""The fleet's GPUs over time, read off the projections: how many were registered, how many work held
(the kernel's metering ticks, bucket by bucket, and the schedule now), and what the agents reported
of their utilisation. Pure functions of the states and an instant; the buckets are those of
:mod:`projections.days`.
"""

from __future__ import annotations

import bisect

import msgspec

from projections.days import BUCKET_MS, BUCKET_NS
from projections.endpoints import EndpointsState
from projections.ledger import LedgerState
from projections.liveness import LivenessState, reported_util
from projections.registry import RegistryState
from projections.schedule import TERMINAL, ScheduleState


class FleetPoint(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet in one bucket.

    Attributes:
        bucket: the bucket number (its start is ``bucket * BUCKET_NS``).
        registered_gpus: GPUs of the workers registered at the bucket's end (or at ``now_ns``).
        allocated_gpus: GPU-milliseconds metered in the bucket over its length (elapsed length for
            the bucket running at ``now_ns``).
        util_sum / readings: the agents' reported ``util_pct``, summed, and how many readings.
    """

    bucket: int
    registered_gpus: int
    allocated_gpus: float
    util_sum: float
    readings: int


def registered_gpus(registry: RegistryState, instants_ns: list[int]) -> list[int]:
    """GPUs of the workers registered at each of ``instants_ns`` (ascending): from a worker's first
    registration until its deregistration, with the GPUs of its latest registration. A worker that
    was deregistered and came back counts from its first registration (the registry keeps how long
    it was away, per day, not when)."""
    changes: list[tuple[int, int]] = []
    for record in registry.workers.values():
        gpus = len(record.registration.gpus)
        if gpus:
            changes.append((record.since_ns, gpus))
            if record.deregistered_ns is not None:
                changes.append((record.deregistered_ns, -gpus))
    changes.sort()
    times = [t for t, _ in changes]
    running, totals = 0, [0]
    for _, delta in changes:
        running += delta
        totals.append(running)
    return [totals[bisect.bisect_right(times, instant)] for instant in instants_ns]


def fleet_points(
    registry: RegistryState, ledger: LedgerState, liveness: LivenessState, first: int, last: int, now_ns: int
) -> list[FleetPoint]:
    """The fleet in each bucket from ``first`` to ``last`` (bucket numbers, inclusive), as of
    ``now_ns``."""
    ends = [min((bucket + 1) * BUCKET_NS, now_ns) for bucket in range(first, last + 1)]
    registered = registered_gpus(registry, ends)
    points = []
    for i, bucket in enumerate(range(first, last + 1)):
        key = str(bucket)
        length_ms = max(1, min(BUCKET_MS, (ends[i] - bucket * BUCKET_NS) // 1_000_000))
        util_sum, readings = reported_util(liveness, bucket)
        points.append(
            FleetPoint(
                bucket=bucket,
                registered_gpus=registered[i],
                allocated_gpus=ledger.fleet_gpu_ms.get(key, 0) / length_ms,
                util_sum=util_sum,
                readings=readings,
            )
        )
    return points


def gpus_now(registry: RegistryState, schedule: ScheduleState, endpoints: EndpointsState) -> tuple[int, int]:
    """``(registered, allocated)`` GPUs now: of the workers not deregistered, and held by the
    current assignments of live jobs and of endpoint replicas not lost."""
    registered = sum(len(r.registration.gpus) for r in registry.workers.values() if r.deregistered_ns is None)
    allocated = 0
    for job in schedule.jobs.values():
        if job.state not in TERMINAL:
            allocated += sum(a.gpus for a in job.assignments.values())
    for endpoint in endpoints.endpoints.values():
        if endpoint.state != "deleted":
            allocated += sum(r.gpus for r in endpoint.replicas.values() if r.state != "lost")
    return registered, allocated
