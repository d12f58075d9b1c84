"""Placement: a pure decision from one request and the candidate workers to a gang of assignments.

(About 620 lines, a fifth of them this docstring: the filters, the ranking, the gang and the
explanation of a refusal are one decision whose parts change together; the candidate index that
speeds it up lives apart, in :mod:`core.candidates`.)

``place`` filters, ranks and picks; it has no I/O, no clock (``now_ns`` is a parameter), no
randomness, and ranks equal scores by base score then worker id, so the same input (in any order)
always gives the same output.

Filters, in order; a rejected worker is counted under the first reason it fails:

* ``pool``: the worker is not in the request's *lane*. Shared work runs on shared workers, and on a
  managed worker whose policy lists ``shared`` in ``allowed_pools`` (the owner lends idle reserved
  capacity; managed work of the owner preempts it, see :mod:`projections.admission`). Managed work runs only
  on managed workers whose ``owner_tenant`` is the tenant; private work only on the tenant's own
  private workers. A managed or private worker without an owner takes no managed or private work.
  A worker whose host cannot sandbox workloads takes no work at all, and one started unsandboxed
  (local development) only its owner's own managed or private work, never shared work it would
  borrow (:mod:`core.sandbox`).
* ``gpu_type``: GPU work with a ``gpu_type`` needs a worker of that family
  (:func:`core.pricing.gpu_family`); CPU work (``gpus == 0``) ignores ``gpu_type`` and fits any host.
* ``state`` (cordoned, lost, deregistered, unverified), ``silent`` (no heartbeat, or the latest is older than
  3 of its intervals), ``excluded`` (the request's ``exclude_workers``).
* ``policy_tenant``, ``policy_pool``, ``policy_price`` (GPU work only: the tenant's price per
  GPU-hour, by default the list price of the worker's GPU family in the request's pool, is below the
  provider's minimum), ``maintenance`` (``now_ns`` inside a weekly window, UTC).
* capacity: ``policy_concurrency`` (``max_concurrent`` assignments reached), ``gpus`` (fewer free
  GPUs than a slot needs), ``vram`` (fewer free GPUs with ``vram_mb`` usable: min(free now,
  ``max_vram_fraction`` x total)), ``cpus`` / ``memory`` (only where the host reported them).

Ranking: ``score = uptime_term x tier_term x load_term x geo_term``, each in [0, 1] (the product of
the first three is the *base score*, independent of the request):
``uptime ** uptime_exp`` (30-day uptime, :mod:`core.tiers`); the tier's factor (platinum 1.0, gold
0.9, silver 0.75, unverified 0.5); geo 1.0 when the request names no region or the same one,
``geo_near`` (0.85) for the same area (the region's first ``-`` token: ``eu-west-1`` ~ ``eu-central-1``),
else ``geo_far`` (0.7); ``1 - load_penalty x busy`` (penalty 0.5) where busy is the larger of the
share of GPUs assigned (of CPUs, on a CPU host) and the live utilisation.

Gang: all requested slots or none. Spread first: each slot goes to a different worker, best first;
only when fewer workers fit than there are slots does a worker take a second slot (round-robin
over the ranked workers with room, best first). Fewer total slots than requested: unplaceable,
``permanent`` when even the idle fleet (cordoned and lost workers included, deregistered excluded)
could never hold the gang or the tenant has no worker in a managed or private pool.

:class:`core.candidates.CandidateIndex` gives the same decisions while inspecting a few
workers: pass it as ``place(..., index=...)``.

One module on purpose: filters, ranking, gang selection and the provenance that explains them
are one pure decision; the provenance must name exactly the filters and score terms used, so they
change together.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from core.clock import NS_PER_S, silent_at
from core.pricing import CPU_GPU_TYPE, gpu_family, list_price_micros
from core.tiers import TIER_FACTORS, Tier
from schemas.values import Assignment, Pool, Provenance, Sandboxing, ScoreCard, WorkerState, WorkKind
from schemas.workers import MaintenanceWindow, WorkerPolicy

if TYPE_CHECKING:
    from core.candidates import CandidateIndex

POLICY = "rank-v1"
TOP_K = 5
"""Scorecards kept in the provenance besides the chosen workers'."""
MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
CAPACITY = ("policy_concurrency", "gpus", "vram", "cpus", "memory")
FILTERS: tuple[str, ...] = ("pool", "gpu_type", "state", "silent", "excluded", "policy_tenant")
FILTERS += ("policy_pool", "policy_price", "maintenance", *CAPACITY)
"""Every filter reason, in the order they are checked."""

Lane = tuple[str, str]


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


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One worker as placement sees it; built by :func:`projections.capacity.candidates`.

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
        uptime / tier: 30-day uptime and tier (:mod:`projections.capacity`) when built.
        last_beat_ns / interval_s: the latest heartbeat's time (``None``: never) and interval.
        sandbox: how its host isolates workloads (``off``: owner's work only; ``unavailable``: none).
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


class RankWeights(msgspec.Struct, frozen=True, kw_only=True):
    """The ranking's knobs (see the module docstring); every term stays in [0, 1]."""

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


# --- the rules -------------------------------------------------------------------------------------


def lanes(c: Candidate) -> tuple[Lane, ...]:
    """The ``(pool, owner)`` lanes whose work the worker may take (owner ``""`` for shared). A host
    that cannot sandbox takes none; an unsandboxed one only its owner's own."""
    if c.sandbox == "unavailable":
        return ()
    own: tuple[Lane, ...] = ((c.pool, c.owner_tenant),) if c.owner_tenant and c.pool != "shared" else ()
    if c.sandbox == "off":
        return own
    if c.pool == "shared":
        return (("shared", ""),)
    if c.pool == "managed" and "shared" in c.policy.allowed_pools:
        return (*own, ("shared", ""))
    return own


def request_lane(request: PlacementRequest) -> Lane:
    """The lane a request draws from."""
    return (request.pool, "" if request.pool == "shared" else request.tenant)


def in_maintenance(windows: Iterable[MaintenanceWindow], now_ns: int) -> bool:
    """True if ``now_ns`` (Unix ns, UTC) is inside a weekly window. A window whose end is not after
    its start runs past midnight into the next day; Sunday's runs into Monday."""
    minute = (now_ns // NS_PER_S // 60 + 3 * MINUTES_PER_DAY) % MINUTES_PER_WEEK  # 1970-01-01: Thursday
    for w in windows:
        length = (w.end_minute - w.start_minute) % MINUTES_PER_DAY or (
            MINUTES_PER_DAY if w.end_minute > w.start_minute else 0
        )
        if (minute - w.weekday * MINUTES_PER_DAY - w.start_minute) % MINUTES_PER_WEEK < length:
            return True
    return False


def silent(c: Candidate, now_ns: int) -> bool:
    """True if the worker never beat or its latest beat is older than 3 of its intervals."""
    if c.last_beat_ns is None:
        return True
    return silent_at(now_ns, c.last_beat_ns, c.interval_s)


def _at_least(ascending: Sequence[int], floor: int) -> int:
    return len(ascending) - bisect.bisect_left(ascending, floor)


def busy(c: Candidate) -> float:
    """How loaded the worker is, in [0, 1]: the larger of the share of its GPUs assigned (of its
    CPUs, on a CPU host) and its live utilisation."""
    share = c.gpus_used / c.gpus_total if c.gpus_total else (c.cpus_used / c.cpus if c.cpus else 0.0)
    return min(1.0, max(share, c.util or 0.0))


def _terms(c: Candidate, w: RankWeights) -> tuple[float, float, float, float]:
    uptime = float(c.uptime**w.uptime_exp)
    tier = w.tier_factors.get(c.tier, w.tier_factors["unverified"])
    load = 1.0 - w.load_penalty * busy(c)
    return uptime, tier, load, uptime * tier * load


def base_score(c: Candidate, w: RankWeights) -> float:
    """``uptime_term x tier_term x load_term``: the score before the request's geo term, so an
    upper bound of it; ``score = base_score x geo_term`` exactly (the same float operations)."""
    return _terms(c, w)[3]


class Decision:
    """One request's filters and scores, evaluated against one candidate at a time."""

    def __init__(self, request: PlacementRequest, weights: RankWeights, now_ns: int) -> None:
        self.request = request
        self.weights = weights
        self.now_ns = now_ns
        self.lane = request_lane(request)
        self.family = gpu_family(request.gpu_type) if request.gpus and request.gpu_type else None
        self.area = (request.region or "").split("-", 1)[0]
        self._prices: dict[str, int] = {}
        self._geo: dict[str, float] = {}

    def price(self, family: str) -> int:
        """Micro-USD per GPU-hour the tenant pays on a worker of ``family``."""
        if self.request.price_micros_per_gpu_hour is not None:
            return self.request.price_micros_per_gpu_hour
        if family not in self._prices:
            self._prices[family] = list_price_micros(family, self.request.pool, self.now_ns // 1_000_000)
        return self._prices[family]

    def structural(self, c: Candidate) -> str | None:
        """``pool`` or ``gpu_type`` if the worker can never take this request's work."""
        if self.lane not in lanes(c):
            return "pool"
        if self.family is not None and c.gpu_family != self.family:
            return "gpu_type"
        return None

    def eligible(self, c: Candidate) -> str | None:
        """The first non-capacity filter the worker fails, or ``None``."""
        r, p = self.request, c.policy
        reason = self.structural(c)
        if reason is not None:
            return reason
        if c.state != "available":
            return "state"
        if silent(c, self.now_ns):
            return "silent"
        if c.worker_id in r.exclude_workers:
            return "excluded"
        if p.allowed_tenants and r.tenant not in p.allowed_tenants:
            return "policy_tenant"
        if p.allowed_pools and r.pool not in p.allowed_pools:
            return "policy_pool"
        minimum = p.min_price_micros_per_gpu_hour
        if r.gpus and minimum is not None and self.price(c.gpu_family) < minimum:
            return "policy_price"
        if p.maintenance and in_maintenance(p.maintenance, self.now_ns):
            return "maintenance"
        return None

    def capacity(self, c: Candidate, freed: tuple[int, float, int, int] = (0, 0.0, 0, 0)) -> tuple[int, str]:
        """How many of the request's slots fit at once (capped at the slot count), and the capacity
        reason when none does. ``freed`` = ``(gpus, cpus, memory_mb, assignments)`` to treat as
        released (preemption); freed GPUs count as offering their whole ``vram_limit_mb``."""
        r = self.request
        n = len(r.slots)
        if c.policy.max_concurrent is not None:
            n = min(n, c.policy.max_concurrent - c.assignments + freed[3])
            if n <= 0:
                return 0, "policy_concurrency"
        if r.gpus:
            free = c.gpus_total - c.gpus_used + freed[0]
            if free < r.gpus:
                return 0, "gpus"
            vram = c.vram_limit_mb if freed[0] else c.vram_usable_mb
            fit = min(_at_least(vram, r.vram_mb), free)
            if fit < r.gpus:
                return 0, "vram"
            n = min(n, fit // r.gpus)
        if c.cpus and r.cpus > 0:
            n = min(n, int((c.cpus - c.cpus_used + freed[1]) // r.cpus))
            if n <= 0:
                return 0, "cpus"
        if c.memory_mb and r.memory_mb > 0:
            n = min(n, (c.memory_mb - c.memory_used_mb + freed[2]) // r.memory_mb)
            if n <= 0:
                return 0, "memory"
        return n, ""

    def idle_slots(self, c: Candidate) -> int:
        """Slots the worker could hold if it were idle and available (0 when deregistered)."""
        if c.state == "deregistered":
            return 0
        return self.hardware_slots(c.vram_limit_mb, c.cpus, c.memory_mb)

    def hardware_slots(self, vram_limit_mb: Sequence[int], cpus: int, memory_mb: int) -> int:
        """Slots an idle host with this hardware holds (``vram_limit_mb`` ascending), at most the
        request's slot count."""
        r = self.request
        n = len(r.slots)
        if r.gpus:
            n = min(n, _at_least(vram_limit_mb, r.vram_mb) // r.gpus)
        if cpus and r.cpus > 0:
            n = min(n, int(cpus // r.cpus))
        if memory_mb and r.memory_mb > 0:
            n = min(n, memory_mb // r.memory_mb)
        return n

    def geo(self, region: str) -> float:
        """The geo term of a worker in ``region``."""
        if self.request.region is None or region == self.request.region:
            return 1.0
        if region not in self._geo:
            near = self.area and region.split("-", 1)[0] == self.area
            self._geo[region] = self.weights.geo_near if near else self.weights.geo_far
        return self._geo[region]

    def rank(self, c: Candidate, slots: int) -> Ranked:
        """A fitting worker's score card (the score and its terms), slots and base score."""
        uptime, tier, load, base = _terms(c, self.weights)
        geo = self.geo(c.region)
        terms = {"uptime": uptime, "tier": tier, "geo": geo, "load": load}
        return ScoreCard(worker_id=c.worker_id, score=base * geo, terms=terms), slots, base

    def classify(self, c: Candidate) -> tuple[str, Ranked | None]:
        """The first filter the worker fails, or ``""`` and its ranking."""
        reason = self.eligible(c)
        if reason is not None:
            return reason, None
        slots, reason = self.capacity(c)
        return (reason, None) if reason else ("", self.rank(c, slots))

    def idle_enough(self, matching: Iterable[Candidate]) -> int:
        """Slots ``matching`` workers could hold if idle, counted until there are enough."""
        need, idle = len(self.request.slots), 0
        for c in matching:
            idle += self.idle_slots(c)
            if idle >= need:
                break
        return idle


Ranked = tuple[ScoreCard, int, float]  # a feasible worker's card, the slots it can take, its base score


def rank_key(item: Ranked) -> tuple[float, float, str]:
    """Best first: by score, then (equal scores) by base score, then by worker id."""
    return (-item[0].score, -item[2], item[0].worker_id)


def place(
    request: PlacementRequest,
    candidates: Sequence[Candidate],
    weights: RankWeights = DEFAULT_WEIGHTS,
    *,
    now_ns: int,
    index: CandidateIndex | None = None,
) -> Placed | Unplaceable:
    """Place every slot of ``request`` or none.

    Args:
        request: what to place.
        candidates: every worker (ignored when ``index`` is given).
        weights: the ranking's knobs.
        now_ns: the instant, Unix ns (heartbeat silence, maintenance windows, list price).
        index: a :class:`core.candidates.CandidateIndex` built with the same ``weights``: the
            same assignments, ``top`` and permanence, far fewer workers inspected; its
            ``filtered`` counts are coarser (see the class).

    Returns:
        :class:`Placed` with one assignment per slot, ids ``f"{work_id}-s{slot}-e{epoch}"`` (a
        retried decision appends the same ids), or :class:`Unplaceable`.
    """
    if index is not None:
        return index.place(request, weights, now_ns=now_ns)
    d = Decision(request, weights, now_ns)
    filtered: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    feasible: list[Ranked] = []
    for c in candidates:
        reason, ranked = d.classify(c)
        if ranked is not None:
            feasible.append(ranked)
            continue
        filtered[reason] += 1
        if reason not in ("pool", "gpu_type"):
            groups[group_of(reason, c.state)] += 1
    feasible.sort(key=rank_key)
    placed = gang(request, feasible, len(candidates), filtered)
    if placed is not None:
        return placed
    live = sum(1 for c in candidates if d.lane in lanes(c) and c.state != "deregistered")
    idle = d.idle_enough(c for c in candidates if d.structural(c) is None)
    return unplaceable(d, len(candidates), filtered, groups, feasible, live, idle)


def gang(
    request: PlacementRequest, ranked: list[Ranked], total: int, filtered: Counter[str]
) -> Placed | None:
    """Spread the slots over ``ranked`` workers (best first, one each, then round-robin), or ``None``
    when their capacity is short."""
    need = len(request.slots)
    if sum(item[1] for item in ranked) < need:
        return None
    chosen: list[str] = []
    rnd = 0
    while len(chosen) < need:
        chosen += [card.worker_id for card, slots, _ in ranked if slots > rnd][: need - len(chosen)]
        rnd += 1
    assignments = [
        Assignment(
            assignment_id=assignment_id(request.work_id, slot, request.epoch),
            worker_id=worker_id,
            slot=slot,
            epoch=request.epoch,
            gpus=request.gpus,
        )
        for slot, worker_id in zip(request.slots, chosen, strict=True)
    ]
    top = [item[0] for item in ranked[: max(len(set(chosen)), TOP_K)]]
    counts = {reason: n for reason, n in sorted(filtered.items()) if n}
    provenance = Provenance(candidates=total, filtered=counts, top=top, policy=POLICY)
    return Placed(assignments=assignments, provenance=provenance)


# --- when nothing fits ------------------------------------------------------------------------------

_PREDICATES: dict[str, tuple[str, str]] = {
    "cordoned": ("is cordoned", "are cordoned"),
    "unverified": ("is not verified yet", "are not verified yet"),
    "lost": ("is lost", "are lost"),
    "silent": ("is silent", "are silent"),
    "excluded": ("is excluded", "are excluded"),
    "policy": ("refuses it by policy", "refuse it by policy"),
    "maintenance": ("is in maintenance", "are in maintenance"),
    "busy": ("is busy", "are busy"),
    "vram": ("lacks free VRAM", "lack free VRAM"),
}


def group_of(reason: str, state: str) -> str:
    """How a failing worker is described in a waiting reason (``_PREDICATES``)."""
    if reason == "state":
        return state
    if reason.startswith("policy_") and reason != "policy_concurrency":
        return "policy"
    return reason if reason in ("silent", "excluded", "maintenance", "vram") else "busy"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _unit_and_shape(d: Decision) -> tuple[str, str]:
    """``("2 shards", "1x A100 with 40 GB free")``: how a refusal names what was asked."""
    r = d.request
    unit = _plural(len(r.slots), "shard" if r.kind == "job" else "replica")
    shape = "a CPU slot"
    if r.gpus:
        free = f" with {r.vram_mb / 1024:g} GB free" if r.vram_mb else ""
        shape = f"{r.gpus}x {d.family or 'GPU'}{free}"
    return unit, shape


def permanent_reason(d: Decision, lane_live: int, idle: int) -> str | None:
    """Why ``d``'s request can never be placed, or ``None`` when it may fit some day.

    Never: managed or private work of a tenant without a (non-deregistered) worker in that pool, or
    more slots than the lane's workers of the GPU type could hold even if idle. Shared work with no
    shared worker at all waits (providers come and go). The gateway refuses such a submission with
    this reason; the coordinator rejects a job that reaches it anyway.

    Args:
        lane_live: workers of the request's lane that are not deregistered.
        idle: :meth:`Decision.idle_enough` of the lane's workers of the GPU type.
    """
    r = d.request
    if lane_live == 0:
        return None if r.pool == "shared" else f"tenant {r.tenant} has no {r.pool} workers"
    if idle < len(r.slots):
        unit, shape = _unit_and_shape(d)
        return f"{unit} need {shape}; the {r.pool} pool could hold at most {idle} of them even if idle"
    return None


def unplaceable(
    d: Decision,
    total: int,
    filtered: Counter[str],
    groups: Counter[str],
    feasible: list[Ranked],
    lane_live: int,
    idle: int,
) -> Unplaceable:
    """The failure of ``d``'s request.

    Args:
        total: candidates considered.
        filtered: by reason; ``groups``: the workers of the lane and GPU type that failed, by
            :func:`group_of`.
        feasible: the workers that fit, best first (too few).
        lane_live: workers of the request's lane that are not deregistered.
        idle: :meth:`Decision.idle_enough` of the lane's workers of the GPU type.
    """
    r = d.request
    provenance = Provenance(
        candidates=total,
        filtered=dict(sorted((+filtered).items())),
        top=[item[0] for item in feasible[:TOP_K]],
        policy=POLICY,
    )
    never = permanent_reason(d, lane_live, idle)
    if never is not None:
        return Unplaceable(reason=never, provenance=provenance, permanent=True)
    if lane_live == 0:
        return Unplaceable(reason="waiting: no workers in the shared pool", provenance=provenance)
    unit, shape = _unit_and_shape(d)
    have = sum(n for g, n in groups.items() if g != "deregistered") + len(feasible)
    who = f"{_plural(have, 'worker')} {'has' if have == 1 else 'have'} that GPU"
    if d.family is None:
        who = f"{_plural(have, 'worker')} in the {r.pool} pool"
    parts = [f"{n} {_PREDICATES[g][n != 1]}" for g in _PREDICATES if (n := groups[g])]
    if feasible:
        room = sum(item[1] for item in feasible)
        parts.append(f"{len(feasible)} {'has' if len(feasible) == 1 else 'have'} room for only {room}")
    text = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return Unplaceable(reason=f"waiting: {unit} need {shape}; {who} but {text}", provenance=provenance)


REASONS: dict[str, str] = {
    "pool": "not in the pool (or not the tenant's)",
    "gpu_type": "another GPU type",
    "state": "cordoned, lost, deregistered or not verified yet",
    "silent": "no recent heartbeat",
    "excluded": "excluded (just lost, or rejected this work)",
    "policy_tenant": "provider policy: tenant not allowed",
    "policy_pool": "provider policy: pool not allowed",
    "policy_price": "provider policy: price below its minimum",
    "maintenance": "in a maintenance window",
    "policy_concurrency": "provider policy: max concurrent work reached",
    "gpus": "not enough free GPUs",
    "vram": "not enough free VRAM per GPU",
    "cpus": "not enough free CPUs",
    "memory": "not enough free memory",
    "pruned": "not inspected (unavailable, full, or could not outrank the chosen)",
}


def explain(provenance: Provenance) -> list[str]:
    """Human lines for ``resontech why``: what was considered, what was filtered and why, and the
    best-ranked workers with their score terms."""
    p = provenance
    lines = [f"{_plural(p.candidates, 'worker')} considered (policy {p.policy})"]
    order = {reason: i for i, reason in enumerate((*FILTERS, "pruned"))}
    for reason in sorted(p.filtered, key=lambda r: (order.get(r, len(order)), r)):
        lines.append(f"  {p.filtered[reason]} filtered out: {REASONS.get(reason, reason)}")
    for i, card in enumerate(p.top, 1):
        terms = " x ".join(f"{name} {value:.3f}" for name, value in card.terms.items())
        lines.append(f"  #{i} {card.worker_id}: score {card.score:.3f} = {terms}")
    return lines


_ASSIGNMENT_ID = re.compile(r"^(.+)-s([0-9]+)-e([0-9]+)$")


def assignment_id(work_id: str, slot: int, epoch: int) -> str:
    """The id of the assignment of ``slot`` of ``work_id`` at ``epoch``: ``<work_id>-s<slot>-e<epoch>``."""
    return f"{work_id}-s{slot}-e{epoch}"


def parse_assignment_id(value: str) -> tuple[str, int, int] | None:
    """``(work_id, slot, epoch)`` of an :func:`assignment_id`, or ``None`` for another shape."""
    match = _ASSIGNMENT_ID.match(value)
    return None if match is None else (match[1], int(match[2]), int(match[3]))
