"""``GET /v1/jobs/{job_id}/telemetry``: a job's GPU readings over time, only from the workers that
held its assignments and only while they held them (as the schedule reducer saw it: a stale
placement gives no worker), never another tenant's, only of the GPUs each worker registered,
downsampled to the asked bound."""

from __future__ import annotations

from typing import Any

from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, worker_subject
from gateway.job_telemetry import Downsampled, merged
from projections import REGISTRY, SCHEDULE
from schemas.jobs import JobAssignmentRevoked, JobCancelled, JobPlaced
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerRegistered
from tests.support.accounts import provider_key
from tests.support.gateway import Api

SPEC: dict[str, Any] = {"name": "gpus", "kind": "process", "command": ["python", "-c", "print(1)"]}


async def submit(api: Api, key: str, shards: int = 1) -> str:
    response = await api.request("POST", "/v1/jobs", key, json={**SPEC, "shards": shards})
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


async def append_job(api: Api, tenant: str, job_id: str, event: Any) -> None:
    await api.kernel.append(job_subject(tenant, job_id, event), event, visible_in=SCHEDULE)


async def register(api: Api, worker_id: str, gpus: int) -> None:
    """Register ``worker_id`` with ``gpus`` GPUs, as the kernel does: only their readings are shown."""
    assert api.kernel is not None
    models = [Gpu(index=i, model="NVIDIA L4", vram_total_mb=23_034, vram_free_mb=23_000) for i in range(gpus)]
    event = WorkerRegistered(provider="p1", hostname=worker_id, gpus=models)
    await api.kernel.append(worker_subject(worker_id, event), event, visible_in=REGISTRY)


def beat(running: list[str], *utils: float, mem: int = 500) -> Heartbeat:
    gpus = [GpuTelemetry(index=i, util_pct=u, mem_used_mb=mem) for i, u in enumerate(utils)]
    return Heartbeat(interval_s=1.0, gpus=gpus, running=running)


async def beats(log: EventLog, worker: str, n: int, event: Heartbeat) -> None:
    for _ in range(n):
        await log.append(heartbeat_subject(worker), event)


def placed(*assignments: Assignment) -> JobPlaced:
    return JobPlaced(assignments=list(assignments), provenance=Provenance(candidates=len(assignments)))


async def test_readings_come_only_from_the_jobs_workers_while_they_held_it(api: Api, log: EventLog) -> None:
    tenant, key = await api.tenant()
    _, other_key = await api.tenant()
    job = await submit(api, key, shards=2)
    a1 = Assignment(assignment_id="a-1", worker_id="w-1", slot=0, epoch=1, gpus=2)
    a2 = Assignment(assignment_id="a-2", worker_id="w-2", slot=1, epoch=1, gpus=1)
    for worker_id, gpus in (("w-1", 2), ("w-2", 1), ("w-3", 1), ("w-9", 1)):
        await register(api, worker_id, gpus)
    await beats(log, "w-1", 2, beat([], 11.0, 11.0))  # before the job was placed there: never shown
    await append_job(api, tenant, job, placed(a1, a2))
    await beats(log, "w-1", 3, beat(["a-1"], 40.0, 60.0))  # two GPUs: mean 50 %, 1000 MiB together
    await beats(log, "w-2", 2, beat(["a-2"], 70.0, mem=2048))
    await beats(log, "w-2", 1, beat(["a-2", "someone-elses"], 5.0))  # a shared host: withheld
    revoked = JobAssignmentRevoked(
        assignment_id="a-1", worker_id="w-1", slot=0, epoch=1, reason="worker lost"
    )
    await append_job(api, tenant, job, revoked)
    await beats(log, "w-1", 2, beat([], 99.0, 99.0))  # after it lost the job: never shown
    a3 = Assignment(assignment_id="a-3", worker_id="w-3", slot=0, epoch=2, gpus=1)
    stale = Assignment(assignment_id="a-9", worker_id="w-9", slot=0, epoch=1, gpus=1)
    await append_job(api, tenant, job, placed(a3))
    await append_job(api, tenant, job, placed(stale))  # at or below the job's epoch: ignored
    await beats(log, "w-3", 2, beat(["a-3"], 30.0, mem=100))
    await beats(log, "w-9", 2, beat(["a-9"], 1.0))
    await append_job(api, tenant, job, JobCancelled(by="test"))
    await beats(log, "w-3", 2, beat([], 77.0))  # after the job ended: never shown

    response = await api.request("GET", f"/v1/jobs/{job}/telemetry", key)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["job_id"] == job and body["points"] == 300
    workers = {w["worker_id"]: w for w in body["workers"]}
    assert list(workers) == ["w-1", "w-2", "w-3"]  # first placed first; w-9's stale placement is none
    w1, w2, w3 = workers["w-1"], workers["w-2"], workers["w-3"]
    assert [(s["assignment_id"], s["slot"], s["epoch"]) for s in w1["spans"]] == [("a-1", 0, 1)]
    assert all(s["ended_at"] for w in workers.values() for s in w["spans"])  # revoked, or the job ended
    assert (w1["beats"], w1["withheld"]) == (3, 0)
    assert {(s["util_pct"], s["mem_used_mb"]) for s in w1["samples"]} == {(50.0, 1000.0)}
    assert sum(s["beats"] for s in w1["samples"]) == 3
    assert (w2["beats"], w2["withheld"]) == (3, 1)
    assert {(s["util_pct"], s["mem_used_mb"]) for s in w2["samples"]} == {(70.0, 2048.0)}
    assert (w3["beats"], w3["withheld"]) == (2, 0)
    assert {s["util_pct"] for s in w3["samples"]} == {30.0}
    times = [s["time_s"] for s in w1["samples"] + w3["samples"]]
    assert times == sorted(times)

    # Another tenant's key, or a provider's, never reads it (the same 404 as for a job that does not exist).
    refused = await api.request("GET", f"/v1/jobs/{job}/telemetry", other_key)
    assert refused.status_code == 404 and job in refused.json()["error"]["message"]
    provider = await provider_key(api, "prov-telemetry")
    assert (await api.request("GET", f"/v1/jobs/{job}/telemetry", provider)).status_code == 403
    assert (await api.request("GET", f"/v1/jobs/{job}/telemetry")).status_code == 401
    seen = await api.request("GET", f"/v1/jobs/{job}/telemetry?tenant={tenant}", api.operator_key)
    assert seen.status_code == 200 and len(seen.json()["workers"]) == 3


async def test_a_job_no_worker_ever_held_has_no_telemetry(api: Api, log: EventLog) -> None:
    _, key = await api.tenant()
    job = await submit(api, key)
    await beats(log, "w-idle", 2, beat([], 10.0))
    response = await api.request("GET", f"/v1/jobs/{job}/telemetry?points=10", key)
    assert response.status_code == 200, response.text
    assert response.json() == {"job_id": job, "points": 10, "workers": []}


async def test_readings_are_downsampled_to_at_most_the_asked_points(api: Api, log: EventLog) -> None:
    tenant, key = await api.tenant()
    job = await submit(api, key)
    await register(api, "w-1", 1)
    await append_job(
        api, tenant, job, placed(Assignment(assignment_id="a-1", worker_id="w-1", slot=0, epoch=1))
    )
    utils = [float(i % 100) for i in range(400)]
    await log.append_many((heartbeat_subject("w-1"), beat(["a-1"], u, mem=i)) for i, u in enumerate(utils))
    for points in (1, 7, 50):
        response = await api.request("GET", f"/v1/jobs/{job}/telemetry?points={points}", key)
        assert response.status_code == 200, response.text
        [worker] = response.json()["workers"]
        samples = worker["samples"]
        assert 1 <= len(samples) <= points and worker["beats"] == 400
        assert sum(s["beats"] for s in samples) == 400  # every beat in exactly one sample
        weighted = sum(s["util_pct"] * s["beats"] for s in samples) / 400
        assert abs(weighted - sum(utils) / 400) < 1e-9  # means of buckets, not picks
        assert [s["time_s"] for s in samples] == sorted(s["time_s"] for s in samples)
    [one] = (await api.request("GET", f"/v1/jobs/{job}/telemetry?points=1", key)).json()["workers"][0][
        "samples"
    ]
    assert one["mem_used_mb"] == sum(range(400)) / 400
    for bad in ("points=0", "points=2001", "points=x", "surprise=1"):
        assert (await api.request("GET", f"/v1/jobs/{job}/telemetry?{bad}", key)).status_code == 400, bad


def test_buckets_and_spans() -> None:
    series = Downsampled(0, 99, 10)
    for t in range(100):
        series.add(t, float(t), None)
    series.add(50, None, None)  # a beat without readings makes no sample
    samples = series.samples()
    assert len(samples) == 10 and [s.beats for s in samples] == [10] * 10
    assert samples[0].util_pct == 4.5 and samples[0].mem_used_mb is None
    assert merged([(5, 9), (0, 3), (2, 4), (8, None), (20, 30)]) == [(0, 4), (5, None)]
    assert merged([(0, 10), (2, 5), (11, 12)]) == [(0, 10), (11, 12)]
