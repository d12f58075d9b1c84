"""Topology-aware placement: a gang inside the smallest network domain that has room for it.

A request may name a level (:data:`schemas.values.TOPOLOGY_LEVELS`: ``clique``, ``switch``, ``rack``,
``block``, ``zone``) and a mode, as Kueue's topology-aware scheduling does:

* ``required``: every slot goes to workers of one domain of that level, or none is placed (the work
  waits, saying which domain came closest);
* ``preferred``: one domain of that level if one has room, else one of the next wider level, and so
  on; across domains when none at any level has room. The provenance says where it climbed.

Among the domains with room, the one with the least room wins (best fit: the larger domains stay whole
for larger gangs), ties going to the domain whose best worker ranks first; inside it, the slots spread
over its workers as any gang's do, best first. A worker without a domain at a level is in none.

A worker's domains are its provider's claim (and a Kubernetes node's labels its cluster's): they are
read as ``<provider>/<name>`` (:func:`projections.candidates.domains_of`), so equal names of two
providers are two domains, and no worker places itself into another provider's domain.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from core.placement.rules import Ranked
from schemas.values import TOPOLOGY_LEVELS, TopologyRequest

SHOWN = 5
"""Rejected domains a provenance names (the rest are counted)."""


@dataclass(frozen=True, slots=True)
class Narrowed:
    """The workers a gang goes to (in rank order) and what the provenance says about the domain."""

    ranked: list[Ranked]
    note: str


def narrow(
    want: TopologyRequest, need: int, ranked: Sequence[Ranked], domains_of: Callable[[str], Mapping[str, str]]
) -> Narrowed | str:
    """The workers of the domain ``need`` slots go to, or why none has room (``required`` only).

    Args:
        want: the request's level and mode.
        need: slots to place.
        ranked: every feasible worker, best first, with the slots it can take.
        domains_of: a worker's domains by level.
    """
    levels = (
        TOPOLOGY_LEVELS[TOPOLOGY_LEVELS.index(want.level) :] if want.mode == "preferred" else (want.level,)
    )
    closest = ""
    for level in levels:
        groups: dict[str, list[Ranked]] = {}
        for item in ranked:
            domain = domains_of(item[0].worker_id).get(level)
            if domain:
                groups.setdefault(domain, []).append(item)
        room = {domain: sum(item[1] for item in items) for domain, items in groups.items()}
        fits = [domain for domain in groups if room[domain] >= need]  # in the order of their best worker
        if fits:
            best = min(fits, key=lambda domain: room[domain])
            return Narrowed(groups[best], _note(want, level, best, room, fits, need))
        if level == want.level and room:
            roomiest = max(room, key=lambda domain: room[domain])
            closest = f" (the roomiest, {roomiest}, has room for {room[roomiest]})"
    if want.mode == "required":
        closest = closest or " (no worker with room names one)"
        return f"no {want.level} domain has room for {need} shards{closest}"
    return Narrowed(
        list(ranked),
        f"preferred {want.level}: no domain at any level has room for {need}; placed across domains",
    )


def _note(
    want: TopologyRequest, level: str, best: str, room: dict[str, int], fits: list[str], need: int
) -> str:
    head = f"{level} {best} (room for {room[best]} of {need})"
    if level != want.level:
        head = f"preferred {want.level}: no {want.level} domain had room; climbed to {head}"
    others = sorted((d for d in room if d != best), key=lambda d: (d not in fits, -room[d], d))
    if others:
        shown = ", ".join(f"{d} ({room[d]}{'' if d in fits else ', too small'})" for d in others[:SHOWN])
        more = f" and {len(others) - SHOWN} more" if len(others) > SHOWN else ""
        head += f"; not chosen: {shown}{more}"
    return head


__all__ = ["Narrowed", "narrow"]
