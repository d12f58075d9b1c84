"""A job's metric as a sparkline, for ``resontech watch``: pure (no I/O, no clock).

:class:`Curve` collects one metric (``loss`` by default, or a key of the events' ``metrics``) from a
job's feed events into at most two lines:

* **shards**: ``job.progress`` of a shard (it has a ``slot``). Each point (``round``,
  ``train_epoch``, ``step``; a missing part counts as -1) holds the latest value each shard reported
  there, and the line draws the mean over the shards that did. A shard that restarts after a
  recovery replaces its earlier values at the same points.
* **job**: job-wide values: ``job.round_completed`` (a federated round's aggregated metrics) and
  ``job.progress`` without a ``slot`` (the kernel's copy of a round's metrics, or a workload that
  reports for the whole job).

Points are drawn in their order, not in arrival order. When a line has more points than the
columns it has, :func:`downsample` draws each column as the mean of a bucket of consecutive points.
NaN and infinities (a diverged run) are drawn as gaps and left out of min and max; an event without
the metric adds no point.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence

BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_BLOCKS = "_.-:=+*#"
"""For an output that cannot encode :data:`BLOCKS` (a Latin-1 terminal)."""
GAP = "·"
ASCII_GAP = "?"
TOP_LEVEL = ("loss", "gpu_util_pct")
"""Metrics that ``job.progress`` carries as fields of its own, not in ``metrics``."""
MIN_SPARK = 10
"""A line drops its details, then min and max, rather than draw its sparkline in fewer columns
than its points, this, or a third of the width (the least of them)."""

Point = tuple[int, int, int]
"""Where a value lies in training: ``(round, train_epoch, step)``, -1 for a part not reported."""


def downsample(values: Sequence[float], width: int) -> list[float]:
    """At most ``width`` values: ``values`` as they are when they fit, else one per bucket of
    consecutive values (the buckets' sizes differ by one at most), the mean of its finite values
    (NaN when it has none)."""
    count = len(values)
    if width <= 0:
        return []
    if count <= width:
        return list(values)
    columns = []
    for i in range(width):
        bucket = [v for v in values[i * count // width : (i + 1) * count // width] if math.isfinite(v)]
        columns.append(math.fsum(bucket) / len(bucket) if bucket else math.nan)
    return columns


def spark(values: Sequence[float], blocks: str = BLOCKS, gap: str = GAP) -> str:
    """One character per value, from the lowest block (the smallest finite value) to the highest
    (the largest); ``gap`` for NaN or an infinity; the middle block for every value of a flat line."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return gap * len(values)
    low, high = min(finite), max(finite)
    top = len(blocks) - 1
    span = high / 2 - low / 2  # halves: the span of two huge values of opposite signs is finite

    def glyph(value: float) -> str:
        if not math.isfinite(value):
            return gap
        if span == 0:
            return blocks[top // 2]
        return blocks[min(top, max(0, round((value / 2 - low / 2) / span * top)))]

    return "".join(glyph(v) for v in values)


def number(value: float) -> str:
    """A value in 4 significant digits (``nan``, ``inf`` as such)."""
    return f"{value:.4g}"


def metric_value(event: Mapping[str, object], metric: str) -> float | None:
    """The metric's value in a progress or round event, or ``None`` when it has none (a value that
    is not a number counts as none; JSON has no NaN: msgspec writes a NaN as ``null``)."""
    value = event.get(metric) if metric in TOP_LEVEL else None
    metrics = event.get("metrics")
    if value is None and isinstance(metrics, Mapping):
        value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def reported_metrics(event: Mapping[str, object]) -> set[str]:
    """The names of the metrics an event has a value of."""
    names = {name for name in TOP_LEVEL if metric_value(event, name) is not None}
    metrics = event.get("metrics")
    if isinstance(metrics, Mapping):
        names.update(str(name) for name in metrics if metric_value(event, str(name)) is not None)
    return names


def point_of(event: Mapping[str, object]) -> Point | None:
    """The event's :data:`Point`, or ``None`` when it has no round, no epoch and no step."""
    parts = [event.get(name) for name in ("round", "train_epoch", "step")]
    if all(part is None for part in parts):
        return None
    first, second, third = (part if isinstance(part, int) else -1 for part in parts)
    return first, second, third


class Series:
    """One line: the metric at each point, per reporter (a shard's slot, or ``None`` for the job)."""

    def __init__(self) -> None:
        self.points: dict[Point, dict[int | None, float]] = {}
        self.order: list[Point] = []
        self.reporters: set[int | None] = set()

    def put(self, point: Point, reporter: int | None, value: float) -> None:
        """``reporter``'s value at ``point`` (replacing the one it reported there before)."""
        at = self.points.get(point)
        if at is None:
            at = self.points[point] = {}
            bisect.insort(self.order, point)
        at[reporter] = value
        self.reporters.add(reporter)

    def values(self) -> list[float]:
        """Each point's mean over its reporters, in point order (NaN or an infinity propagates)."""
        return [_mean(self.points[p].values()) for p in self.order]


class Curve:
    """One metric of one job, taken from its feed events (:meth:`take`), drawn by :meth:`lines`."""

    def __init__(self, metric: str = "loss") -> None:
        self.metric = metric
        self.shards = Series()
        self.job = Series()
        self.rounds = False
        """Whether :attr:`job` holds federated rounds' aggregates."""
        self.reported: set[str] = set()
        """Every metric the job's events had a value of."""
        self.taken = 0
        """Values taken so far."""
        self.events = 0
        """Progress and round events taken so far (with or without the metric)."""
        self._unplaced: dict[int | None, int] = {}

    def take(self, kind: str, event: Mapping[str, object]) -> bool:
        """Add what a feed event (its kind and its fields) says of the metric; whether it added a
        value. Events other than ``job.progress`` and ``job.round_completed`` say nothing."""
        slot = event.get("slot")
        reporter = slot if isinstance(slot, int) and not isinstance(slot, bool) else None
        if kind == "job.progress":
            series = self.job if reporter is None else self.shards
        elif kind == "job.round_completed":
            series, reporter, self.rounds = self.job, None, True
        else:
            return False
        self.events += 1
        self.reported |= reported_metrics(event)
        value = metric_value(event, self.metric)
        if value is None:
            return False
        series.put(self._point(event, reporter), reporter, value)
        self.taken += 1
        return True

    def _point(self, event: Mapping[str, object], reporter: int | None) -> Point:
        point = point_of(event)
        if point is None:  # no position: the reporter's n-th such value
            self._unplaced[reporter] = count = self._unplaced.get(reporter, 0) + 1
            point = (-1, -1, count)
        return point

    def size(self) -> int:
        """The points of both lines."""
        return len(self.shards.order) + len(self.job.order)

    def absence(self) -> str | None:
        """Why there is nothing to draw (``None`` when there is): no progress reported, or the metric
        is not among those the job reports (which are named)."""
        if self.taken:
            return None
        if not self.reported:
            return f"{self.metric}: no progress reported so far"
        return f"{self.metric}: not reported; this job reports {', '.join(sorted(self.reported))}"

    def lines(self, width: int, *, ascii_only: bool = False) -> list[str]:
        """A line per series with values, each at most ``width - 1`` characters (a terminal wraps a
        full line); else :meth:`absence`'s line."""
        glyphs = (ASCII_BLOCKS, ASCII_GAP) if ascii_only else (BLOCKS, GAP)
        drawn = [
            self._line(series, note, width, glyphs)
            for series, note in ((self.shards, self._shards_note()), (self.job, self._job_note()))
            if series.points
        ]
        return drawn or [(self.absence() or "")[: max(1, width - 1)]]

    def _shards_note(self) -> str:
        slots = sorted(s for s in self.shards.reporters if s is not None)
        return f"shard {slots[0]}" if len(slots) == 1 else f"mean of {len(slots)} shards"

    def _job_note(self) -> str:
        return "aggregate per round" if self.rounds else "job-wide"

    def _line(self, series: Series, note: str, width: int, glyphs: tuple[str, str]) -> str:
        values = series.values()
        finite = [v for v in values if math.isfinite(v)]
        last = number(values[-1])
        stats = f"{last}  min {number(min(finite))} max {number(max(finite))}" if finite else last
        points = f"{len(values)} point" + ("s" if len(values) > 1 else "")
        tails = (f"  {stats}  ({note}, {points})", f"  {stats}  ({note})", f"  {stats}", f"  {last}")
        wanted = min(len(values), max(MIN_SPARK, (width - 1) // 3))
        label = self.metric
        for tail in tails:  # the first that leaves the sparkline room enough
            room = width - 1 - len(label) - 1 - len(tail)
            if room >= wanted:
                break
        drawn = spark(downsample(values, max(1, room)), *glyphs)
        return f"{label} {drawn}{tail}"[: max(1, width - 1)]


def _mean(values: Iterable[float]) -> float:
    taken = list(values)
    return sum(taken) / len(taken)
