"""The billing ledger: the METERING stream (``meter.<tenant>.<worker_id>``) priced into tenant invoice
lines and provider payout lines. Money is integer micro-USD (see :mod:`core.pricing`).

* Tokens come only from ticks on ``meter.<tenant>.<worker_id>.tokens``, which only the kernel's
  gateways may publish (:func:`core.streams.token_metering_subject`); the ``tokens`` of a tick on an
  agent's own subject are ignored. Tokens are summed on invoice lines but not priced: the price
  tables bill GPU and CPU time.

* A tick is priced by the table in effect at its ``end_ms``, and billed in the UTC month of its
  ``end_ms`` (``YYYY-MM``).
* Invoice lines are keyed ``tenant/period/work_id/gpu_type/pool/v<price version>``; payout lines
  ``provider/period/tier``. Every invoice line lists the METERING sequences it was derived from, in
  order (ticks arrive in sequence order). Each worker's earnings to date (the payouts of the ticks
  it metered) are kept by worker id, for providers' per-node view.
* A tick whose ``(assignment_id, start_ms)`` was already counted is a duplicate (an agent retry under a
  new event id) and is ignored (a gateway's token ticks are keyed by ``(assignment_id, source,
  start_ms)``: each gateway process is its own source), as is a tick with negative usage or
  ``end_ms < start_ms``: both are counted (``duplicates``, ``invalid``) so that the ledger accounts
  for every sequence it saw. Times outside 1970-01..2199-12 are invalid too.

:class:`InvoiceLine`, :class:`PayoutLine` and :class:`WorkerEarnings` are accumulators and, unlike
the frozen records of the other projections, are updated in place: an invoice line's ``source_seqs``
grows by one sequence per tick, so replacing it on every tick would make the fold quadratic, and the
ledger must fold at least 100k ticks/s. The helpers below return copies, so their results never
change under their caller; a caller keeping a whole older state copies it
(:func:`projections.base.copy_state`).
"""

from __future__ import annotations

import bisect
import datetime
from typing import Any

import msgspec

from core.pricing import price
from projections.base import Projection
from schemas.envelope import Recorded
from schemas.metering import UsageTick
from schemas.values import Pool, WorkKind

_MS_PER_DAY = 86_400_000
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()


def _month_table(first_year: int, last_year: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    starts, names = [], []
    for year in range(first_year, last_year + 1):
        for month in range(1, 13):
            day = datetime.date(year, month, 1).toordinal() - _EPOCH_ORDINAL
            starts.append(day * _MS_PER_DAY)
            names.append(f"{year:04d}-{month:02d}")
    return tuple(starts), tuple(names)


# Constant tables (built once, never changed) so that a tick's period is one bisect, not a calendar
# computation: the period costs as much as the pricing otherwise.
_MONTH_STARTS_MS, _MONTH_NAMES = _month_table(1970, 2200)
_FIRST_MS, _END_MS = _MONTH_STARTS_MS[0], _MONTH_STARTS_MS[-12]


class InvoiceLine(msgspec.Struct, kw_only=True):
    """One line of a tenant's invoice: usage of one piece of work on one GPU type and pool, in one
    month, at one price version.

    Attributes:
        gpu_ms / cpu_ms / tokens: usage summed over the line's ticks.
        charge_micros: the sum of its ticks' charges, micro-USD.
        ticks: how many ticks it sums.
        source_seqs: the METERING sequences of those ticks, ascending.
    """

    tenant: str
    period: str
    work_id: str
    work_kind: WorkKind
    gpu_type: str
    pool: Pool
    price_version: int
    gpu_ms: int = 0
    cpu_ms: int = 0
    tokens: int = 0
    charge_micros: int = 0
    ticks: int = 0
    source_seqs: list[int] = []


class PayoutLine(msgspec.Struct, kw_only=True):
    """What one provider earned in one month at one tier (usage summed, payout in micro-USD)."""

    provider: str
    period: str
    tier: str
    gpu_ms: int = 0
    cpu_ms: int = 0
    payout_micros: int = 0
    ticks: int = 0


class WorkerEarnings(msgspec.Struct, kw_only=True):
    """What one worker earned its provider to date (usage summed, payout in micro-USD)."""

    provider: str
    gpu_ms: int = 0
    cpu_ms: int = 0
    payout_micros: int = 0
    ticks: int = 0


class LedgerState(msgspec.Struct, kw_only=True):
    """Invoice and payout lines by key.

    Attributes:
        seq: the last METERING sequence applied.
        workers: each worker's earnings to date, by worker id.
        seen: ``assignment_id:start_ms`` (``assignment_id:source:start_ms`` for a gateway's token
            tick) -> the sequence of the tick that was counted for it.
        duplicates / invalid: ticks ignored as duplicates / as invalid.
    """

    seq: int = 0
    lines: dict[str, InvoiceLine] = {}
    payouts: dict[str, PayoutLine] = {}
    workers: dict[str, WorkerEarnings] = {}
    seen: dict[str, int] = {}
    duplicates: int = 0
    invalid: int = 0


def period_of(ms: int) -> str:
    """The UTC month ``YYYY-MM`` of Unix milliseconds ``ms``.

    Raises:
        ValueError: ``ms`` is outside the months the ledger bills, 1970-01 to 2199-12.
    """
    if not _FIRST_MS <= ms < _END_MS:
        raise ValueError(f"{ms} ms is outside 1970-01..2199-12")
    return _MONTH_NAMES[bisect.bisect_right(_MONTH_STARTS_MS, ms) - 1]


def line_key(tenant: str, period: str, work_id: str, gpu_type: str, pool: str, version: int) -> str:
    """The key of an invoice line in :attr:`LedgerState.lines`."""
    return f"{tenant}/{period}/{work_id}/{gpu_type}/{pool}/v{version}"


def payout_key(provider: str, period: str, tier: str) -> str:
    """The key of a payout line in :attr:`LedgerState.payouts`."""
    return f"{provider}/{period}/{tier}"


def evolve(state: LedgerState, recorded: Recorded[Any]) -> LedgerState:
    """Apply one usage tick; records at or below ``state.seq`` are already applied and ignored.

    One function on purpose: this is the hottest loop of the ledger's fold.
    """
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    tick = recorded.event
    if type(tick) is not UsageTick:
        return state
    subject = recorded.subject.split(".")  # meter.<tenant>.<worker_id>[.tokens]
    tenant, worker_id = subject[1], subject[2]
    counted = len(subject) == 4  # the kernel's own count: only it carries tokens and a source
    start_ms, end_ms, gpu_ms, cpu_ms, tokens = (
        tick.start_ms,
        tick.end_ms,
        tick.gpu_ms,
        tick.cpu_ms,
        tick.tokens if counted else 0,
    )
    if gpu_ms < 0 or cpu_ms < 0 or tokens < 0 or not _FIRST_MS <= start_ms <= end_ms < _END_MS:
        state.invalid += 1
        return state
    seen_key = (
        f"{tick.assignment_id}:{tick.source}:{start_ms}" if counted else f"{tick.assignment_id}:{start_ms}"
    )
    if seen_key in state.seen:
        state.duplicates += 1
        return state
    state.seen[seen_key] = seq

    charge, payout, version = price(tick)
    period = _MONTH_NAMES[bisect.bisect_right(_MONTH_STARTS_MS, end_ms) - 1]  # period_of(end_ms)
    key = line_key(tenant, period, tick.work_id, tick.gpu_type, tick.pool, version)
    line = state.lines.get(key)
    if line is None:
        line = state.lines[key] = InvoiceLine(
            tenant=tenant,
            period=period,
            work_id=tick.work_id,
            work_kind=tick.work_kind,
            gpu_type=tick.gpu_type,
            pool=tick.pool,
            price_version=version,
        )
    line.gpu_ms += gpu_ms
    line.cpu_ms += cpu_ms
    line.tokens += tokens
    line.charge_micros += charge
    line.ticks += 1
    line.source_seqs.append(seq)

    key = payout_key(tick.provider, period, tick.tier)
    paid = state.payouts.get(key)
    if paid is None:
        paid = state.payouts[key] = PayoutLine(provider=tick.provider, period=period, tier=tick.tier)
    paid.gpu_ms += gpu_ms
    paid.cpu_ms += cpu_ms
    paid.payout_micros += payout
    paid.ticks += 1

    earned = state.workers.get(worker_id)
    if earned is None:
        earned = state.workers[worker_id] = WorkerEarnings(provider=tick.provider)
    earned.gpu_ms += gpu_ms
    earned.cpu_ms += cpu_ms
    earned.payout_micros += payout
    earned.ticks += 1
    return state


LEDGER: Projection[LedgerState] = Projection(
    name="ledger",
    stream="METERING",
    version=3,
    state_type=LedgerState,
    initial=LedgerState,
    evolve=evolve,
)


def _copy(line: InvoiceLine) -> InvoiceLine:
    return msgspec.structs.replace(line, source_seqs=list(line.source_seqs))


def charges(state: LedgerState, tenant: str, period: str | None = None) -> int:
    """The tenant's total charge in micro-USD, over every period or over one (``YYYY-MM``)."""
    return sum(
        line.charge_micros
        for line in state.lines.values()
        if line.tenant == tenant and (period is None or line.period == period)
    )


def invoice(state: LedgerState, tenant: str, period: str) -> list[InvoiceLine]:
    """Copies of the tenant's invoice lines for one period, by line key."""
    lines = state.lines
    return [_copy(lines[k]) for k in sorted(lines) if lines[k].tenant == tenant and lines[k].period == period]


def payouts(state: LedgerState, provider: str) -> list[PayoutLine]:
    """Copies of the provider's payout lines, by period then tier."""
    lines = state.payouts
    return [msgspec.structs.replace(lines[k]) for k in sorted(lines) if lines[k].provider == provider]


def earnings(state: LedgerState, worker_id: str) -> WorkerEarnings | None:
    """A copy of what ``worker_id`` earned to date, or ``None`` if it never metered anything."""
    earned = state.workers.get(worker_id)
    return None if earned is None else msgspec.structs.replace(earned)
