"""The coordinator service (``resontech coordinator``): thin glue around the pure decisions.

It keeps the registry, liveness, schedule, endpoint and tenant projections live, and on every change
(and every ``tick_s``) it reads them, calls the pure decision functions and appends what they return:

1. marks workers whose heartbeats stopped ``lost`` and revokes their assignments, and marks lost
   workers that heartbeat again ``recovered`` (their old work stays fenced by epoch)
   (:mod:`projections.recovery`);
2. revokes assignments an agent rejected, and cordons workers the health controller condemns
   (:func:`projections.admission.health_verdicts`);
3. keeps gang jobs (``ddp``) whole (:func:`projections.gangs.settle`): revokes and stops what is
   left of a gang that lost a shard, and fails a gang on a failed rank only once it cannot be
   collateral damage of a lost peer;
4. retries or fails jobs with failed shards, and completes jobs whose every shard is done
   (:func:`projections.recovery.settle_failures`, :func:`projections.lifecycle.completed`);
5. admits, places and preempts for queued work (:mod:`ops.coordinator.job_queue`, deciding with
   :func:`core.placement.place` and :mod:`projections.lifecycle`), appending ``job.placed`` with the
   job's expected sequence, so that two coordinators never both place the same job;
6. sends every placed assignment's ``start_work`` command (:mod:`ops.coordinator.starts`),
   idempotently (the command id is derived from the assignment id);
7. keeps endpoints' replicas (:mod:`ops.coordinator.replicas`, :mod:`projections.replica_upkeep`).

Every append that depends on what the coordinator read carries the expected sequence of the
aggregate it decided about; a :class:`ConcurrencyConflict` means another coordinator (or the agent)
got there first, and the next step re-reads and re-decides.

A step costs what changed since the last one, not the size of the fleet. The runners' listeners
collect the keys of the jobs, endpoints and workers whose events were applied; a step decides about
those (the first step, about everything). Placement draws from a
:class:`ops.coordinator.live_capacity.LiveCapacity` built once after catch-up and kept equal to a rebuild
from the projections by the same changes and every heartbeat. Silent workers come off a heap of
heartbeat deadlines (:class:`ops.coordinator.beat_deadlines.BeatDeadlines`). Queued jobs that did not
change are tried again when capacity may have grown, and at least every
:data:`ops.coordinator.job_queue.RECHECK_S`.

Its parts are built from what they use and wired here: one :class:`ops.coordinator.appender.Appender`
(which counts conflicts) serves them all; each reads the projections through read-only views
(:mod:`ops.coordinator.views`); none holds the coordinator.

One module past 500 lines on purpose: each decision here is a few lines of glue around a pure function
(a checkpoint set completed, a gang settled, a job completed), and the step's order reads best in one
place; the parts with state of their own are modules of their own already.

It lives in ``ops/`` because it reads projections: ``core/`` holds the pure decisions it calls and
must not import them; the decisions that read projections (recovery, admission, lifecycle, gangs,
replica upkeep) are in ``projections/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from core.errors import AppendRejected, AppendTimeout, LogUnavailable
from core.log import EventLog
from core.placement.values import DEFAULT_WEIGHTS, RankWeights
from ops.coordinator.appender import Appender
from ops.coordinator.beat_deadlines import BeatDeadlines
from ops.coordinator.inputs import Presigner
from ops.coordinator.job_queue import JobQueue
from ops.coordinator.live_capacity import LiveCapacity
from ops.coordinator.replicas import Replicas
from ops.coordinator.silence import SilenceJudge
from ops.coordinator.starts import Starts
from ops.coordinator.views import jobs_in_order
from ops.process import service_connection
from projections import (
    ENDPOINTS,
    LIVENESS,
    REGISTRY,
    SCHEDULE,
    TENANTS,
    checkpoints,
    gangs,
    lifecycle,
    recovery,
)
from projections.admission import health_verdicts
from projections.endpoints import endpoint_key
from projections.registry import RegistryState
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, JobRecord, job_key
from schemas.envelope import Recorded
from schemas.jobs import JobFailed
from schemas.workers import WorkerCordoned

log = logging.getLogger("resontech.coordinator")

REBUILD_S = 60.0
"""How often every worker's candidate is read again (uptime and tiers change with the clock alone)."""
DEADLINE_SLACK_S = 0.005
"""Wake this long after a heartbeat deadline, so that it has passed by the clock ``step`` reads."""


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
        weights: RankWeights = DEFAULT_WEIGHTS,
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
        self.appender = Appender(event_log)
        self.queue, self.starts, self.replicas = self._parts()
        self._changed = asyncio.Event()
        self._failures: dict[str, list[int]] = {}
        self.capacity: LiveCapacity | None = None  # built at the first step
        self._beat_deadlines = BeatDeadlines()
        self._silence = SilenceJudge(event_log)
        self._gang_failing_since: dict[str, int] = {}  # gang job key -> when a rank's failure was seen
        self._dirty_jobs: set[str] = set()
        self._dirty_endpoints: set[str] = set()
        self._dirty_workers: set[str] = set()
        self._rebuilt_at = 0.0
        self.registry.listeners.append(self._on_worker)
        self.liveness.listeners.append(self._on_beat)
        self.schedule.listeners += [self._on_job, self._count_failure]
        self.endpoints.listeners.append(self._on_endpoint)
        self.tenants.listeners.append(self._on_tenant)

    def _parts(self) -> tuple[JobQueue, Starts, Replicas]:
        """The parts, each from what it uses (none holds the coordinator)."""
        queue = JobQueue(
            appender=self.appender,
            schedule=self.schedule,
            tenants=self.tenants,
            endpoints=self.endpoints,
            capacity=self.ensure_capacity,
            changed=self.job_changed,
            weights=self.weights,
        )
        starts = Starts(
            appender=self.appender, schedule=self.schedule, registry=self.registry, presigner=self.presigner
        )
        replicas = Replicas(
            appender=self.appender,
            registry=self.registry,
            liveness=self.liveness,
            schedule=self.schedule,
            endpoints=self.endpoints,
            capacity=self.ensure_capacity,
            presigner=self.presigner,
        )
        return queue, starts, replicas

    @property
    def runners(self) -> tuple[ProjectionRunner[Any], ...]:
        return (self.registry, self.liveness, self.schedule, self.endpoints, self.tenants)

    @property
    def placements(self) -> int:
        """``job.placed`` appends acknowledged."""
        return self.queue.placements

    @property
    def conflicts(self) -> int:
        """Appends refused because another writer got there first."""
        return self.appender.conflicts

    @property
    def decision_ms(self) -> deque[float]:
        """The latest placement decisions' durations, milliseconds."""
        return self.queue.decision_ms

    @property
    def start_commands(self) -> int:
        """Jobs' ``start_work`` commands this process sent."""
        return len(self.starts.commanded)

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
                try:
                    await self.step(time.time_ns())
                except Exception as exc:
                    # A stream without a leader for seconds (a node died) must not end the coordinator,
                    # nor may one bad value (a worker's, a tenant's: values are bounded where decoded,
                    # and live_capacity leaves out a worker it cannot read): the step's changes were
                    # taken off the lists, so everything is decided again.
                    if isinstance(exc, AppendTimeout | AppendRejected | LogUnavailable):
                        log.warning("%s: step interrupted (%s); deciding all again", self.name, exc.message)
                    else:
                        log.exception("%s: step failed; deciding all again", self.name)
                    self.capacity = None
                    await asyncio.sleep(self.tick_s)
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
        await self.complete_checkpoints(jobs)
        await self.complete_jobs(jobs)
        await self.queue.place(now_ns, jobs)
        await self.starts.send(jobs)
        await self.replicas.step(now_ns)

    # -- what changed --------------------------------------------------------------------------

    def _on_job(self, record: Recorded[Any]) -> None:
        self.job_changed(job_key(record.token(1), record.token(2)))

    def job_changed(self, key: str) -> None:
        """Decide about the job of ``key`` at the next step."""
        self._dirty_jobs.add(key)
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
        self._silence.beat(record.time_ns)
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
        settled = self.queue.sync(jobs, self.schedule.state)  # the others: our placement is on its way
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
        self.queue.build(self.schedule.state)
        for worker_id, beat in self.liveness.state.beats.items():
            self._beat_deadlines.beat(worker_id, beat)
            self._silence.beat(beat.time_ns)
        return set(self.registry.state.workers) | set(self.liveness.state.beats)

    def ensure_capacity(self, now_ns: int) -> LiveCapacity:
        """The live capacity, built (the first step's sync) if it was not yet."""
        if self.capacity is None:
            self._sync(now_ns)
        assert self.capacity is not None
        return self.capacity

    def jobs_in_order(self, keys: Collection[str] | None) -> list[tuple[str, JobRecord]]:
        """The jobs of ``keys`` (``None``: all) in submission order."""
        return jobs_in_order(self.schedule.state, keys)

    # -- failures ------------------------------------------------------------------------------

    async def detect_lost(self, now_ns: int, workers: Collection[str] | None = None) -> None:
        """Append ``worker.lost`` for every available worker whose heartbeats stopped, and revoke.

        Args:
            workers: the workers that changed or fell silent since the last step (``None``: all).
        """
        self.ensure_capacity(now_ns)
        self._beat_deadlines.expire(now_ns)
        overdue = self._beat_deadlines.overdue
        late = overdue if workers is None else overdue & (set(workers) | self._silence.postponed)
        if not late:
            return
        beats = self.liveness.state.beats
        longest_s = max(beats[w].interval_s for w in late)
        if not await self._silence.workers_to_blame(now_ns, set(late), longest_s):
            return  # the log's silence, not theirs (ops.coordinator.silence)
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
        self.ensure_capacity(now_ns)
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
        for _, job in self.jobs_in_order(keys):
            for event in recovery.revocations_on(job, worker_id, reason):
                await self.appender.append_job(job, event)

    async def revoke_rejected(self, jobs: Collection[str] | None = None) -> None:
        """Revoke assignments their agent rejected, so that they are placed elsewhere."""
        for _, job in self.jobs_in_order(jobs):
            for event in recovery.rejected_revocations(job):
                await self.appender.append_job(job, event)

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

    # -- jobs' ends: failures, gangs, completion -----------------------------------------------

    async def settle_failures(self, jobs: Collection[str] | None = None) -> None:
        """Fail or retry the jobs with failed shards (:func:`projections.recovery.settle_failures`)."""
        for _, job in self.jobs_in_order(jobs):
            for event in recovery.settle_failures(job, gang=gangs.is_gang(job)):
                await self.appender.append_job(job, event)

    async def settle_gangs(self, now_ns: int, jobs: Collection[str] | None = None) -> None:
        """Keep gang jobs whole: restart a gang that lost a shard or had a rank stopped by its agent;
        fail it on a failed rank once no lost peer can explain the failure (:func:`projections.gangs.settle`).

        Args:
            jobs: the jobs that changed; gangs waiting out a failed rank's grace are looked at too.
        """
        keys = None if jobs is None else set(jobs) | {k.rsplit("@", 1)[0] for k in self._gang_failing_since}
        for key, job in self.jobs_in_order(keys):
            if job.state in TERMINAL or not gangs.is_gang(job):
                continue
            failing = f"{key}@{job.epoch}"  # when a failure of this epoch was first seen
            if job.failed_slots:
                since = self._gang_failing_since.setdefault(failing, now_ns)
            else:
                since = self._gang_failing_since.pop(failing, now_ns)
            grace = gangs.grace_ns(job, self.liveness.state.beats, self.tick_s)
            workers = self.registry.state.workers
            outcome = gangs.settle(job, workers, failing_since_ns=since, now_ns=now_ns, grace_ns=grace)
            if isinstance(outcome, JobFailed):
                if await self.appender.append_job(job, outcome):
                    self._gang_failing_since.pop(failing, None)
            else:
                await self.appender.revoke(outcome)

    async def complete_checkpoints(self, jobs: Collection[str] | None = None) -> None:
        """Append ``job.checkpointed`` naming a sharded checkpoint's set once every node's part of
        one step is stored (:func:`projections.checkpoints.completed`)."""
        for _, job in self.jobs_in_order(jobs):
            if job.checkpoint_parts and (event := checkpoints.completed(job)) is not None:
                await self.appender.append_job(job, event)

    async def complete_jobs(self, jobs: Collection[str] | None = None) -> None:
        """Append ``job.completed`` for a live job all of whose shards completed
        (:func:`projections.lifecycle.completed`)."""
        for _, job in self.jobs_in_order(jobs):
            if (event := lifecycle.completed(job)) is not None:
                await self.appender.append_job(job, event)

    # -- appends -------------------------------------------------------------------------------

    async def _append_worker(self, worker_id: str, event: Any) -> bool:
        record = self.registry.state.workers.get(worker_id)
        return await self.appender.append_worker(
            worker_id, event, expected_seq=record.last_seq if record else 0
        )


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


__all__: Sequence[str] = ("Coordinator", "running", "serve")
