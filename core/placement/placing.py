"""The decision: filter and rank every candidate, then choose the gang (every slot or none), with
the assignment ids it gives.

Assignment ids are the kernel's own, never a tenant's choice: tenants choose their job and endpoint
ids, and two tenants (or a job and an endpoint of one tenant) may choose the same one. Every key the
kernel and the agents act on (commands and their dedupe ids, starts remembered, the agent's epochs
and work directories, meter subjects, rate buckets) derives from the assignment id, so the id names
its tenant and kind too: ``<k><digest>-s<slot>-e<epoch>``, where ``k`` is ``j`` (job) or ``e``
(endpoint) and ``digest`` is 128 bits of BLAKE2b over ``(kind, tenant, work_id)``
(:func:`work_ref`). It is deterministic (a retried decision appends the same ids), 1-57 characters
of ``[a-z0-9-]`` (a subject token, a file name and a Kubernetes label value as it is). Ids stored
before (``<work_id>-s<slot>-e<epoch>``) keep their shape in the log; :func:`parse_assignment_id`
reads both.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from core.placement import topology
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
from schemas.values import Assignment, Provenance, WorkKind


def place(
    request: PlacementRequest,
    candidates: Sequence[Candidate],
    weights: RankWeights = DEFAULT_WEIGHTS,
    *,
    now_ns: int,
) -> Placed | Unplaceable:
    """Place every slot of ``request`` or none, by the plain scan: filter and rank every candidate.

    This is the reference the coordinator's
    :meth:`core.placement.candidate_index.CandidateIndex.place` reproduces while inspecting a few
    workers (the tests compare the two).

    Args:
        request: what to place.
        candidates: every worker.
        weights: the ranking's knobs.
        now_ns: the instant, Unix ns (heartbeat silence, maintenance windows, list price).

    Returns:
        :class:`Placed` with one assignment per slot, ids :func:`assignment_id` (a retried decision
        appends the same ids), or :class:`Unplaceable`.
    """
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
        if reason not in ("pool", "image", "gpu_type"):
            groups[group_of(reason, c.state)] += 1
    feasible.sort(key=rank_key)
    domains = {c.worker_id: c.domains for c in candidates} if request.topology else {}
    placed = gang(request, feasible, len(candidates), filtered, lambda w: domains.get(w, {}))
    if placed is not None:
        return placed
    live = sum(1 for c in candidates if d.lane in lanes(c) and c.state != "deregistered")
    idle = d.idle_enough(c for c in candidates if d.structural(c) is None)
    return unplaceable(d, len(candidates), filtered, groups, feasible, live, idle)


def gang(
    request: PlacementRequest,
    ranked: list[Ranked],
    total: int,
    filtered: Counter[str],
    domains_of: Callable[[str], Mapping[str, str]] = lambda _: {},
) -> Placed | Unplaceable | None:
    """Spread the slots over ``ranked`` workers (best first, one each, then round-robin), or ``None``
    when their capacity is short. A request naming a topology goes to the workers of one network
    domain (:func:`core.placement.topology.narrow`; ``domains_of``: a worker's domains), or is
    :class:`Unplaceable` saying why none has room."""
    need = len(request.slots)
    if sum(item[1] for item in ranked) < need:
        return None
    counts = {reason: n for reason, n in sorted(filtered.items()) if n}
    note = ""
    if request.topology is not None:
        narrowed = topology.narrow(request.topology, need, ranked, domains_of)
        if isinstance(narrowed, str):
            top = [item[0] for item in ranked[:TOP_K]]
            why = Provenance(candidates=total, filtered=counts, top=top, policy=POLICY, topology=narrowed)
            return Unplaceable(reason=narrowed, provenance=why)
        ranked, note = narrowed.ranked, narrowed.note
    chosen: list[str] = []
    rnd = 0
    while len(chosen) < need:
        chosen += [card.worker_id for card, slots, _ in ranked if slots > rnd][: need - len(chosen)]
        rnd += 1
    assignments = [
        Assignment(
            assignment_id=assignment_id(
                request.work_id, slot, request.epoch, tenant=request.tenant, kind=request.kind
            ),
            worker_id=worker_id,
            slot=slot,
            epoch=request.epoch,
            gpus=request.gpus,
        )
        for slot, worker_id in zip(request.slots, chosen, strict=True)
    ]
    top = [item[0] for item in ranked[: max(len(set(chosen)), TOP_K)]]
    provenance = Provenance(candidates=total, filtered=counts, top=top, policy=POLICY, topology=note)
    return Placed(assignments=assignments, provenance=provenance)


_ASSIGNMENT_ID = re.compile(r"^(.+)-s([0-9]+)-e([0-9]+)$")
_KIND_LETTER: dict[WorkKind, str] = {"job": "j", "endpoint": "e"}
_REF_DIGEST_BYTES = 16
"""128 bits: no two (tenant, kind, work id) share a reference, even when one party picks ids to try."""
_REF = re.compile(r"^[je][0-9a-f]{32}$")


@functools.lru_cache(maxsize=65_536)  # the coordinator asks about every live endpoint each step
def work_ref(tenant: str, kind: WorkKind, work_id: str) -> str:
    """The kernel's name of one job or endpoint, unique across tenants and kinds: ``j`` or ``e`` and
    32 hex digits of BLAKE2b-128 over the three parts, each length-prefixed (so no two different
    triples join to the same bytes)."""
    h = hashlib.blake2b(digest_size=_REF_DIGEST_BYTES, person=b"resontech-work")
    for part in (kind, tenant, work_id):
        raw = part.encode()
        h.update(len(raw).to_bytes(4, "big") + raw)
    return f"{_KIND_LETTER[kind]}{h.hexdigest()}"


def assignment_id(work_id: str, slot: int, epoch: int, *, tenant: str, kind: WorkKind) -> str:
    """The id of the assignment of ``slot`` of ``tenant``'s ``kind`` ``work_id`` at ``epoch``:
    ``<work_ref>-s<slot>-e<epoch>`` (:func:`work_ref`)."""
    return f"{work_ref(tenant, kind, work_id)}-s{slot}-e{epoch}"


def parse_assignment_id(value: str) -> tuple[str, int, int] | None:
    """``(head, slot, epoch)`` of an assignment id, or ``None`` for another shape. ``head`` is the
    :func:`work_ref` of an :func:`assignment_id`, or the work id itself in an id stored before
    assignment ids were scoped (``<work_id>-s<slot>-e<epoch>``): :func:`is_work_ref` tells which."""
    match = _ASSIGNMENT_ID.match(value)
    return None if match is None else (match[1], int(match[2]), int(match[3]))


def is_work_ref(head: str) -> bool:
    """Whether ``head`` (of :func:`parse_assignment_id`) has the shape of a :func:`work_ref`."""
    return bool(_REF.match(head))
