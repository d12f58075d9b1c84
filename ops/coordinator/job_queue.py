"""The queued jobs: admission, placement and preemption, the coordinator's placing half.

Kept apart from :mod:`ops.coordinator.service` (which calls :meth:`JobQueue.place` once per step).
It remembers which jobs the schedule shows queued and which placements this process appended that
the schedule does not show yet (those jobs are held, not decided again), and each step:

1. admits the queued jobs under their tenants' quotas, in priority then submission order, and
   appends what the others call for (:func:`projections.lifecycle.admission`);
2. places each admitted job with the live capacity's placement index, holding each placement in the
   capacity at once, and appends ``job.placed`` (:func:`projections.lifecycle.placed`);
3. for a job that did not fit, appends its rejection or queue reason, or preempts for it
   (:func:`projections.admission.preemption_victims`, :func:`projections.lifecycle.unplaced`).

Appends go out ``APPEND_CHUNK`` at a time while the next decisions are made
(:mod:`ops.coordinator.pipeline`). Each carries its job's expected sequence, so a conflict loses only
that job's decision (and its hold), which the next step makes again.

It is built from what it uses: the appender, read-only views of the schedule, tenants and endpoints,
the live capacity (by a function that builds it when it is not yet), a callback that marks a job to
decide again, the ranking weights and the clock. It counts its own placements and decision times.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Any

from core.placement.values import DEFAULT_WEIGHTS, Placed, PlacementRequest, RankWeights, Unplaceable
from ops.coordinator.appender import Appender
from ops.coordinator.live_capacity import LiveCapacity
from ops.coordinator.pipeline import pipelined
from ops.coordinator.views import SYSTEM_CLOCK, Clock, View
from projections import gangs, lifecycle
from projections.admission import Usage, Victim, preemption_victims, request_for_job
from projections.endpoints import EndpointsState
from projections.schedule import JobRecord, ScheduleState, job_key, missing_slots
from projections.tenants import TenantsState, quotas

RECHECK_S = 1.0
"""How often queued jobs that nothing touched are tried again anyway (maintenance windows end)."""
DECISIONS_KEPT = 100_000
"""Decision times kept in :attr:`JobQueue.decision_ms` (the newest)."""


class JobQueue:
    """The queued jobs of a :class:`~ops.coordinator.Coordinator` (see the module docstring).

    Args:
        appender: where its appends go.
        schedule: the jobs, read-only.
        tenants: the tenants (their quotas), read-only.
        endpoints: the endpoints (whose replicas preemption may take), read-only.
        capacity: the live capacity at a time (nanoseconds), built if it was not yet.
        changed: marks a job, by key, to be decided again at the next step.
        weights: ranking weights for preemption victims.
        clock: when queued jobs are tried again (:data:`RECHECK_S`).

    Attributes:
        queued: keys of the jobs the schedule shows queued.
        placements: ``job.placed`` appends acknowledged.
        decision_ms: the latest placement decisions' durations, milliseconds.
    """

    def __init__(
        self,
        *,
        appender: Appender,
        schedule: View[ScheduleState],
        tenants: View[TenantsState],
        endpoints: View[EndpointsState],
        capacity: Callable[[int], LiveCapacity],
        changed: Callable[[str], None],
        weights: RankWeights = DEFAULT_WEIGHTS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.appender = appender
        self.schedule, self.tenants, self.endpoints = schedule, tenants, endpoints
        self.capacity, self.changed = capacity, changed
        self.weights, self.clock = weights, clock
        self.placements = 0
        self.decision_ms: deque[float] = deque(maxlen=DECISIONS_KEPT)
        self.queued: set[str] = set()
        self._awaiting: dict[str, int] = {}  # job key -> sequence of our placement not yet applied
        self._recheck_at = 0.0

    def build(self, schedule: ScheduleState) -> None:
        """Start from the whole schedule (the first step)."""
        self.queued = {key for key, job in schedule.jobs.items() if job.state == "queued"}

    def sync(self, keys: Collection[str], schedule: ScheduleState) -> set[str]:
        """Take in the changes to the jobs of ``keys``; return those the capacity may take from the
        schedule: all but the jobs whose placement by this process is not applied yet (held)."""
        for key in keys:
            job = schedule.jobs.get(key)
            if job is not None and job.state == "queued":
                self.queued.add(key)
            else:
                self.queued.discard(key)
        jobs = schedule.jobs
        settled = {key for key in keys if key not in jobs or not self.awaits(key, jobs[key])}
        for key in settled:
            self._awaiting.pop(key, None)
        return settled

    def awaits(self, key: str, job: JobRecord) -> bool:
        """True while our acknowledged placement of the job is not yet in the schedule."""
        seq = self._awaiting.get(key)
        return seq is not None and job.last_seq < seq

    async def place(self, now_ns: int, jobs: Collection[str] | None = None) -> None:
        """Place queued jobs that fit, in priority then submission order, under quota.

        Args:
            jobs: the jobs that changed since the last step; the others are tried too when
                capacity was freed or ``RECHECK_S`` passed (``None``: every queued job).

        Decisions are made one after another against the live capacity, each placement held in it
        at once; their appends go out while the next decisions are made.
        """
        capacity = self.capacity(now_ns)
        tried: Collection[str] | None = None
        if jobs is not None and not self._recheck_due(capacity):
            tried = self.queued.intersection(jobs)
            if not tried:
                return
        order = await self._admitted(capacity.usage)
        await pipelined(self._decisions(capacity, order, tried, now_ns))

    def _recheck_due(self, capacity: LiveCapacity) -> bool:
        now = self.clock.monotonic()
        if not capacity.freed and now < self._recheck_at:
            return False
        capacity.freed = False
        self._recheck_at = now + RECHECK_S
        return True

    async def _admitted(self, usage: Usage) -> list[JobRecord]:
        """Queued jobs under their tenant's quota, in order, after appending what those that wait
        call for. Jobs whose placement we appended but the schedule does not show yet are left out."""
        state = self.schedule.state.jobs
        queued = {key: state[key] for key in self.queued if key in state and not self.awaits(key, state[key])}
        admission = lifecycle.admission(ScheduleState(jobs=queued), quotas(self.tenants.state), usage)
        for job, event in admission.waits:
            await self.appender.append_job(job, event)
        return admission.order

    def _decisions(
        self, capacity: LiveCapacity, order: list[JobRecord], tried: Collection[str] | None, now_ns: int
    ) -> Iterator[Awaitable[Any]]:
        """Decide each job of ``order`` (only those of ``tried`` unless ``None``), lazily, yielding
        the appends to make."""
        for queued in order:
            key = job_key(queued.tenant, queued.job_id)
            job = self.schedule.state.jobs.get(key)  # it may have changed while appends were awaited
            if (tried is not None and key not in tried) or job is None or self.awaits(key, job):
                continue
            if job.state != "queued" or not missing_slots(job) or gangs.partial(job):
                continue  # a gang is placed whole, once settle_gangs has freed every shard
            started = time.perf_counter()
            request = request_for_job(job)
            decision = capacity.index.place(request, now_ns=now_ns)
            self.decision_ms.append((time.perf_counter() - started) * 1000)
            if isinstance(decision, Placed):
                capacity.take(key, job, decision.assignments)
                yield self._place(key, job, decision)
            else:
                yield self._unplaced(capacity, job, request, decision, now_ns)

    async def _place(self, key: str, job: JobRecord, decision: Placed) -> None:
        position = await self.appender.append_job(job, lifecycle.placed(decision))
        if position is None:  # another writer got there first: the next step drops our hold
            self.changed(key)
            return
        self.placements += 1
        self._awaiting[key] = position.seq

    async def _unplaced(
        self,
        capacity: LiveCapacity,
        job: JobRecord,
        request: PlacementRequest,
        decision: Unplaceable,
        now_ns: int,
    ) -> None:
        """A job that did not fit: reject it if it never can, else preempt for it, else say why."""
        victims: list[Victim] = []
        if not lifecycle.rejects(job, decision) and capacity.may_preempt(request):
            victims = preemption_victims(
                request,
                capacity.index.candidates(),
                self.schedule.state,
                self.endpoints.state,
                now_ns=now_ns,
                weights=self.weights,
            )
        outcome = lifecycle.unplaced(job, decision, victims, self.schedule.state)
        await self.appender.revoke(outcome.preempt)
        if outcome.event is not None:
            await self.appender.append_job(job, outcome.event)
