"""The charts of money and machines (``gateway/dashboard/static/series.js``) in real headless Chromium
on a served gateway: a tenant's spend per day (Billing), a provider's earnings per day and tier and
its nodes' uptime per day (Payouts), the operator's fleet GPU utilisation (Fleet). Each chart is
checked against the API's figures (its lines, its number of points, the total beside it), drawn
(coloured pixels on its canvas) and free of every other account's figures; each view leaves a
screenshot in ``docs/screenshots/`` (``billing``, ``provider``, ``fleet``) for the README."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from playwright.async_api import Browser, Page, expect

from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, metering_subject, worker_subject
from projections.days import MS_PER_DAY
from projections.liveness import MIN_BEAT_GAP_NS
from schemas.jobs import JobPlaced, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerLost, WorkerRecovered
from tests.support.dashboard import known_provider_key, money, register_with_telemetry, until_http
from tests.support.gateway import GatewayServer
from tests.support.pages import open_dashboard

HOUR_MS = 3_600_000
COLOURED = """
(title) => {
  const canvas = document.querySelector(`figure[data-chart="${title}"] canvas`);
  if (!canvas || !canvas.width) return 0;
  const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let coloured = 0;
  for (let i = 0; i < pixels.length; i += 4) {
    const [r, g, b, a] = [pixels[i], pixels[i + 1], pixels[i + 2], pixels[i + 3]];
    if (a > 128 && Math.max(r, g, b) - Math.min(r, g, b) > 80) coloured += 1; // a line's, not grey
  }
  return coloured;
}
"""


def today() -> int:
    return time.time_ns() // 1_000_000 // MS_PER_DAY


def day_end(day: int) -> int:
    """A tick end in ``day``: noon, or a minute after midnight for today (never later than now)."""
    return day * MS_PER_DAY + (60_000 if day == today() else MS_PER_DAY // 2)


async def meter(log: EventLog, tenant: str, worker: str, end_ms: int, gpus: int, **fields: Any) -> None:
    """One hour of ``gpus`` GPUs on ``worker`` ending at ``end_ms``, as the kernel stores a tick."""
    usage = UsageTick(
        work_id=fields.pop("work_id", "train"),
        work_kind="job",
        assignment_id=f"{worker}-{end_ms}",
        epoch=1,
        gpu_type="A100",
        pool="shared",
        start_ms=end_ms - HOUR_MS,
        end_ms=end_ms,
        gpu_ms=gpus * HOUR_MS,
        **fields,
    )
    await log.append(metering_subject(tenant, worker, usage.assignment_id, UsageTick), usage)


async def chart_drawn(page: Page, title: str, pixels: int = 50) -> None:
    """Wait until the chart's canvas has ``pixels`` of a line's colours on it (uPlot draws on a
    frame)."""
    for _ in range(100):
        if await page.evaluate(COLOURED, title) >= pixels:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"nothing is drawn on the chart {title!r}")


async def legend(page: Page, title: str) -> list[str]:
    return [
        t.strip()
        for t in await page.locator(f'figure[data-chart="{title}"] .u-legend .u-label').all_text_contents()
    ]


async def test_a_provider_sees_its_earnings_per_day_and_tier_and_its_nodes_uptime(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    server = gateway_server
    tenant, _ = await server.tenant()
    key = await known_provider_key(log, server, "prov-a")
    await known_provider_key(log, server, "prov-b")
    await register_with_telemetry(log, "w-a1", "prov-a", gpus=2, util=87.5)
    await register_with_telemetry(log, "w-a2", "prov-a", gpus=1, util=40.0)
    await register_with_telemetry(log, "w-b1", "prov-b", gpus=1, util=10.0)
    day = today()
    for back in range(14):
        await meter(
            log, tenant, "w-a1", day_end(day - back), 1 + back * 7 % 5, provider="prov-a", tier="gold"
        )
        if back % 3 == 0:
            await meter(log, tenant, "w-a2", day_end(day - back), 1, provider="prov-a", tier="silver")
    await meter(log, tenant, "w-b1", day_end(day), 8, provider="prov-b", tier="gold", work_id="theirs")
    await log.append(worker_subject("w-a2", WorkerLost), WorkerLost(silent_s=90.0))
    await asyncio.sleep(1.0)
    await log.append(worker_subject("w-a2", WorkerRecovered), WorkerRecovered(down_s=1.0))

    def applied(body: Any) -> bool:
        nodes = body["nodes"]
        return len(body["tiers"]) == 2 and len(nodes) == 2 and nodes[1]["days"][-1]["uptime"] < 1

    daily = await until_http(
        server, "/v1/billing/payouts/daily", key, applied, "the payouts and the downtime"
    )
    payouts = await until_http(server, "/v1/billing/payouts", key, lambda body: True, "payouts read")
    assert daily["total"] == payouts["total"] and daily["tiers"] == ["gold", "silver"]

    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(key)
    await expect(page.locator("#tabs button")).to_have_text(["Workers", "Payouts"])
    await page.click('#tabs button[data-tab="payouts"]')
    earnings = page.locator('figure[data-chart="Earnings per day"]')
    await expect(earnings).to_have_attribute("data-points", str(30 * 3))  # total, gold, silver: 30 days each
    await chart_drawn(page, "Earnings per day")
    assert {"total", "gold", "silver"} <= set(await legend(page, "Earnings per day"))
    await expect(page.locator("#payouts-chart-note")).to_contain_text(money(daily["total"]))
    await expect(page.locator("#payouts-chart-note")).to_contain_text("tiers: gold, silver")
    uptime = page.locator('figure[data-chart="Node uptime per day"]')
    await expect(uptime).to_have_attribute("data-points", str(30 * 2))  # the window, null before today
    await chart_drawn(page, "Node uptime per day", pixels=12)  # two lone points (one day each)
    nodes = set(await legend(page, "Node uptime per day"))
    assert {"w-a1", "w-a2"} <= nodes and "w-b1" not in nodes
    rows = sum(len(period["tiers"]) for period in payouts["periods"])
    await expect(page.locator("#payouts-table tbody tr")).to_have_count(rows)
    await dashboard.screenshot("provider")
    assert "w-b1" not in await page.content() and "theirs" not in await page.content()
    assert dashboard.errors == []


async def test_a_tenant_sees_its_spend_per_day(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    server = gateway_server
    tenant, key = await server.tenant()
    other, other_key = await server.tenant()
    day = today()
    for back in range(21):
        await meter(
            log, tenant, "w-1", day_end(day - back), 1 + (back * 5) % 7, provider="prov-a", tier="gold"
        )
    await meter(log, other, "w-2", day_end(day), 50, provider="prov-a", tier="gold", work_id="theirs")
    daily = await until_http(
        server,
        "/v1/billing/usage/daily",
        key,
        lambda body: sum(d["spend"]["micros"] > 0 for d in body["days"]) == 21,
        "the spend is priced",
    )
    theirs = await until_http(
        server,
        "/v1/billing/usage/daily",
        other_key,
        lambda body: body["total"]["micros"] > 0,
        "theirs priced",
    )
    assert daily["total"] == (await server.request("GET", "/v1/billing/usage", key)).json()["total"]

    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(key)
    await expect(page.locator("#tabs button")).to_have_text(["Jobs", "Endpoints", "Billing"])
    await page.click('#tabs button[data-tab="billing"]')
    spend = page.locator('figure[data-chart="Spend per day"]')
    await expect(spend).to_have_attribute("data-points", "30")
    await chart_drawn(page, "Spend per day")
    assert "spend" in await legend(page, "Spend per day")
    await expect(page.locator("#billing-chart-note")).to_contain_text(money(daily["total"]))
    await expect(page.locator("#billing-total")).to_contain_text(money(daily["total"]))
    await expect(page.locator("#usage-table tbody tr").first).to_be_visible()
    await dashboard.screenshot("billing")
    assert money(theirs["total"]) not in await page.content() and "theirs" not in await page.content()
    assert dashboard.errors == []


async def test_the_operator_sees_the_fleets_gpu_utilisation(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    server = gateway_server
    tenant, _ = await server.tenant()
    await register_with_telemetry(log, "w-f1", "prov-f", gpus=4, util=87.5)
    await register_with_telemetry(log, "w-f2", "prov-f", gpus=1, util=40.0)
    await asyncio.sleep(2 * MIN_BEAT_GAP_NS / 1e9)  # a worker's beats count one per gap: after its first
    for worker, util in (("w-f1", 62.5), ("w-f2", 20.0)):
        beat = Heartbeat(interval_s=30.0, gpus=[GpuTelemetry(index=0, util_pct=util)])
        await log.append(heartbeat_subject(worker), beat)
    job = JobSubmitted(name="train", kind="process", shards=1, command=["true"])
    await log.append(job_subject(tenant, "j1", job), job)
    placed = JobPlaced(
        assignments=[Assignment(assignment_id="j1-a", worker_id="w-f1", slot=0, epoch=1, gpus=2)],
        provenance=Provenance(candidates=2),
    )
    await log.append(job_subject(tenant, "j1", placed), placed)
    now_ms = time.time_ns() // 1_000_000
    usage = UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id="j1-a",
        epoch=1,
        provider="prov-f",
        gpu_type="A100",
        pool="shared",
        start_ms=now_ms - 20_000,
        end_ms=now_ms,
        gpu_ms=2 * 20_000,
        tier="gold",
    )
    await log.append(metering_subject(tenant, "w-f1", "j1-a", UsageTick), usage)
    fleet = await until_http(
        server,
        "/v1/fleet/utilisation",
        server.operator_key,
        lambda body: body["now"]["allocated_gpus"] == 2 and sum(b["readings"] for b in body["buckets"]) == 7,
        "the fleet's placement and beats are applied",
    )
    assert fleet["now"] == {"registered_gpus": 5, "allocated_gpus": 2, "allocated": 0.4}
    reported = [b for b in fleet["buckets"] if b["readings"]]
    assert sum(b["reported_util_pct"] * b["readings"] for b in reported) == 4 * 87.5 + 40.0 + 62.5 + 20.0

    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(server.operator_key)
    await expect(page.locator('#tabs button[data-tab="fleet"]')).to_have_text("Fleet")
    await page.click('#tabs button[data-tab="fleet"]')
    await expect(page.locator("#fleet-now")).to_have_text("Now: 2 of 5 GPUs allocated (40.0%)")
    chart = page.locator('figure[data-chart="Fleet GPU utilisation"]')
    await expect(chart).to_have_attribute("data-points", str(2 * 288))  # two lines, 24 h of buckets
    await chart_drawn(page, "Fleet GPU utilisation", pixels=12)  # a bucket or two: points
    assert {"allocated (kernel)", "measured (agents' report)"} <= set(
        await legend(page, "Fleet GPU utilisation")
    )
    await dashboard.screenshot("fleet")
    assert dashboard.errors == []
