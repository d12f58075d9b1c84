"""The candidates placement chooses from, indexed.

:func:`projections.capacity.candidates` builds one :class:`core.placement.Candidate` per worker
from the projections.

:class:`CandidateIndex` keeps them ordered for :func:`core.placement.place` (``index=``): the
plain scan costs one filter-and-score per registered worker; the index inspects, in the common
case, ``max(slots, TOP_K)`` workers plus those it finds unfit on the way.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from core.placement import (
    DEFAULT_WEIGHTS,
    TOP_K,
    Candidate,
    Decision,
    Lane,
    Placed,
    PlacementRequest,
    Ranked,
    RankWeights,
    Unplaceable,
    base_score,
    gang,
    group_of,
    lanes,
    unplaceable,
)
from schemas.values import Assignment


def occupy(c: Candidate, a: Assignment, *, cpus: float = 0.0, memory_mb: int = 0, sign: int = 1) -> Candidate:
    """The candidate with assignment ``a`` (and its ``cpus`` / ``memory_mb``) added; ``sign=-1``
    removes it (never below zero)."""
    return msgspec.structs.replace(
        c,
        gpus_used=max(0, c.gpus_used + sign * a.gpus),
        cpus_used=max(0.0, c.cpus_used + sign * cpus),
        memory_used_mb=max(0, c.memory_used_mb + sign * memory_mb),
        assignments=max(0, c.assignments + sign),
    )


Key = tuple[float, str]  # (-base_score, worker_id)
Shelf = tuple[int, int, list[Key]]  # (-free GPUs, -most usable VRAM of one GPU, the workers)
Profile = tuple[tuple[int, ...], int, int]  # (vram_limit_mb, cpus, memory_mb): what an idle host offers


class Filing(NamedTuple):
    """Where a candidate is filed: everything :meth:`CandidateIndex.place` reads off a worker
    without looking at the candidate itself."""

    key: Key
    family: str
    region: str
    lanes: tuple[Lane, ...]
    parked: str | None  # the state, or ``policy_concurrency``: on no shelf, only counted
    free: int  # free GPUs
    vram: int  # the most usable VRAM of one GPU
    profile: Profile
    live: bool  # not deregistered


def filing(c: Candidate, weights: RankWeights) -> Filing:
    """Where ``c`` is filed in an index with ``weights``."""
    limit = c.policy.max_concurrent
    parked: str | None = c.state if c.state != "available" else None
    if parked is None and limit is not None and c.assignments >= limit:
        parked = "policy_concurrency"
    return Filing(
        key=(-base_score(c, weights), c.worker_id),
        family=c.gpu_family,
        region=c.region,
        lanes=lanes(c),
        parked=parked,
        free=max(0, c.gpus_total - c.gpus_used),
        vram=c.vram_usable_mb[-1] if c.vram_usable_mb else 0,
        profile=(tuple(c.vram_limit_mb), c.cpus, c.memory_mb),
        live=c.state != "deregistered",
    )


class CandidateIndex:
    """Candidates kept in sorted lists ("shelves"), for placement that inspects few workers.

    A worker that may take work sits, for each lane (pool and owner) it serves, on the shelf of its
    GPU family, region, number of free GPUs and largest usable VRAM, ordered by
    :func:`core.placement.base_score`. Since a worker's score is its base score times the geo term
    of its region, the shelves merged best first yield the workers in the exact order of the plain
    scan's ranking (score, then base score, then worker id): a placement reads only shelves of the
    requested family with enough free GPUs and VRAM, and stops once it holds ``max(slots, TOP_K)``
    workers that fit. Its decision, ``top`` included,
    equals :func:`core.placement.place`'s plain scan over :meth:`candidates`; so does whether a
    failure is permanent, which it computes from the distinct hardware profiles, not per worker.

    Workers that can take nothing (not available, ``max_concurrent`` reached) are only counted.
    When nothing fits, ``filtered`` counts those under ``state`` / ``policy_concurrency``, and
    workers on shelves with too few free GPUs or too little VRAM under ``gpus`` / ``vram``, without
    checking the filters before them (the plain scan names the first filter each fails); a placed
    request's ``filtered`` counts what was inspected, plus ``pruned``: matching workers not inspected.

    Keep it current: :meth:`take` / :meth:`release` for assignments made and ended,
    :meth:`upsert` / :meth:`remove` when a worker's record or heartbeat changes.
    """

    def __init__(self, candidates: Iterable[Candidate] = (), weights: RankWeights = DEFAULT_WEIGHTS) -> None:
        self.weights = weights
        self._by_id: dict[str, Candidate] = {}
        self._filed: dict[str, Filing] = {}
        # lane -> family -> region -> shelves, most free GPUs first; and each shelf by its key
        self._shelves: dict[Lane, dict[str, dict[str, list[Shelf]]]] = {}
        self._shelf: dict[tuple[Lane, str, str, int, int], list[Key]] = {}
        self._sizes: dict[Lane, Counter[str]] = {}  # lane -> family -> workers
        self._parked: dict[Lane, dict[str, Counter[str]]] = {}  # lane -> family -> state or policy
        self._profiles: dict[Lane, dict[str, Counter[Profile]]] = {}  # of workers not deregistered
        self._live: Counter[Lane] = Counter()
        for c in candidates:
            self.upsert(c)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, worker_id: str) -> Candidate | None:
        """The worker's current candidate, or ``None``."""
        return self._by_id.get(worker_id)

    def candidates(self) -> list[Candidate]:
        """Every candidate as it stands, by worker id."""
        return [self._by_id[w] for w in sorted(self._by_id)]

    def upsert(self, c: Candidate) -> None:
        """Add the worker or replace its candidate (re-shelved only where its filing changed)."""
        filed = filing(c, self.weights)
        old = self._filed.get(c.worker_id)
        self._by_id[c.worker_id] = c
        if old == filed:
            return  # e.g. new telemetry that moves neither its score nor its free VRAM
        if old is not None:
            self._file(old, -1)
        self._filed[c.worker_id] = filed
        self._file(filed, 1)

    def remove(self, worker_id: str) -> None:
        """Forget the worker (no-op if unknown)."""
        if self._by_id.pop(worker_id, None) is not None:
            self._file(self._filed.pop(worker_id), -1)

    def beat(self, worker_id: str, time_ns: int, interval_s: float) -> None:
        """Record a heartbeat (cheap: the worker stays on its shelf). Call it for every beat, or
        often enough that no live worker looks silent."""
        c = self._by_id.get(worker_id)
        if c is not None:
            self._by_id[worker_id] = msgspec.structs.replace(c, last_beat_ns=time_ns, interval_s=interval_s)

    def take(self, a: Assignment, request: PlacementRequest | None = None) -> None:
        """Count a new assignment on its worker (with ``request``'s per-slot CPUs and memory)."""
        c = self._by_id.get(a.worker_id)
        if c is not None:
            cpus, memory_mb = (request.cpus, request.memory_mb) if request else (0.0, 0)
            self.upsert(occupy(c, a, cpus=cpus, memory_mb=memory_mb))

    def release(self, a: Assignment, request: PlacementRequest | None = None) -> None:
        """Stop counting an assignment that ended or was revoked (``request`` as it was taken)."""
        c = self._by_id.get(a.worker_id)
        if c is not None:
            cpus, memory_mb = (request.cpus, request.memory_mb) if request else (0.0, 0)
            self.upsert(occupy(c, a, cpus=cpus, memory_mb=memory_mb, sign=-1))

    def _file(self, f: Filing, sign: int) -> None:
        """Shelve (``sign=1``) or unshelve (``-1``) a worker filed as ``f`` in each of its lanes."""
        for lane in f.lanes:
            self._sizes.setdefault(lane, Counter())[f.family] += sign
            if f.live:
                self._live[lane] += sign
                self._profiles.setdefault(lane, {}).setdefault(f.family, Counter())[f.profile] += sign
            if f.parked is not None:
                self._parked.setdefault(lane, {}).setdefault(f.family, Counter())[f.parked] += sign
            else:
                ordered = self._shelf.get((lane, f.family, f.region, f.free, f.vram))
                if ordered is None:
                    ordered = self._shelf[lane, f.family, f.region, f.free, f.vram] = []
                    regions = self._shelves.setdefault(lane, {}).setdefault(f.family, {})
                    bisect.insort(regions.setdefault(f.region, []), (-f.free, -f.vram, ordered))
                if sign > 0:
                    bisect.insort(ordered, f.key)
                else:
                    del ordered[bisect.bisect_left(ordered, f.key)]

    def place(
        self, request: PlacementRequest, weights: RankWeights | None = None, *, now_ns: int
    ) -> Placed | Unplaceable:
        """:func:`core.placement.place` over this index (``weights``: the index's, or ``None``)."""
        if weights is not None and weights != self.weights:
            raise ValueError("the index was built with other rank weights")
        d = Decision(request, self.weights, now_ns)
        sizes = self._sizes.get(d.lane, Counter())
        families = [f for f in sorted(sizes) if d.family is None or f == d.family]
        shelves = self._shelves.get(d.lane, {})
        gpus, vram_mb = request.gpus, request.vram_mb if request.gpus else 0
        heap: list[tuple[float, float, str, int, float, list[Key]]] = []
        for family in families:
            for region, by_free in shelves.get(family, {}).items():
                geo = d.geo(region)
                for neg_free, neg_vram, ordered in by_free:
                    if -neg_free < gpus:
                        break
                    if ordered and -neg_vram >= vram_mb:
                        neg_base, worker_id = ordered[0]
                        heap.append((neg_base * geo, neg_base, worker_id, 0, geo, ordered))
        heapq.heapify(heap)
        # (-score, -base, worker id) is the ranking's order, and each shelf is in that order too
        # (base x geo is monotonic in base), so the merge yields workers in exactly the plain
        # scan's order: stop at the first ``keep`` that fit.
        keep = max(len(request.slots), TOP_K)
        top: list[Ranked] = []
        failed: list[tuple[str, str]] = []  # (reason, state) of the workers that did not fit
        while heap and len(top) < keep:
            _, _, worker_id, at, geo, ordered = heap[0]
            if at + 1 < len(ordered):
                neg_base, after = ordered[at + 1]
                heapq.heapreplace(heap, (neg_base * geo, neg_base, after, at + 1, geo, ordered))
            else:
                heapq.heappop(heap)
            c = self._by_id[worker_id]
            reason, ranked = d.classify(c)
            if ranked is not None:
                top.append(ranked)
            else:
                failed.append((reason, c.state))
        lane_size = sum(sizes.values())
        in_type = sum(sizes[f] for f in families)
        filtered = Counter(reason for reason, _ in failed)
        filtered.update(pool=len(self) - lane_size, gpu_type=lane_size - in_type)
        pruned = filtered.copy()
        pruned["pruned"] = in_type - len(top) - len(failed)
        placed = gang(request, top, len(self), pruned)
        if placed is not None:
            return placed
        groups = Counter(group_of(reason, state) for reason, state in failed)
        for family in families:
            for kind, n in self._parked.get(d.lane, {}).get(family, Counter()).items():
                filtered["policy_concurrency" if kind == "policy_concurrency" else "state"] += n
                groups[kind if kind != "policy_concurrency" else "busy"] += n
            for by_free in shelves.get(family, {}).values():
                for neg_free, neg_vram, ordered in by_free:
                    short = "gpus" if -neg_free < gpus else "vram" if -neg_vram < vram_mb else ""
                    if short:
                        filtered[short] += len(ordered)
                        groups["busy" if short == "gpus" else short] += len(ordered)
        idle = self._idle(d, families)
        return unplaceable(d, len(self), filtered, groups, top, self._live[d.lane], idle)

    def _idle(self, d: Decision, families: list[str]) -> int:
        """:meth:`Decision.idle_enough` from the hardware profiles of ``families`` in the lane."""
        need, idle = len(d.request.slots), 0
        profiles = self._profiles.get(d.lane, {})
        for family in families:
            for (vram, cpus, memory), n in profiles.get(family, Counter()).items():
                idle += n * d.hardware_slots(vram, cpus, memory)
                if idle >= need:
                    return idle
        return idle
