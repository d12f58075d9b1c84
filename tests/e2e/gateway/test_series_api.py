"""Figures over time: a tenant's spend per day and a provider's earnings per day and tier are the
ledger's, day by day; a provider's nodes' uptime per day is the registry's; the fleet's GPUs are the
operator's only. Each account reads its own figures and nothing of another's."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

from core.pricing import price
from core.streams import heartbeat_subject, job_subject, metering_subject, worker_subject
from projections import LEDGER, LIVENESS, REGISTRY, SCHEDULE
from projections.days import BUCKET_MS, MS_PER_DAY
from projections.liveness import MIN_BEAT_GAP_NS
from schemas.jobs import JobPlaced, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerLost, WorkerRecovered
from tests.support.accounts import provider_key, register_worker
from tests.support.gateway import Api


def tick(
    work_id: str, end_ms: int, *, gpu_ms: int = 10_000, length_ms: int = 10_000, **fields: Any
) -> UsageTick:
    base: dict[str, Any] = {
        "work_id": work_id,
        "work_kind": "job",
        "assignment_id": f"{work_id}-{end_ms}",
        "epoch": 1,
        "provider": "prov-a",
        "gpu_type": "A100",
        "pool": "shared",
        "tier": "gold",
    }
    base.update(fields)
    return UsageTick(start_ms=end_ms - length_ms, end_ms=end_ms, gpu_ms=gpu_ms, **base)


async def meter(api: Api, tenant: str, usage: UsageTick, worker_id: str = "w-a1") -> None:
    subject = metering_subject(tenant, worker_id, usage.assignment_id, UsageTick)
    await api.kernel.append(subject, usage, visible_in=LEDGER)


def today() -> int:
    return time.time_ns() // 1_000_000 // MS_PER_DAY


def iso_day(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


def noon(day: int) -> int:
    """A tick end inside ``day`` (its first minute for today, so that it is never later than now)."""
    return day * MS_PER_DAY + (60_000 if day == today() else MS_PER_DAY // 2)


async def get(api: Api, path: str, key: str) -> Any:
    response = await api.request("GET", path, key)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_tenants_spend_per_day_is_its_ledger_day_by_day(api: Api) -> None:
    a, a_key = await api.tenant()
    b, b_key = await api.tenant()
    day = today()
    mine = [
        tick("train", noon(day)),
        tick("train", noon(day - 1)),
        tick("eval", noon(day - 1), gpu_ms=30_000),
    ]
    old = tick("train", noon(day - 40))
    for usage in (*mine, old):
        await meter(api, a, usage)
    await meter(api, b, tick("theirs", noon(day), gpu_ms=50_000))

    spend = await get(api, "/v1/billing/usage/daily", a_key)
    assert spend["tenant"] == a and len(spend["days"]) == 30
    assert (spend["first_day"], spend["last_day"]) == (iso_day(day - 29), iso_day(day))
    by_day = {d["day"]: d["spend"]["micros"] for d in spend["days"]}
    assert by_day[iso_day(day)] == price(mine[0])[0] > 0
    assert by_day[iso_day(day - 1)] == price(mine[1])[0] + price(mine[2])[0]
    assert sum(by_day.values()) == spend["total"]["micros"] == sum(price(t)[0] for t in mine)
    assert spend["days"][-1]["spend"]["usd"].startswith("0.")
    # a wider window reaches the older day; over a year, the days sum to the ledger's usage total
    assert (await get(api, "/v1/billing/usage/daily?days=60", a_key))["total"]["micros"] == sum(
        price(t)[0] for t in (*mine, old)
    )
    year = await get(api, "/v1/billing/usage/daily?days=366", a_key)
    assert len(year["days"]) == 366
    assert year["total"] == (await get(api, "/v1/billing/usage", a_key))["total"]

    # scoping: B sees only its own day, never A's; A cannot be named by B; the operator names one
    theirs = await get(api, "/v1/billing/usage/daily", b_key)
    assert theirs["total"]["micros"] == price(tick("theirs", noon(day), gpu_ms=50_000))[0]
    assert (await api.request("GET", f"/v1/billing/usage/daily?tenant={a}", b_key)).status_code == 404
    assert await get(api, f"/v1/billing/usage/daily?tenant={a}", api.operator_key) == spend
    assert (await api.request("GET", "/v1/billing/usage/daily", api.operator_key)).status_code == 400
    provider = await provider_key(api, "prov-q")
    assert (await api.request("GET", "/v1/billing/usage/daily", provider)).status_code == 403
    assert (await api.request("GET", "/v1/billing/usage/daily")).status_code == 401
    for bad in ("0", "367", "x"):
        assert (await api.request("GET", f"/v1/billing/usage/daily?days={bad}", a_key)).status_code == 400


async def test_a_providers_earnings_per_day_and_tier_and_its_nodes_uptime(api: Api) -> None:
    tenant, tenant_key = await api.tenant()
    mine = await provider_key(api, "prov-a")
    theirs = await provider_key(api, "prov-b")
    await register_worker(api, "w-a1", provider="prov-a", gpus=2)
    await register_worker(api, "w-b1", provider="prov-b", gpus=1)
    day = today()
    ticks = [
        tick("train", noon(day)),
        tick("train", noon(day - 1), tier="silver"),
        tick("eval", noon(day - 1), gpu_ms=20_000),
    ]
    for usage in ticks:
        await meter(api, tenant, usage)
    await meter(api, tenant, tick("other", noon(day), provider="prov-b", gpu_ms=90_000), "w-b1")
    lost = WorkerLost(silent_s=90.0)
    await api.kernel.append(worker_subject("w-a1", lost), lost, visible_in=REGISTRY)
    await asyncio.sleep(0.3)
    back = WorkerRecovered(down_s=0.3)
    await api.kernel.append(worker_subject("w-a1", back), back, visible_in=REGISTRY)

    before_ns = time.time_ns()
    earned = await get(api, "/v1/billing/payouts/daily?days=7", mine)
    after_ns = time.time_ns()
    assert earned["provider"] == "prov-a" and len(earned["days"]) == 7
    assert earned["tiers"] == ["gold", "silver"]
    days = {d["day"]: d for d in earned["days"]}
    assert days[iso_day(day)]["tiers"] == [{"tier": "gold", "payout": days[iso_day(day)]["total"]}]
    assert days[iso_day(day)]["total"]["micros"] == price(ticks[0])[1] > 0
    assert {t["tier"]: t["payout"]["micros"] for t in days[iso_day(day - 1)]["tiers"]} == {
        "gold": price(ticks[2])[1],
        "silver": price(ticks[1])[1],
    }
    assert days[iso_day(day - 2)] == {
        "day": iso_day(day - 2),
        "total": {"micros": 0, "usd": "0.000000"},
        "tiers": [],
    }
    assert earned["total"] == (await get(api, "/v1/billing/payouts", mine))["total"]

    # uptime: the registry's lost interval within today's observed time; nothing before it registered
    [node] = earned["nodes"]
    assert (node["worker_id"], node["hostname"], node["state"]) == ("w-a1", "host-w-a1", "available")
    assert [d["uptime"] for d in node["days"][:-1]] == [None] * 6
    record = api.kernel.state(REGISTRY).workers["w-a1"]
    down = record.downtime_ns
    assert down >= 300_000_000
    low, high = 1 - down / (before_ns - record.since_ns), 1 - down / (after_ns - record.since_ns)
    assert low - 1e-6 <= node["days"][-1]["uptime"] <= high + 1e-6 and node["days"][-1]["uptime"] < 1

    # scoping: another provider cannot name this one; a tenant cannot read payouts; the operator names one
    assert (await api.request("GET", "/v1/billing/payouts/daily?provider=prov-a", theirs)).status_code == 404
    other = await get(api, "/v1/billing/payouts/daily?days=7", theirs)
    assert [n["worker_id"] for n in other["nodes"]] == ["w-b1"] and other["tiers"] == ["gold"]
    assert other["total"]["micros"] == price(tick("other", noon(day), provider="prov-b", gpu_ms=90_000))[1]
    assert (await api.request("GET", "/v1/billing/payouts/daily", tenant_key)).status_code == 403
    assert (await api.request("GET", "/v1/billing/payouts/daily", api.operator_key)).status_code == 400
    seen = await get(api, "/v1/billing/payouts/daily?days=7&provider=prov-a", api.operator_key)
    assert seen["days"] == earned["days"] and seen["tiers"] == earned["tiers"]


async def test_the_fleet_is_the_operators_only(api: Api) -> None:
    tenant, tenant_key = await api.tenant()
    provider = await provider_key(api, "prov-f")
    await register_worker(api, "w-f1", provider="prov-f", gpus=2)
    await register_worker(api, "w-f2", provider="prov-f", gpus=2)
    await asyncio.sleep(2 * MIN_BEAT_GAP_NS / 1e9)  # a worker's beats count one per gap: after its first
    for worker, util in (("w-f1", 50.0), ("w-f2", 100.0)):
        beat = Heartbeat(interval_s=30.0, gpus=[GpuTelemetry(index=i, util_pct=util) for i in range(2)])
        await api.kernel.append(heartbeat_subject(worker), beat, visible_in=LIVENESS)
    job = JobSubmitted(name="train", kind="process", shards=1, command=["true"])
    await api.kernel.append(job_subject(tenant, "j1", job), job, visible_in=SCHEDULE)
    placed = JobPlaced(
        assignments=[Assignment(assignment_id="j1-a", worker_id="w-f1", slot=0, epoch=1, gpus=2)],
        provenance=Provenance(candidates=2),
    )
    await api.kernel.append(job_subject(tenant, "j1", placed), placed, visible_in=SCHEDULE)
    hour_ago = (time.time_ns() // 1_000_000 - 3_600_000) // BUCKET_MS
    whole = tick(
        "j1", (hour_ago + 1) * BUCKET_MS, gpu_ms=3 * BUCKET_MS, length_ms=BUCKET_MS, provider="prov-f"
    )
    await meter(api, tenant, whole, "w-f1")

    fleet = await get(api, "/v1/fleet/utilisation", api.operator_key)
    assert (fleet["hours"], fleet["bucket_s"], len(fleet["buckets"])) == (24, 300, 288)
    assert fleet["now"] == {"registered_gpus": 4, "allocated_gpus": 2, "allocated": 0.5}
    by_start = {b["at"]: b for b in fleet["buckets"]}
    metered = by_start[dt.datetime.fromtimestamp(hour_ago * 300, dt.UTC).isoformat().replace("+00:00", "Z")]
    # three GPUs for the whole bucket, before these workers registered (so no share of them)
    assert (metered["allocated_gpus"], metered["registered_gpus"], metered["allocated"]) == (3.0, 0, None)
    assert fleet["buckets"][-1]["registered_gpus"] == 4
    reported = [b for b in fleet["buckets"] if b["readings"]]
    assert sum(b["readings"] for b in reported) == 4
    assert sum(b["reported_util_pct"] * b["readings"] for b in reported) / 4 == 75.0
    assert len((await get(api, "/v1/fleet/utilisation?hours=1", api.operator_key))["buckets"]) == 12

    for key in (tenant_key, provider):
        assert (await api.request("GET", "/v1/fleet/utilisation", key)).status_code == 403
    assert (await api.request("GET", "/v1/fleet/utilisation?hours=169", api.operator_key)).status_code == 400
