"""Admission: GPU quotas, the queue's order, preemption and the health controller. Pure decisions.

Quotas. A tenant's quota is a number of concurrent GPUs per pool (``None`` or absent: no limit).
Usage is the GPUs held by active assignments: current assignments of live jobs and replicas of live
endpoints that are not lost. A job is admitted when its missing slots fit what is left; one that
could not fit even an unused quota waits with ``permanent=True`` (the coordinator rejects it).

Queue order (:func:`triage`). Pending jobs by priority (highest first), then submission order. Quota
is strict FIFO per tenant and pool: once a job of a tenant's pool waits for quota, every later job
of that tenant and pool (same or lower priority, by the order) waits behind it, so a large job is
never starved by a stream of small ones; other tenants and pools are not affected, CPU jobs (no GPUs)
never wait for GPU quota, and a permanently over-quota job blocks nobody. Capacity is not FIFO: the
coordinator tries the admitted jobs in order, and a job that does not fit the hardware waits while a
later one that fits runs; priority is enforced by preemption instead. Kueue-style borrowing is out
of scope.

Preemption (:func:`preemption_victims`) is decided here and carried out by the coordinator as
checkpoint-and-requeue. Two rules: managed work reclaims its owner's managed workers from the shared
work lent them (jobs and endpoint replicas: "managed cluster jobs always preempt shared pool jobs
for the same hardware"); and within one pool a job preempts the *same tenant's* strictly lower
priority jobs (priorities are set by tenants, so they never rank one tenant's work above
another's). Endpoints have no priority and are never preempted by priority.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

import msgspec

from core.clock import NS_PER_S
from core.placement.explaining import permanent_reason
from core.placement.rules import Decision, lanes
from core.placement.values import DEFAULT_WEIGHTS, Candidate, PlacementRequest, RankWeights
from projections.candidates import candidate_of
from projections.endpoints import EndpointRecord, EndpointsState, missing_replicas, replica_assignment
from projections.liveness import LivenessState
from projections.registry import RegistryState, WorkerRecord
from projections.schedule import TERMINAL, JobRecord, ScheduleState, missing_slots, pending
from schemas.values import Assignment, WorkKind

Quotas = Mapping[str, Mapping[str, int | None]]
"""tenant -> pool -> the most GPUs its active assignments may hold (``None``: no limit)."""
Usage = dict[str, dict[str, int]]
"""tenant -> pool -> GPUs its active assignments hold."""
MAX_SUBSET_VICTIMS = 10
"""Preemption tries every subset of a worker's preemptible assignments up to this many, else
prefixes of them in preference order."""


class Admit(msgspec.Struct, frozen=True, kw_only=True):
    """The work fits its quota; ``gpus`` is what it adds to the tenant's usage."""

    gpus: int = 0


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """The work waits; ``permanent``: it can never fit the quota as set (reject it)."""

    reason: str
    permanent: bool = False


def quota_usage(schedule: ScheduleState, endpoints: EndpointsState) -> Usage:
    """GPUs held by active assignments, by tenant and pool."""
    usage: Usage = {}
    for job in schedule.jobs.values():
        if job.state not in TERMINAL and job.assignments:
            held = sum(a.gpus for a in job.assignments.values())
            pools = usage.setdefault(job.tenant, {})
            pools[job.spec.pool] = pools.get(job.spec.pool, 0) + held
    for endpoint in endpoints.endpoints.values():
        if endpoint.state != "deleted":
            held = sum(r.gpus for r in endpoint.replicas.values() if r.state != "lost")
            if held:
                pools = usage.setdefault(endpoint.tenant, {})
                pools[endpoint.spec.pool] = pools.get(endpoint.spec.pool, 0) + held
    return usage


def check_quota(
    tenant: str, pool: str, gpus: int, quotas: Quotas, usage: Usage, *, whole: int | None = None
) -> Admit | Wait:
    """Whether ``gpus`` more GPUs fit the tenant's quota in ``pool``.

    Args:
        whole: the GPUs of the whole work (default ``gpus``): over the quota itself, the wait is
            permanent.
    """
    limit = quotas.get(tenant, {}).get(pool)
    used = usage.get(tenant, {}).get(pool, 0)
    if limit is None or gpus == 0 or used + gpus <= limit:
        return Admit(gpus=gpus)
    reason = f"over quota: tenant {tenant} holds {used} of its {limit} GPUs in the {pool} pool"
    reason += f" and this needs {gpus} more"
    return Wait(reason=reason, permanent=(gpus if whole is None else whole) > limit)


IDLE_USE = (0, 0.0, 0, 0)
"""``(gpus, cpus, memory_mb, assignments)`` in use on an idle worker."""


def idle_host(record: WorkerRecord, now_ns: int) -> Candidate:
    """The worker as placement would see it idle, whatever its load or heartbeat (``now_ns``, Unix
    ns, only dates its tier, which :func:`never_fits` does not look at)."""
    return candidate_of(record, None, IDLE_USE, now_ns)


def never_fits(request: PlacementRequest, hosts: Sequence[Candidate], now_ns: int) -> str | None:
    """Why ``request`` could never be placed on the registered fleet, or ``None``.

    The coordinator's permanent rejection (:func:`core.placement.permanent_reason`) judged before
    anything runs, against every registered worker as if idle (``hosts``: :func:`idle_host` of each),
    so the gateway can refuse a submission that would only be rejected later. Both scans stop as
    soon as the answer is known, so a request that fits costs a few hosts, not the whole fleet.
    """
    d = Decision(request, DEFAULT_WEIGHTS, now_ns)
    lane_live = int(any(d.lane in lanes(c) and c.state != "deregistered" for c in hosts))  # only 0 matters
    idle = d.idle_enough(c for c in hosts if d.structural(c) is None)
    return permanent_reason(d, lane_live, idle)


def admit(job: JobRecord, quotas: Quotas, usage: Usage) -> Admit | Wait:
    """Whether the job's missing slots fit its tenant's quota in its pool."""
    need = len(missing_slots(job)) * job.spec.resources.gpus
    return check_quota(
        job.tenant, job.spec.pool, need, quotas, usage, whole=job.spec.shards * job.spec.resources.gpus
    )


def triage(
    schedule: ScheduleState, quotas: Quotas, usage: Usage
) -> tuple[list[JobRecord], list[tuple[JobRecord, Wait]]]:
    """The pending jobs to try, in order, and those that wait for quota with why (see the module
    docstring). Admitted jobs count against the quota as if placed, so the list never oversubscribes
    it. ``usage`` is not modified."""
    used = {tenant: dict(pools) for tenant, pools in usage.items()}
    blocked: dict[tuple[str, str], str] = {}
    admitted: list[JobRecord] = []
    waiting: list[tuple[JobRecord, Wait]] = []
    for job in pending(schedule):
        queue = (job.tenant, job.spec.pool)
        verdict = admit(job, quotas, used)
        if isinstance(verdict, Admit) and verdict.gpus and queue in blocked:
            verdict = Wait(reason=f"queued behind job {blocked[queue]}, which waits for quota")
        if isinstance(verdict, Wait):
            if not verdict.permanent:
                blocked.setdefault(queue, job.job_id)
            waiting.append((job, verdict))
            continue
        pools = used.setdefault(job.tenant, {})
        pools[job.spec.pool] = pools.get(job.spec.pool, 0) + verdict.gpus
        admitted.append(job)
    return admitted, waiting


def next_jobs(schedule: ScheduleState, quotas: Quotas, usage: Usage) -> list[JobRecord]:
    """The pending jobs the coordinator should try to place, in order (:func:`triage`)."""
    return triage(schedule, quotas, usage)[0]


def request_for_job(
    job: JobRecord, *, epoch: int | None = None, exclude: Collection[str] = ()
) -> PlacementRequest:
    """The placement of a job's missing slots, at epoch ``job.epoch + 1`` by default, excluding
    ``exclude`` and every worker that rejected the job."""
    r = job.spec.resources
    return PlacementRequest(
        work_id=job.job_id,
        tenant=job.tenant,
        kind="job",
        slots=missing_slots(job),
        gpus=r.gpus,
        vram_mb=r.vram_mb,
        gpu_type=r.gpu_type,
        cpus=r.cpus,
        memory_mb=r.memory_mb,
        pool=job.spec.pool,
        region=job.spec.region,
        priority=job.spec.priority,
        exclude_workers=frozenset(job.rejected_by) | frozenset(exclude),
        epoch=job.epoch + 1 if epoch is None else epoch,
        image=job.spec.image is not None,
        topology=job.spec.topology,
    )


def replica_gpus(endpoint: EndpointRecord) -> int:
    """GPUs per replica: none for the CPU engine or an endpoint that names neither a GPU type, a
    VRAM need nor vLLM; else one."""
    if endpoint.spec.engine == "cpu":
        return 0
    return int(bool(endpoint.spec.gpu_type or endpoint.spec.vram_mb or endpoint.spec.engine == "vllm"))


def request_for_endpoint(
    endpoint: EndpointRecord,
    *,
    slots: Sequence[int] | None = None,
    epoch: int | None = None,
    exclude: Collection[str] = (),
) -> PlacementRequest:
    """The placement of an endpoint's replicas (default: the missing ones), at epoch
    ``endpoint.epoch + 1`` by default."""
    return PlacementRequest(
        work_id=endpoint.endpoint_id,
        tenant=endpoint.tenant,
        kind="endpoint",
        slots=list(missing_replicas(endpoint) if slots is None else slots),
        gpus=replica_gpus(endpoint),
        vram_mb=endpoint.spec.vram_mb,
        gpu_type=endpoint.spec.gpu_type,
        pool=endpoint.spec.pool,
        exclude_workers=frozenset(exclude),
        epoch=endpoint.epoch + 1 if epoch is None else epoch,
        image=endpoint.spec.image is not None,
    )


class Victim(NamedTuple):
    """An assignment to stop with a checkpoint: ``key`` is the job's or endpoint's key."""

    key: str
    assignment: Assignment
    kind: WorkKind
    priority: int = 0


class _Running(NamedTuple):
    victim: Victim
    freed: tuple[int, float, int, int]  # gpus, cpus, memory_mb, assignments
    order: tuple[int, int, int, int]  # endpoints last, lowest priority, newest (-seq), slot


def _preemptible(
    request: PlacementRequest,
    hosts: Mapping[str, Candidate],
    schedule: ScheduleState,
    endpoints: EndpointsState,
) -> dict[str, list[_Running]]:
    """Per host, the assignments the request may preempt, best victims first."""
    found: dict[str, list[_Running]] = {}

    def reclaim(worker_id: str, pool: str) -> bool:
        host = hosts[worker_id]
        managed = request.pool == "managed" and host.pool == "managed"
        return managed and pool == "shared" and host.owner_tenant == request.tenant

    for key in sorted(schedule.jobs):
        job = schedule.jobs[key]
        if job.state in TERMINAL or (job.tenant, job.job_id) == (request.tenant, request.work_id):
            continue
        lower = (
            job.spec.pool == request.pool
            and job.tenant == request.tenant
            and job.spec.priority < request.priority
        )
        for a in sorted(job.assignments.values(), key=lambda a: a.slot):
            if a.worker_id in hosts and (lower or reclaim(a.worker_id, job.spec.pool)):
                victim = Victim(key, a, "job", job.spec.priority)
                freed = (a.gpus, job.spec.resources.cpus, job.spec.resources.memory_mb, 1)
                order = (0, job.spec.priority, -job.submitted_seq, a.slot)
                found.setdefault(a.worker_id, []).append(_Running(victim, freed, order))
    for key in sorted(endpoints.endpoints):
        endpoint = endpoints.endpoints[key]
        if endpoint.state == "deleted":
            continue
        for r in sorted(endpoint.replicas.values(), key=lambda r: r.slot):
            if r.state != "lost" and r.worker_id in hosts and reclaim(r.worker_id, endpoint.spec.pool):
                order = (1, 0, -endpoint.deployed_seq, r.slot)
                victim = Victim(key, replica_assignment(r), "endpoint")
                found.setdefault(r.worker_id, []).append(_Running(victim, (r.gpus, 0.0, 0, 1), order))
    for running in found.values():
        running.sort(key=lambda r: (r.order, r.victim.key))
    return found


Cost = tuple[int, int, int, int]  # victims, endpoints among them, sum of priorities, -sum of seqs


def _cost(chosen: Sequence[_Running]) -> Cost:
    return (
        len(chosen),
        sum(r.order[0] for r in chosen),
        sum(r.order[1] for r in chosen),
        sum(r.order[2] for r in chosen),
    )


def _options(d: Decision, host: Candidate, running: list[_Running]) -> dict[int, tuple[Cost, list[_Running]]]:
    """For each number of extra slots freeing some of ``running`` gives on ``host``, the cheapest
    set that gives it."""
    base = d.capacity(host)[0]
    sizes = range(1, len(running) + 1)
    if len(running) <= MAX_SUBSET_VICTIMS:
        subsets = [s for n in sizes for s in itertools.combinations(running, n)]
    else:
        subsets = [tuple(running[:n]) for n in sizes]
    best: dict[int, tuple[Cost, list[_Running]]] = {}
    for subset in subsets:
        freed = (
            sum(r.freed[0] for r in subset),
            sum(r.freed[1] for r in subset),
            sum(r.freed[2] for r in subset),
            len(subset),
        )
        gain = d.capacity(host, freed)[0] - base
        cost = _cost(subset)
        if gain > 0 and (gain not in best or cost < best[gain][0]):
            best[gain] = (cost, list(subset))
    return best


def preemption_victims(
    request: PlacementRequest,
    candidates: Sequence[Candidate],
    schedule: ScheduleState,
    endpoints: EndpointsState,
    *,
    now_ns: int,
    weights: RankWeights = DEFAULT_WEIGHTS,
) -> list[Victim]:
    """The fewest assignments to stop so that every slot of ``request`` fits (then endpoints last,
    lowest priority and newest first); empty when it already fits or cannot fit even so.

    Only workers that pass every filter but capacity count; a freed GPU is assumed to offer its
    whole ``max_vram_fraction`` of VRAM once its workload has stopped.
    """
    d = Decision(request, weights, now_ns)
    hosts = {c.worker_id: c for c in candidates if d.eligible(c) is None}
    need = len(request.slots) - sum(d.capacity(c)[0] for c in hosts.values())
    if need <= 0:
        return []
    best: dict[int, tuple[Cost, list[_Running]]] = {0: ((0, 0, 0, 0), [])}
    for worker_id, running in sorted(_preemptible(request, hosts, schedule, endpoints).items()):
        step = dict(best)
        for got, (cost, chosen) in best.items():
            for gain, (extra, victims) in _options(d, hosts[worker_id], running).items():
                total = min(need, got + gain)
                new: Cost = (
                    cost[0] + extra[0],
                    cost[1] + extra[1],
                    cost[2] + extra[2],
                    cost[3] + extra[3],
                )
                if total not in step or new < step[total][0]:
                    step[total] = (new, chosen + victims)
        best = step
    if need not in best:
        return []
    return [r.victim for r in sorted(best[need][1], key=lambda r: (r.order, r.victim.key))]


def health_verdicts(
    registry: RegistryState,
    liveness: LivenessState,
    failures: Mapping[str, Sequence[int]],
    now_ns: int,
    k: int = 3,
    window_s: float = 600,
    *,
    acknowledged: Mapping[str, int] | None = None,
) -> list[tuple[str, str]]:
    """Workers the health controller should cordon, by worker id, with the reason.

    Args:
        failures: worker id -> times (Unix ns) its assignments failed.
        now_ns: the instant, Unix ns.
        k: failures within the window that cordon (default 3).
        window_s: the window, seconds (default 600).
        acknowledged: worker id -> hardware error total already dealt with (an operator uncordoned
            it): only a higher total cordons again. NVML's counters only grow until a driver reload.

    Workers already cordoned or deregistered are skipped. Hardware errors are the ECC and Xid
    counters of the latest heartbeat.
    """
    start = now_ns - window_s * NS_PER_S
    verdicts = []
    for worker_id in sorted(registry.workers):
        record = registry.workers[worker_id]
        if record.cordoned or record.state == "deregistered":
            continue
        recent = sum(1 for t in failures.get(worker_id, ()) if start < t <= now_ns)
        if recent >= k:
            verdicts.append((worker_id, f"{recent} assignment failures in the last {window_s:g} s"))
            continue
        beat = liveness.beats.get(worker_id)
        errors = [(g.index, g.ecc_errors or 0, g.xid_errors or 0) for g in beat.gpus] if beat else []
        if sum(e + x for _, e, x in errors) > (acknowledged or {}).get(worker_id, 0):
            detail = ", ".join(f"GPU {i} ecc {e} xid {x}" for i, e, x in errors if e or x)
            verdicts.append((worker_id, f"hardware errors: {detail}"))
    return verdicts
