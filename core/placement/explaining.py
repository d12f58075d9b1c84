"""Placement's words: why a request cannot be placed (now, or ever), and the lines that explain a
provenance to a person (``resontech why``). They name exactly the filters and score terms of
:mod:`core.placement.rules`, so the two change together."""

from __future__ import annotations

from collections import Counter

from core.placement.rules import FILTERS, Decision, Ranked
from core.placement.values import POLICY, TOP_K, Unplaceable
from schemas.values import Provenance

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


_IMAGES = {False: "", True: " that run container images"}
"""How a lane's workers are named when the work names an image (only such workers take it)."""


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
        return None if r.pool == "shared" else f"tenant {r.tenant} has no {r.pool} workers{_IMAGES[r.image]}"
    if idle < len(r.slots):
        unit, shape = _unit_and_shape(d)
        where = f"the {r.pool} pool's workers{_IMAGES[True]}" if r.image else f"the {r.pool} pool"
        return f"{unit} need {shape}; {where} could hold at most {idle} of them even if idle"
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
        return Unplaceable(
            reason=f"waiting: no workers in the shared pool{_IMAGES[r.image]}", provenance=provenance
        )
    unit, shape = _unit_and_shape(d)
    have = sum(n for g, n in groups.items() if g != "deregistered") + len(feasible)
    who = f"{_plural(have, 'worker')} {'has' if have == 1 else 'have'} that GPU"
    if d.family is None:
        who = f"{_plural(have, 'worker')} in the {r.pool} pool{_IMAGES[r.image]}"
    parts = [f"{n} {_PREDICATES[g][n != 1]}" for g in _PREDICATES if (n := groups[g])]
    if feasible:
        room = sum(item[1] for item in feasible)
        parts.append(f"{len(feasible)} {'has' if len(feasible) == 1 else 'have'} room for only {room}")
    text = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return Unplaceable(reason=f"waiting: {unit} need {shape}; {who} but {text}", provenance=provenance)


REASONS: dict[str, str] = {
    "pool": "not in the pool (or not the tenant's)",
    "image": "runs no container images (the work names one)",
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
    """Human lines for ``resontech why``: what was considered, what was filtered and why, the network
    domain chosen (and those not), and the best-ranked workers with their score terms."""
    p = provenance
    lines = [f"{_plural(p.candidates, 'worker')} considered (policy {p.policy})"]
    order = {reason: i for i, reason in enumerate((*FILTERS, "pruned"))}
    for reason in sorted(p.filtered, key=lambda r: (order.get(r, len(order)), r)):
        lines.append(f"  {p.filtered[reason]} filtered out: {REASONS.get(reason, reason)}")
    if p.topology:
        lines.append(f"  network domain: {p.topology}")
    for i, card in enumerate(p.top, 1):
        terms = " x ".join(f"{name} {value:.3f}" for name, value in card.terms.items())
        lines.append(f"  #{i} {card.worker_id}: score {card.score:.3f} = {terms}")
    return lines
