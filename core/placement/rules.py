"""The filters and the ranking: which workers may take a request's slots, how many each can hold,
and in what order they are chosen (see :mod:`core.placement` for the rules in words)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Final

from core.clock import NS_PER_S, silent_at
from core.placement.values import Candidate, PlacementRequest, RankWeights
from core.pricing import gpu_family, list_price_micros
from schemas.values import ScoreCard
from schemas.workers import MaintenanceWindow

MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
CAPACITY = ("policy_concurrency", "gpus", "vram", "cpus", "memory")
FILTERS: tuple[str, ...] = ("pool", "image", "gpu_type", "state", "silent", "excluded", "policy_tenant")
FILTERS += ("policy_pool", "policy_price", "maintenance", *CAPACITY)
"""Every filter reason, in the order they are checked."""

Lane = tuple[str, str, bool]
"""A pool, an owner (``""`` for shared) and whether the work names its own container image."""
Ranked = tuple[ScoreCard, int, float]  # a feasible worker's card, the slots it can take, its base score
_SHARED: tuple[Lane, ...] = (("shared", "", False),)
RUNS_IMAGES: Final = "kubernetes"
"""The sandbox of workers that run work naming an image (every workload of theirs is a container)."""


def lanes(c: Candidate) -> tuple[Lane, ...]:
    """The ``(pool, owner, image)`` lanes whose work the worker may take (owner ``""`` for shared).
    A host that cannot sandbox takes none; an unsandboxed one only its owner's own; only a worker
    that runs images takes work that names one."""
    if c.sandbox == "unavailable":
        return ()
    if c.sandbox != "off" and c.pool == "shared":
        plain: tuple[Lane, ...] = _SHARED
    else:
        plain = ((c.pool, c.owner_tenant, False),) if c.owner_tenant and c.pool != "shared" else ()
        if c.sandbox != "off" and c.pool == "managed" and "shared" in c.policy.allowed_pools:
            plain = (*plain, *_SHARED)
    if c.sandbox != RUNS_IMAGES:
        return plain
    return (*plain, *((pool, owner, True) for pool, owner, _ in plain))


def request_lane(request: PlacementRequest) -> Lane:
    """The lane a request draws from."""
    return (request.pool, "" if request.pool == "shared" else request.tenant, request.image)


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


def rank_key(item: Ranked) -> tuple[float, float, str]:
    """Best first: by score, then (equal scores) by base score, then by worker id."""
    return (-item[0].score, -item[2], item[0].worker_id)


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
        """``pool``, ``image`` or ``gpu_type`` if the worker can never take this request's work."""
        served = lanes(c)
        if self.lane not in served:
            return "image" if (*self.lane[:2], False) in served else "pool"
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
