"""The decision: filter and rank every candidate, then choose the gang (every slot or none), with
the assignment ids it gives."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.placement.explaining import group_of, unplaceable
from core.placement.rules import Decision, Ranked, lanes, rank_key
from core.placement.values import (
    DEFAULT_WEIGHTS,
    POLICY,
    TOP_K,
    Candidate,
    Placed,
    PlacementRequest,
    RankWeights,
    Unplaceable,
)
from schemas.values import Assignment, Provenance

if TYPE_CHECKING:
    from core.candidate_index import CandidateIndex


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
        index: a :class:`core.candidate_index.CandidateIndex` built with the same ``weights``: the
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


_ASSIGNMENT_ID = re.compile(r"^(.+)-s([0-9]+)-e([0-9]+)$")


def assignment_id(work_id: str, slot: int, epoch: int) -> str:
    """The id of the assignment of ``slot`` of ``work_id`` at ``epoch``: ``<work_id>-s<slot>-e<epoch>``."""
    return f"{work_id}-s{slot}-e{epoch}"


def parse_assignment_id(value: str) -> tuple[str, int, int] | None:
    """``(work_id, slot, epoch)`` of an :func:`assignment_id`, or ``None`` for another shape."""
    match = _ASSIGNMENT_ID.match(value)
    return None if match is None else (match[1], int(match[2]), int(match[3]))
