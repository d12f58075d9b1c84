"""Time, one way: the units the kernel counts in, how a stored message's time becomes nanoseconds,
and when a worker's heartbeat runs out.

Every store time in the log is a Unix time in integer nanoseconds. NATS gives a message's time as a
``datetime`` (microseconds are all nats-py keeps); :func:`ns_of` turns it into nanoseconds exactly,
without the float rounding of ``timestamp() * 1e9`` (which is off by a few hundred nanoseconds for
most times of this century, so that one message's time differed by the path that read it).

A worker is lost when its latest heartbeat is older than :data:`LOST_AFTER_INTERVALS` of its own
heartbeat interval: :func:`beat_deadline_ns` is the instant after which it is, for placement (a
silent worker is no candidate), for the liveness projection, for the coordinator's lost detector
and for the API's ``online``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
LOST_AFTER_INTERVALS = 3.0
"""A worker silent for this many of its heartbeat intervals is not a candidate (and is lost)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def ns_of(when: datetime | None) -> int:
    """``when`` in Unix nanoseconds, exactly (0 for ``None``); a naive ``datetime`` is taken as UTC."""
    if when is None:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MICROSECOND * 1000


def now_ms() -> int:
    """The time now in Unix milliseconds (the unit of usage ticks)."""
    return time.time_ns() // NS_PER_MS


def seconds_ns(seconds: float) -> int:
    """``seconds`` in nanoseconds, rounded to the nearest."""
    return round(seconds * NS_PER_S)


def beat_deadline_ns(beat_ns: int, interval_s: float, intervals: float = LOST_AFTER_INTERVALS) -> int:
    """The last instant (Unix ns) a worker whose latest beat was at ``beat_ns`` is still alive: after
    it, the worker is silent (lost)."""
    return beat_ns + seconds_ns(intervals * interval_s)


def silent_at(now_ns: int, beat_ns: int, interval_s: float, intervals: float = LOST_AFTER_INTERVALS) -> bool:
    """Whether a worker whose latest beat was at ``beat_ns`` is silent at ``now_ns``."""
    return now_ns > beat_deadline_ns(beat_ns, interval_s, intervals)
