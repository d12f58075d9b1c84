"""Bodies of the figures over time: a tenant's spend per day, a provider's earnings per day and tier
with its nodes' uptime per day, the fleet's GPU utilisation over the last hours (the operator's).

Days are UTC dates (``2026-04-01``); a window of ``days`` days ends today (UTC) and lists every day
in it, oldest first, a day without figures included (zero money, ``null`` uptime). Money is integer
micro-USD plus a decimal string (:class:`~schemas.api.billing.Money`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.api.billing import Money
from schemas.api.common import Request

Days = Annotated[int, msgspec.Meta(ge=1, le=366)]
Hours = Annotated[int, msgspec.Meta(ge=1, le=168)]


class SpendQuery(Request, frozen=True, kw_only=True):
    """``days``: the window, 1 to 366 days ending today (default 30); ``tenant``: the operator names
    one (a tenant key always reads its own)."""

    tenant: str | None = None
    days: Days = 30


class DaySpend(msgspec.Struct, frozen=True, kw_only=True):
    """What the tenant was charged for the usage that ended on ``day``."""

    day: str
    spend: Money


class DailySpend(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's spend per UTC day, ``first_day`` to ``last_day``; ``total``: their sum."""

    tenant: str
    first_day: str
    last_day: str
    days: list[DaySpend]
    total: Money


class EarningsQuery(Request, frozen=True, kw_only=True):
    """``days``: as :class:`SpendQuery`; ``provider``: the operator names one (a provider key always
    reads its own)."""

    provider: str | None = None
    days: Days = 30


class TierAmount(msgspec.Struct, frozen=True, kw_only=True):
    tier: str
    payout: Money


class DayEarnings(msgspec.Struct, frozen=True, kw_only=True):
    """What the provider earned for the usage that ended on ``day``: in all, and by uptime tier (the
    tier each tick was accepted at)."""

    day: str
    total: Money
    tiers: list[TierAmount]


class DayUptime(msgspec.Struct, frozen=True, kw_only=True):
    """``uptime``: the share of the day the node was registered and not lost, 0 to 1; ``null`` for a
    day it was not observed (not registered yet, deregistered, or later than now)."""

    day: str
    uptime: float | None


class NodeUptime(msgspec.Struct, frozen=True, kw_only=True):
    """One of the provider's nodes and its uptime per day (the kernel's lost and recovered events)."""

    worker_id: str
    hostname: str
    state: str
    days: list[DayUptime]


class DailyEarnings(msgspec.Struct, frozen=True, kw_only=True):
    """A provider's earnings per UTC day and tier, ``first_day`` to ``last_day``, and its nodes'
    uptime per day (by worker id); ``tiers``: every tier seen in the window."""

    provider: str
    first_day: str
    last_day: str
    tiers: list[str]
    days: list[DayEarnings]
    total: Money
    nodes: list[NodeUptime]


class FleetQuery(Request, frozen=True, kw_only=True):
    """``hours``: the window, 1 to 168 hours ending now (default 24)."""

    hours: Hours = 24


class FleetBucket(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet over one bucket of time (5 minutes from ``at``).

    Attributes:
        at: the bucket's start, ISO 8601 UTC.
        registered_gpus: GPUs of the workers registered at the bucket's end (the registry).
        allocated_gpus: the mean number of GPUs work held over the bucket: GPU-milliseconds of the
            kernel's metering ticks divided by the bucket's length (elapsed length for the bucket
            still running; its ticks arrive every 10 s, so it reads low until it closes).
        allocated: ``allocated_gpus / registered_gpus``, 0 to 1 (``null`` with no GPU registered).
        reported_util_pct: the mean ``util_pct`` of every GPU reading in the bucket's heartbeats:
            what the agents say of their GPUs, not checked by the kernel (``null``: none reported).
        readings: how many GPU readings that mean is over.
    """

    at: str
    registered_gpus: int
    allocated_gpus: float
    allocated: float | None
    reported_util_pct: float | None
    readings: int


class FleetNow(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet now, from the kernel's schedule and registry: GPUs held by current assignments of live
    jobs and endpoint replicas, of the GPUs of registered workers (lost ones included)."""

    registered_gpus: int
    allocated_gpus: int
    allocated: float | None


class FleetUtilisation(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet's GPU utilisation in :data:`bucket_s`-second buckets over the last ``hours`` hours,
    oldest first (the bucket now running last), and now."""

    hours: int
    bucket_s: int
    buckets: list[FleetBucket]
    now: FleetNow
