"""The capacity the coordinator places against, kept current change by change instead of rebuilt.

:class:`LiveCapacity` holds the :class:`core.placement.candidate_index.CandidateIndex` and the quota
usage that placement reads. Its contract: after :meth:`LiveCapacity.sync` with the keys of what changed, and
:meth:`LiveCapacity.beat` for every heartbeat, the index holds exactly the candidates that
:func:`projections.candidates.candidates` builds from the same projections, and the usage is
:func:`projections.admission.quota_usage`'s, except for two things:

* the coordinator's own placements are held from the moment it decides them (:meth:`take`), before
  the schedule shows them, so that the next decision already sees them;
* the terms that change with the clock alone, not with an event (30-day uptime, tier), are as of
  the last time the worker was read; the coordinator reads every worker again every ``REBUILD_S``
  (:meth:`rebuild`), which also drops the index's emptied shelves.

A unit test drives random event sequences through it and compares with a rebuild after each event.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from core.placement.candidate_index import CandidateIndex, occupy
from core.placement.rules import silent
from core.placement.values import DEFAULT_WEIGHTS, Candidate, PlacementRequest, RankWeights
from projections.admission import Usage
from projections.candidates import candidate_of
from projections.endpoints import EndpointRecord, EndpointsState, replica_assignment
from projections.liveness import LastBeat, LivenessState
from projections.registry import RegistryState, WorkerRecord
from projections.schedule import TERMINAL, JobRecord, ScheduleState
from schemas.values import Assignment, GpuTelemetry

log = logging.getLogger("resontech.coordinator")


class _Hold(NamedTuple):
    """One active assignment as capacity and quota count it."""

    assignment: Assignment
    cpus: float
    memory_mb: int
    tenant: str
    pool: str
    priority: int = 0


_IDLE = (0, 0.0, 0, 0)
Telemetry = tuple[list[GpuTelemetry], float]  # what a candidate reads off a beat besides its time


class LiveCapacity:
    """The candidate index and the quota usage placement reads, kept current change by change.

    Holds are the active assignments that load workers and count against quotas, per job and per
    endpoint: those of the projections, plus the coordinator's own placements from the moment it
    decides them until the projection shows them or their append failed (see the module docstring).

    Attributes:
        index: the candidates, with their load.
        usage: GPUs held, by tenant and pool.
        jobs_on: worker id -> keys of the jobs holding it (with how many assignments).
        priorities: (tenant, pool) -> priorities of the jobs holding workers (with how many
            assignments): whether a request may preempt anything at all.
        freed: set when capacity may have grown (a release, a worker that may take more); the
            caller clears it.
    """

    def __init__(self, weights: RankWeights = DEFAULT_WEIGHTS) -> None:
        self.weights = weights
        self.index = CandidateIndex((), weights)
        self.usage: Usage = {}
        self.jobs_on: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.priorities: defaultdict[tuple[str, str], Counter[int]] = defaultdict(Counter)
        self.freed = True
        self._use: dict[str, list[float]] = {}  # worker -> [gpus, cpus, memory_mb, assignments]
        self._holds: dict[tuple[str, str], dict[str, _Hold]] = {}  # (kind, key) -> assignment id -> hold
        self._telemetry: dict[str, Telemetry | None] = {}  # worker -> what its candidate was read from

    @classmethod
    def build(
        cls,
        registry: RegistryState,
        liveness: LivenessState,
        schedule: ScheduleState,
        endpoints: EndpointsState,
        now_ns: int,
        weights: RankWeights = DEFAULT_WEIGHTS,
    ) -> LiveCapacity:
        """Capacity from the whole state."""
        capacity = cls(weights)
        capacity.sync(
            registry, liveness, schedule, endpoints, jobs=schedule.jobs, endpoint_keys=endpoints.endpoints
        )
        capacity.rebuild(registry, liveness, now_ns)
        return capacity

    def sync(
        self,
        registry: RegistryState,
        liveness: LivenessState,
        schedule: ScheduleState,
        endpoints: EndpointsState,
        *,
        workers: Iterable[str] = (),
        jobs: Iterable[str] = (),
        endpoint_keys: Iterable[str] = (),
        now_ns: int = 0,
    ) -> None:
        """Read again the endpoints, jobs and workers of these keys (those whose events were applied)."""
        for key in endpoint_keys:
            self.set_endpoint(key, endpoints.endpoints.get(key))
        for key in jobs:
            self.set_job(key, schedule.jobs.get(key))
        for worker_id in workers:
            self.refresh(worker_id, registry.workers.get(worker_id), liveness.beats.get(worker_id), now_ns)

    def set_job(self, key: str, job: JobRecord | None) -> None:
        """Hold exactly the job's current assignments (none once it ended)."""
        active: dict[str, _Hold] = {}
        if job is not None and job.state not in TERMINAL:
            active = {a.assignment_id: _job_hold(job, a) for a in job.assignments.values()}
        self._set(("job", key), active)

    def take(self, key: str, job: JobRecord, assignments: Iterable[Assignment]) -> None:
        """Hold a placement of ``job`` just decided, before its append is acknowledged."""
        held = dict(self._holds.get(("job", key), {}))
        held.update((a.assignment_id, _job_hold(job, a)) for a in assignments)
        self._set(("job", key), held)

    def set_endpoint(self, key: str, endpoint: EndpointRecord | None) -> None:
        """Hold exactly the endpoint's replicas that are not lost (none once it is deleted)."""
        active: dict[str, _Hold] = {}
        if endpoint is not None and endpoint.state != "deleted":
            for r in endpoint.replicas.values():
                if r.state != "lost":
                    hold = _Hold(replica_assignment(r), 0.0, 0, endpoint.tenant, endpoint.spec.pool)
                    active[r.assignment_id] = hold
        self._set(("endpoint", key), active)

    def refresh(
        self, worker_id: str, record: WorkerRecord | None, beat: LastBeat | None, now_ns: int
    ) -> None:
        """Read one worker's candidate again from its record and latest beat."""
        old = self.index.get(worker_id)
        if record is None:
            self.index.remove(worker_id)
            self._telemetry.pop(worker_id, None)
            return
        new = _candidate(record, beat, self._use.get(worker_id, _IDLE), now_ns)
        if new is None:
            self.index.remove(worker_id)
            self._telemetry.pop(worker_id, None)
            return
        self.index.upsert(new)
        self._telemetry[worker_id] = None if beat is None else (beat.gpus, beat.cpu_pct)
        if old is None or _roomier(old, new, now_ns):
            self.freed = True

    def beat(self, worker_id: str, record: WorkerRecord | None, beat: LastBeat, now_ns: int) -> None:
        """A new heartbeat of the worker: its candidate is read again when the telemetry changed
        (free VRAM, utilisation), else only the beat's time is noted (cheap)."""
        if record is not None and self._telemetry.get(worker_id) != (beat.gpus, beat.cpu_pct):
            self.refresh(worker_id, record, beat, now_ns)
        else:
            self.index.beat(worker_id, beat.time_ns, beat.interval_s)

    def rebuild(self, registry: RegistryState, liveness: LivenessState, now_ns: int) -> None:
        """A fresh index of every worker: for uptime and tiers, which change with the clock alone (and
        because an index never drops a shelf once emptied)."""
        workers, beats = registry.workers, liveness.beats
        use = self._use
        read = (_candidate(workers[w], beats.get(w), use.get(w, _IDLE), now_ns) for w in sorted(workers))
        self.index = CandidateIndex((c for c in read if c is not None), self.weights)
        self._telemetry = {w: (b.gpus, b.cpu_pct) if (b := beats.get(w)) else None for w in workers}
        self.freed = True

    def may_preempt(self, request: PlacementRequest) -> bool:
        """False when :func:`projections.admission.preemption_victims` can only find nothing: shared
        or private work, and no job of the tenant's pool of a lower priority holds a worker."""
        if request.pool == "managed":
            return True
        held = self.priorities.get((request.tenant, request.pool)) or Counter()
        return any(priority < request.priority for priority in held)

    def _set(self, key: tuple[str, str], active: dict[str, _Hold]) -> None:
        old = self._holds.get(key, {})
        for assignment_id, hold in old.items():
            if active.get(assignment_id) != hold:
                self._count(key, hold, -1)
        for assignment_id, hold in active.items():
            if old.get(assignment_id) != hold:
                self._count(key, hold, 1)
        if active:
            self._holds[key] = active
        else:
            self._holds.pop(key, None)

    def _count(self, key: tuple[str, str], hold: _Hold, sign: int) -> None:
        a = hold.assignment
        use = self._use.setdefault(a.worker_id, [0, 0.0, 0, 0])
        use[0] += sign * a.gpus
        use[1] += sign * hold.cpus
        use[2] += sign * hold.memory_mb
        use[3] += sign
        if use[3] <= 0:
            del self._use[a.worker_id]  # also drops float drift in the CPU sum
        pools = self.usage.setdefault(hold.tenant, {})
        pools[hold.pool] = pools.get(hold.pool, 0) + sign * a.gpus
        if key[0] == "job":
            _tally(self.jobs_on[a.worker_id], key[1], sign)
            _tally(self.priorities[hold.tenant, hold.pool], hold.priority, sign)
        c = self.index.get(a.worker_id)
        if c is not None:
            self.index.upsert(occupy(c, a, cpus=hold.cpus, memory_mb=hold.memory_mb, sign=sign))
        if sign < 0:
            self.freed = True


_RANKING: dict[str, Any] = {
    "util": None,
    "uptime": 1.0,
    "tier": "unverified",
    "last_beat_ns": None,
    "interval_s": 1.0,
    "vram_usable_mb": [],
}
"""A candidate's fields that only rank it, or are compared apart (:func:`_roomier`), set to one value."""


def _roomier(old: Candidate, new: Candidate, now_ns: int) -> bool:
    """Whether the worker may take work it could not take before: anything but the ranking terms
    and the beat's time changed, or it has more usable VRAM, or it is no longer silent."""
    if msgspec.structs.replace(old, **_RANKING) != msgspec.structs.replace(new, **_RANKING):
        return True
    if any(n > o for n, o in zip(new.vram_usable_mb, old.vram_usable_mb, strict=False)):
        return True
    return silent(old, now_ns) and not silent(new, now_ns)


def _candidate(record: WorkerRecord, beat: LastBeat | None, use: Any, now_ns: int) -> Candidate | None:
    """The worker's candidate, or ``None`` (logged) when its facts cannot be read: one worker's bad
    value leaves that worker out of placement, never stops placement for the others."""
    try:
        return candidate_of(record, beat, use, now_ns)
    except (ArithmeticError, ValueError, TypeError):
        log.exception("worker %s left out of placement: its candidate cannot be read", record.worker_id)
        return None


def _job_hold(job: JobRecord, a: Assignment) -> _Hold:
    return _Hold(
        a, job.spec.resources.cpus, job.spec.resources.memory_mb, job.tenant, job.spec.pool, job.spec.priority
    )


def _tally(counter: Counter[Any], key: Any, sign: int) -> None:
    counter[key] += sign
    if counter[key] <= 0:
        del counter[key]
