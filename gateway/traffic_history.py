"""Each endpoint's inference traffic through this gateway over the last hour, in 10-second buckets.

The inference proxy (:mod:`gateway.inference`) tells :class:`TrafficBuckets` of every request that
finished (its latency, whether it failed, its time in line), every request refused with a 429 and
the depth of the endpoint's line (at each arrival and every autoscaler tick); each goes into the
bucket of :data:`BUCKET_S` seconds it happened in. A bucket, once a later one opens, is kept as its
start and nine numbers: requests, errors, latency P50/P95/P99 (from the request's arrival to the last
byte of its answer), time in line P50/P99, the line's peak depth, and 429s.

* **Percentiles.** While a bucket is open its latencies (and waits) are counted in a log-scale
  histogram of fixed bins :data:`GROWTH` apart (5%): a percentile is its bin's geometric middle,
  within 2.5% of the exact nearest-rank figure, and a bucket costs the same at 1 request or 10,000.
* **Bounded.** An endpoint keeps :data:`HISTORY_S` of buckets (older ones are dropped), and only
  buckets in which something happened (an idle endpoint costs nothing more). At most
  :data:`MAX_SERIES` endpoints are kept, :data:`MAX_SERIES_PER_TENANT` of one tenant: a tenant over
  its share loses its own least recently served endpoint's history, never another tenant's; over
  the total, the least recently served endpoint's goes. A closed bucket is 44 bytes and the open
  one two histograms of :data:`BINS` counters: an endpoint served for an hour holds ~20 KB
  (measured with ``tracemalloc``), so the whole store stays under ~40 MB.
* **This gateway's.** Each gateway process counts the requests it proxied; with several gateways
  each holds its share, and a restart starts empty (the replica counts, read from the log, do not:
  :mod:`gateway.scale_history`).

No I/O and no clock: every method takes ``now`` (Unix seconds) from its caller.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field

BUCKET_S = 10
"""Seconds per bucket."""
HISTORY_S = 3600
"""How far back an endpoint's buckets go."""
MAX_SERIES = 2000
"""Endpoints whose history one gateway keeps."""
MAX_SERIES_PER_TENANT = 200
"""Endpoints of one tenant whose history one gateway keeps."""
GROWTH = 1.05
"""Ratio between the bounds of a histogram bin."""
SMALLEST_MS = 0.1
"""The upper bound of the first bin: a latency at or below it reads as 0.1 ms."""
LARGEST_MS = 3_600_000.0
"""Latencies above an hour count in the last bin."""
_LOG_GROWTH = math.log(GROWTH)
BINS = math.ceil(math.log(LARGEST_MS / SMALLEST_MS) / _LOG_GROWTH) + 1
FIELDS = (
    "requests",
    "errors",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "wait_p50_ms",
    "wait_p99_ms",
    "depth",
    "rejected",
)
"""What a closed bucket keeps, in this order (float32 each)."""
_STRIDE = len(FIELDS)


def bin_of(ms: float) -> int:
    """The histogram bin of a latency in milliseconds."""
    if ms <= SMALLEST_MS:
        return 0
    return min(BINS - 1, math.ceil(math.log(ms / SMALLEST_MS) / _LOG_GROWTH))


def bin_ms(index: int) -> float:
    """What a bin reads as: the geometric middle of its bounds (the first bin: its upper bound)."""
    return SMALLEST_MS if index == 0 else SMALLEST_MS * GROWTH ** (index - 0.5)


def quantile(histogram: array[int], total: int, q: float) -> float:
    """The nearest-rank ``q`` percentile (ms) of ``total`` values counted in ``histogram`` (0 for none)."""
    if total == 0:
        return 0.0
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return bin_ms(index)
    return bin_ms(BINS - 1)


def _bins() -> array[int]:
    return array("I", [0]) * BINS


@dataclass(slots=True)
class OpenBucket:
    """The bucket being filled: counts and histograms."""

    start: int
    requests: int = 0
    errors: int = 0
    latency: array[int] = field(default_factory=_bins)
    waited: int = 0
    wait: array[int] = field(default_factory=_bins)
    depth: int = 0
    rejected: int = 0

    def closed(self) -> tuple[float, ...]:
        """The bucket's figures, in :data:`FIELDS` order."""
        return (
            self.requests,
            self.errors,
            quantile(self.latency, self.requests, 0.50),
            quantile(self.latency, self.requests, 0.95),
            quantile(self.latency, self.requests, 0.99),
            quantile(self.wait, self.waited, 0.50),
            quantile(self.wait, self.waited, 0.99),
            self.depth,
            self.rejected,
        )


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket's figures (latencies in ms; ``None`` without a request finished in it).

    Attributes:
        start: Unix seconds, a multiple of :data:`BUCKET_S`.
        rps: requests over the bucket's length (over the time elapsed, for the open one).
        depth: the line's peak depth seen in it.
        rejected: requests answered 429 in it (line full, or waited past the deadline).
    """

    start: int
    requests: int
    errors: int
    rps: float
    error_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    depth: int
    rejected: int


def _bucket(start: int, values: tuple[float, ...], seconds: float) -> Bucket:
    requests, errors, p50, p95, p99, w50, w99, depth, rejected = values
    served = requests > 0

    def ms(value: float) -> float | None:
        return round(value, 3) if served else None

    return Bucket(
        start=start,
        requests=int(requests),
        errors=int(errors),
        rps=requests / seconds,
        error_rate=errors / requests if served else 0.0,
        p50_ms=ms(p50),
        p95_ms=ms(p95),
        p99_ms=ms(p99),
        wait_p50_ms=ms(w50),
        wait_p99_ms=ms(w99),
        depth=int(depth),
        rejected=int(rejected),
    )


@dataclass(slots=True)
class Series:
    """One endpoint's buckets: the closed ones packed (starts, and :data:`FIELDS` per bucket), and
    the open one."""

    tenant: str
    starts: array[int] = field(default_factory=lambda: array("q"))
    values: array[float] = field(default_factory=lambda: array("f"))
    open: OpenBucket | None = None
    active: float = 0.0

    def at(self, now: float) -> OpenBucket:
        """The open bucket of ``now`` (closing the one before when ``now`` is past it)."""
        start = int(now // BUCKET_S) * BUCKET_S
        self.active = max(self.active, now)
        bucket = self.open
        if bucket is not None and bucket.start >= start:
            return bucket  # a late call (clocks of two callers) counts in the open bucket
        if bucket is not None:
            self.starts.append(bucket.start)
            self.values.extend(bucket.closed())
        self.trim(now)
        self.open = OpenBucket(start)
        return self.open

    def trim(self, now: float) -> None:
        """Drop the closed buckets older than :data:`HISTORY_S`."""
        cutoff = now - HISTORY_S
        old = 0
        while old < len(self.starts) and self.starts[old] + BUCKET_S <= cutoff:
            old += 1
        if old:
            del self.starts[:old]
            del self.values[: old * _STRIDE]

    def window(self, now: float, since: float) -> list[Bucket]:
        """The buckets that end after ``since``, oldest first, the open one last."""
        found = [
            _bucket(start, tuple(self.values[i * _STRIDE : (i + 1) * _STRIDE]), BUCKET_S)
            for i, start in enumerate(self.starts)
            if start + BUCKET_S > since
        ]
        bucket = self.open
        if bucket is not None and bucket.start + BUCKET_S > since:
            elapsed = min(float(BUCKET_S), max(1.0, now - bucket.start))
            found.append(_bucket(bucket.start, bucket.closed(), elapsed))
        return found


class TrafficBuckets:
    """Every endpoint's :class:`Series`, by endpoint key (``tenant/endpoint_id``); see the module
    docstring."""

    def __init__(self, max_series: int = MAX_SERIES, max_per_tenant: int = MAX_SERIES_PER_TENANT) -> None:
        self.series: dict[str, Series] = {}
        self.max_series = max_series
        self.max_per_tenant = max_per_tenant
        self.per_tenant: Counter[str] = Counter()

    def record(self, key: str, now: float, seconds: float, ok: bool, waited_s: float = 0.0) -> None:
        """A request finished at ``now`` after ``seconds`` (``waited_s`` of them in line)."""
        bucket = self._series(key, now).at(now)
        bucket.requests += 1
        bucket.errors += 0 if ok else 1
        bucket.latency[bin_of(seconds * 1000)] += 1
        bucket.waited += 1
        bucket.wait[bin_of(waited_s * 1000)] += 1

    def refused(self, key: str, now: float) -> None:
        """A request was answered 429 at ``now``."""
        self._series(key, now).at(now).rejected += 1

    def depth(self, key: str, now: float, depth: int) -> None:
        """The endpoint's line holds ``depth`` requests at ``now`` (nothing is kept for an empty line)."""
        if depth <= 0:
            return
        bucket = self._series(key, now).at(now)
        bucket.depth = max(bucket.depth, depth)

    def window(self, key: str, now: float, window_s: float) -> list[Bucket]:
        """The endpoint's buckets over the last ``window_s`` seconds (none if it had no traffic)."""
        series = self.series.get(key)
        return [] if series is None else series.window(now, now - window_s)

    def _series(self, key: str, now: float) -> Series:
        series = self.series.get(key)
        if series is not None:
            return series
        tenant = key.partition("/")[0]
        self._expire(now)
        if self.per_tenant[tenant] >= self.max_per_tenant:
            self._drop(min((k for k, s in self.series.items() if s.tenant == tenant), key=self._age))
        elif len(self.series) >= self.max_series:
            self._drop(min(self.series, key=self._age))
        series = self.series[key] = Series(tenant)
        self.per_tenant[tenant] += 1
        return series

    def _age(self, key: str) -> float:
        return self.series[key].active

    def _expire(self, now: float) -> None:
        """Forget the endpoints with nothing in the last hour."""
        for key in [k for k, s in self.series.items() if s.active <= now - HISTORY_S]:
            self._drop(key)

    def _drop(self, key: str) -> None:
        series = self.series.pop(key)
        self.per_tenant[series.tenant] -= 1
        if not self.per_tenant[series.tenant]:
            del self.per_tenant[series.tenant]
