"""The coordinator service (``resontech coordinator``): thin glue around the pure decisions.

It keeps the registry, liveness, schedule and endpoint projections live, and on every change (and
every ``tick_s``) it:

1. marks workers whose heartbeats stopped ``lost`` and revokes their assignments, and marks lost
   workers that heartbeat again ``recovered`` (their old work stays fenced by epoch);
2. revokes assignments an agent rejected, and cordons workers the health controller condemns;
3. keeps gang jobs (``ddp``) whole (:mod:`projections.gangs`): revokes and stops what is left of a
   gang that lost a shard, and fails a gang on a failed rank only once it cannot be collateral
   damage of a lost peer;
4. places queued work with :func:`core.placement.place`, appending ``job.placed`` with the job's
   expected sequence, so that two coordinators never both place the same job;
5. sends every placed assignment's ``start_work`` command (a ``ddp`` shard's with its rendezvous and
   checkpoint URLs, :mod:`ops.coordinator.workspecs`), idempotently (the command id is derived from the
   assignment id).

Every append that depends on what the coordinator read carries the expected sequence of the
aggregate it decided about; a :class:`ConcurrencyConflict` means another coordinator (or the agent)
got there first, and the next step re-reads and re-decides.

A step costs what changed since the last one, not the size of the fleet. The runners' listeners
collect the keys of the jobs, endpoints and workers whose events were applied; a step decides about
those (the first step, about everything). Placement draws from a
:class:`ops.coordinator.live_capacity.LiveCapacity` built once after catch-up and kept equal to a rebuild from
the projections by the same changes and every heartbeat. Silent workers come off a heap of
heartbeat deadlines (:class:`ops.coordinator.beat_deadlines.BeatDeadlines`). Queued jobs that did not change
are tried again when capacity may have grown, and at least every ``RECHECK_S``.

It lives in ``ops/`` because it reads projections: ``core/`` holds the pure decisions it calls and
must not import them; the decisions that read projections (recovery, admission, gangs) are in
``projections/``. The bookkeeping that makes a step cheap lives beside it in its package
(:mod:`ops.coordinator.live_capacity`, :mod:`ops.coordinator.beat_deadlines`), and so do work specs,
inputs and replicas. The module still runs past 500 lines (~770): it is the one loop that orders
every decision of a step (lost workers, revocations, failures, admission, placement, commands) and
the appends that carry them out; the decisions of admission outcomes and replica upkeep still to
move out to pure functions (as recovery's did) are what would shorten it next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Collection, Iterator, Sequence
from typing import Any

import msgspec

from core import placement
from core.clock import LOST_AFTER_INTERVALS, seconds_ns
from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.log import EventLog
from core.pricing import list_price_micros
from core.streams import command_subject, job_filter, job_subject, worker_filter, worker_subject
from core.wire import Position
from ops.coordinator.beat_deadlines import BeatDeadlines
from ops.coordinator.inputs import InputError, Presigner
from ops.coordinator.live_capacity import LiveCapacity
from ops.coordinator.replicas import Replicas
from ops.coordinator.workspecs import WorkSpecError, ddp_spec, federated_spec
from ops.process import service_connection
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE, TENANTS, gangs, recovery
from projections.admission import Usage, Victim, health_verdicts, preemption_victims, request_for_job, triage
from projections.capacity import tier_of
from projections.endpoints import endpoint_key
from projections.registry import RegistryState
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, JobRecord, ScheduleState, job_key, missing_slots
from projections.tenants import quotas
from schemas import (
    Assignment,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobQueued,
    StartWork,
    StopWork,
    WorkerCordoned,
    WorkSpec,
)
from schemas.envelope import Recorded

log = logging.getLogger("resontech.coordinator")

APPEND_CHUNK = 512
"""Appends a step keeps in flight per chunk (at most two chunks): concurrent, memory bounded."""
CHUNK_S = 0.05
"""A chunk of appends goes out once producing it (deciding) took this long, even if smaller."""
REBUILD_S = 60.0
"""How often every worker's candidate is read again (uptime and tiers change with the clock alone)."""
DEADLINE_SLACK_S = 0.005
"""Wake this long after a heartbeat deadline, so that it has passed by the clock ``step`` reads."""
RECHECK_S = 1.0
"""How often queued jobs that nothing touched are tried again anyway (maintenance windows end)."""
DECISIONS_KEPT = 100_000
"""Decision times kept in :attr:`Coordinator.decision_ms` (the newest)."""


class Coordinator:
    """One coordinator instance. Several may run at once; the log's expected sequences arbitrate.

    Args:
        event_log: the log.
        name: instance name, recorded as ``by`` on the events it appends.
        tick_s: how often to re-decide without a new event (default 0.2 s); a silent worker is
            noticed at its heartbeat deadline, without waiting for the tick.
        weights: ranking weights for placement.

    Attributes:
        placements: ``job.placed`` appends acknowledged.
        conflicts: appends refused because another writer got there first.
        decision_ms: the latest placement decisions' durations, milliseconds.
    """

    def __init__(
        self,
        event_log: EventLog,
        *,
        name: str = "coordinator",
        tick_s: float = 0.2,
        weights: placement.RankWeights = placement.DEFAULT_WEIGHTS,
        presigner: Presigner | None = None,
    ) -> None:
        self.log = event_log
        self.presigner = presigner or Presigner(event_log.settings)
        self.name = name
        self.tick_s = tick_s
        self.weights = weights
        self.registry = ProjectionRunner(event_log, REGISTRY, write_snapshots=False)
        self.liveness = ProjectionRunner(event_log, LIVENESS, write_snapshots=False)
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.endpoints = ProjectionRunner(event_log, ENDPOINTS, write_snapshots=False)
        self.tenants = ProjectionRunner(event_log, TENANTS, write_snapshots=False)
        self.replicas = Replicas(self)
        self._changed = asyncio.Event()
        self._commanded: set[str] = set()
        self._failures: dict[str, list[int]] = {}
        self.placements = 0
        self.conflicts = 0
        self.decision_ms: deque[float] = deque(maxlen=DECISIONS_KEPT)
        self.capacity: LiveCapacity | None = None  # built at the first step
        self._beat_deadlines = BeatDeadlines()
        self._queued: set[str] = set()  # keys of the jobs the schedule shows queued
        self._awaiting: dict[str, int] = {}  # job key -> sequence of our placement not yet applied
        self._unsent: set[str] = set()  # jobs whose start command failed to go out
        self._gang_failing_since: dict[str, int] = {}  # gang job key -> when a rank's failure was seen
        self._dirty_jobs: set[str] = set()
        self._dirty_endpoints: set[str] = set()
        self._dirty_workers: set[str] = set()
        self._rebuilt_at = self._recheck_at = 0.0
        self.registry.listeners.append(self._on_worker)
        self.liveness.listeners.append(self._on_beat)
        self.schedule.listeners += [self._on_job, self._count_failure]
        self.endpoints.listeners.append(self._on_endpoint)
        self.tenants.listeners.append(self._on_tenant)

    @property
    def runners(self) -> tuple[ProjectionRunner[Any], ...]:
        return (self.registry, self.liveness, self.schedule, self.endpoints, self.tenants)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the projections and decide until ``stop`` is set."""
        tasks = [asyncio.create_task(runner.run(stop)) for runner in self.runners]
        try:
            await asyncio.gather(*(runner.caught_up.wait() for runner in self.runners))
            log.info("%s caught up; deciding", self.name)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=self._wait_s())
                self._changed.clear()
                await self.step(time.time_ns())
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    def _wait_s(self) -> float:
        """How long to wait for a change: ``tick_s``, or less when a heartbeat deadline comes first,
        so that a silent worker is noticed when its deadline passes, not up to a tick later."""
        deadline = self._beat_deadlines.next_deadline_ns()
        if deadline is None:
            return self.tick_s
        return min(self.tick_s, max(0.0, (deadline - time.time_ns()) / 1e9) + DEADLINE_SLACK_S)

    async def step(self, now_ns: int) -> None:
        """One round of decisions at ``now_ns``, about what changed since the previous round."""
        workers, jobs = self._sync(now_ns)
        await self.detect_lost(now_ns, workers)
        await self.recover(now_ns, workers)
        await self.revoke_rejected(jobs)
        await self.cordon_unhealthy(now_ns, workers)
        await self.settle_gangs(now_ns, jobs)
        await self.settle_failures(jobs)
        await self.complete_jobs(jobs)
        await self.place_queued(now_ns, jobs)
        await self.send_commands(jobs)
        await self.replicas.step(now_ns)

    # -- what changed --------------------------------------------------------------------------

    def _on_job(self, record: Recorded[Any]) -> None:
        self._dirty_jobs.add(job_key(record.token(1), record.token(2)))
        self._changed.set()

    def _on_endpoint(self, record: Recorded[Any]) -> None:
        self._dirty_endpoints.add(endpoint_key(record.token(1), record.token(2)))
        self._changed.set()

    def _on_tenant(self, _record: Recorded[Any]) -> None:
        if self.capacity is not None:
            self.capacity.freed = True  # a quota changed: try every queued job again
        self._changed.set()

    def _on_worker(self, record: Recorded[Any]) -> None:
        self._dirty_workers.add(record.token(1))
        self._changed.set()

    def _on_beat(self, record: Recorded[Any]) -> None:
        """Beats only wake the coordinator when they matter: a silent or lost worker is back, or
        the telemetry reports hardware errors. BeatDeadlines is noticed by the tick."""
        if self.capacity is None:
            return  # the first step reads every beat
        worker_id = record.token(1)
        beat = self.liveness.state.beats.get(worker_id)
        if beat is None or beat.seq != record.seq:
            return
        worker = self.registry.state.workers.get(worker_id)
        self.capacity.beat(worker_id, worker, beat, record.time_ns)
        was_silent = self._beat_deadlines.beat(worker_id, beat)
        errors = any(g.ecc_errors or g.xid_errors for g in beat.gpus)
        if was_silent or errors or (worker is not None and worker.lost):
            self._dirty_workers.add(worker_id)
            self._changed.set()

    def _sync(self, now_ns: int) -> tuple[set[str], set[str]]:
        """Bring the capacity up to date with the changes since the last step; return the workers
        and the jobs to decide about."""
        workers, jobs, endpoints = self._dirty_workers, self._dirty_jobs, self._dirty_endpoints
        self._dirty_workers, self._dirty_jobs, self._dirty_endpoints = set(), set(), set()
        schedule = self.schedule.state.jobs
        if self.capacity is None:
            return self._build(now_ns), set(schedule)
        if time.monotonic() - self._rebuilt_at >= REBUILD_S:
            self.capacity.rebuild(self.registry.state, self.liveness.state, now_ns)
            self._rebuilt_at = time.monotonic()
        for key in jobs:
            job = schedule.get(key)
            if job is not None and job.state == "queued":
                self._queued.add(key)
            else:
                self._queued.discard(key)
        settled = {key for key in jobs if key not in schedule or not self._awaits(key, schedule[key])}
        for key in settled:  # the others: our own placement is on its way, and held
            self._awaiting.pop(key, None)
        self.capacity.sync(
            self.registry.state,
            self.liveness.state,
            self.schedule.state,
            self.endpoints.state,
            workers=workers,
            jobs=settled,
            endpoint_keys=endpoints,
            now_ns=now_ns,
        )
        return workers | set(self._beat_deadlines.expire(now_ns)), jobs

    def _build(self, now_ns: int) -> set[str]:
        """The first step: capacity and silence from the whole state; returns every worker."""
        self.capacity = LiveCapacity.build(
            self.registry.state,
            self.liveness.state,
            self.schedule.state,
            self.endpoints.state,
            now_ns,
            self.weights,
        )
        self._rebuilt_at = time.monotonic()
        self._queued = {key for key, job in self.schedule.state.jobs.items() if job.state == "queued"}
        for worker_id, beat in self.liveness.state.beats.items():
            self._beat_deadlines.beat(worker_id, beat)
        return set(self.registry.state.workers) | set(self.liveness.state.beats)

    def _ensure_capacity(self, now_ns: int) -> LiveCapacity:
        if self.capacity is None:
            self._sync(now_ns)
        assert self.capacity is not None
        return self.capacity

    def _awaits(self, key: str, job: JobRecord) -> bool:
        """True while our acknowledged placement of the job is not yet in the schedule."""
        seq = self._awaiting.get(key)
        return seq is not None and job.last_seq < seq

    def _jobs(self, keys: Collection[str] | None) -> list[tuple[str, JobRecord]]:
        """The jobs of ``keys`` (``None``: all) in submission order."""
        jobs = self.schedule.state.jobs
        found = [(k, jobs[k]) for k in (jobs if keys is None else keys) if k in jobs]
        found.sort(key=lambda item: item[1].submitted_seq)
        return found

    # -- failures ------------------------------------------------------------------------------

    async def detect_lost(self, now_ns: int, workers: Collection[str] | None = None) -> None:
        """Append ``worker.lost`` for every available worker whose heartbeats stopped, and revoke.

        Args:
            workers: the workers that changed or fell silent since the last step (``None``: all).
        """
        self._ensure_capacity(now_ns)
        self._beat_deadlines.expire(now_ns)
        late = (
            self._beat_deadlines.overdue if workers is None else self._beat_deadlines.overdue & set(workers)
        )
        for worker_id in sorted(late):
            record = self.registry.state.workers.get(worker_id)
            event = recovery.lost(record, self.liveness.state.beats[worker_id], now_ns)
            if event is None or worker_id not in self._beat_deadlines.overdue:
                continue  # unknown, already lost or gone; or it beat again while this step awaited
            if await self._append_worker(worker_id, event):
                log.warning("worker %s lost after %.1fs of silence", worker_id, event.silent_s)
            await self.revoke_worker(worker_id, "worker lost")

    async def recover(self, now_ns: int, workers: Collection[str] | None = None) -> None:
        """Append ``worker.recovered`` for a lost worker that heartbeats again."""
        self._ensure_capacity(now_ns)
        self._beat_deadlines.expire(now_ns)
        registry = self.registry.state.workers
        for worker_id in sorted(registry if workers is None else workers):
            beat = self.liveness.state.beats.get(worker_id)
            silent = worker_id in self._beat_deadlines.overdue
            event = recovery.recovered(registry.get(worker_id), beat, silent=silent)
            if event is not None:
                await self._append_worker(worker_id, event)

    async def revoke_worker(self, worker_id: str, reason: str) -> None:
        """Revoke every current assignment on ``worker_id``."""
        keys: Collection[str] | None = None
        if self.capacity is not None:  # jobs holding the worker, and those changed since the last step
            keys = set(self.capacity.jobs_on.get(worker_id, ())) | self._dirty_jobs
        for _, job in self._jobs(keys):
            for event in recovery.revocations_on(job, worker_id, reason):
                await self._append_job(job, event)

    async def revoke_rejected(self, jobs: Collection[str] | None = None) -> None:
        """Revoke assignments their agent rejected, so that they are placed elsewhere."""
        for _, job in self._jobs(jobs):
            for event in recovery.rejected_revocations(job):
                await self._append_job(job, event)

    def _count_failure(self, record: Any) -> None:
        """Remember when a worker's assignment failed (not when the agent merely stopped): the health
        controller cordons a worker that fails K times in its window."""
        event = record.event
        if not isinstance(event, JobFailed) or event.slot is None or event.retryable:
            return
        job = self.schedule.state.jobs.get(job_key(record.token(1), record.token(2)))
        assignment = job.assignments.get(str(event.slot)) if job else None
        if assignment is not None and assignment.epoch == event.epoch:
            self._failures.setdefault(assignment.worker_id, []).append(record.time_ns)
            self._dirty_workers.add(assignment.worker_id)

    @property
    def unknown_heartbeats(self) -> int:
        """Workers heartbeating without a registration (ignored for placement, counted here)."""
        return len(self.liveness.state.beats.keys() - self.registry.state.workers.keys())

    async def cordon_unhealthy(self, now_ns: int, workers: Collection[str] | None = None) -> None:
        """Cordon workers the health controller condemns (repeated failures, hardware errors)."""
        registry = self.registry.state
        if workers is not None:
            registry = RegistryState(
                workers={w: registry.workers[w] for w in workers if w in registry.workers}
            )
        for worker_id, reason in health_verdicts(registry, self.liveness.state, self._failures, now_ns):
            record = self.registry.state.workers.get(worker_id)
            if record is not None and record.state == "available":
                await self._append_worker(worker_id, WorkerCordoned(reason=reason, by=self.name))

    # -- placement -----------------------------------------------------------------------------

    async def place_queued(self, now_ns: int, jobs: Collection[str] | None = None) -> None:
        """Place queued jobs that fit, in priority then submission order, under quota.

        Args:
            jobs: the jobs that changed since the last step; the others are tried too when
                capacity was freed or ``RECHECK_S`` passed (``None``: every queued job).

        Decisions are made one after another against the live capacity, each placement held in it
        at once; their appends go out ``APPEND_CHUNK`` at a time while the next decisions are made.
        Each carries its job's expected sequence, so a conflict loses only that job's decision (and
        its hold), which the next step makes again.
        """
        capacity = self._ensure_capacity(now_ns)
        tried: Collection[str] | None = None
        if jobs is not None and not self._recheck_due(capacity):
            tried = self._queued.intersection(jobs)
            if not tried:
                return
        order = await self._admitted(capacity.usage)
        await _pipelined(self._decisions(order, tried, now_ns))

    def _recheck_due(self, capacity: LiveCapacity) -> bool:
        now = time.monotonic()
        if not capacity.freed and now < self._recheck_at:
            return False
        capacity.freed = False
        self._recheck_at = now + RECHECK_S
        return True

    def _decisions(
        self, order: list[JobRecord], tried: Collection[str] | None, now_ns: int
    ) -> Iterator[Awaitable[Any]]:
        """Decide each job of ``order`` (only those of ``tried`` unless ``None``), lazily, yielding
        the appends to make."""
        capacity = self.capacity
        assert capacity is not None
        for queued in order:
            key = job_key(queued.tenant, queued.job_id)
            job = self.schedule.state.jobs.get(key)  # it may have changed while appends were awaited
            if (tried is not None and key not in tried) or job is None or self._awaits(key, job):
                continue
            if job.state != "queued" or not missing_slots(job) or gangs.partial(job):
                continue  # a gang is placed whole, once settle_gangs has freed every shard
            started = time.perf_counter()
            request = request_for_job(job)
            decision = capacity.index.place(request, now_ns=now_ns)
            self.decision_ms.append((time.perf_counter() - started) * 1000)
            if isinstance(decision, placement.Placed):
                capacity.take(key, job, decision.assignments)
                yield self._place(key, job, decision)
            else:
                yield self._unplaced(job, request, decision, now_ns)

    async def _place(self, key: str, job: JobRecord, decision: placement.Placed) -> bool:
        event = JobPlaced(assignments=decision.assignments, provenance=decision.provenance)
        position = await self._append_job(job, event)
        if position is None:  # another writer got there first: the next step drops our hold
            self._dirty_jobs.add(key)
            self._changed.set()
            return False
        self.placements += 1
        self._awaiting[key] = position.seq
        return True

    async def _admitted(self, usage: Usage) -> list[JobRecord]:
        """Queued jobs under their tenant's quota, in order; a job over quota gets its reason. Jobs
        whose placement we appended but the schedule does not show yet are left out."""
        state = self.schedule.state.jobs
        queued = {
            key: state[key] for key in self._queued if key in state and not self._awaits(key, state[key])
        }
        admitted, waiting = triage(ScheduleState(jobs=queued), quotas(self.tenants.state), usage)
        for job, wait in waiting:
            if wait.permanent and job.state not in TERMINAL:
                await self._append_job(job, JobFailed(reason=f"rejected: {wait.reason}", retryable=False))
            elif wait.reason != job.queue_reason:
                await self._append_job(job, JobQueued(reason=wait.reason))
        return admitted

    async def _unplaced(
        self,
        job: JobRecord,
        request: placement.PlacementRequest,
        decision: placement.Unplaceable,
        now_ns: int,
    ) -> bool:
        """A job that did not fit: reject it if it never can, else preempt for it, else say why."""
        if decision.permanent and not job.assignments:
            reason = f"rejected: {decision.reason}"
            return await self._append_job(job, JobFailed(reason=reason, retryable=False)) is not None
        capacity = self.capacity
        assert capacity is not None
        victims: list[Victim] = []
        if capacity.may_preempt(request):
            victims = preemption_victims(
                request,
                capacity.index.candidates(),
                self.schedule.state,
                self.endpoints.state,
                now_ns=now_ns,
                weights=self.weights,
            )
        for victim in victims:
            await self._preempt(victim, by=f"{job.tenant}/{job.job_id}")
        if victims:
            return False
        if decision.reason != job.queue_reason:
            return await self._append_job(job, JobQueued(reason=decision.reason)) is not None
        return False

    async def _preempt(self, victim: Victim, *, by: str) -> None:
        """Checkpoint-and-requeue one assignment: revoke it, then tell its agent to checkpoint and stop."""
        if victim.kind != "job":
            return  # endpoint replicas are scaled down by the autoscaler, never preempted here
        job = self.schedule.state.jobs.get(victim.key)
        if job is None:
            return
        assignment = victim.assignment
        revoked = await self._append_job(job, recovery.revoked(assignment, f"preempted by {by}"))
        if revoked is not None:
            stop = StopWork(
                work_id=job.job_id,
                assignment_id=assignment.assignment_id,
                epoch=assignment.epoch,
                reason=f"preempted by {by}",
                checkpoint=True,
            )
            await self.log.append(
                command_subject(assignment.worker_id), stop, event_id=f"preempt-{assignment.assignment_id}"
            )

    async def settle_failures(self, jobs: Collection[str] | None = None) -> None:
        """Fail or retry the jobs with failed shards (:func:`projections.recovery.settle_failures`)."""
        for _, job in self._jobs(jobs):
            for event in recovery.settle_failures(job, gang=gangs.is_gang(job)):
                await self._append_job(job, event)

    # -- gangs ---------------------------------------------------------------------------------

    async def settle_gangs(self, now_ns: int, jobs: Collection[str] | None = None) -> None:
        """Keep gang jobs whole: restart a gang that lost a shard or had a rank stopped by its agent;
        fail it on a failed rank once no lost peer can explain the failure (:mod:`projections.gangs`).

        Args:
            jobs: the jobs that changed; gangs waiting out a failed rank's grace are looked at too.
        """
        keys = None if jobs is None else set(jobs) | {k.rsplit("@", 1)[0] for k in self._gang_failing_since}
        for key, job in self._jobs(keys):
            if job.state in TERMINAL or not gangs.is_gang(job):
                continue
            if gangs.partial(job):
                await self._restart_gang(job, f"gang restart: {job.queue_reason or 'a shard was lost'}")
                continue
            failing = f"{key}@{job.epoch}"
            if not job.failed_slots:
                self._gang_failing_since.pop(failing, None)
                continue
            since = self._gang_failing_since.setdefault(failing, now_ns)
            grace = self._gang_grace_ns(job)
            verdict = gangs.verdict(job, failing_since_ns=since, now_ns=now_ns, grace_ns=grace)
            if verdict == "restart":
                await self._restart_gang(job, f"gang restart: {job.failure_reason}")
            elif verdict == "fail":
                slot = min(job.failed_slots, key=int)
                reason = f"shard {slot} failed: {job.failure_reason}"
                if await self._append_job(job, JobFailed(reason=reason, log_tail=job.log_tail)):
                    self._gang_failing_since.pop(failing, None)

    def _gang_grace_ns(self, job: JobRecord) -> int:
        """How long a failed rank waits for a peer to be declared lost: one heartbeat interval more
        than the slowest peer's loss deadline, plus two decision ticks."""
        beats = self.liveness.state.beats
        interval = max(
            (beats[a.worker_id].interval_s for a in job.assignments.values() if a.worker_id in beats),
            default=1.0,
        )
        return seconds_ns((LOST_AFTER_INTERVALS + 1) * interval + 2 * self.tick_s)

    async def _restart_gang(self, job: JobRecord, reason: str) -> None:
        """Revoke every assignment a gang still holds, in one run of chained appends, and stop the
        workloads of those whose worker is alive."""
        seq = job.last_seq
        for assignment in sorted(job.assignments.values(), key=lambda a: a.slot):
            event = recovery.revoked(assignment, reason)
            try:
                position = await self.log.append(
                    job_subject(job.tenant, job.job_id, event),
                    event,
                    expected_seq=seq,
                    expected_filter=job_filter(job.tenant, job.job_id),
                )
            except ConcurrencyConflict:
                self.conflicts += 1
                return
            seq = position.seq
            record = self.registry.state.workers.get(assignment.worker_id)
            if str(assignment.slot) in job.done or record is None or record.state in ("lost", "deregistered"):
                continue
            stop = StopWork(
                work_id=job.job_id,
                assignment_id=assignment.assignment_id,
                epoch=assignment.epoch,
                reason=reason,
            )
            try:
                await self.log.append(
                    command_subject(assignment.worker_id),
                    stop,
                    event_id=f"gang-stop-{assignment.assignment_id}",
                )
            except (AppendTimeout, AppendRejected) as exc:  # its peers are gone: it fails on its own
                log.warning("stop for %s not sent: %s", assignment.assignment_id, exc)

    async def complete_jobs(self, jobs: Collection[str] | None = None) -> None:
        """Append ``job.completed`` for a live job all of whose shards completed."""
        for _, job in self._jobs(jobs):
            if job.state not in TERMINAL and len(job.done) == job.shards:
                await self._append_job(job, JobCompleted())

    async def send_commands(self, jobs: Collection[str] | None = None) -> None:
        """Send ``start_work`` for every current assignment not yet started (idempotent by id), of
        the jobs that changed and those whose command failed to go out."""
        keys = None if jobs is None else set(jobs) | self._unsent
        self._unsent = set()
        await _pipelined(self._starts(keys))

    def _starts(self, keys: Collection[str] | None) -> Iterator[Awaitable[None]]:
        for key, job in self._jobs(keys):
            if job.state in TERMINAL:
                continue
            for slot, assignment in job.assignments.items():
                if slot not in job.started and assignment.assignment_id not in self._commanded:
                    yield self._send_start(key, job, assignment)

    async def _send_start(self, key: str, job: JobRecord, assignment: Assignment) -> None:
        record = self.registry.state.workers.get(assignment.worker_id)
        tier = tier_of(record, time.time_ns()) if record else "unverified"
        downloads: dict[str, str] = {}
        if job.inputs and job.kind != "federated":  # a federated shard gets its own shard only
            try:
                downloads = await self.presigner.downloads_async(job.tenant, job.inputs)
            except InputError as exc:
                reason = f"input missing at start: {exc}"
                await self._append_job(job, JobFailed(reason=reason, retryable=False))
                return
            except Exception as exc:  # the object store is unreachable: try again next step
                log.warning("inputs of %s not presigned yet: %s", assignment.assignment_id, exc)
                self._unsent.add(key)
                return
        command = start_command(job, assignment, tier, downloads)
        if job.kind == "ddp":
            try:
                spec = ddp_spec(job, assignment, command.spec, self.presigner, self.registry.state.workers)
            except WorkSpecError as exc:
                await self._append_job(job, JobFailed(reason=f"cannot start: {exc.message}", retryable=False))
                return
            command = msgspec.structs.replace(command, spec=spec)
        elif job.kind == "federated":
            federated = federated_spec(job, assignment, command.spec, self.presigner)
            if federated is None:  # sent once the job's federation is ready (a new event of the job)
                return
            command = msgspec.structs.replace(command, spec=federated)
        try:
            await self.log.append(
                command_subject(assignment.worker_id), command, event_id=f"start-{assignment.assignment_id}"
            )
        except (AppendTimeout, AppendRejected) as exc:
            log.warning("start command for %s not sent yet: %s", assignment.assignment_id, exc)
            self._unsent.add(key)
            return
        self._commanded.add(assignment.assignment_id)

    # -- appends -------------------------------------------------------------------------------

    async def _append_job(self, job: JobRecord, event: Any) -> Position | None:
        """Append about ``job``, expecting its last sequence; ``None`` on a conflict."""
        try:
            return await self.log.append(
                job_subject(job.tenant, job.job_id, event),
                event,
                expected_seq=job.last_seq,
                expected_filter=job_filter(job.tenant, job.job_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return None

    async def _append_worker(self, worker_id: str, event: Any) -> bool:
        record = self.registry.state.workers.get(worker_id)
        try:
            await self.log.append(
                worker_subject(worker_id, event),
                event,
                expected_seq=record.last_seq if record else 0,
                expected_filter=worker_filter(worker_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return False
        return True


async def _pipelined(appends: Iterator[Awaitable[Any]]) -> list[Any]:
    """Await ``appends`` concurrently, a chunk at a time, starting the next chunk before awaiting
    the previous one: at most two chunks in flight. The iterator is advanced lazily, so the work
    that produces the appends (decisions) overlaps with the acknowledgements of earlier ones."""
    results: list[Any] = []
    inflight: deque[asyncio.Future[list[Any]]] = deque()
    async for batch in _chunks(appends):
        inflight.append(asyncio.gather(*batch))
        if len(inflight) > 1:
            results += await inflight.popleft()
    while inflight:
        results += await inflight.popleft()
    return results


async def _chunks(items: Iterator[Awaitable[Any]]) -> AsyncIterator[list[Awaitable[Any]]]:
    """``items`` in chunks of ``APPEND_CHUNK``, or fewer when producing them took ``CHUNK_S``: the
    event loop must get back to the acknowledgements before their time-out."""
    batch: list[Awaitable[Any]] = []
    started = time.monotonic()
    for item in items:
        batch.append(item)
        if len(batch) >= APPEND_CHUNK or time.monotonic() - started >= CHUNK_S:
            yield batch
            batch = []
            await asyncio.sleep(0)  # let acknowledgements and projection updates in
            started = time.monotonic()
    if batch:
        yield batch


def start_command(
    job: JobRecord, assignment: Any, tier: str = "unverified", downloads: dict[str, str] | None = None
) -> StartWork:
    """The ``start_work`` command for one assignment of ``job``; resumes from its last checkpoint.
    ``downloads`` are the job's inputs, presigned (:mod:`ops.coordinator.inputs`)."""
    resources = job.resources
    return StartWork(
        tenant=job.tenant,
        work_id=job.job_id,
        work_kind="job",
        assignment_id=assignment.assignment_id,
        slot=assignment.slot,
        epoch=assignment.epoch,
        spec=WorkSpec(
            runtime=RUNTIME_OF_KIND.get(job.kind, job.kind),
            command=list(job.command),
            env=dict(job.env),
            downloads=dict(downloads or {}),
            gpus=resources.gpus,
            vram_mb=resources.vram_mb,
            cpus=resources.cpus,
            memory_mb=resources.memory_mb,
            pool=job.pool,
            tier=tier,
            shards=job.shards,
            resume_from=job.last_checkpoint.object_key if job.last_checkpoint else None,
        ),
        price_micros_per_gpu_hour=list_price_micros(resources.gpu_type, job.pool),
    )


RUNTIME_OF_KIND = {"process": "process", "federated": "nvflare-client", "ddp": "torchrun"}
"""The agent runtime that runs each job kind."""


async def serve(settings: Any, *, name: str = "coordinator", stop: asyncio.Event | None = None) -> None:
    """Run one coordinator until SIGINT/SIGTERM (or ``stop``)."""
    async with service_connection(settings, name, stop) as (event_log, stopping):
        await Coordinator(event_log, name=name).run(stopping)


@contextlib.asynccontextmanager
async def running(
    settings: Any, *, name: str = "coordinator", tick_s: float = 0.1
) -> AsyncIterator[Coordinator]:
    """A coordinator on a connection of its own, deciding until the block ends (tests, benchmarks)."""
    own = await EventLog.connect(settings, name=name)
    instance = Coordinator(own, name=name, tick_s=tick_s)
    stop = asyncio.Event()
    task = asyncio.create_task(instance.run(stop))
    try:
        yield instance
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await own.close()


__all__: Sequence[str] = ("Coordinator", "running", "serve", "start_command")
