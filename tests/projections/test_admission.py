"""Admission: quota usage and waits, the queue's order, preemption and the health controller."""

from __future__ import annotations

from typing import Any

import msgspec

from core.placement.placing import place
from core.placement.values import Candidate, Placed
from projections.admission import (
    Admit,
    Victim,
    Wait,
    admit,
    health_verdicts,
    next_jobs,
    preemption_victims,
    quota_usage,
    replica_gpus,
    request_for_endpoint,
    request_for_job,
    triage,
)
from projections.endpoints import EndpointRecord, EndpointsState, ReplicaRecord
from projections.liveness import LastBeat, LivenessState
from projections.registry import RegistryState
from projections.schedule import JobRecord, ScheduleState, job_key
from schemas.jobs import JobResources
from schemas.values import Assignment, GpuTelemetry
from schemas.workers import WorkerPolicy
from tests.support.placement_hosts import NOW, S, host, placement_request
from tests.support.projection_records import changed, endpoint_record, job_record, worker_record

replace = msgspec.structs.replace
_seq = iter(range(1, 1_000_000))


def job(job_id: str, *, tenant: str = "acme", gpus: int = 1, shards: int = 1, **kw: Any) -> JobRecord:
    """A job submitted after every job made before it (``submitted_seq`` increases)."""
    fields: dict[str, Any] = {
        "tenant": tenant,
        "job_id": job_id,
        "name": job_id,
        "kind": "process",
        "shards": shards,
        "resources": JobResources(gpus=gpus, cpus=0.0, memory_mb=0),
        "submitted_seq": next(_seq),
    }
    fields.update(kw)
    return job_record(**fields)


def running(j: JobRecord, *workers: str) -> JobRecord:
    """The job with slot i assigned to ``workers[i]`` at epoch 1."""
    assignments = {
        str(i): Assignment(
            assignment_id=f"{j.job_id}-s{i}-e1", worker_id=w, slot=i, epoch=1, gpus=j.spec.resources.gpus
        )
        for i, w in enumerate(workers)
    }
    return replace(
        j, assignments=assignments, epoch=1, state="running", started=dict.fromkeys(assignments, 1)
    )


def schedule(*jobs: JobRecord) -> ScheduleState:
    return ScheduleState(jobs={job_key(j.tenant, j.job_id): j for j in jobs})


def endpoint(endpoint_id: str, *replicas: tuple[str, str], pool: str = "shared", **kw: Any) -> EndpointRecord:
    """An endpoint with one 1-GPU replica per ``(worker_id, state)``."""
    records = {
        str(i): ReplicaRecord(
            assignment_id=f"{endpoint_id}-r{i}", worker_id=w, slot=i, epoch=1, gpus=1, state=s
        )
        for i, (w, s) in enumerate(replicas)
    }
    fields: dict[str, Any] = {"tenant": "beta", "endpoint_id": endpoint_id, "name": endpoint_id, "model": "m"}
    fields.update(kw)
    return endpoint_record(pool=pool, replicas=records, epoch=1, deployed_seq=next(_seq), **fields)


def endpoints(*records: EndpointRecord) -> EndpointsState:
    return EndpointsState(endpoints={f"{e.tenant}/{e.endpoint_id}": e for e in records})


# --- quotas ----------------------------------------------------------------------------------------


def test_quota_usage_counts_active_assignments() -> None:
    jobs = schedule(
        running(job("a", gpus=2, shards=2), "w1", "w2"),
        running(job("b", gpus=1, pool="managed"), "w3"),
        replace(running(job("done", gpus=4), "w1"), state="completed"),
        running(job("c", tenant="beta", gpus=1), "w4"),
    )
    table = endpoints(
        endpoint("e", ("w1", "ready"), ("w2", "lost")),
        replace(endpoint("gone", ("w1", "ready")), state="deleted"),
    )
    assert quota_usage(jobs, table) == {"acme": {"shared": 4, "managed": 1}, "beta": {"shared": 2}}


def test_admit_under_and_over_quota() -> None:
    quotas = {"acme": {"shared": 8, "managed": None}}
    usage = {"acme": {"shared": 6}}
    assert admit(job("a", gpus=2), quotas, usage) == Admit(gpus=2)
    over = admit(job("b", gpus=2, shards=2), quotas, usage)
    assert isinstance(over, Wait)
    assert (
        over.reason
        == "over quota: tenant acme holds 6 of its 8 GPUs in the shared pool and this needs 4 more"
    )
    assert not over.permanent
    assert admit(job("c", gpus=4, shards=3), quotas, usage) == Wait(
        reason=over.reason.replace("4 more", "12 more"), permanent=True
    )
    assert admit(job("d", gpus=64, pool="managed"), quotas, usage) == Admit(gpus=64)  # no limit
    assert admit(job("e", gpus=1, tenant="beta"), quotas, usage) == Admit(gpus=1)  # no quota set
    assert admit(job("f", gpus=0, shards=100), quotas, {"acme": {"shared": 8}}) == Admit(gpus=0)  # CPU


def test_admit_counts_only_missing_slots() -> None:
    half = replace(running(job("a", gpus=2, shards=2), "w1"), state="queued")  # slot 1 lost its worker
    assert admit(half, {"acme": {"shared": 4}}, {"acme": {"shared": 2}}) == Admit(gpus=2)


# --- the queue -------------------------------------------------------------------------------------


def test_priority_then_fifo() -> None:
    a, b, c, d = job("a"), job("b", priority=5), job("c"), job("d", priority=5)
    assert [j.job_id for j in next_jobs(schedule(a, b, c, d), {}, {})] == ["b", "d", "a", "c"]


def test_quota_is_strict_fifo_per_tenant_and_pool() -> None:
    big, small, other, cpu, low = (
        job("big", gpus=4),
        job("small", gpus=1),
        job("other", tenant="beta", gpus=1),
        job("cpu", gpus=0),
        job("low", gpus=1, priority=-1),
    )
    quotas = {"acme": {"shared": 4}, "beta": {"shared": 4}}
    admitted, waiting = triage(schedule(big, small, other, cpu, low), quotas, {"acme": {"shared": 2}})
    assert [j.job_id for j in admitted] == ["other", "cpu"]
    assert [(j.job_id, w.reason.split(":")[0]) for j, w in waiting] == [
        ("big", "over quota"),
        ("small", "queued behind job big, which waits for quota"),
        ("low", "queued behind job big, which waits for quota"),
    ]


def test_admitted_jobs_use_up_the_quota_in_order() -> None:
    jobs = schedule(job("a", gpus=2), job("b", gpus=2), job("c", gpus=2))
    usage = {"acme": {"shared": 0}}
    assert [j.job_id for j in next_jobs(jobs, {"acme": {"shared": 4}}, usage)] == ["a", "b"]
    assert usage == {"acme": {"shared": 0}}  # not modified


def test_a_permanently_over_quota_job_blocks_nobody() -> None:
    jobs = schedule(job("huge", gpus=8), job("a", gpus=1))
    admitted, waiting = triage(jobs, {"acme": {"shared": 4}}, {})
    assert [j.job_id for j in admitted] == ["a"]
    assert waiting[0][1].permanent


def test_requests_from_jobs_and_endpoints() -> None:
    j = replace(
        running(job("j", gpus=2, shards=3, region="eu-west-1", priority=3), "w1"),
        rejected_by={"w9": "policy"},
    )
    r = request_for_job(j, exclude=["w1"])
    assert (r.work_id, r.kind, r.slots, r.gpus, r.epoch, r.priority) == ("j", "job", [1, 2], 2, 2, 3)
    assert r.exclude_workers == frozenset({"w1", "w9"})
    e = changed(endpoint("e", ("w1", "ready")), desired_replicas=3, gpu_type="A100", vram_mb=20000)
    r = request_for_endpoint(e)
    assert (r.work_id, r.kind, r.slots, r.gpus, r.vram_mb, r.epoch) == ("e", "endpoint", [1, 2], 1, 20000, 2)
    assert replica_gpus(changed(e, engine="cpu")) == 0
    assert replica_gpus(changed(e, gpu_type=None, vram_mb=0)) == 0
    assert replica_gpus(changed(e, gpu_type=None, vram_mb=0, engine="vllm")) == 1
    assert not r.image and request_for_endpoint(changed(e, image="ghcr.io/acme/vllm:1")).image
    assert not request_for_job(j).image
    assert request_for_job(replace(j, spec=replace(j.spec, image="ghcr.io/acme/trainer:1"))).image


# --- preemption ------------------------------------------------------------------------------------

LENDING = {"pool": "managed", "owner_tenant": "acme"}


def lending(worker_id: str, **kw: Any) -> Candidate:
    """A managed worker of acme that lends its idle capacity to the shared pool."""
    return host(worker_id, **{**LENDING, "policy": WorkerPolicy(allowed_pools=["managed", "shared"]), **kw})


def test_managed_preempts_shared_on_its_reserved_hardware() -> None:
    fleet = [lending("m1", gpus_used=4), host("s1", gpus_used=4)]
    shared_on_m1 = running(job("x", tenant="beta", gpus=4), "m1")
    shared_on_s1 = running(job("y", tenant="beta", gpus=4), "s1")
    req = placement_request(pool="managed", gpus=2, work_id="mine")
    victims = preemption_victims(req, fleet, schedule(shared_on_m1, shared_on_s1), endpoints(), now_ns=NOW)
    assert victims == [Victim("beta/x", shared_on_m1.assignments["0"], "job", 0)]
    # once it has stopped, the request fits
    freed = [replace(fleet[0], gpus_used=0), fleet[1]]
    assert isinstance(place(req, freed, now_ns=NOW), Placed)


def test_fewest_victims_then_lowest_priority_then_newest() -> None:
    fleet = [lending("m1", gpus_used=4)]
    old_low = running(job("old-low", tenant="beta", gpus=1, priority=0), "m1")
    new_low = running(job("new-low", tenant="beta", gpus=1, priority=0), "m1")
    high = running(job("high", tenant="beta", gpus=1, priority=9), "m1")
    wide = running(job("wide", tenant="gamma", gpus=1, shards=1), "m1")
    jobs = schedule(old_low, new_low, high, wide)
    one = preemption_victims(placement_request(pool="managed"), fleet, jobs, endpoints(), now_ns=NOW)
    assert [v.key for v in one] == ["gamma/wide"]  # newest of the lowest priority
    two = preemption_victims(placement_request(pool="managed", gpus=3), fleet, jobs, endpoints(), now_ns=NOW)
    assert [v.key for v in two] == ["gamma/wide", "beta/new-low", "beta/old-low"]
    # one 2-GPU victim of higher priority beats two 1-GPU ones
    big = running(job("big", tenant="beta", gpus=2, priority=5), "m2")
    pair = [lending("m2", gpus_used=2, gpus_total=2, vram_usable_mb=[40960] * 2), *fleet]
    jobs = schedule(old_low, new_low, high, wide, big)
    victims = preemption_victims(
        placement_request(pool="managed", gpus=2), pair, jobs, endpoints(), now_ns=NOW
    )
    assert [v.key for v in victims] == ["beta/big"]


def test_managed_reclaims_shared_endpoint_replicas_last() -> None:
    fleet = [lending("m1", gpus_used=2, gpus_total=2, vram_usable_mb=[40960] * 2, vram_limit_mb=[40960] * 2)]
    shared_job = running(job("x", tenant="beta", gpus=1), "m1")
    table = endpoints(endpoint("e", ("m1", "ready")))
    one = preemption_victims(
        placement_request(pool="managed"), fleet, schedule(shared_job), table, now_ns=NOW
    )
    assert [(v.key, v.kind) for v in one] == [("beta/x", "job")]
    both = preemption_victims(
        placement_request(pool="managed", gpus=2), fleet, schedule(shared_job), table, now_ns=NOW
    )
    assert [(v.key, v.kind, v.assignment.gpus) for v in both] == [
        ("beta/x", "job", 1),
        ("beta/e", "endpoint", 1),
    ]


def test_priority_preemption_only_within_a_tenant() -> None:
    fleet = [host("s1", gpus_used=4)]
    mine = running(job("mine", gpus=4, priority=1), "s1")
    theirs = running(job("theirs", tenant="beta", gpus=4, priority=0), "s1")
    urgent = placement_request(priority=5)
    assert [v.key for v in preemption_victims(urgent, fleet, schedule(mine), endpoints(), now_ns=NOW)] == [
        "acme/mine"
    ]
    assert preemption_victims(urgent, fleet, schedule(theirs), endpoints(), now_ns=NOW) == []
    assert (
        preemption_victims(placement_request(priority=1), fleet, schedule(mine), endpoints(), now_ns=NOW)
        == []
    )  # not lower
    table = endpoints(endpoint("e", ("s1", "ready"), tenant="acme"))
    assert (
        preemption_victims(urgent, fleet, schedule(), table, now_ns=NOW) == []
    )  # endpoints have no priority


def test_no_preemption_when_impossible_or_needless() -> None:
    shared_on_m1 = running(job("x", tenant="beta", gpus=4), "m1")
    jobs = schedule(shared_on_m1)
    reserved_for_other = [lending("m1", gpus_used=4, owner_tenant="other")]
    assert (
        preemption_victims(
            placement_request(pool="managed"), reserved_for_other, jobs, endpoints(), now_ns=NOW
        )
        == []
    )
    too_big = placement_request(pool="managed", gpus=8)
    assert preemption_victims(too_big, [lending("m1", gpus_used=4)], jobs, endpoints(), now_ns=NOW) == []
    cordoned = [lending("m1", gpus_used=4, state="cordoned")]
    assert (
        preemption_victims(placement_request(pool="managed"), cordoned, jobs, endpoints(), now_ns=NOW) == []
    )
    fits = [lending("m1", gpus_used=4), host("m2", **LENDING)]
    assert preemption_victims(placement_request(pool="managed"), fits, jobs, endpoints(), now_ns=NOW) == []
    itself = placement_request(pool="managed", tenant="beta", work_id="x")
    assert (
        preemption_victims(
            itself, [lending("m1", gpus_used=4, owner_tenant="beta")], jobs, endpoints(), now_ns=NOW
        )
        == []
    )


# --- the health controller -------------------------------------------------------------------------


def registry(*worker_ids: str, **kw: Any) -> RegistryState:
    return RegistryState(
        workers={w: worker_record(worker_id=w, provider="p", hostname=w, **kw) for w in worker_ids}
    )


def test_health_cordons_after_k_failures_in_the_window() -> None:
    reg = registry("w1", "w2", "w3")
    failures = {
        "w1": [NOW - 100 * S, NOW - 50 * S, NOW],
        "w2": [NOW - 700 * S, NOW - 50 * S, NOW],  # the oldest is outside the 600 s window
        "w3": [NOW - 10 * S] * 2,
    }
    assert health_verdicts(reg, LivenessState(), failures, NOW) == [
        ("w1", "3 assignment failures in the last 600 s")
    ]
    assert [w for w, _ in health_verdicts(reg, LivenessState(), failures, NOW, k=2)] == ["w1", "w2", "w3"]
    assert [w for w, _ in health_verdicts(reg, LivenessState(), failures, NOW, window_s=1000)] == ["w1", "w2"]


def test_health_cordons_on_hardware_errors() -> None:
    reg = registry("w1", "w2", "w3")
    bad = [GpuTelemetry(index=0, ecc_errors=0), GpuTelemetry(index=1, ecc_errors=2, xid_errors=1)]
    beats = {
        "w1": LastBeat(seq=1, time_ns=NOW, interval_s=1.0, gpus=bad),
        "w2": LastBeat(seq=2, time_ns=NOW, interval_s=1.0, gpus=[GpuTelemetry(index=0, ecc_errors=0)]),
        "w3": LastBeat(seq=3, time_ns=NOW, interval_s=1.0, gpus=[GpuTelemetry(index=0, xid_errors=5)]),
    }
    liveness = LivenessState(beats=beats)
    assert health_verdicts(reg, liveness, {}, NOW) == [
        ("w1", "hardware errors: GPU 1 ecc 2 xid 1"),
        ("w3", "hardware errors: GPU 0 ecc 0 xid 5"),
    ]
    assert [w for w, _ in health_verdicts(reg, liveness, {}, NOW, acknowledged={"w1": 3, "w3": 4})] == ["w3"]


def test_health_skips_cordoned_and_deregistered_workers() -> None:
    reg = registry("w1")
    reg.workers["w2"] = worker_record(
        worker_id="w2", provider="p", hostname="h", cordoned=True, state="cordoned"
    )
    reg.workers["w3"] = worker_record(
        worker_id="w3", provider="p", hostname="h", deregistered_ns=1, state="deregistered"
    )
    failures = {w: [NOW] * 5 for w in ("w1", "w2", "w3")}
    assert [w for w, _ in health_verdicts(reg, LivenessState(), failures, NOW)] == ["w1"]
