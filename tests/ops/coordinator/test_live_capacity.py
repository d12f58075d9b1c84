"""The coordinator's live capacity against a rebuild: random event sequences, compared after each.

Events are folded by the real reducers; :class:`ops.coordinator.live_capacity.LiveCapacity` hears of them the
way the coordinator tells it (``sync`` with the keys an event touched, ``beat`` for a heartbeat), and
after every event it must hold what :func:`projections.candidates.candidates` and
:func:`projections.admission.quota_usage` build from scratch, and decide as an index built from them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from core.placement.candidate_index import CandidateIndex
from core.placement.values import PlacementRequest
from core.streams import endpoint_subject, heartbeat_subject, job_subject, worker_subject
from ops.coordinator.live_capacity import LiveCapacity
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE
from projections.admission import quota_usage
from projections.candidates import candidates
from projections.schedule import job_key
from schemas._base import Event
from schemas.endpoints import EndpointDeleted, EndpointDeployed, EndpointReplicaLost, EndpointReplicaPlaced
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCancelled,
    JobCompleted,
    JobPlaced,
    JobResources,
    JobSubmitted,
)
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import (
    Heartbeat,
    WorkerCordoned,
    WorkerDeregistered,
    WorkerLost,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRecovered,
    WorkerRegistered,
    WorkerUncordoned,
)
from tests.support.placement_hosts import outcome
from tests.support.reducer_builders import Log

S = 1_000_000_000
NOW = 1_800_000_000 * S
WORKERS = [f"w{i}" for i in range(12)]
TENANTS = ["acme", "beta"]
MODELS = [("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81559), ("Tesla T4", 16384)]
NO_PROVENANCE = Provenance(candidates=0, filtered={}, top=[])


class Fleet:
    """The four projections capacity reads, each folded from its own stream, and what happened."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.registry, self.liveness = Log(REGISTRY), Log(LIVENESS)
        self.schedule, self.endpoints = Log(SCHEDULE), Log(ENDPOINTS)
        self.gpus: dict[str, list[Gpu]] = {}
        self.jobs: list[tuple[str, str]] = []
        self.deployed: list[tuple[str, str]] = []
        self.epochs: dict[str, int] = {}

    def states(self) -> tuple[Any, Any, Any, Any]:
        return self.registry.state, self.liveness.state, self.schedule.state, self.endpoints.state

    def t(self) -> float:
        return NOW / S - 60 + self.registry.seq + self.schedule.seq + self.liveness.seq

    # each returns what changed: ("worker" | "beat" | "job" | "endpoint", key)

    def register(self) -> tuple[str, str]:
        r = self.rng
        w = r.choice(WORKERS)
        model, vram = r.choice(MODELS)
        gpus = [
            Gpu(index=i, model=model, vram_total_mb=vram, vram_free_mb=vram)
            for i in range(r.choice([0, 1, 2, 4]))
        ]
        self.gpus[w] = gpus
        pool = r.choice(["shared", "shared", "managed", "private"])
        event = WorkerRegistered(
            provider="p",
            hostname=w,
            region=r.choice(["eu-west", "us-east"]),
            pool=pool,
            owner_tenant=None if pool == "shared" else r.choice(TENANTS),
            gpus=gpus,
            cpus=r.choice([0, 16]),
            memory_mb=r.choice([0, 65536]),
        )
        return self._worker(w, event)

    def worker_event(self) -> tuple[str, str]:
        r = self.rng
        event = r.choice(
            [
                WorkerPolicySet(
                    policy=WorkerPolicy(
                        max_concurrent=r.choice([None, 1, 2]),
                        max_vram_fraction=r.choice([1.0, 0.5]),
                        allowed_pools=r.choice([[], ["shared", "managed"]]),
                    )
                ),
                WorkerCordoned(reason="test", by="t"),
                WorkerUncordoned(by="t"),
                WorkerLost(silent_s=3.0),
                WorkerRecovered(down_s=3.0),
                WorkerDeregistered(),
            ]
        )
        return self._worker(r.choice(WORKERS), event)

    def _worker(self, w: str, event: Event) -> tuple[str, str]:
        self.registry(worker_subject(w, event), event, self.t())
        return "worker", w

    def heartbeat(self) -> tuple[str, str]:
        r = self.rng
        w = r.choice(WORKERS)
        telemetry = [
            GpuTelemetry(
                index=g.index, util_pct=float(r.choice([0, 50, 100])), mem_used_mb=r.choice([0, 20000])
            )
            for g in self.gpus.get(w, [])
        ]
        previous = self.liveness.state.beats.get(w)
        if previous is not None and r.random() < 0.4:
            telemetry = previous.gpus  # an unchanged reading, as most beats of an idle host are
        event = Heartbeat(interval_s=1.0, gpus=telemetry, cpu_pct=r.choice([10.0, 90.0]))
        self.liveness(heartbeat_subject(w), event, NOW / S - r.choice([0.5, 10]))
        return "beat", w

    def submit(self) -> tuple[str, str]:
        r = self.rng
        tenant, job_id = r.choice(TENANTS), f"j{len(self.jobs)}"
        gpus = r.choice([0, 1, 2])
        event = JobSubmitted(
            name=job_id,
            kind="process",
            shards=r.choice([1, 2]),
            resources=JobResources(
                gpus=gpus, vram_mb=r.choice([0, 30000]) if gpus else 0, cpus=1, memory_mb=1024
            ),
            pool=r.choice(["shared", "shared", "managed"]),
            priority=r.choice([0, 1]),
        )
        self.jobs.append((tenant, job_id))
        return self._job(tenant, job_id, event)

    def job_event(self) -> tuple[str, str]:
        r = self.rng
        tenant, job_id = r.choice(self.jobs)
        job = self.schedule.state.jobs[job_key(tenant, job_id)]
        if job.assignments and r.random() < 0.4:
            a = r.choice(list(job.assignments.values()))
            fields = {
                "assignment_id": a.assignment_id,
                "worker_id": a.worker_id,
                "slot": a.slot,
                "epoch": a.epoch,
            }
            return self._job(tenant, job_id, JobAssignmentRevoked(**fields, reason="test"))
        if r.random() < 0.1:
            return self._job(tenant, job_id, r.choice([JobCompleted(), JobCancelled(by="t")]))
        epoch = job.epoch + 1
        placed = [
            Assignment(
                assignment_id=f"{job_id}-s{slot}-e{epoch}",
                worker_id=r.choice(WORKERS),
                slot=slot,
                epoch=epoch,
                gpus=job.spec.resources.gpus,
            )
            for slot in range(job.spec.shards)
            if str(slot) not in job.assignments
        ]
        return self._job(tenant, job_id, JobPlaced(assignments=placed, provenance=NO_PROVENANCE))

    def _job(self, tenant: str, job_id: str, event: Event) -> tuple[str, str]:
        self.schedule(job_subject(tenant, job_id, event), event, self.t())
        return "job", job_key(tenant, job_id)

    def endpoint_event(self) -> tuple[str, str]:
        r = self.rng
        if not self.deployed or r.random() < 0.2:
            tenant, endpoint_id = r.choice(TENANTS), f"e{len(self.deployed)}"
            self.deployed.append((tenant, endpoint_id))
            event: Event = EndpointDeployed(name=endpoint_id, model="m", max_replicas=2, vram_mb=1000)
            return self._endpoint(tenant, endpoint_id, event)
        tenant, endpoint_id = r.choice(self.deployed)
        endpoint = self.endpoints.state.endpoints[f"{tenant}/{endpoint_id}"]
        live = [rep for rep in endpoint.replicas.values() if rep.state != "lost"]
        if live and r.random() < 0.4:
            rep = r.choice(live)
            return self._endpoint(
                tenant,
                endpoint_id,
                EndpointReplicaLost(assignment_id=rep.assignment_id, epoch=rep.epoch, reason="x"),
            )
        if r.random() < 0.1:
            return self._endpoint(tenant, endpoint_id, EndpointDeleted(by="t"))
        epoch = endpoint.epoch + 1
        slot = r.choice([0, 1])
        a = Assignment(
            assignment_id=f"{endpoint_id}-r{slot}-e{epoch}",
            worker_id=r.choice(WORKERS),
            slot=slot,
            epoch=epoch,
            gpus=1,
        )
        return self._endpoint(
            tenant, endpoint_id, EndpointReplicaPlaced(assignments=[a], provenance=NO_PROVENANCE)
        )

    def _endpoint(self, tenant: str, endpoint_id: str, event: Event) -> tuple[str, str]:
        self.endpoints(endpoint_subject(tenant, endpoint_id, event), event, self.t())
        return "endpoint", f"{tenant}/{endpoint_id}"


def tell(capacity: LiveCapacity, fleet: Fleet, kind: str, key: str) -> None:
    """What the coordinator does with the change: ``sync`` the touched key, ``beat`` a heartbeat."""
    registry, liveness, schedule, endpoints = fleet.states()
    if kind == "beat":
        capacity.beat(key, registry.workers.get(key), liveness.beats[key], NOW)
        return
    keys: dict[str, Any] = {
        "worker": {"workers": [key]},
        "job": {"jobs": [key]},
        "endpoint": {"endpoint_keys": [key]},
    }
    capacity.sync(registry, liveness, schedule, endpoints, now_ns=NOW, **keys[kind])


def requests(rng: random.Random, n: int) -> list[PlacementRequest]:
    return [
        PlacementRequest(
            work_id=f"r{i}",
            tenant=rng.choice(TENANTS),
            slots=list(range(rng.choice([1, 2, 3]))),
            gpus=(gpus := rng.choice([0, 1, 2])),
            vram_mb=rng.choice([0, 30000, 70000]) if gpus else 0,
            cpus=rng.choice([0.0, 4.0]),
            memory_mb=rng.choice([0, 8192]),
            pool=rng.choice(["shared", "managed", "private"]),
            region=rng.choice([None, "eu-west"]),
            epoch=1,
        )
        for i in range(n)
    ]


def nonzero(usage: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    found = {t: {p: n for p, n in pools.items() if n} for t, pools in usage.items()}
    return {t: pools for t, pools in found.items() if pools}


def assert_equal_to_a_rebuild(capacity: LiveCapacity, fleet: Fleet, asks: list[PlacementRequest]) -> None:
    fresh = CandidateIndex(candidates(*fleet.states(), NOW))
    assert capacity.index.candidates() == fresh.candidates()
    assert nonzero(capacity.usage) == nonzero(quota_usage(fleet.schedule.state, fleet.endpoints.state))
    for ask in asks:
        assert outcome(capacity.index.place(ask, now_ns=NOW)) == outcome(fresh.place(ask, now_ns=NOW))


@pytest.mark.parametrize("seed", range(25))
def test_live_capacity_equals_a_rebuild_after_every_event(seed: int) -> None:
    rng = random.Random(seed)
    fleet = Fleet(rng)
    for _ in range(4):
        fleet.register()
    capacity = LiveCapacity.build(*fleet.states(), NOW)
    asks = requests(rng, 6)
    actions = [fleet.register, fleet.worker_event, fleet.heartbeat, fleet.heartbeat, fleet.heartbeat]
    actions += [fleet.submit, fleet.job_event, fleet.job_event, fleet.endpoint_event]
    for _ in range(150):
        action = rng.choice(actions)
        if action == fleet.job_event and not fleet.jobs:
            action = fleet.submit
        tell(capacity, fleet, *action())
        assert_equal_to_a_rebuild(capacity, fleet, asks)


def test_changed_telemetry_moves_a_worker_and_unchanged_telemetry_only_its_beat() -> None:
    rng = random.Random(0)
    fleet = Fleet(rng)
    gpu = Gpu(index=0, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81920, vram_free_mb=81920)
    fleet.gpus["w0"] = [gpu]
    fleet._worker("w0", WorkerRegistered(provider="p", hostname="h", gpus=[gpu]))
    capacity = LiveCapacity.build(*fleet.states(), NOW)
    ask = PlacementRequest(work_id="r", tenant="acme", slots=[0], gpus=1, vram_mb=40000, epoch=1)
    busy = Heartbeat(interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=100.0, mem_used_mb=60000)])
    fleet.liveness(heartbeat_subject("w0"), busy, NOW / S - 1)
    tell(capacity, fleet, "beat", "w0")
    assert outcome(capacity.index.place(ask, now_ns=NOW))[1].startswith("waiting")  # 21,920 MiB free
    capacity.freed = False
    fleet.liveness(heartbeat_subject("w0"), busy, NOW / S - 0.5)  # the same reading, later
    tell(capacity, fleet, "beat", "w0")
    assert capacity.index.get("w0").last_beat_ns == NOW - S // 2  # type: ignore[union-attr]
    assert not capacity.freed  # nothing that could fit more
    idle = Heartbeat(interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=0.0, mem_used_mb=0)])
    fleet.liveness(heartbeat_subject("w0"), idle, NOW / S)
    tell(capacity, fleet, "beat", "w0")
    assert capacity.freed
    assert_equal_to_a_rebuild(capacity, fleet, [ask])
