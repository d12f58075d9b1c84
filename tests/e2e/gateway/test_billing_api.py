"""The billing API: a tenant's usage and invoices (lines naming the ranges of METERING sequences
they sum), a provider's payouts; money as integer micro-USD plus a decimal string; scoping."""

from __future__ import annotations

from core.pricing import price
from core.streams import metering_subject
from gateway.routes.billing import money
from projections import LEDGER
from schemas.metering import UsageTick
from tests.support.accounts import provider_key
from tests.support.gateway import Api

MARCH_MS = 1_772_323_200_000  # 2026-03-01T00:00:00Z
APRIL_MS = 1_775_001_600_000  # 2026-04-01T00:00:00Z


def tick(work_id: str, start_ms: int, *, gpu_ms: int = 0, cpu_ms: int = 0, **fields: object) -> UsageTick:
    base: dict[str, object] = {
        "work_id": work_id,
        "work_kind": "job",
        "assignment_id": f"{work_id}-s0-e1",
        "epoch": 1,
        "provider": "prov-bill",
        "gpu_type": "A100",
        "pool": "shared",
        "tier": "gold",
    }
    base.update(fields)
    return UsageTick(start_ms=start_ms, end_ms=start_ms + 10_000, gpu_ms=gpu_ms, cpu_ms=cpu_ms, **base)  # type: ignore[arg-type]


async def meter(api: Api, tenant: str, usage: UsageTick, worker_id: str = "w-bill") -> int:
    subject = metering_subject(tenant, worker_id, usage.assignment_id, UsageTick)
    position = await api.kernel.append(subject, usage, visible_in=LEDGER)
    return position.seq


def test_money_is_exact() -> None:
    assert money(0).usd == "0.000000"
    assert money(1_490_000).usd == "1.490000"
    assert money(7).usd == "0.000007"
    assert money(-2_500_001).usd == "-2.500001"


async def test_usage_and_invoices_with_their_source_ranges(api: Api) -> None:
    a, a_key = await api.tenant()
    b, b_key = await api.tenant()
    march = [tick("train", MARCH_MS + i * 10_000, gpu_ms=10_000) for i in range(3)]
    april = [
        tick("train", APRIL_MS, gpu_ms=10_000),
        tick("eval", APRIL_MS, cpu_ms=40_000, gpu_type="cpu"),
    ]
    march_seqs = [await meter(api, a, t) for t in march]
    april_seqs = [await meter(api, a, t) for t in april]
    other = tick("theirs", MARCH_MS + 3_600_000, gpu_ms=5_000, assignment_id="theirs-s0-e1")
    await meter(api, b, other)
    # a tenant B tick in a month tenant A has no usage in
    await meter(api, b, tick("theirs", MARCH_MS - 20 * 86_400_000, gpu_ms=1_000, assignment_id="theirs-feb"))

    usage = (await api.request("GET", "/v1/billing/usage", a_key)).json()
    assert [p["period"] for p in usage["periods"]] == ["2026-04", "2026-03"]
    april_usage, march_usage = usage["periods"]
    assert march_usage["gpu_seconds"] == 30.0
    assert march_usage["charge"]["micros"] == sum(price(t)[0] for t in march)
    assert {w["work_id"] for w in april_usage["work"]} == {"train", "eval"}
    [cpu_work] = [w for w in april_usage["work"] if w["work_id"] == "eval"]
    assert cpu_work["cpu_seconds"] == 40.0 and cpu_work["charge"]["micros"] == price(april[1])[0]
    total = sum(price(t)[0] for t in march + april)
    assert usage["total"] == {"micros": total, "usd": money(total).usd}
    only_march = (await api.request("GET", "/v1/billing/usage?period=2026-03", a_key)).json()
    assert [p["period"] for p in only_march["periods"]] == ["2026-03"]

    invoices = (await api.request("GET", "/v1/billing/invoices", a_key)).json()
    assert [(i["period"], i["lines"]) for i in invoices] == [("2026-04", 2), ("2026-03", 1)]
    march_invoice = (await api.request("GET", "/v1/billing/invoices/2026-03", a_key)).json()
    [line] = march_invoice["lines"]
    assert march_seqs == list(range(march_seqs[0], march_seqs[0] + 3))
    assert line["source_ranges"] == [[march_seqs[0], march_seqs[-1]]]  # one run of its three ticks
    assert line["ticks"] == 3 and line["work_id"] == "train"
    assert march_invoice["total"]["micros"] == sum(price(t)[0] for t in march)
    assert march_invoice["total"]["usd"] == money(march_invoice["total"]["micros"]).usd
    april_invoice = (await api.request("GET", "/v1/billing/invoices/2026-04", a_key)).json()
    assert sorted(r for line in april_invoice["lines"] for r in line["source_ranges"]) == [
        [seq, seq] for seq in april_seqs
    ]

    # scoping: B's invoice month is not found for A, and B sees only its own lines
    assert (await api.request("GET", "/v1/billing/invoices/2026-02", a_key)).status_code == 404
    theirs = (await api.request("GET", "/v1/billing/invoices/2026-03", b_key)).json()
    assert [line["work_id"] for line in theirs["lines"]] == ["theirs"]
    assert (await api.request("GET", f"/v1/billing/usage?tenant={a}", b_key)).status_code == 404
    operator = await api.request("GET", f"/v1/billing/invoices?tenant={b}", api.operator_key)
    assert [i["period"] for i in operator.json()] == ["2026-03", "2026-02"]


async def test_bad_queries_auth_and_roles(api: Api) -> None:
    tenant, admin = await api.tenant()
    viewer = await api.key(tenant, admin, "viewer")
    provider = await provider_key(api, "prov-q")
    for path in ("/v1/billing/usage", "/v1/billing/invoices", "/v1/billing/invoices/2026-03"):
        assert (await api.request("GET", path)).status_code == 401
        assert (await api.request("GET", path, provider)).status_code == 403
    assert (await api.request("GET", "/v1/billing/usage", viewer)).status_code == 200
    assert (await api.request("GET", "/v1/billing/invoices/2026-03", viewer)).status_code == 404
    bad = await api.request("GET", "/v1/billing/invoices/March", admin)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_period"
    assert (await api.request("GET", "/v1/billing/usage?period=2026-13", admin)).status_code == 400
    assert (await api.request("GET", "/v1/billing/usage", api.operator_key)).status_code == 400


async def test_payouts_by_period_and_tier(api: Api) -> None:
    tenant, admin = await api.tenant()
    key = await provider_key(api, "prov-bill")
    other = await provider_key(api, "prov-other")
    gold = tick("train", MARCH_MS, gpu_ms=60_000)
    silver = tick("train", APRIL_MS, gpu_ms=60_000, tier="silver", assignment_id="train-s0-e2")
    unverified = tick(
        "train", APRIL_MS + 10_000, gpu_ms=60_000, tier="unverified", assignment_id="train-s0-e3"
    )
    for usage in (gold, silver, unverified):
        await meter(api, tenant, usage)
    body = (await api.request("GET", "/v1/billing/payouts", key)).json()
    assert body["provider"] == "prov-bill"
    assert [p["period"] for p in body["periods"]] == ["2026-04", "2026-03"]
    april, march = body["periods"]
    assert [(t["tier"], t["payout"]["micros"]) for t in march["tiers"]] == [("gold", price(gold)[1])]
    assert {t["tier"]: t["payout"]["micros"] for t in april["tiers"]} == {
        "silver": price(silver)[1],
        "unverified": 0,
    }
    assert body["total"]["micros"] == price(gold)[1] + price(silver)[1]
    assert (await api.request("GET", "/v1/billing/payouts", other)).json()["periods"] == []
    assert (await api.request("GET", "/v1/billing/payouts?provider=prov-bill", other)).status_code == 404
    assert (await api.request("GET", "/v1/billing/payouts", admin)).status_code == 403
    assert (await api.request("GET", "/v1/billing/payouts")).status_code == 401
    assert (await api.request("GET", "/v1/billing/payouts", api.operator_key)).status_code == 400
    seen = await api.request("GET", "/v1/billing/payouts?provider=prov-bill&period=2026-03", api.operator_key)
    assert [p["period"] for p in seen.json()["periods"]] == ["2026-03"]
