"""Bodies of the billing routes: usage, invoices with their lines, payouts.

Money is an integer number of micro-USD (``micros``, 1 USD = 1,000,000) plus the same amount as a
decimal string (``usd``, six decimals) for people; clients compute with ``micros``. Periods are UTC
months, ``YYYY-MM``, taken from each usage tick's end.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.api.common import Request

Period = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{4}-(0[1-9]|1[0-2])$")]


class Money(msgspec.Struct, frozen=True, kw_only=True):
    """An amount: ``micros`` micro-USD, and ``usd`` the same as a decimal string (``"1.490000"``)."""

    micros: int
    usd: str


class UsageQuery(Request, frozen=True, kw_only=True):
    """``period``: one UTC month ``YYYY-MM`` (default: every period with usage)."""

    tenant: str | None = None
    period: Period | None = None


class WorkUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One job's or endpoint's usage in a period (``tokens``: an endpoint's prompt plus completion
    tokens, as the gateway counted them; metered, not priced)."""

    work_id: str
    work_kind: str
    gpu_seconds: float
    cpu_seconds: float
    tokens: int
    charge: Money


class PeriodUsage(msgspec.Struct, frozen=True, kw_only=True):
    """A period's usage: totals and by job or endpoint (largest charge first)."""

    period: str
    gpu_seconds: float
    cpu_seconds: float
    tokens: int
    charge: Money
    work: list[WorkUsage]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    periods: list[PeriodUsage]
    total: Money


class InvoiceLineView(msgspec.Struct, frozen=True, kw_only=True):
    """One invoice line: the usage of one piece of work on one GPU type and pool at one price
    version, and where in METERING it was summed from (the audit trail).

    Attributes:
        ticks: how many metering ticks the line sums (GPU/CPU time and token counts).
        source_ranges: inclusive ``[first, last]`` runs of METERING sequences, ascending and
            disjoint, at most 64: the line's ticks are the counted ticks of its key (tenant, period,
            work, GPU type, pool, price version) within them, neither duplicates nor invalid, and
            there are ``ticks`` of them. A line's ticks interleave with other lines' in the stream,
            so runs are merged, nearest first, to keep a line's size fixed: a range may hold other
            lines' sequences too, and the widest gaps between the line's ticks stay out of it.
    """

    work_id: str
    work_kind: str
    gpu_type: str
    pool: str
    price_version: int
    gpu_seconds: float
    cpu_seconds: float
    tokens: int
    ticks: int
    charge: Money
    source_ranges: list[tuple[int, int]]


class InvoiceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A period's invoice at a glance; ``open`` while the month is not over (it still grows)."""

    period: str
    total: Money
    lines: int
    open: bool


class Invoice(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    period: str
    open: bool
    total: Money
    lines: list[InvoiceLineView]


class PayoutQuery(Request, frozen=True, kw_only=True):
    """``provider``: the operator names one (a provider key always sees its own)."""

    provider: str | None = None
    period: Period | None = None


class TierPayout(msgspec.Struct, frozen=True, kw_only=True):
    """What the provider earned in a period at one uptime tier."""

    tier: str
    gpu_seconds: float
    cpu_seconds: float
    ticks: int
    payout: Money


class PeriodPayout(msgspec.Struct, frozen=True, kw_only=True):
    period: str
    total: Money
    tiers: list[TierPayout]


class Payouts(msgspec.Struct, frozen=True, kw_only=True):
    provider: str
    periods: list[PeriodPayout]
    total: Money
