"""Which workers' heartbeats stopped, without scanning every worker: the coordinator's lost detector.

:class:`BeatDeadlines` keeps a heap of heartbeat deadlines (a beat's time plus ``intervals`` of its own
interval); :meth:`BeatDeadlines.expire` pops the deadlines that passed, so a step costs the workers that
fell silent, not the fleet. Its answer equals :func:`projections.liveness.overdue` at the same
instant.
"""

from __future__ import annotations

import heapq

from core.clock import LOST_AFTER_INTERVALS, beat_deadline_ns
from projections.liveness import LastBeat


class BeatDeadlines:
    """The workers silent for more than ``intervals`` of their own heartbeat interval.

    :attr:`overdue` holds the workers whose latest beat is more than ``intervals`` of its own
    interval old, exactly as :func:`projections.liveness.overdue` at the ``now_ns`` of the latest
    :meth:`expire`.
    """

    def __init__(self, intervals: float = LOST_AFTER_INTERVALS) -> None:
        self.intervals = intervals
        self.overdue: set[str] = set()
        self._latest: dict[str, LastBeat] = {}
        self._deadlines: list[tuple[int, str, int]] = []  # (deadline ns, worker, beat seq)

    def beat(self, worker_id: str, beat: LastBeat) -> bool:
        """Note the worker's latest beat; returns whether it was overdue or had never beaten."""
        silent = worker_id in self.overdue or worker_id not in self._latest
        self._latest[worker_id] = beat
        self.overdue.discard(worker_id)
        deadline = beat_deadline_ns(beat.time_ns, beat.interval_s, self.intervals)
        heapq.heappush(self._deadlines, (deadline, worker_id, beat.seq))
        return silent

    def next_deadline_ns(self) -> int | None:
        """When the earliest latest beat runs out (Unix ns), or ``None`` for none. Deadlines of beats
        a newer beat replaced are dropped on the way: they would only wake the caller for nothing."""
        heap = self._deadlines
        while heap and self._latest[heap[0][1]].seq != heap[0][2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expire(self, now_ns: int) -> list[str]:
        """Move the workers whose latest beat is too old at ``now_ns`` into :attr:`overdue`; return them."""
        late = []
        heap = self._deadlines
        while heap and heap[0][0] < now_ns:  # past its deadline: silent (core.clock.silent_at)
            _, worker_id, seq = heap[0]
            current = self._latest[worker_id].seq == seq
            heapq.heappop(heap)
            if current and worker_id not in self.overdue:
                self.overdue.add(worker_id)
                late.append(worker_id)
        return late
