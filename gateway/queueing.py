"""The line in front of an endpoint's replicas: bounded, fair across API keys, with a deadline.

One :class:`Line` per endpoint in each gateway process (:class:`gateway.inference.InferenceProxy`
holds them). It counts the requests each replica holds (``in_flight``, by address) and lets a
request through while a replica holds fewer than the endpoint's ``max_concurrency``; otherwise the
request waits in line:

* **Bounded.** At most ``max_queue`` requests wait; one more is refused at once (:class:`LineFull`,
  a 429 at the edge). A request that waited past its deadline leaves with a 429 too; the caller
  keeps the clock (:meth:`Line.leave` with a reason).
* **Fair across keys.** Each API key has its own first-in-first-out queue and the keys are served in
  turn, one request each, so a burst from one key waits behind itself, not in front of another's.
* **Dispatch.** :meth:`Line.dispatch` hands free replica slots to waiters, in that fair order, while
  any candidate replica holds less than the limit; the replica is the routing policy's choice
  (:mod:`gateway.routing`). It runs when a request arrives, when a slot is released and whenever a
  waiter looks again (the set of ready replicas changes with the ENDPOINTS projection).
* **Figures.** Depth now, time in line of the requests that left it for a replica (last
  :data:`WINDOW_S`), refusals by reason, and the recent service rate that ``Retry-After`` is
  estimated from (:meth:`Line.retry_after_s`).

No I/O and no clock: every method takes ``now`` (monotonic seconds) from its caller. Waiting itself
is an :class:`asyncio.Event` per waiter, set when a slot is granted.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.errors import ResontechError

WINDOW_S = 60.0
"""Time in line and service rate are figures of the last minute."""
RATE_WINDOW_S = 30.0
"""``Retry-After`` divides the depth by the completions per second of the last 30 s."""
UNKNOWN_RETRY_S = 5
"""``Retry-After`` when nothing finished lately (a cold start, say): a few seconds."""
MAX_RETRY_S = 600

Pick = Callable[[str | None, Sequence[str], dict[str, int], int], str | None]
"""A routing policy: ``(route key, candidate addresses, in-flight by address, limit)`` -> the
address to send to, or ``None`` when no candidate has room."""


class LineFull(ResontechError):
    """The endpoint's line holds ``max_queue`` requests already."""

    code = "queue_full"


@dataclass(eq=False, slots=True)
class Waiter:
    """One request in (or through) the line: ``address`` is set once a replica slot is granted."""

    key_id: str
    route_key: str | None
    joined: float
    address: str | None = None
    granted: asyncio.Event = field(default_factory=asyncio.Event)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]


@dataclass(slots=True)
class Line:
    """An endpoint's line and the slots its replicas hold (see the module docstring).

    Attributes:
        limit / max_queue: the endpoint's ``max_concurrency`` and ``max_queue``.
        pick: the routing policy.
        candidates: the replicas slots were last handed out on (kept for dispatch on release).
        in_flight: requests each replica holds now, by address.
        rejected: requests refused, by reason (``queue_full``, ``queue_timeout``).
        abandoned: waiters whose client left before a slot came.
    """

    limit: int
    max_queue: int
    pick: Pick
    candidates: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    queues: dict[str, deque[Waiter]] = field(default_factory=dict)
    turn: deque[str] = field(default_factory=deque)
    depth: int = 0
    waits: deque[tuple[float, float]] = field(default_factory=deque)
    finished: deque[float] = field(default_factory=deque)
    depths: deque[tuple[float, int]] = field(default_factory=deque)
    rejected: Counter[str] = field(default_factory=Counter)
    abandoned: int = 0

    def room(self, candidates: Sequence[str]) -> bool:
        """Whether some candidate replica holds fewer requests than the limit."""
        return any(self.in_flight.get(a, 0) < self.limit for a in candidates)

    def enter(self, key_id: str, route_key: str | None, now: float, candidates: Sequence[str]) -> Waiter:
        """A request arrives: granted at once when nobody waits and a replica has room, else queued.

        Raises:
            LineFull: ``max_queue`` requests wait already (counted as ``queue_full``).
        """
        self.dispatch(candidates, now)
        waiter = Waiter(key_id, route_key, now)
        if self.depth == 0 and self.room(candidates):
            self._grant(waiter, candidates, now)
            return waiter
        if self.depth >= self.max_queue:
            self.rejected["queue_full"] += 1
            raise LineFull(f"{self.depth} requests wait already (max_queue {self.max_queue})")
        queue = self.queues.get(key_id)
        if queue is None:
            queue = self.queues[key_id] = deque()
            self.turn.append(key_id)
        queue.append(waiter)
        self.depth += 1
        return waiter

    def dispatch(self, candidates: Sequence[str], now: float) -> int:
        """Grant free slots on ``candidates`` to waiters, keys in turn; returns how many."""
        self.candidates = list(candidates)
        granted = 0
        while self.depth and self.room(candidates):
            key_id = self.turn[0]
            queue = self.queues[key_id]
            waiter = queue.popleft()
            self.turn.rotate(-1)
            if not queue:
                self._forget(key_id)
            self.depth -= 1
            self._grant(waiter, candidates, now)
            granted += 1
        return granted

    def _forget(self, key_id: str) -> None:
        del self.queues[key_id]
        self.turn.remove(key_id)

    def _grant(self, waiter: Waiter, candidates: Sequence[str], now: float) -> None:
        address = self.pick(waiter.route_key, candidates, self.in_flight, self.limit)
        assert address is not None  # the caller checked room()
        self.in_flight[address] = self.in_flight.get(address, 0) + 1
        waiter.address = address
        waiter.granted.set()
        self.waits.append((now, now - waiter.joined))
        self._trim(now)

    def leave(self, waiter: Waiter, now: float, reason: str | None = None, abandoned: bool = True) -> None:
        """A waiter gives up (``reason``: ``queue_timeout`` counts as refused; without one, as its
        client gone when ``abandoned``, else not at all: its endpoint failed or went); one granted
        meanwhile gives its slot back."""
        if waiter.address is not None:
            self.release(waiter.address, now)
            return
        queue = self.queues.get(waiter.key_id)
        if queue is None or waiter not in queue:
            return  # left already
        queue.remove(waiter)
        self.depth -= 1
        if not queue:
            self._forget(waiter.key_id)
        if reason is not None:
            self.rejected[reason] += 1
        elif abandoned:
            self.abandoned += 1

    def release(self, address: str, now: float) -> None:
        """A request held by ``address`` finished (or failed): its slot goes to the next waiter."""
        self._drop(address)
        self.finished.append(now)
        self.dispatch(self.candidates, now)

    def moved(self, old: str, new: str) -> None:
        """A request failed over from ``old`` to ``new``: its slot moves with it (even beyond the
        limit: it was admitted already)."""
        if old != new:
            self._drop(old)
            self.in_flight[new] = self.in_flight.get(new, 0) + 1

    def _drop(self, address: str) -> None:
        """One request fewer held by ``address``."""
        held = self.in_flight.get(address, 0) - 1
        if held > 0:
            self.in_flight[address] = held
        else:
            self.in_flight.pop(address, None)

    def _trim(self, now: float) -> None:
        for samples in (self.waits, self.depths):
            while samples and samples[0][0] < now - WINDOW_S:
                samples.popleft()
        while self.finished and self.finished[0] < now - WINDOW_S:
            self.finished.popleft()

    def retry_after_s(self, now: float) -> int:
        """Seconds a refused client should wait: the line's depth (and itself) over the completions
        per second of the last :data:`RATE_WINDOW_S`; :data:`UNKNOWN_RETRY_S` when nothing finished
        lately; within ``[1, MAX_RETRY_S]``."""
        self._trim(now)
        done = sum(1 for t in self.finished if t >= now - RATE_WINDOW_S)
        if done == 0:
            return UNKNOWN_RETRY_S
        rate = done / RATE_WINDOW_S
        return max(1, min(MAX_RETRY_S, math.ceil((self.depth + 1) / rate)))

    def sample(self, now: float) -> None:
        """Remember the depth now (the autoscaler samples it every tick)."""
        self.depths.append((now, self.depth))
        self._trim(now)

    def mean_depth(self, now: float, window_s: float) -> float:
        """The mean of the depths sampled over the last ``window_s`` seconds (0 with none)."""
        recent = [d for t, d in self.depths if t >= now - window_s]
        return sum(recent) / len(recent) if recent else 0.0

    def wait_ms(self, now: float, q: float) -> float:
        """The ``q`` percentile of time in line, in ms, of the requests granted in the last minute."""
        self._trim(now)
        return percentile(sorted(w for _, w in self.waits), q) * 1000

    @property
    def held(self) -> int:
        """Requests the endpoint's replicas hold now."""
        return sum(self.in_flight.values())
