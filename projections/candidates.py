"""The placement candidates, read off the projections: one candidate per worker, with its tier.

The pure placement rules in :mod:`core.placement` take :class:`core.placement.Candidate` values;
this module builds them from the registry, the latest heartbeats and the active assignments of the
schedule and the endpoint table (``projections`` may import ``core``, not the other way round).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from core.clock import NS_PER_S
from core.placement.values import Candidate
from core.pricing import CPU_GPU_TYPE
from core.tiers import MIN_OBSERVATION_S, WINDOW_S, Tier, family_of, tier_for
from projections.endpoints import EndpointsState
from projections.liveness import LastBeat, LivenessState
from projections.registry import RegistryState, WorkerRecord, uptime
from projections.schedule import TERMINAL, ScheduleState
from schemas.workers import WorkerRegistered


def uptime_30d(record: WorkerRecord, now_ns: int, *, window_s: int = WINDOW_S) -> float:
    """The fraction of the last ``window_s`` seconds the worker was not lost, in [0, 1].

    The window ends at ``now_ns`` (or at the deregistration of a deregistered worker). Exact for a
    worker first registered within the window; otherwise an estimate (see the module docstring).

    Args:
        record: the worker's registry record.
        now_ns: the instant, Unix nanoseconds (the server's clock, as the registry's times).
        window_s: the window, seconds (default 30 days).

    Returns:
        1.0 when nothing was observed yet.
    """
    end = record.deregistered_ns if record.deregistered_ns is not None else now_ns
    window_ns = window_s * NS_PER_S
    life = end - record.since_ns
    if life <= window_ns:
        return uptime(record, now_ns)
    start = end - window_ns
    share = window_ns / life
    # closed lost intervals all lie between the first registration and the open one (if any)
    closed_end = end if record.lost_since_ns is None else record.lost_since_ns
    closed_span = closed_end - record.since_ns
    closed_down = 0.0
    if closed_span > 0:
        closed_down = record.downtime_ns * max(0, closed_end - start) / closed_span
    open_down = 0 if record.lost_since_ns is None else end - max(record.lost_since_ns, start)
    observed = window_ns - record.excluded_ns * share
    if observed <= 0:
        return 1.0
    down = min(observed, closed_down + max(0, open_down))
    return max(0.0, 1.0 - down / observed)


def tier_of(
    record: WorkerRecord,
    now_ns: int,
    *,
    window_s: int = WINDOW_S,
    min_observation_s: int = MIN_OBSERVATION_S,
) -> Tier:
    """The worker's tier at ``now_ns`` (Unix ns).

    Args:
        window_s: the uptime window, seconds (default 30 days).
        min_observation_s: a worker first registered less than this many seconds ago is
            ``unverified`` (default 24 h), as is one that has not passed its verification job.
    """
    if not record.verified or now_ns - record.since_ns < min_observation_s * NS_PER_S:
        return "unverified"
    models = [g.model for g in record.registration.gpus]
    return tier_for(uptime_30d(record, now_ns, window_s=window_s), models)


def candidates(
    registry: RegistryState,
    liveness: LivenessState,
    schedule: ScheduleState,
    endpoints: EndpointsState,
    now_ns: int,
) -> list[Candidate]:
    """Every registered worker (deregistered ones included, filtered as ``state``), by worker id,
    with its load from the active assignments of live jobs and endpoints (lost replicas excluded)."""
    use: dict[str, list[float]] = {}  # worker -> [gpus, cpus, memory_mb, assignments]
    for job in schedule.jobs.values():
        if job.state not in TERMINAL:
            for a in job.assignments.values():
                u = use.setdefault(a.worker_id, [0, 0, 0, 0])
                u[0] += a.gpus
                u[1] += job.spec.resources.cpus
                u[2] += job.spec.resources.memory_mb
                u[3] += 1
    for endpoint in endpoints.endpoints.values():
        if endpoint.state != "deleted":
            for r in endpoint.replicas.values():
                if r.state != "lost":
                    u = use.setdefault(r.worker_id, [0, 0, 0, 0])
                    u[0] += r.gpus
                    u[3] += 1
    return [
        candidate_of(registry.workers[w], liveness.beats.get(w), use.get(w, [0, 0, 0, 0]), now_ns)
        for w in sorted(registry.workers)
    ]


def candidate_of(record: WorkerRecord, beat: LastBeat | None, use: Sequence[float], now_ns: int) -> Candidate:
    """One candidate from its registry record, latest beat and ``[gpus, cpus, memory_mb, count]`` used."""
    registered = record.registration
    families = Counter(family_of(g.model) for g in registered.gpus)
    family = min(families, key=lambda f: (-families[f], f)) if families else CPU_GPU_TYPE
    gpus = [g for g in registered.gpus if family_of(g.model) == family]
    used_mb = {t.index: t.mem_used_mb for t in beat.gpus} if beat else {}
    fraction = record.policy.max_vram_fraction
    usable, limit, utils = [], [], []
    for g in gpus:
        mem = used_mb.get(g.index)
        free = g.vram_free_mb if mem is None else g.vram_total_mb - mem
        limit.append(int(g.vram_total_mb * fraction))
        usable.append(max(0, min(free, limit[-1])))
    if beat is not None:
        indexes = {g.index for g in gpus}
        utils = [t.util_pct for t in beat.gpus if t.index in indexes and t.util_pct is not None]
        if not gpus:
            utils = [beat.cpu_pct]
    return Candidate(
        worker_id=record.worker_id,
        pool=registered.pool,
        owner_tenant=registered.owner_tenant,
        sandbox=registered.sandbox,
        region=registered.region,
        state=record.state,
        policy=record.policy,
        gpu_family=family,
        gpus_total=len(gpus),
        gpus_used=int(use[0]),
        vram_usable_mb=sorted(usable),
        vram_limit_mb=sorted(limit),
        cpus=registered.cpus,
        cpus_used=float(use[1]),
        memory_mb=registered.memory_mb,
        memory_used_mb=int(use[2]),
        assignments=int(use[3]),
        util=min(1.0, sum(utils) / len(utils) / 100) if utils else None,
        uptime=uptime_30d(record, now_ns),
        tier=tier_of(record, now_ns),
        last_beat_ns=None if beat is None else beat.time_ns,
        interval_s=1.0 if beat is None else beat.interval_s,
        domains=domains_of(registered),
    )


def domains_of(registered: WorkerRegistered) -> dict[str, str]:
    """A worker's network domains, level -> ``<provider>/<name>``: a name is its provider's claim,
    so two providers' equal names are two domains (:mod:`core.placement.topology`)."""
    return {level: f"{registered.provider}/{name}" for level, name in registered.topology.items()}
