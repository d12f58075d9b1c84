"""The workers API: a provider sees its own nodes (state, tier, uptime, work, earnings, telemetry),
the operator every node, a tenant none."""

from __future__ import annotations

from collections.abc import Callable

from core.log import EventLog
from core.pricing import price
from core.streams import job_subject, metering_subject
from projections import LEDGER, LIVENESS, REGISTRY, SCHEDULE
from schemas.jobs import JobPlaced, JobStarted, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, Provenance
from tests.support import AgentProcess, registered, until
from tests.support.accounts import provider_key, register_worker
from tests.support.gateway import Api

T0_MS = 1_775_001_000_000  # 2026-04-01


async def test_a_provider_sees_its_own_workers_with_work_and_earnings(api: Api) -> None:
    tenant, _ = await api.tenant()
    mine = await provider_key(api, "prov-a")
    theirs = await provider_key(api, "prov-b")
    await register_worker(api, "w-a1", provider="prov-a", gpus=2)
    await register_worker(api, "w-a2", provider="prov-a", beat=False)
    await register_worker(api, "w-b1", provider="prov-b")
    job = JobSubmitted(name="train", kind="process", shards=1, command=["true"])
    await api.kernel.append(job_subject(tenant, "j1", job), job, visible_in=SCHEDULE)
    a = Assignment(assignment_id="j1-s0-e1", worker_id="w-a1", slot=0, epoch=1, gpus=1)
    for event in (
        JobPlaced(assignments=[a], provenance=Provenance(candidates=1)),
        JobStarted(assignment_id=a.assignment_id, worker_id="w-a1", slot=0, epoch=1),
    ):
        await api.kernel.append(job_subject(tenant, "j1", event), event, visible_in=SCHEDULE)
    tick = UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id=a.assignment_id,
        epoch=1,
        provider="prov-a",
        gpu_type="A100",
        pool="shared",
        start_ms=T0_MS,
        end_ms=T0_MS + 600_000,
        gpu_ms=600_000,
        tier="gold",
    )
    await api.kernel.append(
        metering_subject(tenant, "w-a1", tick.assignment_id, UsageTick), tick, visible_in=LEDGER
    )

    listed = await api.request("GET", "/v1/workers", mine)
    assert listed.status_code == 200, listed.text
    workers = {w["worker_id"]: w for w in listed.json()["items"]}
    assert set(workers) == {"w-a1", "w-a2"}
    w = workers["w-a1"]
    assert (w["state"], w["online"], w["tier"], w["uptime_30d"]) == ("available", True, "unverified", 1.0)
    assert [g["model"] for g in w["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2
    [work] = w["work"]
    assert (work["kind"], work["work_id"], work["state"], work["gpus"], work["tenant"]) == (
        "job",
        "j1",
        "running",
        1,
        None,
    )
    payout = price(tick)[1]
    assert payout > 0
    assert w["earnings"]["payout"]["micros"] == payout and w["earnings"]["gpu_seconds"] == 600.0
    assert workers["w-a2"]["online"] is False and workers["w-a2"]["last_heartbeat_at"] is None
    assert workers["w-a2"]["earnings"]["payout"] == {"micros": 0, "usd": "0.000000"}

    detail = (await api.request("GET", "/v1/workers/w-a1", mine)).json()
    assert detail["telemetry"]["cpu_pct"] == 12.5 and detail["telemetry"]["memory_used_mb"] == 2048
    assert (await api.request("GET", "/v1/workers/w-a1", theirs)).status_code == 404
    assert (await api.request("GET", "/v1/workers/nope", mine)).status_code == 404
    assert [w["worker_id"] for w in (await api.request("GET", "/v1/workers", theirs)).json()["items"]] == [
        "w-b1"
    ]

    every = (await api.request("GET", "/v1/workers", api.operator_key)).json()["items"]
    assert {w["worker_id"] for w in every} == {"w-a1", "w-a2", "w-b1"}
    [seen] = [w for w in every if w["worker_id"] == "w-a1"]
    assert seen["work"][0]["tenant"] == tenant  # the operator sees whose work it is
    narrowed = (await api.request("GET", "/v1/workers?provider=prov-b", api.operator_key)).json()["items"]
    assert [w["worker_id"] for w in narrowed] == ["w-b1"]


async def test_tenants_are_refused_and_keys_are_required(api: Api) -> None:
    _, admin = await api.tenant()
    await register_worker(api, "w-x", provider="prov-x")
    for path in ("/v1/workers", "/v1/workers/w-x"):
        assert (await api.request("GET", path)).status_code == 401
        refused = await api.request("GET", path, admin)
        assert refused.status_code == 403
        assert "provider" in refused.json()["error"]["message"]


async def test_pagination_filters_and_bad_cursors(api: Api) -> None:
    key = await provider_key(api, "prov-p")
    for n in range(5):
        await register_worker(api, f"w-{n}", provider="prov-p", beat=n % 2 == 0)
    ids: list[str] = []
    url = "/v1/workers?limit=2"
    while url:
        page = (await api.request("GET", url, key)).json()
        ids += [w["worker_id"] for w in page["items"]]
        url = f"/v1/workers?limit=2&after={page['next']}" if page["next"] else ""
    assert ids == [f"w-{n}" for n in range(5)]
    assert len((await api.request("GET", "/v1/workers?state=available", key)).json()["items"]) == 5
    assert (await api.request("GET", "/v1/workers?state=lost", key)).json()["items"] == []
    for query in ("after=bogus", "limit=0", "state=asleep", "extra=1"):
        assert (await api.request("GET", f"/v1/workers?{query}", key)).status_code == 400, query


async def test_a_real_agent_shows_up_under_its_provider(
    api: Api, log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    key = await provider_key(api, "prov-real")
    worker_id = await registered(log, agents("real-node", "--provider", "prov-real"))
    await until(
        lambda: (
            worker_id in api.kernel.state(REGISTRY).workers and worker_id in api.kernel.state(LIVENESS).beats
        ),
        "the gateway saw the agent register and beat",
    )
    detail = await api.request("GET", f"/v1/workers/{worker_id}", key)
    assert detail.status_code == 200, detail.text
    body = detail.json()
    assert body["provider"] == "prov-real" and body["state"] == "available"
    assert body["online"] and body["telemetry"] is not None and body["telemetry"]["interval_s"] == 0.2
