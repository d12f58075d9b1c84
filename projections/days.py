"""Time cut into UTC days and into fleet buckets: the units of the per-day and over-time figures the
projections keep beside their totals (a tenant's spend and a provider's earnings per day in the
ledger, a worker's downtime per day in the registry, the fleet's GPU use per bucket in the ledger and
its reported utilisation per bucket in liveness).

A day is a number: whole days since 1970-01-01 UTC (``day_of_ms(ms) == ms // 86_400_000``), shown as
an ISO date (:func:`day_name`). A fleet bucket is :data:`BUCKET_S` seconds numbered the same way. In
a state, days and buckets are dict keys written in decimal (``"20544"``): a state's canonical JSON
has string keys only. Everything here is pure arithmetic on integers.
"""

from __future__ import annotations

import datetime

from core.clock import NS_PER_MS, NS_PER_S

MS_PER_DAY = 86_400_000
NS_PER_DAY = MS_PER_DAY * NS_PER_MS
DAYS_KEPT = 400
"""How many days of per-day figures a worker's registry record keeps (longer than any window read)."""
BUCKET_S = 300
"""The width of a fleet bucket: 5 minutes."""
BUCKET_MS = BUCKET_S * 1000
BUCKET_NS = BUCKET_S * NS_PER_S
BUCKETS_KEPT = 8 * 86_400 // BUCKET_S
"""Fleet buckets kept: 8 days (heartbeats are kept 7)."""
SPLIT_MAX = 64
"""An interval over more buckets than this (a malformed one) is put whole in the bucket of its end."""
_EPOCH = datetime.date(1970, 1, 1)


def day_of_ms(ms: int) -> int:
    """The UTC day of Unix milliseconds ``ms``."""
    return ms // MS_PER_DAY


def day_name(day: int) -> str:
    """Day number ``day`` as an ISO date (``2026-04-01``)."""
    return (_EPOCH + datetime.timedelta(days=day)).isoformat()


def overlap(start: int, end: int, lo: int, hi: int) -> int:
    """How much of ``[start, end)`` lies in ``[lo, hi)`` (0 when they do not meet)."""
    return max(0, min(end, hi) - max(start, lo))


def add_days(days: dict[str, int], start_ns: int, end_ns: int) -> dict[str, int]:
    """A copy of ``days`` (day number -> nanoseconds) with ``[start_ns, end_ns)`` added, split at UTC
    midnights, and the days more than :data:`DAYS_KEPT` before ``end_ns``'s dropped."""
    last = end_ns // NS_PER_DAY
    first = max(start_ns // NS_PER_DAY, last - DAYS_KEPT)
    out = {day: ns for day, ns in days.items() if int(day) >= last - DAYS_KEPT}
    for day in range(first, last + 1):
        part = overlap(start_ns, end_ns, day * NS_PER_DAY, (day + 1) * NS_PER_DAY)
        if part:
            out[str(day)] = out.get(str(day), 0) + part
    return out


def spread(buckets: dict[str, int], start_ms: int, end_ms: int, amount: int) -> None:
    """Add ``amount`` (used over ``[start_ms, end_ms)``) to the fleet buckets it covers, in place,
    each its share by time (the last takes the rounding), so that the buckets sum to ``amount``."""
    first, last = start_ms // BUCKET_MS, max(start_ms, end_ms - 1) // BUCKET_MS
    if first != last and last - first <= SPLIT_MAX:
        span = end_ms - start_ms
        for bucket in range(first, last):
            share = amount * overlap(start_ms, end_ms, bucket * BUCKET_MS, (bucket + 1) * BUCKET_MS) // span
            key = str(bucket)
            buckets[key] = buckets.get(key, 0) + share
            amount -= share
    key = str(last)
    buckets[key] = buckets.get(key, 0) + amount
