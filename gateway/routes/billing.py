"""Billing: a tenant's usage and invoices, a provider's payouts, all read off the live ledger.

The ledger (:mod:`projections.ledger`) has already priced every metering tick into invoice lines
(``tenant/period/work/gpu type/pool/price version``, each naming the ranges of METERING sequences it
sums) and payout lines (``provider/period/tier``). These routes group them; they compute no price.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gateway.api import Call, Router
from gateway.bodies import S, carried
from gateway.errors import ApiError, not_found
from gateway.scope import scoped_tenant
from projections import LEDGER
from projections.ledger import (
    InvoiceLine,
    LedgerState,
    PayoutLine,
    WorkerEarnings,
    invoice,
    payouts,
    period_of,
)
from schemas.api.billing import (
    Invoice,
    InvoiceLineView,
    InvoiceSummary,
    Money,
    PayoutQuery,
    Payouts,
    PeriodPayout,
    PeriodUsage,
    TierPayout,
    Usage,
    UsageQuery,
    WorkUsage,
)
from schemas.api.jobs import TenantQuery

router = Router("billing")
_PERIOD = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")
MICROS_PER_USD = 1_000_000


def money(micros: int) -> Money:
    """``micros`` micro-USD as :class:`Money` (``usd`` with six decimals, exact)."""
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), MICROS_PER_USD)
    return Money(micros=micros, usd=f"{sign}{whole}.{fraction:06d}")


def seconds(ms: int) -> float:
    return ms / 1000


def paid(body: type[S], line: PayoutLine | WorkerEarnings, **given: Any) -> S:
    """``body`` with a payout's figures: GPU- and CPU-seconds, ticks and the payout."""
    return carried(
        body,
        line,
        gpu_seconds=seconds(line.gpu_ms),
        cpu_seconds=seconds(line.cpu_ms),
        payout=money(line.payout_micros),
        **given,
    )


def current_period() -> str:
    return period_of(time.time_ns() // 1_000_000)


def tenant_lines(ledger: LedgerState, tenant: str, period: str | None = None) -> list[InvoiceLine]:
    """The tenant's invoice lines (of one period, or all), by line key. The lines are the ledger's
    own accumulators: read them, never keep or change them."""
    lines = ledger.lines
    return [
        lines[k]
        for k in sorted(lines)
        if lines[k].tenant == tenant and (period is None or lines[k].period == period)
    ]


def _work_usage(lines: Iterable[InvoiceLine]) -> list[WorkUsage]:
    by_work: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for line in lines:
        sums = by_work[(line.work_id, line.work_kind)]
        sums[0] += line.gpu_ms
        sums[1] += line.cpu_ms
        sums[2] += line.tokens
        sums[3] += line.charge_micros
    usage = [
        WorkUsage(
            work_id=work_id,
            work_kind=kind,
            gpu_seconds=seconds(gpu),
            cpu_seconds=seconds(cpu),
            tokens=tokens,
            charge=money(charge),
        )
        for (work_id, kind), (gpu, cpu, tokens, charge) in by_work.items()
    ]
    usage.sort(key=lambda w: (-w.charge.micros, w.work_id))
    return usage


@router.get("/v1/billing/usage", query=UsageQuery, response=Usage)
async def usage(call: Call[None, UsageQuery]) -> Usage:
    """GPU- and CPU-seconds, inference tokens and charges by period and by job or endpoint (newest
    period first)."""
    tenant = scoped_tenant(call, call.query.tenant)
    by_period: dict[str, list[InvoiceLine]] = defaultdict(list)
    for line in tenant_lines(call.kernel.state(LEDGER), tenant, call.query.period):
        by_period[line.period].append(line)
    periods = [
        PeriodUsage(
            period=period,
            gpu_seconds=seconds(sum(line.gpu_ms for line in lines)),
            cpu_seconds=seconds(sum(line.cpu_ms for line in lines)),
            tokens=sum(line.tokens for line in lines),
            charge=money(sum(line.charge_micros for line in lines)),
            work=_work_usage(lines),
        )
        for period, lines in sorted(by_period.items(), reverse=True)
    ]
    return Usage(tenant=tenant, periods=periods, total=money(sum(p.charge.micros for p in periods)))


@router.get("/v1/billing/invoices", query=TenantQuery, response=list[InvoiceSummary])
async def list_invoices(call: Call[None, TenantQuery]) -> list[InvoiceSummary]:
    """The tenant's invoices, one per period with usage, newest first."""
    tenant = scoped_tenant(call, call.query.tenant)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for line in tenant_lines(call.kernel.state(LEDGER), tenant):
        totals[line.period][0] += line.charge_micros
        totals[line.period][1] += 1
    now = current_period()
    return [
        InvoiceSummary(period=period, total=money(total), lines=count, open=period >= now)
        for period, (total, count) in sorted(totals.items(), reverse=True)
    ]


@router.get("/v1/billing/invoices/{period}", query=TenantQuery, response=Invoice)
async def get_invoice(call: Call[None, TenantQuery]) -> Invoice:
    """One period's invoice (``YYYY-MM``): every line with the ranges of METERING sequences it was
    derived from."""
    tenant = scoped_tenant(call, call.query.tenant)
    period = call.params["period"]
    if not _PERIOD.match(period):
        raise ApiError(400, "invalid_period", f"period must be a month as YYYY-MM (2026-04), got {period!r}")
    lines = invoice(call.kernel.state(LEDGER), tenant, period)
    if not lines:
        raise not_found(f"invoice for {period}")
    views = [
        carried(
            InvoiceLineView,
            line,
            gpu_seconds=seconds(line.gpu_ms),
            cpu_seconds=seconds(line.cpu_ms),
            charge=money(line.charge_micros),
        )
        for line in lines
    ]
    return Invoice(
        tenant=tenant,
        period=period,
        open=period >= current_period(),
        total=money(sum(line.charge_micros for line in lines)),
        lines=views,
    )


def provider_of(call: Call[Any, Any], requested: str | None) -> str:
    """The provider a provider-scoped request reads: a provider key's own (naming another is a 404);
    the operator must name one."""
    principal = call.principal
    if principal.kind == "provider":
        if requested and requested != principal.account:
            raise not_found(f"provider {requested}")
        return principal.account
    if not requested:
        raise ApiError(400, "provider_required", "the operator must name the provider (?provider=...)")
    return requested


@router.get("/v1/billing/payouts", access="provider", query=PayoutQuery, response=Payouts)
async def list_payouts(call: Call[None, PayoutQuery]) -> Payouts:
    """The provider's payouts by period and uptime tier (newest period first)."""
    provider = provider_of(call, call.query.provider)
    by_period: dict[str, list[TierPayout]] = defaultdict(list)
    for line in payouts(call.kernel.state(LEDGER), provider):
        if call.query.period is None or line.period == call.query.period:
            by_period[line.period].append(paid(TierPayout, line))
    periods = [
        PeriodPayout(period=period, total=money(sum(t.payout.micros for t in tiers)), tiers=tiers)
        for period, tiers in sorted(by_period.items(), reverse=True)
    ]
    return Payouts(provider=provider, periods=periods, total=money(sum(p.total.micros for p in periods)))
