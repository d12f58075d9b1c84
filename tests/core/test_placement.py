"""Placement: every filter, the ranking and its terms, gang and spread, determinism, permanent vs
waiting, the candidates built from the projections, and the index agreeing with the plain scan."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from core.placement.candidate_index import VRAM_BANDS_PER_DOUBLING, CandidateIndex, band, occupy
from core.placement.explaining import explain
from core.placement.placing import place, work_ref
from core.placement.rules import FILTERS, in_maintenance
from core.placement.values import Candidate, Placed, PlacementRequest, RankWeights, Unplaceable
from core.pricing import list_price_micros
from projections.candidates import candidate_of, candidates
from projections.endpoints import EndpointsState, ReplicaRecord
from projections.liveness import LastBeat, LivenessState
from projections.registry import RegistryState
from projections.schedule import ScheduleState
from schemas.jobs import JobResources
from schemas.values import Assignment, Gpu, GpuTelemetry
from schemas.workers import MaintenanceWindow, WorkerPolicy
from tests.support.placement_hosts import NOW, S, host, outcome, placement_request, utc
from tests.support.projection_records import endpoint_record, job_record, worker_record

replace = msgspec.structs.replace


def placed(result: Placed | Unplaceable) -> Placed:
    assert isinstance(result, Placed), result
    return result


def failed(result: Placed | Unplaceable) -> Unplaceable:
    assert isinstance(result, Unplaceable), result
    return result


def workers(result: Placed | Unplaceable) -> list[str]:
    return [a.worker_id for a in placed(result).assignments]


# --- filters -----------------------------------------------------------------------------------------

POLICY = WorkerPolicy
FILTER_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("pool", {"pool": "managed", "owner_tenant": "acme"}, {}),  # reserved: no shared work
    ("pool", {"pool": "private", "owner_tenant": "other"}, {"pool": "private"}),
    ("pool", {}, {"pool": "managed"}),  # managed work never goes to shared workers
    ("pool", {"pool": "managed", "owner_tenant": None}, {"pool": "managed"}),
    ("image", {}, {"image": True}),  # an agent's host runs no images
    ("image", {"sandbox": "bubblewrap"}, {"image": True}),
    ("pool", {"sandbox": "kubernetes"}, {"pool": "managed", "image": True}),  # the lane's pool first
    ("gpu_type", {}, {"gpu_type": "H100"}),
    ("state", {"state": "cordoned"}, {}),
    ("state", {"state": "lost"}, {}),
    ("state", {"state": "deregistered"}, {}),
    ("silent", {"last_beat_ns": None}, {}),
    ("silent", {"last_beat_ns": NOW - 4 * S}, {}),  # 3 intervals of 1 s
    ("excluded", {}, {"exclude_workers": frozenset({"w1"})}),
    ("policy_tenant", {"policy": POLICY(allowed_tenants=["other"])}, {}),
    ("policy_pool", {"policy": POLICY(allowed_pools=["private"])}, {}),
    ("policy_price", {"policy": POLICY(min_price_micros_per_gpu_hour=1_500_000)}, {}),
    ("policy_price", {"policy": POLICY(min_price_micros_per_gpu_hour=10)}, {"price_micros_per_gpu_hour": 9}),
    (
        "maintenance",
        {"policy": POLICY(maintenance=[MaintenanceWindow(weekday=2, start_minute=700, end_minute=740)])},
        {},
    ),
    ("policy_concurrency", {"policy": POLICY(max_concurrent=2), "assignments": 2}, {}),
    ("gpus", {"gpus_used": 3}, {"gpus": 2}),
    ("gpus", {"gpu_family": "cpu", "gpus_total": 0, "vram_usable_mb": [], "vram_limit_mb": []}, {}),
    ("vram", {"vram_usable_mb": [1000, 1000, 1000, 50000]}, {"gpus": 2, "vram_mb": 40000}),
    ("vram", {"vram_usable_mb": [32768] * 4, "vram_limit_mb": [32768] * 4}, {"vram_mb": 40000}),
    ("cpus", {"cpus": 8, "cpus_used": 7.5}, {"cpus": 1.0}),
    ("memory", {"memory_mb": 8192, "memory_used_mb": 8000}, {"memory_mb": 1024}),
]


@pytest.mark.parametrize(("reason", "worker", "req"), FILTER_CASES)
def test_every_filter_reason(reason: str, worker: dict[str, Any], req: dict[str, Any]) -> None:
    result = failed(place(placement_request(**req), [host("w1", **worker)], now_ns=NOW))
    assert result.provenance.filtered == {reason: 1}
    assert result.provenance.candidates == 1


def test_every_reason_is_covered() -> None:
    assert {case[0] for case in FILTER_CASES} == set(FILTERS)


def test_first_failing_filter_is_counted() -> None:
    worker = host("w1", state="cordoned", gpus_used=4, policy=POLICY(allowed_tenants=["x"]))
    assert failed(place(placement_request(), [worker], now_ns=NOW)).provenance.filtered == {"state": 1}


def test_pool_lanes() -> None:
    managed = host("m1", pool="managed", owner_tenant="acme")
    lending = host(
        "m2", pool="managed", owner_tenant="acme", policy=POLICY(allowed_pools=["managed", "shared"])
    )
    private = host("p1", pool="private", owner_tenant="acme")
    fleet = [managed, lending, private]
    assert workers(place(placement_request(pool="managed", slots=[0, 1]), fleet, now_ns=NOW)) == ["m1", "m2"]
    assert workers(place(placement_request(tenant="other"), fleet, now_ns=NOW)) == ["m2"]  # backfill
    assert workers(place(placement_request(pool="private"), fleet, now_ns=NOW)) == ["p1"]
    assert failed(place(placement_request(pool="private", tenant="other"), fleet, now_ns=NOW)).permanent


def test_vram_fit_uses_the_least_of_free_gpus_and_usable_vram() -> None:
    # 2 GPUs taken; telemetry says 3 have 40 GB free: only 2 are free to assign
    worker = host("w1", gpus_used=2, vram_usable_mb=[0, 40960, 40960, 40960])
    assert workers(place(placement_request(gpus=2, vram_mb=40960), [worker], now_ns=NOW)) == ["w1"]
    assert failed(place(placement_request(gpus=3), [worker], now_ns=NOW)).provenance.filtered == {"gpus": 1}


def test_list_price_is_the_default_tenant_price() -> None:
    a100 = list_price_micros("A100", "shared")
    worker = host("w1", policy=POLICY(min_price_micros_per_gpu_hour=a100))
    assert workers(place(placement_request(), [worker], now_ns=NOW)) == ["w1"]
    dearer = host("w1", policy=POLICY(min_price_micros_per_gpu_hour=a100 + 1))
    assert failed(place(placement_request(), [dearer], now_ns=NOW)).provenance.filtered == {"policy_price": 1}
    lent = replace(dearer, pool="managed", owner_tenant="acme")
    assert workers(place(placement_request(pool="managed"), [lent], now_ns=NOW)) == [
        "w1"
    ]  # managed pays +25%
    cpu_work = placement_request(gpus=0)  # CPU work pays no GPU-hour: the GPU price policy does not apply
    assert workers(place(cpu_work, [dearer], now_ns=NOW)) == ["w1"]


def test_cpu_work_on_a_host_without_gpus() -> None:
    cpu_host = host("c1", gpu_family="cpu", gpus_total=0, vram_usable_mb=[], vram_limit_mb=[], cpus=4)
    result = placed(
        place(placement_request(gpus=0, cpus=2, slots=[0, 1], gpu_type="A100"), [cpu_host], now_ns=NOW)
    )
    assert [a.worker_id for a in result.assignments] == ["c1", "c1"]
    assert [a.gpus for a in result.assignments] == [0, 0]
    assert failed(place(placement_request(gpus=0, cpus=2, slots=[0, 1, 2]), [cpu_host], now_ns=NOW)).permanent
    full_gpu_host = host("g1", gpus_used=4)  # every GPU taken, CPU work still fits
    assert workers(place(placement_request(gpus=0), [full_gpu_host], now_ns=NOW)) == ["g1"]


# --- maintenance windows --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("windows", "now", "inside"),
    [
        ([(0, 0, 60)], utc(2, 0, 0), True),  # Monday 00:00, first minute
        ([(0, 0, 60)], utc(2, 0, 59), True),
        ([(0, 0, 60)], utc(2, 1, 0), False),  # the end is exclusive
        ([(0, 0, 60)], utc(1, 23, 59), False),  # Sunday night is not Monday
        ([(6, 1380, 1440)], utc(1, 23, 59), True),  # until the end of Sunday
        ([(6, 1380, 1440)], utc(2, 0, 0), False),
        ([(6, 1380, 60)], utc(1, 23, 30), True),  # Sunday 23:00 -> Monday 01:00, across the week
        ([(6, 1380, 60)], utc(2, 0, 30), True),
        ([(6, 1380, 60)], utc(2, 1, 0), False),
        ([(6, 1380, 60)], utc(1, 22, 59), False),
        ([(2, 1380, 1500)], utc(5, 0, 59), True),  # an end past 24:00 spills into Thursday
        ([(2, 600, 600)], utc(4, 10, 0), False),  # empty
        ([(1, 0, 1440), (3, 0, 1440)], NOW, False),
        ([(1, 0, 1440), (2, 0, 1440)], NOW, True),
    ],
)
def test_maintenance_windows(windows: list[tuple[int, int, int]], now: int, inside: bool) -> None:
    parsed = [MaintenanceWindow(weekday=d, start_minute=s, end_minute=e) for d, s, e in windows]
    assert in_maintenance(parsed, now) is inside


# --- ranking ---------------------------------------------------------------------------------------


def test_score_terms() -> None:
    worker = host("w1", uptime=0.98, tier="platinum", region="eu-west-1", gpus_used=1, util=0.2)
    card = placed(place(placement_request(region="eu-west-1"), [worker], now_ns=NOW)).provenance.top[0]
    assert card.terms == {"uptime": 0.98, "tier": 1.0, "geo": 1.0, "load": 1 - 0.5 * 0.25}
    assert card.score == pytest.approx(0.98 * 0.875)
    near = placed(place(placement_request(region="eu-central-1"), [worker], now_ns=NOW)).provenance.top[0]
    far = placed(place(placement_request(region="us-east-1"), [worker], now_ns=NOW)).provenance.top[0]
    assert (near.terms["geo"], far.terms["geo"]) == (0.85, 0.7)
    hot = placed(place(placement_request(), [replace(worker, util=0.9)], now_ns=NOW)).provenance.top[0]
    assert hot.terms["load"] == pytest.approx(0.55)  # live utilisation beats the assigned share


def test_ranking_order_and_weights() -> None:
    fleet = [
        host("a-silver", tier="silver", uptime=0.91),
        host("b-platinum", tier="platinum", uptime=0.995, region="eu-west-1"),
        host("c-gold-far", tier="gold", uptime=0.99, region="us-east-1"),
        host("d-gold-near", tier="gold", uptime=0.99, region="eu-west-1"),
        host("e-gold-busy", tier="gold", uptime=0.99, region="eu-west-1", gpus_used=3),
    ]
    req = placement_request(region="eu-west-1")
    order = [c.worker_id for c in placed(place(req, fleet, now_ns=NOW)).provenance.top]
    assert order == ["b-platinum", "d-gold-near", "c-gold-far", "e-gold-busy", "a-silver"]
    # without tier factors the silver host (0.91 x far 0.7) overtakes the busy gold one (0.99 x 0.625)
    flat = RankWeights(tier_factors=dict.fromkeys(("platinum", "gold", "silver", "unverified"), 1.0))
    order = [c.worker_id for c in placed(place(req, fleet, flat, now_ns=NOW)).provenance.top]
    assert order == ["b-platinum", "d-gold-near", "c-gold-far", "a-silver", "e-gold-busy"]


def test_ties_break_by_worker_id() -> None:
    fleet = [host(w) for w in ("w3", "w1", "w2")]
    assert workers(place(placement_request(slots=[0, 1]), fleet, now_ns=NOW)) == ["w1", "w2"]


# --- gang and spread -------------------------------------------------------------------------------


def test_gang_is_all_or_nothing() -> None:
    fleet = [host("w1", gpus_used=3), host("w2", gpus_used=3)]
    result = failed(place(placement_request(slots=[0, 1, 2]), fleet, now_ns=NOW))
    assert not result.permanent
    assert "room for only 2" in result.reason
    assert len(placed(place(placement_request(slots=[0, 1]), fleet, now_ns=NOW)).assignments) == 2


def test_spread_first_then_round_robin() -> None:
    fleet = [host("w1", uptime=0.99), host("w2", uptime=0.98), host("w3", gpus_used=2)]
    assert workers(place(placement_request(slots=[0, 1, 2]), fleet, now_ns=NOW)) == ["w1", "w2", "w3"]
    # 7 slots of 1 GPU on capacities 4, 4, 2: one each, then a second each, then w1 and w2
    seven = place(placement_request(slots=list(range(7))), fleet, now_ns=NOW)
    assert workers(seven) == ["w1", "w2", "w3", "w1", "w2", "w3", "w1"]
    assert failed(place(placement_request(slots=list(range(11))), fleet, now_ns=NOW)).reason.startswith(
        "waiting"
    )


def test_assignments_are_deterministic_and_idempotent() -> None:
    fleet = [host(f"w{i}", uptime=0.9 + i / 100, util=(i % 3) / 10) for i in range(10)]
    req = placement_request(work_id="job-7", slots=[2, 5], epoch=4)
    first = placed(place(req, fleet, now_ns=NOW))
    ref = work_ref("acme", "job", "job-7")
    assert [a.assignment_id for a in first.assignments] == [f"{ref}-s2-e4", f"{ref}-s5-e4"]
    assert [(a.slot, a.epoch, a.gpus) for a in first.assignments] == [(2, 4, 1), (5, 4, 1)]
    for seed in range(5):
        shuffled = fleet[:]
        random.Random(seed).shuffle(shuffled)
        assert place(req, shuffled, now_ns=NOW) == first


# --- permanent vs waiting --------------------------------------------------------------------------


def test_waiting_says_why() -> None:
    fleet = [
        host("w1", state="cordoned"),
        host("w2", gpus_used=4),
        host("w3", gpus_used=4),
        host("t4", gpu_family="T4"),
    ]
    result = failed(
        place(
            placement_request(slots=[0, 1], gpu_type="NVIDIA A100-SXM4-40GB", vram_mb=40960),
            fleet,
            now_ns=NOW,
        )
    )
    assert not result.permanent
    assert result.reason == (
        "waiting: 2 shards need 1x A100 with 40 GB free; "
        "3 workers have that GPU but 1 is cordoned and 2 are busy"
    )
    assert result.provenance.filtered == {"gpu_type": 1, "state": 1, "gpus": 2}


def test_permanent_when_the_fleet_could_never_hold_it() -> None:
    fleet = [host("w1"), host("w2", state="lost"), host("w3", state="deregistered", gpus_total=8)]
    assert failed(place(placement_request(gpus=8), fleet, now_ns=NOW)).permanent  # the 8-GPU host is gone
    assert failed(place(placement_request(vram_mb=80000), fleet, now_ns=NOW)).permanent
    assert failed(place(placement_request(gpu_type="H100"), fleet, now_ns=NOW)).permanent
    assert (
        failed(place(placement_request(pool="managed"), fleet, now_ns=NOW)).reason
        == "tenant acme has no managed workers"
    )
    assert failed(place(placement_request(slots=list(range(9)), gpus=1), fleet, now_ns=NOW)).permanent
    lost_only = fleet[1:2]
    assert not failed(
        place(placement_request(slots=list(range(4))), lost_only, now_ns=NOW)
    ).permanent  # it may return


def test_empty_shared_pool_waits() -> None:
    result = failed(place(placement_request(), [], now_ns=NOW))
    assert (result.permanent, result.reason) == (False, "waiting: no workers in the shared pool")


def test_work_that_names_an_image_runs_only_on_workers_that_run_images() -> None:
    node, agent = host("node", sandbox="kubernetes"), host("agent", sandbox="bubblewrap", uptime=1.0)
    assert workers(place(placement_request(image=True), [agent, node], now_ns=NOW)) == ["node"]
    assert workers(place(placement_request(), [agent, node], now_ns=NOW)) == ["agent"]  # plain work: either
    refused = failed(place(placement_request(image=True), [agent], now_ns=NOW))
    assert (refused.permanent, refused.reason) == (
        False,
        "waiting: no workers in the shared pool that run container images",
    )
    assert refused.provenance.filtered == {"image": 1}
    assert "  1 filtered out: runs no container images (the work names one)" in explain(refused.provenance)
    own = host("own", pool="private", owner_tenant="acme", sandbox="bubblewrap")
    never = failed(place(placement_request(pool="private", image=True), [own], now_ns=NOW))
    assert (never.permanent, never.reason) == (
        True,
        "tenant acme has no private workers that run container images",
    )
    small = failed(place(placement_request(slots=[0, 1], gpus=4, image=True), [node, agent], now_ns=NOW))
    assert small.permanent
    assert "the shared pool's workers that run container images could hold at most 1" in small.reason


def test_explain() -> None:
    fleet = [host("w1"), host("w2", state="cordoned")]
    lines = explain(placed(place(placement_request(), fleet, now_ns=NOW)).provenance)
    assert lines[0] == "2 workers considered (policy rank-v1)"
    assert lines[1] == "  1 filtered out: cordoned, lost, deregistered or not verified yet"
    assert lines[2].startswith("  #1 w1: score 0.873 = uptime 0.970 x tier 0.900 x geo 1.000 x load 1.000")


# --- candidates from the projections ---------------------------------------------------------------


def test_candidates_from_the_projections() -> None:
    gpus = [
        Gpu(index=i, model="NVIDIA A100-SXM4-40GB", vram_total_mb=40960, vram_free_mb=40000) for i in range(3)
    ]
    gpus.append(Gpu(index=3, model="Tesla T4", vram_total_mb=16384, vram_free_mb=16000))
    day = 86_400 * S
    registry = RegistryState(
        workers={
            "w1": worker_record(
                worker_id="w1",
                provider="p",
                hostname="h1",
                region="eu-west-1",
                gpus=gpus,
                cpus=32,
                memory_mb=65536,
                policy=WorkerPolicy(max_vram_fraction=0.5),
                since_ns=NOW - 10 * day,
                verified=True,
            ),
            "w0": worker_record(worker_id="w0", provider="p", hostname="h0", cpus=4, since_ns=NOW - day // 2),
        }
    )
    telemetry = [
        GpuTelemetry(index=0, util_pct=50.0, mem_used_mb=30000),
        GpuTelemetry(index=1, util_pct=10.0),
    ]
    liveness = LivenessState(
        beats={
            "w1": LastBeat(seq=1, time_ns=NOW - S, interval_s=2.0, gpus=telemetry),
            "w0": LastBeat(seq=2, time_ns=NOW, interval_s=1.0, cpu_pct=25.0),
        }
    )
    a = Assignment(assignment_id="j-s0-e1", worker_id="w1", slot=0, epoch=1, gpus=2)
    job = job_record(
        tenant="acme",
        job_id="j",
        name="j",
        kind="process",
        shards=1,
        resources=JobResources(gpus=2, cpus=4, memory_mb=8192),
        assignments={"0": a},
        state="running",
    )
    done = replace(job, job_id="old", state="completed")
    replica = ReplicaRecord(assignment_id="e-r0-e1", worker_id="w1", slot=0, epoch=1, gpus=1, state="ready")
    lost = replace(replica, slot=1, state="lost")
    endpoint = endpoint_record(
        tenant="acme", endpoint_id="e", name="e", model="m", replicas={"0": replica, "1": lost}
    )
    schedule = ScheduleState(jobs={"acme/j": job, "acme/old": done})
    table = EndpointsState(endpoints={"acme/e": endpoint})
    w0, w1 = candidates(registry, liveness, schedule, table, NOW)
    assert (w1.worker_id, w1.gpu_family, w1.gpus_total, w1.gpus_used, w1.assignments) == (
        "w1",
        "A100",
        3,
        3,
        2,
    )
    assert w1.vram_limit_mb == [20480] * 3
    assert w1.vram_usable_mb == [10960, 20480, 20480]  # GPU 0: 40960 - 30000 used; others capped at 50%
    assert (w1.cpus_used, w1.memory_used_mb) == (4.0, 8192)
    assert w1.util == pytest.approx(0.3)
    assert (w1.last_beat_ns, w1.interval_s, w1.uptime) == (NOW - S, 2.0, 1.0)
    assert w1.tier == "gold"  # 100% uptime, but the T4 keeps the host out of the A100 / H100 class
    assert (w0.gpu_family, w0.gpus_total, w0.util, w0.tier) == ("cpu", 0, 0.25, "unverified")
    assert candidate_of(registry.workers["w0"], None, [0, 0, 0, 0], NOW).last_beat_ns is None


def test_occupy_and_release() -> None:
    a = Assignment(assignment_id="x", worker_id="w1", slot=0, epoch=1, gpus=2)
    taken = occupy(host("w1"), a, cpus=1.5, memory_mb=100)
    assert (taken.gpus_used, taken.cpus_used, taken.memory_used_mb, taken.assignments) == (2, 1.5, 100, 1)
    assert occupy(taken, a, cpus=1.5, memory_mb=100, sign=-1) == host("w1")
    assert occupy(host("w1"), a, sign=-1) == host("w1")  # never below zero


# --- the index -------------------------------------------------------------------------------------

FAMILIES = ["A100", "H100", "T4", "cpu"]


def random_host(rng: random.Random, i: int) -> Candidate:
    family = rng.choice(FAMILIES)
    total = 0 if family == "cpu" else rng.choice([1, 2, 4, 8])
    pool = rng.choice(["shared"] * 4 + ["managed", "private"])
    policy = WorkerPolicy(
        allowed_tenants=rng.choice([[], [], ["acme"], ["beta"]]),
        allowed_pools=rng.choice([[], [], ["shared"], ["managed", "shared"]]),
        min_price_micros_per_gpu_hour=rng.choice([None, None, 400_000, 2_000_000]),
        max_concurrent=rng.choice([None, None, 1, 3]),
        maintenance=rng.choice([[], [], [MaintenanceWindow(weekday=2, start_minute=600, end_minute=800)]]),
    )
    limit = sorted(rng.choice([16384, 40960, 81920]) for _ in range(total))
    return Candidate(
        worker_id=f"w{i:03d}",
        pool=pool,
        owner_tenant=None if pool == "shared" else rng.choice(["acme", "beta"]),
        region=rng.choice(["eu-west-1", "eu-central-1", "us-east-1", ""]),
        state=rng.choice(["available"] * 6 + ["cordoned", "lost", "deregistered"]),
        policy=policy,
        gpu_family=family,
        gpus_total=total,
        gpus_used=rng.randint(0, total),
        vram_usable_mb=sorted(v - rng.choice([0, 0, 8000, rng.randint(0, v)]) for v in limit),  # telemetry
        vram_limit_mb=limit,
        cpus=rng.choice([0, 8, 64]),
        memory_mb=rng.choice([0, 65536]),
        assignments=rng.randint(0, 2),
        util=rng.choice([None, 0.0, 0.5, 1.0]),
        uptime=rng.choice([1.0, 0.99, 0.96, 0.9, 0.5]),
        tier=rng.choice(["platinum", "gold", "silver", "unverified"]),
        last_beat_ns=rng.choice([NOW, NOW, NOW - S, NOW - 10 * S, None]),
        sandbox=rng.choice(["bubblewrap", "bubblewrap", "kubernetes", "off", ""]),
    )


def random_request(rng: random.Random, n: int) -> PlacementRequest:
    gpus = rng.choice([0, 1, 1, 2, 4])
    return PlacementRequest(
        work_id=f"j{n}",
        tenant=rng.choice(["acme", "beta"]),
        slots=list(range(rng.choice([1, 1, 2, 3, 8]))),
        gpus=gpus,
        vram_mb=rng.choice([0, 16000, 40000]),
        gpu_type=rng.choice([None, None, "A100", "H100", "T4"]),
        cpus=rng.choice([0.0, 1.0, 4.0]),
        memory_mb=rng.choice([0, 4096]),
        pool=rng.choice(["shared"] * 3 + ["managed", "private"]),
        region=rng.choice([None, "eu-west-1", "us-east-1"]),
        exclude_workers=frozenset(rng.sample([f"w{i:03d}" for i in range(40)], 3)),
        epoch=1,
        image=rng.random() < 0.3,
    )


@pytest.mark.parametrize("seed", range(40))
def test_index_gives_the_plain_scan_decision(seed: int) -> None:
    rng = random.Random(seed)
    fleet = [random_host(rng, i) for i in range(rng.choice([5, 40, 120]))]
    index = CandidateIndex(rng.sample(fleet, len(fleet)))
    placed_any = False
    for n in range(30):
        req = random_request(rng, n)
        plain = place(req, index.candidates(), now_ns=NOW)
        indexed = index.place(req, now_ns=NOW)
        assert outcome(indexed) == outcome(plain)
        structural = ("pool", "image", "gpu_type")  # counted exactly by both
        assert [indexed.provenance.filtered.get(r, 0) for r in structural] == [
            plain.provenance.filtered.get(r, 0) for r in structural
        ]
        if isinstance(plain, Placed):
            placed_any = True
            pruned = plain.provenance.filtered  # the plain scan counts every worker
            assert sum(pruned.values()) + len({a.worker_id for a in plain.assignments}) <= len(fleet)
            for a in plain.assignments:
                index.take(a, req)
            if rng.random() < 0.3:
                index.release(plain.assignments[0], req)
        if rng.random() < 0.1:
            index.upsert(replace(rng.choice(fleet), state="available", last_beat_ns=NOW))
    assert placed_any or len(fleet) == 5


def test_index_inspects_few_workers() -> None:
    fleet = [host(f"w{i:04d}", uptime=1.0 - i / 10_000) for i in range(2000)]
    index = CandidateIndex(fleet)
    result = placed(index.place(placement_request(slots=[0, 1]), now_ns=NOW))
    assert workers(result) == ["w0000", "w0001"]
    assert result.provenance.filtered == {"pruned": 1995}
    with pytest.raises(ValueError, match="weights"):
        index.place(placement_request(), RankWeights(geo_far=0.1), now_ns=NOW)


def test_index_updates() -> None:
    index = CandidateIndex(
        [host("w1", gpus_total=1, vram_usable_mb=[40960], vram_limit_mb=[40960]), host("w2")]
    )
    first = placed(index.place(placement_request(), now_ns=NOW)).assignments[0]
    assert first.worker_id == "w1"
    index.take(first)
    assert workers(index.place(placement_request(), now_ns=NOW)) == ["w2"]
    index.release(first)
    index.remove("w2")
    assert workers(index.place(placement_request(), now_ns=NOW)) == ["w1"]
    index.upsert(replace(index.get("w1"), state="cordoned"))  # type: ignore[type-var]
    assert failed(index.place(placement_request(), now_ns=NOW)).provenance.filtered == {"state": 1}
    assert len(index) == 1


def test_equal_scores_rank_by_base_score_then_worker_id() -> None:
    # base scores one ulp apart (0.96 x 0.75 x 0.5625 < 0.9 x 0.9 x 0.5) round to one score x 0.7:
    # the higher base ranks first, as in the index's shelves (a tie on the 5th place of the top,
    # where the index stops reading)
    vram = {"gpus_total": 8, "gpus_used": 7, "vram_usable_mb": [40960] * 8, "vram_limit_mb": [40960] * 8}
    a = host("w5", uptime=0.96, tier="silver", region="eu-central-1", **vram)
    b = host("w6", uptime=0.9, tier="gold", util=1.0, region="eu-central-1", **vram)
    fleet = [a, b, *(host(f"w{i}", region="us-east-1") for i in range(4))]
    req = placement_request(region="us-east-1")
    plain = placed(place(req, fleet, now_ns=NOW))
    assert [(c.worker_id, c.score) for c in plain.provenance.top[3:]] == [("w3", 0.873), ("w6", 0.2835)]
    assert [
        c.worker_id for c in placed(place(placement_request(), fleet[:2], now_ns=NOW)).provenance.top
    ] == [
        "w6",
        "w5",
    ]
    assert outcome(CandidateIndex(fleet).place(req, now_ns=NOW)) == outcome(plain)


def test_index_beat_keeps_workers_from_looking_silent() -> None:
    index = CandidateIndex([host("w1", last_beat_ns=NOW - 10 * S)])
    assert failed(index.place(placement_request(), now_ns=NOW)).provenance.filtered == {"silent": 1}
    index.beat("w1", NOW - S, 1.0)
    assert workers(index.place(placement_request(), now_ns=NOW)) == ["w1"]
    index.beat("unknown", NOW, 1.0)  # ignored


def test_bands_group_workers_and_never_hide_one_that_fits() -> None:
    def vram_band(mb: int) -> float:
        return band(mb, VRAM_BANDS_PER_DOUBLING)

    assert all(vram_band(mb) >= mb for mb in range(1, 200_000, 7))
    assert all(band(cpus / 4, 1) >= cpus / 4 for cpus in range(1, 1000))
    assert band(0, 1) == band(-1.5, 1) == 0  # nothing left: below any request
    assert vram_band(39_000) == vram_band(40_000) >= 40_000  # one shelf for both: the band reaches 40,000
    assert len({vram_band(mb) for mb in range(1024, 81_921)}) == 26  # 1 to 80 GiB: 26 shelves, not 80,000
    near = host("w1", gpus_total=1, vram_usable_mb=[39_000], vram_limit_mb=[81_920])  # inspected, unfit
    fits = host("w2", gpus_total=1, vram_usable_mb=[40_000], vram_limit_mb=[81_920], uptime=0.5)
    full = host("w3", gpus_total=1, cpus=8, cpus_used=8.0)  # no CPU left: on a shelf no CPU work reads
    index = CandidateIndex([near, fits, full])
    result = placed(index.place(placement_request(vram_mb=40_000, cpus=1.0), now_ns=NOW))
    assert workers(result) == ["w2"] and result.provenance.filtered == {"vram": 1, "pruned": 1}
    assert workers(index.place(placement_request(vram_mb=40_000), now_ns=NOW)) == ["w3"]  # needs no CPU
