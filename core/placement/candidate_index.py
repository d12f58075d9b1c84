"""The candidates placement chooses from, indexed.

:func:`projections.candidates.candidates` builds one :class:`core.placement.Candidate` per worker
from the projections.

:class:`CandidateIndex` keeps them ordered, and :meth:`CandidateIndex.place` is the decision the
coordinator makes: the same as :func:`core.placement.placing.place`'s plain scan (the reference the
tests compare it with), but where the scan costs one filter-and-score per registered worker, the
index inspects, in the common case, ``max(slots, TOP_K)`` workers plus those it finds unfit on the
way.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from core.placement.explaining import group_of, unplaceable
from core.placement.placing import gang
from core.placement.rules import CAPACITY, Decision, Lane, Ranked, base_score, lanes
from core.placement.values import (
    DEFAULT_WEIGHTS,
    TOP_K,
    Candidate,
    Placed,
    PlacementRequest,
    RankWeights,
    Unplaceable,
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
Room = tuple[int, float, float, float]  # free GPUs, and the bands of usable VRAM, free CPUs, free memory
Head = tuple[float, str, Room, list[Key]]  # a shelf by its best worker: (*its key, room, the shelf)
Profile = tuple[tuple[int, ...], int, int]  # (vram_limit_mb, cpus, memory_mb): what an idle host offers
# a shelf in the merge of CandidateIndex.place, by its next worker: (-score, -base score, worker id,
# the worker's place on the shelf, the geo term, the shelf, its group, the shelf's place in the group)
Entry = tuple[float, float, str, int, float, list[Key], list[Head], int]


class Filing(NamedTuple):
    """Where a candidate is filed: everything :meth:`CandidateIndex.place` reads off a worker
    without looking at the candidate itself."""

    key: Key
    family: str
    region: str
    lanes: tuple[Lane, ...]
    parked: str | None  # the state, or ``policy_concurrency``: on no shelf, only counted
    room: Room  # what its shelf offers (:func:`room_of`)
    profile: Profile
    live: bool  # not deregistered


VRAM_BANDS_PER_DOUBLING = 4
"""Shelves group workers by usable VRAM in bands about 19% wide: free VRAM comes from live telemetry
and is close to unique per worker, so a shelf per exact value would be a shelf per worker."""
HOST_BANDS_PER_DOUBLING = 1
"""Free CPUs and memory are banded by doublings: enough to keep full hosts off the shelves a
request reads."""


def band(value: float, per_doubling: int) -> float:
    """The top of the band ``value`` falls in, bands ``per_doubling`` to a doubling: at least
    ``value``, the same for every value of the band, and 0 for nothing left; so a shelf whose band
    top is below a request holds no worker that fits it."""
    if value <= 0:
        return 0
    step = math.floor(math.log2(value) * per_doubling)
    return max(value, 2 ** ((step + 1) / per_doubling))


def room_of(c: Candidate) -> Room:
    """What a worker offers a slot, coarsely: free GPUs exactly, then the bands of the most usable
    VRAM of one GPU, free CPUs and free memory (unlimited where the host does not report them, as
    :meth:`core.placement.Decision.capacity` does not check them there)."""
    vram = band(c.vram_usable_mb[-1] if c.vram_usable_mb else 0, VRAM_BANDS_PER_DOUBLING)
    cpus = band(c.cpus - c.cpus_used, HOST_BANDS_PER_DOUBLING) if c.cpus else math.inf
    memory = band(c.memory_mb - c.memory_used_mb, HOST_BANDS_PER_DOUBLING) if c.memory_mb else math.inf
    return max(0, c.gpus_total - c.gpus_used), vram, cpus, memory


def lacking(amounts: Room) -> int:
    """A bit per resource of ``amounts`` (GPUs, VRAM, CPUs, memory) that is zero: what a room has
    none of, or what a request does not need."""
    return sum(1 << i for i, amount in enumerate(amounts) if amount <= 0)


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
        room=room_of(c),
        profile=(tuple(c.vram_limit_mb), c.cpus, c.memory_mb),
        live=c.state != "deregistered",
    )


def _open_shelf(heap: list[Entry], group: list[Head], start: int, geo: float, need: Room) -> None:
    """Put the first shelf of ``group`` from ``start`` whose room reaches ``need`` on ``heap``."""
    gpus, vram_mb, cpus, memory_mb = need
    for at in range(start, len(group)):
        neg_base, worker_id, room, ordered = group[at]
        if room[0] >= gpus and room[1] >= vram_mb and room[2] >= cpus and room[3] >= memory_mb:
            heapq.heappush(heap, (neg_base * geo, neg_base, worker_id, 0, geo, ordered, group, at))
            return


class CandidateIndex:
    """Candidates kept in sorted lists ("shelves"), for placement that inspects few workers.

    A worker that may take work sits, for each lane (pool, owner, image or not) it serves, on the shelf of its
    GPU family, region and room (:func:`room_of`: free GPUs, and bands of usable VRAM, free CPUs
    and free memory), ordered by :func:`core.placement.base_score`. The shelves of one lane,
    family, region and set of resources they have none of (a *group*: one geo term for every worker
    in it; a request never reads a group that lacks what it needs, such as hosts whose CPUs are all
    taken, which keep their rank since the load term counts GPUs on a GPU host) are kept in the
    order of their best workers. A worker's score is its base score times its region's geo term, so merging
    the shelves best first yields the workers in the exact order of the plain scan's ranking (score,
    then base score, then worker id). The merge is lazy: it starts from the first shelf of each
    group whose room reaches the request, and opens a group's next
    such shelf only once the best worker of the previous one is taken, so a decision costs the
    groups plus the workers it inspects, not the shelves. It stops once it holds
    ``max(slots, TOP_K)`` workers that fit (a worker whose bands reach the request but whose exact
    VRAM, CPUs or memory do not is inspected and found unfit). Its decision, ``top`` included, equals
    :func:`core.placement.placing.place`'s plain scan over :meth:`candidates`; so does whether a failure is
    permanent, which it computes from the distinct hardware profiles, not per worker.

    Workers that can take nothing (not available, ``max_concurrent`` reached) are only counted.
    When nothing fits, ``filtered`` counts those under ``state`` / ``policy_concurrency``, and
    workers on shelves whose room falls short under the first of ``gpus`` / ``vram`` / ``cpus`` /
    ``memory`` it lacks, without checking the filters before them (the plain scan names the first
    filter each fails); a placed request's ``filtered`` counts what was inspected, plus ``pruned``:
    matching workers not inspected.

    Keep it current: :meth:`take` / :meth:`release` for assignments made and ended,
    :meth:`upsert` / :meth:`remove` when a worker's record or heartbeat changes.
    """

    def __init__(self, candidates: Iterable[Candidate] = (), weights: RankWeights = DEFAULT_WEIGHTS) -> None:
        self.weights = weights
        self._by_id: dict[str, Candidate] = {}
        self._filed: dict[str, Filing] = {}
        # lane -> family -> region -> what its shelves lack (:func:`lacking`) -> the group's
        # non-empty shelves, best first; and each shelf by its key
        self._groups: dict[Lane, dict[str, dict[str, dict[int, list[Head]]]]] = {}
        self._shelf: dict[tuple[Lane, str, str, Room], list[Key]] = {}
        self._sizes: defaultdict[Lane, Counter[str]] = defaultdict(Counter)  # lane -> family -> workers
        # lane -> family -> workers by state or policy; and by profile, of workers not deregistered
        self._parked: defaultdict[Lane, defaultdict[str, Counter[str]]] = defaultdict(
            lambda: defaultdict(Counter)
        )
        self._profiles: defaultdict[Lane, defaultdict[str, Counter[Profile]]] = defaultdict(
            lambda: defaultdict(Counter)
        )
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
            self._sizes[lane][f.family] += sign
            if f.live:
                self._live[lane] += sign
                self._profiles[lane][f.family][f.profile] += sign
            if f.parked is not None:
                self._parked[lane][f.family][f.parked] += sign
            else:
                self._shelve(lane, f, sign)

    def _shelve(self, lane: Lane, f: Filing, sign: int) -> None:
        """Put the worker on its shelf or take it off, keeping the group in the order of the
        shelves' best workers (a shelf left empty is dropped)."""
        shelf_key = (lane, f.family, f.region, f.room)
        ordered = self._shelf.setdefault(shelf_key, [])
        regions = self._groups.setdefault(lane, {}).setdefault(f.family, {})
        group = regions.setdefault(f.region, {}).setdefault(lacking(f.room), [])
        head = ordered[0] if ordered else None
        if sign > 0:
            bisect.insort(ordered, f.key)
        else:
            del ordered[bisect.bisect_left(ordered, f.key)]
        if ordered and ordered[0] == head:
            return
        if head is not None:
            del group[bisect.bisect_left(group, head)]  # a (key) tuple sorts just before its head entry
        if ordered:
            bisect.insort(group, (*ordered[0], f.room, ordered))
        else:
            del self._shelf[shelf_key]

    def place(
        self, request: PlacementRequest, weights: RankWeights | None = None, *, now_ns: int
    ) -> Placed | Unplaceable:
        """Place every slot of ``request`` or none, as :func:`core.placement.placing.place` would over
        :meth:`candidates` (the same assignments, ``top`` and permanence; ``filtered`` is coarser,
        see the class). ``weights``: the index's, or ``None``; others raise ``ValueError``."""
        if weights is not None and weights != self.weights:
            raise ValueError("the index was built with other rank weights")
        d = Decision(request, self.weights, now_ns)
        sizes = self._sizes.get(d.lane) or Counter()
        families = [f for f in sorted(sizes) if d.family is None or f == d.family]
        need: Room = (request.gpus, request.vram_mb if request.gpus else 0, request.cpus, request.memory_mb)
        top, failed = self._best(d, families, need)
        lane_size = sum(sizes.values())
        base = self._sizes.get((*d.lane[:2], False)) or Counter() if d.lane[2] else sizes
        in_pool = sum(base.values())  # the lane's pool and owner, images or not
        in_type = sum(sizes[f] for f in families)
        filtered = Counter(reason for reason, _ in failed)
        filtered.update(pool=len(self) - in_pool, image=in_pool - lane_size, gpu_type=lane_size - in_type)
        pruned = filtered.copy()
        pruned["pruned"] = in_type - len(top) - len(failed)
        placed = gang(request, top, len(self), pruned, self._domains)
        if placed is not None:
            return placed
        groups = Counter(group_of(reason, state) for reason, state in failed)
        self._count_unfit(d.lane, families, need, filtered, groups)
        idle = self._idle(d, families)
        return unplaceable(d, len(self), filtered, groups, top, self._live[d.lane], idle)

    def _domains(self, worker_id: str) -> dict[str, str]:
        return self._by_id[worker_id].domains

    def _best(
        self, d: Decision, families: list[str], need: Room
    ) -> tuple[list[Ranked], list[tuple[str, str]]]:
        """The first ``max(slots, TOP_K)`` workers of ``families`` that fit ``d``'s request, best
        first, merged lazily from the shelves with room for ``need``; and the ``(reason, state)``
        of the workers inspected on the way that did not fit."""
        heap: list[Entry] = []
        needed = ~lacking(need)  # shelves lacking any of these are kept apart, and never read
        groups_by_family = self._groups.get(d.lane, {})
        for family in families:
            for region, by_lack in groups_by_family.get(family, {}).items():
                geo = d.geo(region)
                for lack, group in by_lack.items():
                    if not lack & needed:
                        _open_shelf(heap, group, 0, geo, need)
        # (-score, -base, worker id) is the ranking's order; each shelf is in that order, and a
        # group's shelves are in the order of their first workers, so a shelf cannot yield a worker
        # before the first worker of the group's previous shelf: the merge yields workers in exactly
        # the plain scan's order. Stop at the first ``keep`` that fit.
        keep = len(self._by_id) if d.request.topology else max(len(d.request.slots), TOP_K)  # every domain
        top: list[Ranked] = []
        failed: list[tuple[str, str]] = []
        while heap and len(top) < keep:
            _, _, worker_id, at, geo, ordered, group, shelf_at = heapq.heappop(heap)
            if at + 1 < len(ordered):
                neg_base, after = ordered[at + 1]
                heapq.heappush(heap, (neg_base * geo, neg_base, after, at + 1, geo, ordered, group, shelf_at))
            if at == 0:
                _open_shelf(heap, group, shelf_at + 1, geo, need)
            c = self._by_id[worker_id]
            reason, ranked = d.classify(c)
            if ranked is not None:
                top.append(ranked)
            else:
                failed.append((reason, c.state))
        return top, failed

    def _count_unfit(
        self, lane: Lane, families: list[str], need: Room, filtered: Counter[str], groups: Counter[str]
    ) -> None:
        """Add to ``filtered`` and ``groups`` (by :func:`core.placement.group_of`) the workers of
        ``families`` the merge never inspected: those that can take nothing (not available,
        ``max_concurrent`` reached), and those on shelves whose room falls short of ``need``, under
        the first resource it lacks."""
        groups_by_family = self._groups.get(lane, {})
        for family in families:
            for kind, n in self._parked[lane][family].items():
                filtered["policy_concurrency" if kind == "policy_concurrency" else "state"] += n
                groups[kind if kind != "policy_concurrency" else "busy"] += n
            for by_lack in groups_by_family.get(family, {}).values():
                for _, _, room, ordered in itertools.chain(*by_lack.values()):  # the merge opened the others
                    short = next(
                        (r for r, have, n in zip(CAPACITY[1:], room, need, strict=True) if have < n), ""
                    )
                    if short:
                        filtered[short] += len(ordered)
                        groups[group_of(short, "available")] += len(ordered)

    def _idle(self, d: Decision, families: list[str]) -> int:
        """:meth:`Decision.idle_enough` from the hardware profiles of ``families`` in the lane."""
        need, idle = len(d.request.slots), 0
        profiles = self._profiles[d.lane]
        for family in families:
            for (vram, cpus, memory), n in profiles[family].items():
                idle += n * d.hardware_slots(vram, cpus, memory)
                if idle >= need:
                    return idle
        return idle
