"""Time, one way: the units the kernel counts in, how a stored message's time becomes nanoseconds,
and when a worker's heartbeat runs out.

Every store time in the log is a Unix time in integer nanoseconds. NATS gives a message's time as a
``datetime`` (microseconds are all nats-py keeps); :func:`ns_of` turns it into nanoseconds exactly,
without the float rounding of ``timestamp() * 1e9`` (which is off by a few hundred nanoseconds for
most times of this century, so that one message's time differed by the path that read it).

A worker is lost when its latest heartbeat is older than :data:`LOST_AFTER_INTERVALS` of its own
heartbeat interval (an interval the kernel believes: at most :data:`MAX_BEAT_INTERVAL_S`, see
:func:`believed_interval_s`): :func:`beat_deadline_ns` is the instant after which it is, for
placement (a silent worker is no candidate), for the liveness projection, for the coordinator's lost
detector and for the API's ``online``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from schemas.workers import MAX_BEAT_INTERVAL_S as _MAX_BEAT_INTERVAL_S

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
LOST_AFTER_INTERVALS = 3.0
"""A worker silent for this many of its heartbeat intervals is not a candidate (and is lost)."""
MAX_BEAT_INTERVAL_S = _MAX_BEAT_INTERVAL_S
"""The longest heartbeat interval the kernel believes, seconds (the agent's own setting's bound, and
the most a beat may state: :class:`schemas.workers.Heartbeat`): a worker is lost after at most
``LOST_AFTER_INTERVALS`` of it, whatever interval its beats claim."""
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


def believed_interval_s(interval_s: float) -> float:
    """The heartbeat interval the kernel counts silence in: the agent's, within ``(0,
    MAX_BEAT_INTERVAL_S]``. Beats are bounded where they are decoded (:class:`schemas.workers.Heartbeat`);
    this keeps a value that got past that (an old snapshot, a test's struct) from overflowing a
    deadline or keeping a dead worker alive: above the cap (infinity included) it is the cap, and
    zero, a negative or NaN is zero (the worker is silent at once: no interval is no promise)."""
    if interval_s > MAX_BEAT_INTERVAL_S:
        return MAX_BEAT_INTERVAL_S
    return interval_s if interval_s > 0.0 else 0.0


def lost_after_s(interval_s: float, intervals: float = LOST_AFTER_INTERVALS) -> float:
    """Seconds of silence after which a worker beating at ``interval_s`` is lost."""
    return intervals * believed_interval_s(interval_s)


def beat_deadline_ns(beat_ns: int, interval_s: float, intervals: float = LOST_AFTER_INTERVALS) -> int:
    """The last instant (Unix ns) a worker whose latest beat was at ``beat_ns`` is still alive: after
    it, the worker is silent (lost)."""
    return beat_ns + seconds_ns(lost_after_s(interval_s, intervals))


def silent_at(now_ns: int, beat_ns: int, interval_s: float, intervals: float = LOST_AFTER_INTERVALS) -> bool:
    """Whether a worker whose latest beat was at ``beat_ns`` is silent at ``now_ns``."""
    return now_ns > beat_deadline_ns(beat_ns, interval_s, intervals)
