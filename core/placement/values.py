"""What placement is given and what it answers: the request, the candidate workers, the ranking's
weights, and the two outcomes (every slot placed, or none)."""

from __future__ import annotations

import msgspec

from core.pricing import CPU_GPU_TYPE
from core.tiers import TIER_FACTORS, Tier
from schemas.values import Assignment, Pool, Provenance, Sandboxing, TopologyRequest, WorkerState, WorkKind
from schemas.workers import WorkerPolicy

POLICY = "rank-v1"
"""The name of the ranking policy, recorded in every provenance."""
TOP_K = 5
"""Scorecards kept in the provenance besides the chosen workers'."""


class PlacementRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What to place. Build one with :func:`projections.admission.request_for_job` or ``..._for_endpoint``.

    Attributes:
        work_id: the job or endpoint id (assignment ids derive from it).
        kind: ``job`` (slots are shards) or ``endpoint`` (slots are replicas).
        slots: the slot indexes to place (a re-placement lists only the missing ones).
        gpus / vram_mb: GPUs per slot (0 for CPU work) and usable VRAM per GPU, MiB (0: any).
        gpu_type: a GPU family or model name (``A100``), ``None`` for any.
        cpus / memory_mb: per slot; checked only against hosts that report them.
        region: preferred region (geo affinity), ``None`` for none.
        priority: the work's priority (used by preemption).
        price_micros_per_gpu_hour: what the tenant pays, micro-USD; ``None``: the list price of each
            worker's GPU family in ``pool`` at ``now_ns``.
        exclude_workers: workers never to use (just lost, or rejected this work).
        epoch: the fencing epoch stamped on every new assignment.
        image: the work names its own container image: only workers that run images take it
            (:func:`core.placement.rules.lanes`).
        topology: the network domain every slot must (or should) share (:mod:`core.placement.topology`).
    """

    work_id: str
    tenant: str
    kind: WorkKind = "job"
    slots: list[int]
    gpus: int = 0
    vram_mb: int = 0
    gpu_type: str | None = None
    cpus: float = 0.0
    memory_mb: int = 0
    pool: Pool = "shared"
    region: str | None = None
    priority: int = 0
    price_micros_per_gpu_hour: int | None = None
    exclude_workers: frozenset[str] = frozenset()
    epoch: int
    image: bool = False
    topology: TopologyRequest | None = None


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One worker as placement sees it; built by :func:`projections.candidates.candidates`.

    A host with GPUs of several families is treated as a host of its most common family (ties: the
    alphabetically first); only those GPUs count.

    Attributes:
        gpu_family: ``cpu`` for a host without GPUs.
        gpus_total / gpus_used: GPUs of ``gpu_family``, and GPUs held by active assignments.
        vram_usable_mb: per GPU, ascending: min(free VRAM now, ``max_vram_fraction`` x total), MiB.
        vram_limit_mb: per GPU, ascending: ``max_vram_fraction`` x total (what an idle host offers).
        cpus / memory_mb: the host's, 0 when not reported; ``*_used`` by active job assignments.
        assignments: active assignments on the worker (jobs' shards and endpoints' replicas).
        util: live mean GPU utilisation (CPU on a CPU host), 0..1, ``None`` without telemetry.
        uptime / tier: 30-day uptime and tier (:mod:`projections.candidates`) when built.
        last_beat_ns / interval_s: the latest heartbeat's time (``None``: never) and interval.
        sandbox: how its host isolates workloads (``off``: owner's work only; ``unavailable``: none;
            ``kubernetes``: a node of the kernel's cluster, which alone runs work naming an image).
        domains: its network domains, level -> ``<provider>/<name>`` (a name counts within its
            provider only: :func:`projections.candidates.domains_of`).
    """

    worker_id: str
    pool: Pool = "shared"
    owner_tenant: str | None = None
    sandbox: Sandboxing = ""
    region: str = ""
    state: WorkerState = "available"
    policy: WorkerPolicy = WorkerPolicy()
    gpu_family: str = CPU_GPU_TYPE
    gpus_total: int = 0
    gpus_used: int = 0
    vram_usable_mb: list[int] = []
    vram_limit_mb: list[int] = []
    cpus: int = 0
    cpus_used: float = 0.0
    memory_mb: int = 0
    memory_used_mb: int = 0
    assignments: int = 0
    util: float | None = None
    uptime: float = 1.0
    tier: Tier = "unverified"
    last_beat_ns: int | None = None
    interval_s: float = 1.0
    domains: dict[str, str] = {}


class RankWeights(msgspec.Struct, frozen=True, kw_only=True):
    """The ranking's knobs (see :mod:`core.placement`); every term stays in [0, 1]."""

    uptime_exp: float = 1.0
    tier_factors: dict[str, float] = msgspec.field(default_factory=lambda: dict(TIER_FACTORS))
    geo_near: float = 0.85
    geo_far: float = 0.7
    load_penalty: float = 0.5


DEFAULT_WEIGHTS = RankWeights()


class Placed(msgspec.Struct, frozen=True, kw_only=True):
    """Every requested slot, assigned; ``assignments`` follow the request's slot order."""

    assignments: list[Assignment]
    provenance: Provenance


class Unplaceable(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing was placed. ``permanent``: it can never fit the registered fleet (reject it)."""

    reason: str
    provenance: Provenance
    permanent: bool = False
