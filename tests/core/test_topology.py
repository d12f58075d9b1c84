"""Topology-aware placement: a gang that fits one network domain is placed inside one (the one with
the least room that fits); ``preferred`` climbs to wider levels and says so; ``required`` waits and
says which domain came closest; a domain is its provider's; the index places as the plain scan."""

from __future__ import annotations

import random

import pytest

from core.placement.candidate_index import CandidateIndex
from core.placement.explaining import explain
from core.placement.placing import place
from core.placement.rules import Decision
from core.placement.values import DEFAULT_WEIGHTS, Candidate, Placed, Unplaceable
from projections.candidates import domains_of
from schemas.values import TOPOLOGY_LEVELS, TopologyRequest
from schemas.workers import WorkerRegistered
from tests.support.placement_hosts import NOW, host, placement_request


def in_domains(worker_id: str, gpus: int = 4, **domains: str) -> Candidate:
    return host(
        worker_id,
        gpus_total=gpus,
        vram_usable_mb=[40960] * gpus,
        vram_limit_mb=[40960] * gpus,
        domains=domains,
    )


def gang_of(shards: int, level: str, mode: str = "required") -> object:
    want = TopologyRequest(level=level, mode=mode)  # type: ignore[arg-type]
    return placement_request(slots=list(range(shards)), gpus=4, topology=want)


def domain_of(result: Placed, fleet: list[Candidate], level: str) -> set[str]:
    by_id = {c.worker_id: c for c in fleet}
    return {by_id[a.worker_id].domains.get(level, "") for a in result.assignments}


def test_a_gang_goes_to_the_domain_with_the_least_room_that_fits_and_says_why() -> None:
    fleet = [
        in_domains("a1", rack="p/r1"),  # r1: room for 1 (too small)
        in_domains("b1", rack="p/r2"),
        in_domains("b2", rack="p/r2"),
        in_domains("b3", rack="p/r2"),  # r2: room for 3
        in_domains("c1", rack="p/r3"),
        in_domains("c2", rack="p/r3"),  # r3: room for 2: fits with the least room
        in_domains("free"),  # in no rack
    ]
    result = place(gang_of(2, "rack"), fleet, now_ns=NOW)
    assert isinstance(result, Placed)
    assert sorted(a.worker_id for a in result.assignments) == ["c1", "c2"]
    note = result.provenance.topology
    assert note.startswith("rack p/r3 (room for 2 of 2)")
    assert "p/r2 (3)" in note and "p/r1 (1, too small)" in note
    assert "  network domain: rack p/r3 (room for 2 of 2)" in "\n".join(explain(result.provenance))


def test_required_waits_and_names_the_closest_domain() -> None:
    fleet = [in_domains("a1", rack="p/r1"), in_domains("a2", rack="p/r1"), in_domains("b1", rack="p/r2")]
    result = place(gang_of(3, "rack"), fleet, now_ns=NOW)
    assert isinstance(result, Unplaceable) and not result.permanent
    assert result.reason == "no rack domain has room for 3 shards (the roomiest, p/r1, has room for 2)"
    assert result.provenance.topology == result.reason
    unlabelled = place(gang_of(2, "rack"), [host("x"), host("y")], now_ns=NOW)
    assert isinstance(unlabelled, Unplaceable)
    assert unlabelled.reason.endswith("(no worker with room names one)")


def test_preferred_climbs_to_a_wider_level_then_places_across_domains_and_says_so() -> None:
    fleet = [
        in_domains("a1", rack="p/r1", block="p/b1"),
        in_domains("a2", rack="p/r2", block="p/b1"),
        in_domains("c1", rack="p/r3", block="p/b2"),
    ]
    climbed = place(gang_of(2, "rack", "preferred"), fleet, now_ns=NOW)
    assert isinstance(climbed, Placed)
    assert sorted(a.worker_id for a in climbed.assignments) == ["a1", "a2"]
    assert climbed.provenance.topology.startswith(
        "preferred rack: no rack domain had room; climbed to block p/b1 (room for 2 of 2)"
    )
    across = place(gang_of(3, "rack", "preferred"), fleet, now_ns=NOW)
    assert isinstance(across, Placed) and len({a.worker_id for a in across.assignments}) == 3
    assert across.provenance.topology == (
        "preferred rack: no domain at any level has room for 3; placed across domains"
    )
    required = place(gang_of(3, "rack"), fleet, now_ns=NOW)
    assert isinstance(required, Unplaceable)


def test_a_domain_is_its_providers_so_no_worker_joins_another_providers_rack() -> None:
    honest = WorkerRegistered(provider="acme-gpus", hostname="h1", topology={"rack": "r1"})
    mallory = WorkerRegistered(provider="mallory", hostname="m1", topology={"rack": "r1"})
    assert domains_of(honest) == {"rack": "acme-gpus/r1"} != domains_of(mallory)
    fleet = [
        in_domains("honest-1", **domains_of(honest)),
        in_domains("mallory-1", **domains_of(mallory)),
        in_domains("mallory-2", **domains_of(mallory)),
    ]
    result = place(gang_of(2, "rack"), fleet, now_ns=NOW)
    assert isinstance(result, Placed)
    assert sorted(a.worker_id for a in result.assignments) == ["mallory-1", "mallory-2"]  # its own rack only
    assert place(gang_of(3, "rack"), fleet, now_ns=NOW).reason.startswith("no rack domain has room for 3")  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", range(30))
def test_a_gang_that_fits_one_domain_is_always_placed_inside_one_and_the_index_agrees(seed: int) -> None:
    rng = random.Random(seed)
    fleet = []
    for n in range(rng.randint(5, 60)):
        domains = {
            level: f"p{rng.randint(0, 1)}/{level}{rng.randint(0, 6)}"
            for level in TOPOLOGY_LEVELS
            if rng.random() < 0.8
        }
        gpus = rng.choice([1, 2, 4, 8])
        used = rng.randint(0, gpus)
        vram = [40960] * gpus
        uptime = rng.uniform(0.9, 1.0)
        fleet.append(
            host(
                f"w{n:03d}",
                gpus_total=gpus,
                gpus_used=used,
                vram_usable_mb=vram,
                vram_limit_mb=vram,
                uptime=uptime,
                domains=domains,
            )
        )
    level = rng.choice(TOPOLOGY_LEVELS)
    mode = rng.choice(["required", "preferred"])
    shards = rng.randint(1, 6)
    request = placement_request(
        slots=list(range(shards)), gpus=1, topology=TopologyRequest(level=level, mode=mode)
    )
    result = place(request, fleet, now_ns=NOW)
    room: dict[str, int] = {}
    decision = Decision(request, DEFAULT_WEIGHTS, NOW)
    for c in fleet:
        _, ranked = decision.classify(c)  # the slots the worker can take, as placement counts them
        if ranked is not None and c.domains.get(level):
            room[c.domains[level]] = room.get(c.domains[level], 0) + ranked[1]
    fits = {d for d, r in room.items() if r >= shards}
    if fits:
        assert isinstance(result, Placed)
        [chosen] = domain_of(result, fleet, level)
        assert chosen in fits and room[chosen] == min(room[d] for d in fits)
    elif mode == "required":
        assert isinstance(result, Unplaceable)
    indexed = CandidateIndex(rng.sample(fleet, len(fleet))).place(request, now_ns=NOW)
    assert type(indexed) is type(result)
    if isinstance(result, Placed):
        assert isinstance(indexed, Placed)
        assert indexed.assignments == result.assignments
        assert indexed.provenance.topology == result.provenance.topology
    else:
        assert indexed.reason == result.reason
