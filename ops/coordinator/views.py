"""What the coordinator's parts read: read-only views of the projections, and the clock.

The parts (:mod:`ops.coordinator.job_queue`, :mod:`ops.coordinator.starts`,
:mod:`ops.coordinator.replicas`) are built from these, not from the
:class:`~ops.coordinator.Coordinator`: a :class:`View` shows a projection's current state and nothing
else (a :class:`projections.runner.ProjectionRunner` is one; so is a test's folded state), and a
:class:`Clock` gives the times a part's rules depend on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol, TypeVar

from projections.schedule import JobRecord, ScheduleState

S_co = TypeVar("S_co", covariant=True)


class View(Protocol[S_co]):
    """A projection's live state, read-only: the same object shows each change once it is applied."""

    @property
    def state(self) -> S_co: ...


@dataclass(frozen=True)
class Clock:
    """The times the parts' rules read.

    Attributes:
        wall_ns: wall-clock time, nanoseconds since the epoch (a worker's tier depends on its uptime).
        monotonic: seconds of a monotonic clock (when to try or send again).
    """

    wall_ns: Callable[[], int] = time.time_ns
    monotonic: Callable[[], float] = time.monotonic


SYSTEM_CLOCK = Clock()
"""The clock the parts use unless given another (tests give a fake one)."""


def jobs_in_order(schedule: ScheduleState, keys: Collection[str] | None) -> list[tuple[str, JobRecord]]:
    """The jobs of ``keys`` (``None``: all) that ``schedule`` holds, in submission order."""
    jobs = schedule.jobs
    found = [(k, jobs[k]) for k in (jobs if keys is None else keys) if k in jobs]
    found.sort(key=lambda item: item[1].submitted_seq)
    return found
