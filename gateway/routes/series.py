"""Figures over time, for the dashboard's charts: a tenant's spend per day, a provider's earnings per
day and tier with its nodes' uptime per day, and the fleet's GPU utilisation (the operator's).

Every figure is read off a live projection, by key, never by scanning a log: the ledger keeps each
tenant's and provider's money per UTC day and the fleet's metered GPU time per 5-minute bucket, the
registry each worker's downtime per day, liveness the agents' reported GPU utilisation per bucket
(:mod:`projections.days`). So a year's window costs 366 lookups per tenant, whatever the usage.
Scoping is the billing routes': a tenant key reads its own tenant, a provider key its own provider,
the operator names one; the fleet is the operator's only.
"""

from __future__ import annotations

import time

from core.tiers import TIER_FACTORS
from gateway.api import Call, Router
from gateway.routes.billing import money, provider_of
from gateway.scope import iso, scoped_tenant
from projections import ENDPOINTS, LEDGER, LIVENESS, REGISTRY, SCHEDULE
from projections.days import BUCKET_NS, BUCKET_S, NS_PER_DAY, day_name, overlap
from projections.fleet import fleet_points, gpus_now
from projections.ledger import daily_earnings, daily_spend
from projections.registry import RegistryState, WorkerRecord, daily_uptime
from schemas.api.series import (
    DailyEarnings,
    DailySpend,
    DayEarnings,
    DaySpend,
    DayUptime,
    EarningsQuery,
    FleetBucket,
    FleetNow,
    FleetQuery,
    FleetUtilisation,
    NodeUptime,
    SpendQuery,
    TierAmount,
)

router = Router("series")
NODES_SHOWN = 50
"""The most nodes whose uptime a provider's daily figures list: those down longest in the window."""


def window(days: int, now_ns: int) -> tuple[int, int]:
    """The day numbers of the ``days`` UTC days ending on ``now_ns``'s day."""
    last = now_ns // NS_PER_DAY
    return last - days + 1, last


@router.get("/v1/billing/usage/daily", query=SpendQuery, response=DailySpend)
async def daily_usage(call: Call[None, SpendQuery]) -> DailySpend:
    """The tenant's spend per UTC day over the last ``days`` days (default 30), oldest first."""
    tenant = scoped_tenant(call, call.query.tenant)
    first, last = window(call.query.days, time.time_ns())
    spend = daily_spend(call.kernel.state(LEDGER), tenant, first, last)
    return DailySpend(
        tenant=tenant,
        first_day=day_name(first),
        last_day=day_name(last),
        days=[DaySpend(day=day_name(first + i), spend=money(micros)) for i, micros in enumerate(spend)],
        total=money(sum(spend)),
    )


_TIERS = list(TIER_FACTORS)  # platinum first


def _tier_order(tier: str) -> tuple[int, str]:
    return (_TIERS.index(tier) if tier in _TIERS else len(_TIERS), tier)


def _down_in(record: WorkerRecord, first: int, last: int, now_ns: int) -> int:
    """Nanoseconds the worker was lost within days ``first`` to ``last`` (for ordering)."""
    closed = sum(ns for day, ns in record.down_days.items() if first <= int(day) <= last)
    if record.lost_since_ns is None:
        return closed
    return closed + overlap(record.lost_since_ns, now_ns, first * NS_PER_DAY, (last + 1) * NS_PER_DAY)


def node_uptimes(
    registry: RegistryState, provider: str, first: int, last: int, now_ns: int
) -> list[NodeUptime]:
    """The uptime per day of the provider's nodes registered before the window's end: the
    :data:`NODES_SHOWN` down longest in the window, by worker id."""
    end_ns = min(now_ns, (last + 1) * NS_PER_DAY)
    records = [
        r
        for r in registry.workers.values()
        if r.registration.provider == provider
        and r.since_ns < end_ns
        and (r.deregistered_ns is None or r.deregistered_ns >= first * NS_PER_DAY)
    ]
    records.sort(key=lambda r: (-_down_in(r, first, last, now_ns), r.worker_id))
    shown = sorted(records[:NODES_SHOWN], key=lambda r: r.worker_id)
    names = [day_name(day) for day in range(first, last + 1)]
    return [
        NodeUptime(
            worker_id=r.worker_id,
            hostname=r.registration.hostname,
            state=r.state,
            days=[
                DayUptime(day=names[i], uptime=None if up is None else round(up, 6))
                for i, up in enumerate(daily_uptime(r, first, last, now_ns))
            ],
        )
        for r in shown
    ]


@router.get("/v1/billing/payouts/daily", access="provider", query=EarningsQuery, response=DailyEarnings)
async def daily_payouts(call: Call[None, EarningsQuery]) -> DailyEarnings:
    """The provider's earnings per UTC day and tier over the last ``days`` days (default 30), and its
    nodes' uptime per day (the 50 down longest)."""
    provider = provider_of(call, call.query.provider)
    now_ns = time.time_ns()
    first, last = window(call.query.days, now_ns)
    earned = daily_earnings(call.kernel.state(LEDGER), provider, first, last)
    tiers = sorted({tier for day in earned for tier in day}, key=_tier_order)
    days = [
        DayEarnings(
            day=day_name(first + i),
            total=money(sum(by_tier.values())),
            tiers=[TierAmount(tier=t, payout=money(by_tier[t])) for t in sorted(by_tier, key=_tier_order)],
        )
        for i, by_tier in enumerate(earned)
    ]
    return DailyEarnings(
        provider=provider,
        first_day=day_name(first),
        last_day=day_name(last),
        tiers=tiers,
        days=days,
        total=money(sum(d.total.micros for d in days)),
        nodes=node_uptimes(call.kernel.state(REGISTRY), provider, first, last, now_ns),
    )


@router.get("/v1/fleet/utilisation", access="operator", query=FleetQuery, response=FleetUtilisation)
async def fleet_utilisation(call: Call[None, FleetQuery]) -> FleetUtilisation:
    """The fleet's GPUs in 5-minute buckets over the last ``hours`` hours (default 24): registered,
    allocated (the kernel's metering) and the agents' reported utilisation; and allocated now (the
    schedule)."""
    now_ns = time.time_ns()
    last = now_ns // BUCKET_NS
    first = last - call.query.hours * 3600 // BUCKET_S + 1
    kernel = call.kernel
    points = fleet_points(
        kernel.state(REGISTRY), kernel.state(LEDGER), kernel.state(LIVENESS), first, last, now_ns
    )
    registered, allocated = gpus_now(kernel.state(REGISTRY), kernel.state(SCHEDULE), kernel.state(ENDPOINTS))
    return FleetUtilisation(
        hours=call.query.hours,
        bucket_s=BUCKET_S,
        buckets=[
            FleetBucket(
                at=iso(p.bucket * BUCKET_NS, "seconds"),
                registered_gpus=p.registered_gpus,
                allocated_gpus=round(p.allocated_gpus, 4),
                allocated=_ratio(p.allocated_gpus, p.registered_gpus),
                reported_util_pct=round(p.util_sum / p.readings, 2) if p.readings else None,
                readings=p.readings,
            )
            for p in points
        ],
        now=FleetNow(
            registered_gpus=registered, allocated_gpus=allocated, allocated=_ratio(allocated, registered)
        ),
    )


def _ratio(part: float, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
