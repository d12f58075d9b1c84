"""The endpoint view's charts in real headless Chromium, after real traffic: a real agent serves
all-MiniLM-L6-v2 (the ``engine: cpu`` sentence-transformers engine), the official openai client
calls it through a served gateway, and the page, with the endpoint picked, draws its requests per
second, latency P50/P95/P99, error rate, replicas with the scale events marked, and its line, from
``GET /v1/endpoints/{endpoint_id}/traffic``; a picture of it is ``docs/screenshots/endpoint.png``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import openai
from playwright.async_api import Browser, expect

from core.log import EventLog
from tests.support import AgentProcess, coordinator, registered
from tests.support.dashboard import ms
from tests.support.gateway import GatewayServer
from tests.support.inference import SLOW_HOST, ST_READY_S
from tests.support.pages import open_dashboard

PHASE_S = 25.0
"""Seconds of each phase of traffic: one client, then the bounds changed and four at once."""
LONG = "the quick brown fox jumps over the lazy dog " * 40
SOME = re.compile(r"^[1-9][0-9]*$")
AT_LEAST_2 = re.compile(r"^([2-9]|[1-9][0-9]+)$")
"""A chart's ``data-values`` once it draws something (its points with a value)."""


async def send_for(api: openai.AsyncOpenAI, seconds: float, text: str, pause_s: float) -> int:
    """Requests one after another for ``seconds``; how many were answered."""
    sent = 0
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await api.embeddings.create(model="minilm", input=f"{sent}: {text}")
        sent += 1
        await asyncio.sleep(pause_s)
    return sent


async def traffic(server: GatewayServer, key: str, endpoint_id: str) -> dict[str, Any]:
    response = await server.request("GET", f"/v1/endpoints/{endpoint_id}/traffic", key)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_an_endpoints_latency_chart_after_real_traffic(
    log: EventLog,
    agents: Callable[..., AgentProcess],
    gateway_server: GatewayServer,
    browser: Browser,
) -> None:
    server = gateway_server
    await registered(log, agents("c1", *SLOW_HOST))
    tenant, key = await server.tenant()
    async with coordinator(log):
        spec = {
            "name": "minilm",
            "model": "all-MiniLM-L6-v2",
            "engine": "cpu",
            "min_replicas": 1,
            "max_concurrency": 1,
        }
        deployed = await server.request("POST", "/v1/endpoints", key, json=spec)
        assert deployed.status_code == 201, deployed.text
        endpoint = deployed.json()["endpoint_id"]
        dashboard = await open_dashboard(browser, server)
        page = dashboard.page
        await dashboard.sign_in(key)
        await page.click('#tabs button[data-tab="endpoints"]')
        row = page.locator(f'tr[data-endpoint="{endpoint}"]')
        ready = row.locator('[data-col="replicas"]')
        await expect(ready).to_contain_text("1/1 ready", timeout=ST_READY_S * 1000)

        # Picked: the panel opens below the table with its six charts, the replicas drawn already.
        await row.click()
        panel = page.locator("#endpoint-detail")
        await expect(panel).to_be_visible()
        await expect(row).to_have_class(re.compile(r"\bselected\b"))
        await expect(panel.locator("figure.chart")).to_have_count(6)
        chart = {
            name: panel.locator(f'figure.chart[data-chart="{name}"]')
            for name in ("Requests per second", "Latency", "Error rate", "Replicas", "Line", "Wait in line")
        }
        await expect(chart["Replicas"]).to_have_attribute("data-values", SOME)
        await expect(chart["Latency"]).to_have_attribute("data-values", "0")
        await expect(panel.locator('[data-col="replicas"] .v')).to_have_text("1/1 ready")

        # Real traffic: one client for a while; then the tenant sets new bounds (a scale event,
        # marked as soon as the feed tells) and four clients send longer texts at once to a replica
        # that holds one request at a time, so that they wait in its line.
        api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120.0)
        sent = await send_for(api, PHASE_S, "a short sentence", 0.2)
        bounds = await server.request(
            "PUT", f"/v1/endpoints/{endpoint}/scale", key, json={"min_replicas": 1, "max_replicas": 1}
        )
        assert bounds.status_code == 200, bounds.text
        # Deployed, bounds set; and a mark for each replica lost meanwhile (a loaded machine's slow host
        # can lose one: CI run 11 drew 3 marks).
        await expect(chart["Replicas"]).to_have_attribute("data-marks", AT_LEAST_2)
        sent += sum(await asyncio.gather(*(send_for(api, PHASE_S, LONG, 0.0) for _ in range(4))))

        # The open panel re-reads the window every 5 s: the figures shown are the route's.
        await expect(panel.locator('[data-col="requests"] .v')).to_have_text(str(sent), timeout=20_000)
        shown = await traffic(server, key, endpoint)
        buckets = [b for b in shown["traffic"] if b["requests"]]
        assert sum(b["requests"] for b in buckets) == sent and not any(b["errors"] for b in buckets)
        assert max(b["queue_depth"] for b in buckets) >= 1 and max(b["wait_p99_ms"] for b in buckets) > 0
        latest = buckets[-1]  # P50/P95/P99 of the latest bucket that served requests
        for q in ("p50", "p95", "p99"):
            await expect(panel.locator(f'[data-col="{q}"] .v')).to_have_text(ms(latest[f"{q}_ms"]))
        assert 0 < latest["p50_ms"] <= latest["p95_ms"] <= latest["p99_ms"]
        await expect(panel.locator('[data-col="errors"] .v')).to_have_text("0%")
        # three latency lines, a value per bucket that served requests (none for one that did not)
        await expect(chart["Latency"]).to_have_attribute("data-values", str(3 * len(buckets)))
        await expect(chart["Latency"].locator("canvas")).to_have_count(1)
        await expect(chart["Latency"]).to_have_attribute("data-marks", AT_LEAST_2)
        events = [(e["type"], e["label"]) for e in shown["scale_events"] if e["label"] != "replica lost"]
        assert events == [("endpoint.deployed", "deployed"), ("endpoint.scaled", "bounds set")]

        # The last two minutes: the same figures, drawn wider.
        await page.select_option("#endpoint-window", "120")
        await expect(chart["Latency"]).to_have_attribute("data-values", SOME)
        await panel.scroll_into_view_if_needed()
        await page.wait_for_timeout(500)  # a frame or two for the plots to draw
        await dashboard.screenshot("endpoint")

        # Another tenant's key cannot read it; closing the panel unselects the row.
        _, other = await server.tenant()
        assert (await server.request("GET", f"/v1/endpoints/{endpoint}/traffic", other)).status_code == 404
        await panel.locator('button[aria-label="close"]').click()
        await expect(panel).to_be_hidden()
        await expect(row).not_to_have_class(re.compile(r"\bselected\b"))
    assert tenant and dashboard.errors == []
