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
5. sends every placed assignment's ``start_work`` command (:mod:`ops.workspecs`), idempotently (the
   command id is derived from the assignment id).

Every append that depends on what the coordinator read carries the expected sequence of the
aggregate it decided about; a :class:`ConcurrencyConflict` means another coordinator (or the agent)
got there first, and the next step re-reads and re-decides.

It lives in ``ops/`` because it reads projections: ``core/`` holds the pure decisions it calls and
must not import them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from core import placement
from core.candidates import CandidateIndex
from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.log import EventLog
from core.streams import command_subject, job_filter, job_subject, worker_filter, worker_subject
from ops.workspecs import StartCommands, WorkSpecError
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE, TENANTS, gangs
from projections.admission import health_verdicts, preemption_victims, quota_usage, request_for_job, triage
from projections.capacity import candidates, tier_of
from projections.liveness import overdue
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, JobRecord, job_key, missing_slots
from projections.tenants import quotas
from schemas import (
    Assignment,
    JobAssignmentRevoked,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobQueued,
    StopWork,
    WorkerCordoned,
    WorkerLost,
    WorkerRecovered,
)

log = logging.getLogger("resontech.coordinator")

LOST_AFTER_INTERVALS = 3
"""A worker silent for this many of its heartbeat intervals is lost."""


class Coordinator:
    """One coordinator instance. Several may run at once; the log's expected sequences arbitrate.

    Args:
        event_log: the log.
        name: instance name, recorded as ``by`` on the events it appends.
        tick_s: how often to re-decide without a new event (default 0.2 s), which bounds how late a
            silent worker is noticed.
        weights: ranking weights for placement.
    """

    def __init__(
        self,
        event_log: EventLog,
        *,
        name: str = "coordinator",
        tick_s: float = 0.2,
        weights: placement.RankWeights = placement.DEFAULT_WEIGHTS,
    ) -> None:
        self.log = event_log
        self.name = name
        self.tick_s = tick_s
        self.weights = weights
        self.registry = ProjectionRunner(event_log, REGISTRY, write_snapshots=False)
        self.liveness = ProjectionRunner(event_log, LIVENESS, write_snapshots=False)
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.endpoints = ProjectionRunner(event_log, ENDPOINTS, write_snapshots=False)
        self.tenants = ProjectionRunner(event_log, TENANTS, write_snapshots=False)
        self._changed = asyncio.Event()
        self._commanded: set[str] = set()
        self._failures: dict[str, list[int]] = {}
        self._starts = StartCommands.from_settings(event_log.settings)
        self._gang_failing_since: dict[str, int] = {}
        self.placements = 0
        self.conflicts = 0
        self.decision_ms: list[float] = []

    @property
    def runners(self) -> tuple[ProjectionRunner[Any], ...]:
        return (self.registry, self.liveness, self.schedule, self.endpoints, self.tenants)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the projections and decide until ``stop`` is set."""
        for runner in self.runners:
            runner.listeners.append(lambda _record: self._changed.set())
        self.schedule.listeners.append(self._count_failure)
        tasks = [asyncio.create_task(runner.run(stop)) for runner in self.runners]
        try:
            await asyncio.gather(*(runner.caught_up.wait() for runner in self.runners))
            log.info("%s caught up; deciding", self.name)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=self.tick_s)
                self._changed.clear()
                await self.step(time.time_ns())
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    async def step(self, now_ns: int) -> None:
        """One round of decisions at ``now_ns``."""
        await self.detect_lost(now_ns)
        await self.recover(now_ns)
        await self.revoke_rejected()
        await self.cordon_unhealthy(now_ns)
        await self.settle_gangs(now_ns)
        await self.settle_failures()
        await self.complete_jobs()
        await self.place_queued(now_ns)
        await self.send_commands()

    # -- failures ------------------------------------------------------------------------------

    async def detect_lost(self, now_ns: int) -> None:
        """Append ``worker.lost`` for every available worker whose heartbeats stopped, and revoke."""
        workers = self.registry.state.workers
        for worker_id in overdue(self.liveness.state, now_ns, LOST_AFTER_INTERVALS):
            record = workers.get(worker_id)
            if record is None or record.state in ("lost", "deregistered"):
                continue
            beat = self.liveness.state.beats[worker_id]
            silent = (now_ns - beat.time_ns) / 1e9
            if await self._append_worker(worker_id, WorkerLost(silent_s=silent, last_heartbeat_seq=beat.seq)):
                log.warning("worker %s lost after %.1fs of silence", worker_id, silent)
            await self.revoke_worker(worker_id, "worker lost")

    async def recover(self, now_ns: int) -> None:
        """Append ``worker.recovered`` for a lost worker that heartbeats again."""
        late = set(overdue(self.liveness.state, now_ns, LOST_AFTER_INTERVALS))
        for worker_id, record in self.registry.state.workers.items():
            beat = self.liveness.state.beats.get(worker_id)
            if (
                record.state != "lost"
                or beat is None
                or worker_id in late
                or beat.time_ns <= (record.lost_since_ns or 0)
            ):
                continue
            down = (beat.time_ns - (record.lost_since_ns or beat.time_ns)) / 1e9
            await self._append_worker(worker_id, WorkerRecovered(down_s=down))

    async def revoke_worker(self, worker_id: str, reason: str) -> None:
        """Revoke every current assignment on ``worker_id``."""
        for job in list(self.schedule.state.jobs.values()):
            if job.state in TERMINAL:
                continue
            for key, assignment in list(job.assignments.items()):
                if assignment.worker_id == worker_id and key not in job.done:
                    await self._revoke(job, assignment, reason)

    async def revoke_rejected(self) -> None:
        """Revoke assignments their agent rejected, so that they are placed elsewhere."""
        for job in list(self.schedule.state.jobs.values()):
            for assignment in list(job.assignments.values()):
                reason = job.rejected_by.get(assignment.worker_id)
                if reason is not None:
                    await self._revoke(job, assignment, f"rejected by the worker: {reason}")

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

    @property
    def unknown_heartbeats(self) -> int:
        """Workers heartbeating without a registration (ignored for placement, counted here)."""
        return len(self.liveness.state.beats.keys() - self.registry.state.workers.keys())

    async def cordon_unhealthy(self, now_ns: int) -> None:
        """Cordon workers the health controller condemns (repeated failures, hardware errors)."""
        for worker_id, reason in health_verdicts(
            self.registry.state, self.liveness.state, self._failures, now_ns
        ):
            record = self.registry.state.workers.get(worker_id)
            if record is not None and record.state == "available":
                await self._append_worker(worker_id, WorkerCordoned(reason=reason, by=self.name))

    async def _revoke(self, job: JobRecord, assignment: Assignment, reason: str) -> None:
        event = JobAssignmentRevoked(
            assignment_id=assignment.assignment_id,
            worker_id=assignment.worker_id,
            slot=assignment.slot,
            epoch=assignment.epoch,
            reason=reason,
        )
        await self._append_job(job, event)

    # -- placement -----------------------------------------------------------------------------

    async def place_queued(self, now_ns: int) -> None:
        """Place every queued job that fits, in priority then submission order, under quota.

        Decisions are made one after another against one candidate index (each placement is taken
        out of it), then their appends go out together: each carries its job's expected sequence,
        so a conflict loses only that job's decision, which the next step makes again.
        """
        schedule = self.schedule.state
        usage = quota_usage(schedule, self.endpoints.state)
        index = CandidateIndex(
            candidates(self.registry.state, self.liveness.state, schedule, self.endpoints.state, now_ns),
            self.weights,
        )
        appends = []
        for job in await self._admitted(usage):
            if not missing_slots(job) or gangs.partial(job):
                continue  # a gang is placed whole, once settle_gangs has freed every shard
            started = time.perf_counter()
            request = request_for_job(job)
            decision = index.place(request, now_ns=now_ns)
            self.decision_ms.append((time.perf_counter() - started) * 1000)
            if isinstance(decision, placement.Placed):
                for assignment in decision.assignments:
                    index.take(assignment, request)
                appends.append(
                    self._append_job(
                        job, JobPlaced(assignments=decision.assignments, provenance=decision.provenance)
                    )
                )
            else:
                appends.append(self._unplaced(job, request, decision, index, now_ns))
        for placed in await asyncio.gather(*appends):
            self.placements += int(placed)

    async def settle_failures(self) -> None:
        """A shard that failed fails its job (tenant code crashed); one stopped by its agent
        (``retryable``) is revoked and placed again."""
        for job in list(self.schedule.state.jobs.values()):
            if job.state in TERMINAL or not job.failed_slots or gangs.is_gang(job):
                continue
            fatal = sorted(slot for slot, retryable in job.failed_slots.items() if not retryable)
            if fatal:
                reason = f"shard {fatal[0]} failed: {job.failure_reason}"
                await self._append_job(job, JobFailed(reason=reason, log_tail=job.log_tail, retryable=False))
                continue
            for slot in job.failed_slots:
                assignment = job.assignments.get(slot)
                if assignment is not None:
                    await self._revoke(job, assignment, f"retry: {job.failure_reason}")

    # -- gangs ---------------------------------------------------------------------------------

    async def settle_gangs(self, now_ns: int) -> None:
        """Keep gang jobs whole: restart a gang that lost a shard or had a rank stopped by its agent;
        fail it on a failed rank once no lost peer can explain the failure (:mod:`projections.gangs`)."""
        for key, job in list(self.schedule.state.jobs.items()):
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
            verdict = gangs.verdict(
                job, failing_since_ns=since, now_ns=now_ns, grace_ns=self._gang_grace_ns(job)
            )
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
        return int(((LOST_AFTER_INTERVALS + 1) * interval + 2 * self.tick_s) * 1e9)

    async def _restart_gang(self, job: JobRecord, reason: str) -> None:
        """Revoke every assignment a gang still holds, in one run of chained appends, and stop the
        workloads of those whose worker is alive."""
        seq = job.last_seq
        for assignment in sorted(job.assignments.values(), key=lambda a: a.slot):
            event = JobAssignmentRevoked(
                assignment_id=assignment.assignment_id,
                worker_id=assignment.worker_id,
                slot=assignment.slot,
                epoch=assignment.epoch,
                reason=reason,
            )
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

    async def complete_jobs(self) -> None:
        """Append ``job.completed`` for a live job all of whose shards completed."""
        for job in list(self.schedule.state.jobs.values()):
            if job.state not in TERMINAL and len(job.done) == job.shards:
                await self._append_job(job, JobCompleted())

    async def send_commands(self) -> None:
        """Send ``start_work`` for every current assignment not yet started (idempotent by id)."""
        for job in self.schedule.state.jobs.values():
            if job.state in ("completed", "failed", "cancelled"):
                continue
            for key, assignment in job.assignments.items():
                if key in job.started or assignment.assignment_id in self._commanded:
                    continue
                record = self.registry.state.workers.get(assignment.worker_id)
                tier = tier_of(record, time.time_ns()) if record else "unverified"
                try:
                    command = await self._starts.command(
                        job, assignment, tier=tier, workers=self.registry.state.workers
                    )
                except WorkSpecError as exc:
                    await self._append_job(job, JobFailed(reason=f"cannot start: {exc.message}"))
                    break
                except Exception as exc:  # the object store did not answer a listing: next step
                    log.warning("start command for %s not built yet: %s", assignment.assignment_id, exc)
                    continue
                try:
                    await self.log.append(
                        command_subject(assignment.worker_id),
                        command,
                        event_id=f"start-{assignment.assignment_id}",
                    )
                except (AppendTimeout, AppendRejected) as exc:
                    log.warning("start command for %s not sent yet: %s", assignment.assignment_id, exc)
                    continue
                self._commanded.add(assignment.assignment_id)

    async def _admitted(self, usage: Any) -> list[JobRecord]:
        """Queued jobs under their tenant's quota, in order; a job over quota gets its reason."""
        admitted, waiting = triage(self.schedule.state, quotas(self.tenants.state), usage)
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
        index: CandidateIndex,
        now_ns: int,
    ) -> bool:
        """A job that did not fit: reject it if it never can, else preempt for it, else say why."""
        if decision.permanent and not job.assignments:
            return await self._append_job(
                job, JobFailed(reason=f"rejected: {decision.reason}", retryable=False)
            )
        victims = preemption_victims(
            request,
            index.candidates(),
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
            return await self._append_job(job, JobQueued(reason=decision.reason))
        return False

    async def _preempt(self, victim: Any, *, by: str) -> None:
        """Checkpoint-and-requeue one assignment: revoke it, then tell its agent to checkpoint and stop."""
        if victim.kind != "job":
            return  # endpoint replicas are preempted by the inference issue's autoscaler
        job = self.schedule.state.jobs.get(victim.key)
        if job is None:
            return
        assignment = victim.assignment
        revoked = await self._append_job(
            job,
            JobAssignmentRevoked(
                assignment_id=assignment.assignment_id,
                worker_id=assignment.worker_id,
                slot=assignment.slot,
                epoch=assignment.epoch,
                reason=f"preempted by {by}",
            ),
        )
        if revoked:
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

    # -- appends -------------------------------------------------------------------------------

    async def _append_job(self, job: JobRecord, event: Any) -> bool:
        try:
            await self.log.append(
                job_subject(job.tenant, job.job_id, event),
                event,
                expected_seq=job.last_seq,
                expected_filter=job_filter(job.tenant, job.job_id),
            )
        except ConcurrencyConflict:
            self.conflicts += 1
            return False
        return True

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


async def serve(settings: Any, *, name: str = "coordinator", stop: asyncio.Event | None = None) -> None:
    """Run one coordinator until SIGINT/SIGTERM (or ``stop``)."""
    import signal

    event_log = await EventLog.connect(settings, name=name)
    await event_log.ensure_streams()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    coordinator = Coordinator(event_log, name=name)
    try:
        await coordinator.run(stop)
    finally:
        await event_log.close()


__all__: Sequence[str] = ("Coordinator", "serve")
