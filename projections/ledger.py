"""The billing ledger: the METERING stream priced into tenant invoice lines and provider payout lines.
Money is integer micro-USD (see :mod:`core.pricing`).

Subjects. Every layout has the tenant as token 1 and the worker as token 2:

* ``meter.<tenant>.<worker_id>.<assignment_id>.tick``: a :class:`~schemas.metering.UsageTick`, GPU
  and CPU time of one assignment, as the kernel's intake accepted it;
* ``meter.<tenant>.<worker_id>.<assignment_id>.tokens``: a :class:`~schemas.metering.TokensServed`,
  tokens one replica served as one gateway process (its ``source``) counted them;
* legacy, in logs written before METERING had one subject per assignment:
  ``meter.<tenant>.<worker_id>`` (an agent's ``UsageTick``) and ``meter.<tenant>.<worker_id>.tokens``
  (a gateway's ``UsageTick`` carrying ``tokens`` and ``source``).

Usage ticks (``.tick`` and the legacy agent subject) carry GPU and CPU time; token ticks
(``TokensServed`` and a legacy ``.tokens`` ``UsageTick``) carry tokens and nothing else. Tokens never
come from a usage tick: what an agent says it served is not what the tenant is billed for. Tokens are
summed on invoice lines but not priced (the price tables bill GPU and CPU time), so a token tick
touches no payout and no worker's earnings. A tick of any other shape (a ``UsageTick`` on a subject
of four tokens not ending in ``tokens``, a ``TokensServed`` on a subject not ending in ``tokens``) is
invalid.

Pricing and keys. A tick is priced by the table in effect at its ``end_ms`` and billed in the UTC month
of its ``end_ms`` (``YYYY-MM``). Invoice lines are keyed ``tenant/period/work_kind/work_id/gpu_type/pool/
v<price version>`` (a tenant's job ``x`` and its endpoint ``x`` are two lines), payout lines
``provider/period/tier``; each worker's earnings to date (the payouts of its usage ticks) are kept
by worker id, for providers' per-node view.

Per day and over time (:mod:`projections.days`). Beside the lines, every counted usage tick adds its
charge to its tenant's UTC day (of ``end_ms``, like its period: ``spend``), its payout to its
provider's day and tier (``earned``), and its GPU-milliseconds to the fleet buckets its interval
covers (``fleet_gpu_ms``: the GPUs the kernel's ticks say were in use, bucket by bucket). A day's
figures sum to the month's lines; fleet buckets older than :data:`~projections.days.BUCKETS_KEPT`
are pruned with the marks, so they stay a week's worth.

Duplicates. Each assignment has a mark (each assignment and ``source`` for token ticks, keyed
``<tenant>.<worker_id>.<assignment_id>`` and ``...:<source>``): the end of its last counted interval
and the envelope time of its last tick. A tick that starts before its mark's end is a duplicate (an
agent retrying under a new event id, a gateway's retry) and is not counted. The intake already
appends each assignment's ticks with the expected last sequence of its subject, so that new-layout
ticks never overlap; the marks are the second line of defence, and the first for legacy logs. A mark
not touched for :data:`MARK_RETENTION_NS` of envelope time is dropped, so a retry arriving later than
that would be counted again. Marks are pruned at the first tick whose sequence reaches
``next_prune_seq``, which is then set :data:`PRUNE_EVERY` sequences on (or as many as there are
marks, if more, so that pruning costs at most one mark per sequence): a pure function of the
records, so that any chunking of the same events, and a resume from a snapshot, give the same state.

Invalid ticks (negative usage or tokens, ``end_ms < start_ms``, times outside 1970-01..2199-12, a
subject of the wrong shape) are not counted either. Both are counted (``duplicates``, ``invalid``) so
that the ledger accounts for every sequence it saw.

Source ranges. Every invoice line names the METERING sequences it was derived from as inclusive
ranges, ``source_ranges``, ascending and disjoint, and counts its ``ticks``. **The line's ticks are the
counted ticks of its key within its ranges**: an auditor re-derives the line by folding those
sequences and keeping the ticks the ledger counted (neither duplicate nor invalid) whose line key is
the line's, and checks their number against ``ticks``. While a line has at most :data:`RANGE_CAP`
ranges they are its exact runs (consecutive sequences that are all the line's ticks). A tick that
would open one range more compacts the line to :data:`RANGES_KEPT` ranges by merging the two nearest
ranges, again and again, nearest first: this keeps the ``RANGES_KEPT - 1`` widest holes between
ranges (a hole's width is the number of sequences between two ranges; among equally wide holes the
later one is kept) and fills the others. A merged range holds other lines' sequences too, which the
rule above leaves out. Ticks of a line interleave with every other line's in the stream, so exact runs
are mostly single ticks; the cap keeps a line's size fixed, and keeps the widest gaps (the hours or
days the work did not run) out of its ranges.

:class:`InvoiceLine`, :class:`PayoutLine` and :class:`WorkerEarnings` are accumulators and, unlike
the frozen records of the other projections, are updated in place: replacing them on every tick
would cost more than the rest of the fold, and the ledger must rebuild a million ticks in seconds.
The helpers below return copies, so their results never change under their caller; a caller keeping a
whole older state copies it (:func:`projections.base.copy_state`).
"""

from __future__ import annotations

import bisect
import datetime
from itertools import pairwise
from typing import Any

import msgspec

from core.pricing import price, table_at
from projections.base import Projection
from projections.days import BUCKET_MS, BUCKET_NS, BUCKETS_KEPT, spread
from schemas.envelope import Recorded
from schemas.metering import TokensServed, UsageTick
from schemas.values import Pool, WorkKind

RANGE_CAP = 64
"""The most source ranges an invoice line holds."""
RANGES_KEPT = 32
"""How many ranges a line is compacted to when a tick would exceed :data:`RANGE_CAP`."""
MARK_RETENTION_NS = 24 * 3600 * 1_000_000_000
"""A duplicate mark not touched for this long (envelope time) is dropped: 24 hours."""
PRUNE_EVERY = 10_000
"""Marks are pruned every this many METERING sequences at least (more when there are more marks)."""

_MS_PER_DAY = 86_400_000
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_TICK_SUFFIX = len(".tick")
_TOKENS_SUFFIX = len(".tokens")
_PREFIX = len("meter.")
_NEW_LAYOUT = 5
_LEGACY_AGENT = 3
_LEGACY_TOKENS = 4


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
        ticks: how many ticks it sums (usage and token ticks).
        source_ranges: inclusive ``(first, last)`` runs of METERING sequences, ascending and disjoint,
            at most :data:`RANGE_CAP`: the line's ticks are the counted ticks of its key within them
            (see the module docstring for the merge rule).
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
    source_ranges: list[tuple[int, int]] = []


class Earned(msgspec.Struct, kw_only=True):
    """Usage summed and the payout it earned a provider (micro-USD), counted tick by tick."""

    provider: str
    gpu_ms: int = 0
    cpu_ms: int = 0
    payout_micros: int = 0
    ticks: int = 0

    def add(self, gpu_ms: int, cpu_ms: int, payout: int) -> None:
        """Count one tick (in place: the reducer updates the state it is given)."""
        self.gpu_ms += gpu_ms
        self.cpu_ms += cpu_ms
        self.payout_micros += payout
        self.ticks += 1


class PayoutLine(Earned, kw_only=True):
    """What one provider earned in one month at one tier."""

    period: str
    tier: str


class WorkerEarnings(Earned, kw_only=True):
    """What one worker earned its provider to date."""


class LedgerState(msgspec.Struct, kw_only=True):
    """Invoice and payout lines by key.

    Attributes:
        seq: the last METERING sequence applied.
        workers: each worker's earnings to date, by worker id.
        marks: ``<tenant>.<worker_id>.<assignment_id>`` (``...:<source>`` for token ticks) ->
            ``(end_ms, touched_ns)``: the end of the last interval counted for it and the envelope
            time of its last tick, counted or not.
        next_prune_seq: the sequence at or after which marks untouched for
            :data:`MARK_RETENTION_NS` are dropped next.
        duplicates / invalid: ticks ignored as duplicates / as invalid.
        spend: ``<tenant>/<day>`` -> micro-USD charged for the usage ticks ending in that UTC day.
        earned: ``<provider>/<day>`` -> tier -> micro-USD of payouts for those ticks.
        fleet_gpu_ms: fleet bucket -> GPU-milliseconds of usage ticks in it (every tenant's).
    """

    seq: int = 0
    lines: dict[str, InvoiceLine] = {}
    payouts: dict[str, PayoutLine] = {}
    workers: dict[str, WorkerEarnings] = {}
    marks: dict[str, tuple[int, int]] = {}
    next_prune_seq: int = 0
    duplicates: int = 0
    invalid: int = 0
    spend: dict[str, int] = {}
    earned: dict[str, dict[str, int]] = {}
    fleet_gpu_ms: dict[str, int] = {}


def period_of(ms: int) -> str:
    """The UTC month ``YYYY-MM`` of Unix milliseconds ``ms``.

    Raises:
        ValueError: ``ms`` is outside the months the ledger bills, 1970-01 to 2199-12.
    """
    if not _FIRST_MS <= ms < _END_MS:
        raise ValueError(f"{ms} ms is outside 1970-01..2199-12")
    return _MONTH_NAMES[bisect.bisect_right(_MONTH_STARTS_MS, ms) - 1]


def line_key(
    tenant: str, period: str, work_kind: str, work_id: str, gpu_type: str, pool: str, version: int
) -> str:
    """The key of an invoice line in :attr:`LedgerState.lines`: one per tenant, month, kind of work
    (``job`` or ``endpoint``: a tenant chooses both ids, so a job and an endpoint may share one),
    work id, GPU type, pool and price version."""
    return f"{tenant}/{period}/{work_kind}/{work_id}/{gpu_type}/{pool}/v{version}"


def payout_key(provider: str, period: str, tier: str) -> str:
    """The key of a payout line in :attr:`LedgerState.payouts`."""
    return f"{provider}/{period}/{tier}"


def evolve(state: LedgerState, recorded: Recorded[Any]) -> LedgerState:
    """Apply one tick; records at or below ``state.seq`` are already applied and ignored.

    The hottest loop of the ledger's fold: a dispatch on the event's type (:func:`_usage`,
    :func:`_served`) to plain functions that update the state in place.
    """
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    tick = recorded.event
    kind = type(tick)
    if kind is not UsageTick and kind is not TokensServed:
        return state
    if seq >= state.next_prune_seq:
        _prune(state, seq, recorded.time_ns)
    if kind is UsageTick:
        _usage(state, recorded, tick)
    else:
        _served(state, recorded, tick)
    return state


# The mark of a tick: the subject's own tenant, worker and assignment on the new layout, the payload's
# assignment on a legacy one; a token tick's adds its source.


def _usage(state: LedgerState, recorded: Recorded[Any], tick: UsageTick) -> None:
    """A ``UsageTick``: GPU and CPU time, priced, on an invoice line, a payout line and the worker's
    earnings; or, on a legacy ``.tokens`` subject, a gateway's count of tokens."""
    subject = recorded.subject
    tokens = subject.split(".")
    shape = len(tokens)
    if shape == _NEW_LAYOUT and tokens[4] == "tick":
        mark = subject[_PREFIX:-_TICK_SUFFIX]
    elif shape == _LEGACY_AGENT:
        mark = f"{tokens[1]}.{tokens[2]}.{tick.assignment_id}"
    elif shape == _LEGACY_TOKENS and tokens[3] == "tokens":
        _count_tokens(
            state, recorded, tick, tokens[1], f"{tokens[1]}.{tokens[2]}.{tick.assignment_id}:{tick.source}"
        )
        return
    else:
        state.invalid += 1
        return
    gpu_ms, cpu_ms = tick.gpu_ms, tick.cpu_ms
    if not _counted(state, tick, mark, gpu_ms < 0 or cpu_ms < 0, recorded.time_ns):
        return
    charge, payout, version = price(tick)
    period = period_of(tick.end_ms)
    line = _line(state, recorded.seq, tick, tokens[1], period, version)
    line.gpu_ms += gpu_ms
    line.cpu_ms += cpu_ms
    line.charge_micros += charge
    _pay(state, tick, period, tokens[2], payout)
    _by_day(state, tick, tokens[1], charge, payout)


def _by_day(state: LedgerState, tick: UsageTick, tenant: str, charge: int, payout: int) -> None:
    """A counted usage tick on its tenant's and its provider's day, and its GPU time on the fleet."""
    day = tick.end_ms // _MS_PER_DAY
    key = f"{tenant}/{day}"
    spend = state.spend
    spend[key] = spend.get(key, 0) + charge
    key = f"{tick.provider}/{day}"
    tiers = state.earned.get(key)
    if tiers is None:
        tiers = state.earned[key] = {}
    tier = tick.tier
    tiers[tier] = tiers.get(tier, 0) + payout
    gpu_ms = tick.gpu_ms
    if gpu_ms:
        start_ms, end_ms = tick.start_ms, tick.end_ms
        bucket = start_ms // BUCKET_MS
        if start_ms < end_ms and bucket == (end_ms - 1) // BUCKET_MS:  # the common case: spread's
            fleet, key = state.fleet_gpu_ms, str(bucket)
            fleet[key] = fleet.get(key, 0) + gpu_ms
        else:
            spread(state.fleet_gpu_ms, start_ms, end_ms, gpu_ms)


def _served(state: LedgerState, recorded: Recorded[Any], tick: TokensServed) -> None:
    """A ``TokensServed``: tokens one replica served, as one gateway counted them."""
    subject = recorded.subject
    tokens = subject.split(".")
    shape = len(tokens)
    if shape == _NEW_LAYOUT and tokens[4] == "tokens":
        mark = f"{subject[_PREFIX:-_TOKENS_SUFFIX]}:{tick.source}"
    elif shape == _LEGACY_TOKENS and tokens[3] == "tokens":
        mark = f"{tokens[1]}.{tokens[2]}.{tick.assignment_id}:{tick.source}"
    else:
        state.invalid += 1
        return
    _count_tokens(state, recorded, tick, tokens[1], mark)


def _count_tokens(
    state: LedgerState, recorded: Recorded[Any], tick: UsageTick | TokensServed, tenant: str, mark: str
) -> None:
    """A token tick (of either type) on its invoice line: summed, not priced, at the price version in
    effect at its end; it touches no payout and no worker's earnings."""
    served = tick.tokens
    if not _counted(state, tick, mark, served < 0, recorded.time_ns):
        return
    end_ms = tick.end_ms
    version = table_at(end_ms).version
    _line(state, recorded.seq, tick, tenant, period_of(end_ms), version).tokens += served


def _counted(state: LedgerState, tick: UsageTick | TokensServed, mark: str, bad: bool, time_ns: int) -> bool:
    """Whether the tick counts: ``False`` (and counted as invalid) when ``bad`` or its times are
    outside the months billed, ``False`` (and counted as a duplicate) when it starts before its
    mark's end. Its mark is touched at ``time_ns`` either way, and moved to its end if it counts."""
    start_ms, end_ms = tick.start_ms, tick.end_ms
    if bad or not _FIRST_MS <= start_ms <= end_ms < _END_MS:
        state.invalid += 1
        return False
    marks = state.marks
    last = marks.get(mark)
    if last is not None and start_ms < last[0]:
        marks[mark] = (last[0], time_ns)
        state.duplicates += 1
        return False
    marks[mark] = (end_ms, time_ns)
    return True


def _line(
    state: LedgerState, seq: int, tick: UsageTick | TokensServed, tenant: str, period: str, version: int
) -> InvoiceLine:
    """The tick's invoice line (created if new) with the tick counted and ``seq`` in its ranges; the
    caller adds the usage."""
    key = line_key(tenant, period, tick.work_kind, tick.work_id, tick.gpu_type, tick.pool, version)
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
    line.ticks += 1
    ranges = line.source_ranges
    if ranges and ranges[-1][1] == seq - 1:
        ranges[-1] = (ranges[-1][0], seq)
    else:
        ranges.append((seq, seq))
        if len(ranges) > RANGE_CAP:
            line.source_ranges = compact_ranges(ranges, RANGES_KEPT)
    return line


def _pay(state: LedgerState, tick: UsageTick, period: str, worker_id: str, payout: int) -> None:
    """A counted usage tick on its provider's payout line and its worker's earnings."""
    gpu_ms, cpu_ms = tick.gpu_ms, tick.cpu_ms
    key = payout_key(tick.provider, period, tick.tier)
    paid = state.payouts.get(key)
    if paid is None:
        paid = state.payouts[key] = PayoutLine(provider=tick.provider, period=period, tier=tick.tier)
    paid.add(gpu_ms, cpu_ms, payout)
    earned = state.workers.get(worker_id)
    if earned is None:
        earned = state.workers[worker_id] = WorkerEarnings(provider=tick.provider)
    earned.add(gpu_ms, cpu_ms, payout)


def compact_ranges(ranges: list[tuple[int, int]], kept: int) -> list[tuple[int, int]]:
    """``ranges`` (ascending, disjoint, inclusive) merged down to at most ``kept`` ranges by merging
    the two nearest ranges until no more are left than ``kept``.

    Merging never changes the width of the other holes, so this keeps the ``kept - 1`` widest holes
    (width: the number of sequences strictly between two ranges; among equal widths, the later hole)
    and fills the rest.
    """
    if len(ranges) <= kept:
        return list(ranges)
    # (width + 1, index) of every hole, ascending: the last kept - 1 are the widest, later first
    holes = sorted([(b[0] - a[1], i) for i, (a, b) in enumerate(pairwise(ranges), 1)])
    out = []
    first = ranges[0][0]
    for _, i in sorted(holes[len(holes) - (kept - 1) :], key=lambda hole: hole[1]):
        out.append((first, ranges[i - 1][1]))
        first = ranges[i][0]
    out.append((first, ranges[-1][1]))
    return out


def _prune(state: LedgerState, seq: int, now_ns: int) -> None:
    """Drop the marks not touched since ``now_ns - MARK_RETENTION_NS`` and the fleet buckets older
    than :data:`~projections.days.BUCKETS_KEPT` before ``now_ns``, and set the next prune."""
    oldest = now_ns - MARK_RETENTION_NS
    marks = state.marks
    if any(touched < oldest for _, touched in marks.values()):
        state.marks = {key: mark for key, mark in marks.items() if mark[1] >= oldest}
    state.next_prune_seq = seq + max(PRUNE_EVERY, len(state.marks))
    first = now_ns // BUCKET_NS - BUCKETS_KEPT
    if any(int(bucket) < first for bucket in state.fleet_gpu_ms):
        state.fleet_gpu_ms = {b: ms for b, ms in state.fleet_gpu_ms.items() if int(b) >= first}


LEDGER: Projection[LedgerState] = Projection(
    name="ledger", stream="METERING", version=6, state_type=LedgerState, evolve=evolve
)
"""Version 6: invoice lines are keyed by the kind of work too (:func:`line_key`); an older snapshot
may hold one line for a tenant's job and endpoint of one id, and is rebuilt."""


def _copy(line: InvoiceLine) -> InvoiceLine:
    return msgspec.structs.replace(line, source_ranges=list(line.source_ranges))


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


def daily_spend(state: LedgerState, tenant: str, first_day: int, last_day: int) -> list[int]:
    """The tenant's charges (micro-USD) on each UTC day from ``first_day`` to ``last_day`` (day
    numbers, inclusive)."""
    spend = state.spend
    return [spend.get(f"{tenant}/{day}", 0) for day in range(first_day, last_day + 1)]


def daily_earnings(state: LedgerState, provider: str, first_day: int, last_day: int) -> list[dict[str, int]]:
    """Copies of the provider's payouts (tier -> micro-USD) on each UTC day from ``first_day`` to
    ``last_day`` (inclusive; an empty dict for a day without any)."""
    earned = state.earned
    return [dict(earned.get(f"{provider}/{day}", {})) for day in range(first_day, last_day + 1)]
