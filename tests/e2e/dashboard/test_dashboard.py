"""The dashboard in real headless Chromium (Debian's, driven by Playwright; never a downloaded browser)
against a served gateway on real NATS: sign-in by kind of key, jobs appearing and progressing live
from the feed, a resume after a dropped connection, cancelling from the page, the error banner,
tenant isolation, escaping, a thousand jobs paged through the API's cursors, a provider's workers
and payouts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.async_api import Browser, Route, WebSocketRoute, expect

from core.log import EventLog
from core.streams import (
    endpoint_subject,
    heartbeat_subject,
    job_subject,
    metering_subject,
    worker_subject,
)
from gateway.dashboard import STATIC
from projections import SCHEDULE
from schemas.endpoints import (
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaRevoked,
)
from schemas.jobs import JobFailed, JobPlaced, JobProgress, JobStarted, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerRegistered
from tests.support import REPO, AgentProcess, coordinator, registered
from tests.support.dashboard import known_provider_key, money, ms, register_with_telemetry, until_http
from tests.support.gateway import GatewayServer, ServeGateway
from tests.support.inference import SLOW_HOST, ST_READY_S, engine_pid
from tests.support.pages import open_dashboard

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
UNKNOWN_KEY = "rt_000000000000_" + "x" * 43
T0_MS = 1_775_001_000_000  # 2026-04-01


class FeedProxy:
    """Routes the page's feed WebSockets through Playwright to the real gateway, so the test can drop
    a connection, or swallow what the gateway sends, as a flaky network would."""

    def __init__(self) -> None:
        self.routes: list[tuple[WebSocketRoute, WebSocketRoute]] = []
        self.swallow = False
        self.swallowed: list[str] = []
        self.forwarded: list[str] = []

    def handle(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()

        def forward(message: str | bytes) -> None:
            if self.swallow:
                self.swallowed.append(str(message))
            else:
                self.forwarded.append(str(message))
                page_side.send(message)

        server_side.on_message(forward)
        self.routes.append((page_side, server_side))

    async def drop(self) -> None:
        page_side, server_side = self.routes[-1]
        self.swallow = False
        await server_side.close()
        await page_side.close(code=1012, reason="dropped by the test")


async def submit(server: GatewayServer, key: str, name: str) -> str:
    spec = {"name": name, "kind": "process", "command": ["python", "train.py"], "inputs": []}
    response = await server.request("POST", "/v1/jobs", key, json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


async def append_job_events(log: EventLog, tenant: str, job_id: str, *events: Any) -> int:
    seq = 0
    for event in events:
        seq = (await log.append(job_subject(tenant, job_id, event), event)).seq
    return seq


async def test_a_tenant_watches_its_jobs_live_and_cancels_one(
    serve_gateway: ServeGateway, log: EventLog, browser: Browser, tmp_path: Path
) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_FEED_PING_S="0.5")  # a revoked key is noticed at a ping
    tenant, key = await server.tenant()
    other, other_key = await server.tenant()
    theirs = await submit(server, other_key, "their-secret-job")
    proxy = FeedProxy()
    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await page.route_web_socket(re.compile(r"/v1/feed"), proxy.handle)

    await dashboard.sign_in(key)
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await expect(page.locator("#jobs-empty")).to_be_visible()
    await expect(page.locator("#tabs button")).to_have_text(["Jobs", "Endpoints", "Billing"])
    await expect(page.locator("#who")).to_have_text(f"tenant:{tenant} \u00b7 admin")
    assert await page.evaluate("sessionStorage.getItem('resontech.key')") == key
    assert key not in page.url

    job = await submit(server, key, "mnist")  # no agent runs it: it stays queued until we say
    await expect(dashboard.job(job, "state")).to_have_text("queued")
    await expect(page.locator("#jobs-empty")).to_be_hidden()
    # w-1 registered the GPU it will report: readings of GPUs a worker never registered are shown to nobody
    gpu = Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81_559, vram_free_mb=81_000)
    registration = WorkerRegistered(provider="p1", hostname="h1", gpus=[gpu])
    await log.append(worker_subject("w-1", registration), registration)
    for _ in range(100):  # the gateway's registry has it
        if (await server.request("GET", "/v1/workers/w-1", server.operator_key)).status_code == 200:
            break
        await asyncio.sleep(0.05)
    assignment = Assignment(assignment_id="a-1", worker_id="w-1", slot=0, epoch=1, gpus=1)
    await append_job_events(
        log,
        tenant,
        job,
        JobPlaced(assignments=[assignment], provenance=Provenance(candidates=1)),
        JobStarted(assignment_id="a-1", worker_id="w-1", slot=0, epoch=1),
        JobProgress(epoch=1, slot=0, round=3, train_epoch=2, step=120, loss=0.4321),
    )
    await expect(dashboard.job(job, "loss")).to_have_text("0.4321")
    await expect(dashboard.job(job, "progress")).to_have_text("round 3 \u00b7 epoch 2 \u00b7 step 120")
    await expect(dashboard.job(job, "state")).to_have_text("running")
    await expect(dashboard.job(job, "shards")).to_contain_text("1/1 placed")
    beat = Heartbeat(interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=87.5)], running=["a-1"])
    await log.append(heartbeat_subject("w-1"), beat)
    await expect(dashboard.job(job, "gpu")).to_have_text("88%")

    # A stale shard's progress (an older epoch) is fenced in the page as the schedule reducer fences it.
    fenced = await page.evaluate(
        """import('/ui/jobs.js').then(({current}) => {
          const job = {assignments: [{slot: 0, epoch: 1}, {slot: 1, epoch: 2}]};
          return [current(job, {slot: 0, epoch: 1}), current(job, {slot: 0, epoch: 0}),
                  current(job, {slot: 2, epoch: 1}), current(job, {epoch: 2}), current(job, {epoch: 3}),
                  current({assignments: []}, {epoch: 1})];
        })"""
    )
    assert fenced == [True, False, False, True, False, False]
    await append_job_events(log, tenant, job, JobProgress(epoch=0, slot=0, loss=9.0))
    # The connection drops while an event is in flight: the page resumes from its cursor and gets it.
    proxy.swallow = True
    missed = await append_job_events(log, tenant, job, JobProgress(epoch=1, slot=0, step=130, loss=0.2345))
    for _ in range(100):
        if any('"job.progress"' in m and '"seq":' + str(missed) in m for m in proxy.swallowed):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the gateway never sent seq {missed}: {proxy.swallowed}")
    await proxy.drop()
    await expect(dashboard.job(job, "loss")).to_have_text("0.2345")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    assert len(proxy.routes) == 2
    resumed_from = re.search(r"after=jobs%3A(\d+)", proxy.routes[1][0].url)
    assert resumed_from is not None, proxy.routes[1][0].url
    assert int(resumed_from.group(1)) < missed

    # Escaping: a reason full of markup is shown as text, never run. The job fails while the page
    # is still reading the new job (the answer, read before the failure, arrives after it): the
    # page must read it again rather than keep the stale answer.
    answered, release = asyncio.Event(), asyncio.Event()

    async def late(route: Route) -> None:
        response = await route.fetch()
        answered.set()
        await release.wait()
        await route.fulfill(response=response)

    await page.route(re.compile(r"/v1/jobs/job-[0-9a-f]+$"), late)
    hostile = await submit(server, key, "hostile")
    await asyncio.wait_for(answered.wait(), 10)
    markup = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    failed = await append_job_events(log, tenant, hostile, JobFailed(reason=markup))
    for _ in range(100):
        if any(f'"seq":{failed},' in m for m in proxy.forwarded):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the gateway never sent seq {failed}")
    release.set()
    await expect(dashboard.job(hostile, "reason")).to_have_text(markup)
    await expect(dashboard.job(hostile, "state")).to_have_text("failed")
    await page.unroute(re.compile(r"/v1/jobs/job-[0-9a-f]+$"))
    assert await page.evaluate("window.__pwned === undefined")
    assert await page.locator("#jobs-table img, #jobs-table b").count() == 0

    # The detail panel: the job's events, then cancel from the page (two clicks: arm, confirm).
    await page.click(f'tr[data-job="{job}"]')
    events = page.locator("#job-events tbody tr")
    await expect(events).to_have_count(6)  # submitted, placed, started, 3 progress (one stale)
    await expect(page.locator("#job-summary")).to_contain_text("w-1")
    await page.click("#job-cancel")
    await expect(page.locator("#job-cancel")).to_have_text("Confirm cancel")
    await page.click("#job-cancel")
    await expect(dashboard.job(job, "state")).to_have_text("cancelled")
    await expect(page.locator("#job-cancel")).to_be_hidden()
    await expect(events.last).to_contain_text("job.cancelled")
    await expect(page.locator("#job-title")).to_contain_text("cancelled")
    assert await page.locator("#banner").is_hidden()

    # Endpoints: a deployment appears, and its replica becomes ready, live.
    await page.click('#tabs button[data-tab="endpoints"]')
    await expect(page.locator("#endpoints-empty")).to_be_visible()
    deployed = await server.request("POST", "/v1/endpoints", key, json={"name": "chat", "model": MODEL})
    assert deployed.status_code == 201, deployed.text
    endpoint = deployed.json()["endpoint_id"]
    replicas = page.locator(f'tr[data-endpoint="{endpoint}"] [data-col="replicas"]')
    await expect(replicas).to_contain_text("0/1 ready")
    replica = Assignment(assignment_id="r-1", worker_id="w-2", slot=0, epoch=1, gpus=0)
    for event in (
        EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1)),
        EndpointReplicaReady(assignment_id="r-1", epoch=1, address="http://10.0.0.5:8000"),
    ):
        await log.append(endpoint_subject(tenant, endpoint, event), event)
    await expect(replicas).to_contain_text("1/1 ready")
    row = page.locator(f'tr[data-endpoint="{endpoint}"]')
    where = row.locator('[data-col="where"] .replica')
    await expect(where.locator(".state")).to_have_text("ready")
    await expect(where).to_contain_text("w-2")
    await expect(where.locator(".sub")).to_have_text("http://10.0.0.5:8000")
    await expect(row.locator('[data-col="state"]')).to_have_text("serving")
    await expect(row.locator('[data-col="requests"]')).to_have_text("0")  # nothing served yet
    await expect(row.locator('[data-col="p99"]')).to_have_text("\u2014")
    # Its engine fails (a reason and a log full of markup: shown as text), and the coordinator gives
    # up: the endpoint is failed, at zero replicas, and says why with the engine's last lines.
    why = 'exit status 1: <img src=x onerror="window.__pwned=2">'
    tail = "OSError: no config.json in <script>window.__pwned=3</script>"
    gave_up = f"3 replicas failed in a row without one ready; the last: {why}"
    for event in (
        EndpointReplicaLost(assignment_id="r-1", epoch=1, reason=why, log_tail=tail),
        EndpointReplicaRevoked(assignment_id="r-1", worker_id="w-2", slot=0, epoch=1, reason=why),
        EndpointFailed(reason=gave_up, log_tail=tail),
    ):
        await log.append(endpoint_subject(tenant, endpoint, event), event)
    await expect(row.locator('[data-col="state"] .state')).to_have_text("failed")
    await expect(row.locator('[data-col="why"]')).to_have_text(gave_up)
    engine_log = row.locator('[data-col="engine-log"]')
    await engine_log.locator("summary").click()
    await expect(engine_log.locator("pre")).to_have_text(tail)
    await expect(replicas).to_contain_text("0/0 ready")
    assert await page.evaluate("window.__pwned === undefined")
    assert await page.locator("#endpoints-table img").count() == 0
    await page.screenshot(path=str(tmp_path / "dashboard-endpoints.png"))

    # Billing: metered usage, the month's invoice and its lines.
    hour = 3_600_000
    tick = UsageTick(
        work_id=job,
        work_kind="job",
        assignment_id="a-1",
        epoch=1,
        provider="prov",
        gpu_type="A100",
        pool="shared",
        start_ms=T0_MS,
        end_ms=T0_MS + hour,
        gpu_ms=hour,
        tier="gold",
    )
    metered = await log.append(metering_subject(tenant, "w-1", tick.assignment_id, UsageTick), tick)
    usage = await until_http(
        server, "/v1/billing/usage", key, lambda body: body["total"]["micros"] > 0, "the usage is priced"
    )
    await page.click('#tabs button[data-tab="billing"]')
    await expect(page.locator("#billing-total")).to_have_text(f"Charges to date: {money(usage['total'])}")
    await expect(page.locator("#usage-table tbody tr").first).to_contain_text(job)
    await page.click('#invoices-table tbody tr[data-period="2026-04"]')
    line = page.locator("#invoice-lines tbody tr")
    await expect(line).to_have_count(1)
    await expect(line).to_contain_text("A100")
    await expect(line).to_contain_text(str(metered.seq))
    await page.screenshot(path=str(tmp_path / "dashboard-billing.png"))
    await page.click('#tabs button[data-tab="jobs"]')

    # Another tenant's work never reaches the page, live or listed.
    await submit(server, other_key, "their-second-job")
    marker = await submit(server, key, "marker")
    await expect(dashboard.job(marker, "state")).to_have_text("queued")
    await expect(page.locator("#jobs-table tbody tr")).to_have_count(3)
    content = await page.content()
    assert "their-" not in content and theirs not in content and other not in content
    await page.screenshot(path=str(tmp_path / "dashboard-jobs.png"), full_page=True)

    # The session survives a reload of the page (the key is in sessionStorage).
    await page.reload()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await expect(page.locator("#jobs-table tbody tr")).to_have_count(3)

    # A viewer reads but cannot cancel; when its key is revoked the feed closes and says why.
    viewer = await server.key(tenant, key, "viewer")
    await page.click("#sign-out")
    await dashboard.sign_in(viewer)
    await expect(page.locator("#who")).to_have_text(f"tenant:{tenant} \u00b7 viewer")
    await page.click(f'tr[data-job="{marker}"]')
    await expect(page.locator("#job-title")).to_contain_text("queued")
    await expect(page.locator("#job-cancel")).to_be_hidden()
    viewer_id = viewer.split("_")[1]
    revoked = await server.request("DELETE", f"/v1/tenants/{tenant}/keys/{viewer_id}", key)
    assert revoked.status_code == 204, revoked.text
    await expect(page.locator("#banner-text")).to_have_text(f"API key {viewer_id} was revoked")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "failed")

    # A bad key: the API's error in the banner, no session kept.
    await page.click("#sign-out")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "off")
    await dashboard.sign_in(UNKNOWN_KEY)
    await expect(page.locator("#banner")).to_be_visible()
    await expect(page.locator("#banner-code")).to_have_text("unauthenticated")
    await expect(page.locator("#banner-text")).to_have_text("unknown API key")
    await expect(page.locator("#sign-in")).to_be_visible()
    assert await page.evaluate("sessionStorage.getItem('resontech.key')") is None
    await page.screenshot(path=str(tmp_path / "dashboard-bad-key.png"))
    assert dashboard.errors == []


async def test_the_operator_picks_a_tenant_and_pages_through_a_thousand_jobs(
    gateway_server: GatewayServer, log: EventLog, browser: Browser, tmp_path: Path
) -> None:
    server = gateway_server
    tenant, _ = await server.tenant()
    small, small_key = await server.tenant()
    only = await submit(server, small_key, "lonely")
    submitted = [JobSubmitted(name=f"sweep-{i:04d}", kind="process", shards=1) for i in range(1000)]
    positions = await log.append_many(
        [(job_subject(tenant, f"j{i:04d}", event), event) for i, event in enumerate(submitted)]
    )
    last = positions[-1].seq
    await until_http(
        server,
        "/v1/health",
        server.operator_key,
        lambda body: body["projections"][SCHEDULE.name] >= last,
        "the gateway applied the jobs",
    )

    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(server.operator_key)
    await expect(page.locator("#tabs button")).to_have_text(
        ["Jobs", "Endpoints", "Billing", "Workers", "Payouts", "Fleet"]
    )
    await expect(page.locator("#pick-tenant")).to_be_visible()
    await page.select_option("#tenant-select", tenant)
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    rows = page.locator("#jobs-table tbody tr")
    await expect(rows).to_have_count(100)
    await expect(page.locator("#jobs-count")).to_have_text("100 jobs shown, more below")
    await expect(rows.first).to_contain_text("sweep-0999")  # newest first
    for shown in range(200, 1001, 100):
        await page.click("#jobs-more")
        await expect(rows).to_have_count(shown)
    await expect(page.locator("#jobs-more")).to_be_hidden()
    await expect(page.locator("#jobs-count")).to_have_text("1,000 jobs shown")
    await expect(rows.last).to_contain_text("sweep-0000")

    newest = JobSubmitted(name="late-arrival", kind="process", shards=1)
    await log.append(job_subject(tenant, "late", newest), newest)
    await expect(rows).to_have_count(1001)
    await expect(rows.first).to_contain_text("late-arrival")
    await page.evaluate("window.scrollTo(0, 0)")
    await page.screenshot(path=str(tmp_path / "dashboard-operator.png"))

    await page.select_option("#tenant-select", small)
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("lonely")
    assert only in await rows.first.inner_text()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    assert dashboard.errors == []


async def check_cli(server: GatewayServer, key: str, endpoint: str, tmp_path: Path) -> None:
    """``resontech endpoints`` and ``status`` show the API's traffic figures; ``--json`` all of them."""
    body = (await server.request("GET", f"/v1/endpoints/{endpoint}", key)).json()
    traffic = body["traffic"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "home"), RESONTECH_DATA_DIR=str(tmp_path / "no-stack"))

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv, "--url", server.url, "--key", key],
            capture_output=True, text=True, timeout=60, cwd=REPO, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed, status, as_json = await asyncio.gather(
        asyncio.to_thread(run, "endpoints"),
        asyncio.to_thread(run, "status", endpoint),
        asyncio.to_thread(run, "status", endpoint, "--json"),
    )
    rps = re.compile(r", [0-9.]+ rps,")  # requests per second drifts as time passes: not compared
    figures = rps.sub(
        ", rps,",
        f"{traffic['requests']} req, {traffic['rps']:.2f} rps, {traffic['error_rate']:.1%} errors, "
        f"p50/p95/p99 {traffic['p50_ms']:.1f}/{traffic['p95_ms']:.1f}/{traffic['p99_ms']:.1f} ms",
    )
    assert f"last 60 s: {figures}" in rps.sub(", rps,", listed), listed
    assert f"endpoint {endpoint} (minilm, all-MiniLM-L6-v2) of {body['tenant']}: " in status
    assert f"traffic, last 60 s: {figures}" in rps.sub(", rps,", status), status
    shown = json.loads(as_json)["traffic"]
    assert {k: v for k, v in shown.items() if k != "rps"} == {k: v for k, v in traffic.items() if k != "rps"}


async def test_an_endpoint_serving_traffic_shows_its_figures_live_in_the_page_and_the_cli(
    log: EventLog,
    agents: Callable[..., AgentProcess],
    gateway_server: GatewayServer,
    browser: Browser,
    tmp_path: Path,
) -> None:
    """Real traffic: a real agent serves all-MiniLM-L6-v2 (the ``engine: cpu`` sentence-transformers
    engine, ready in seconds), the official openai client calls it through the gateway, and an
    engine killed under a paused agent makes one request fail for real (503: no replica left)."""
    server = gateway_server
    agent = agents("d1", *SLOW_HOST)
    await registered(log, agent)
    _, key = await server.tenant()
    async with coordinator(log):
        spec = {"name": "minilm", "model": "all-MiniLM-L6-v2", "engine": "cpu", "min_replicas": 1}
        deployed = await server.request("POST", "/v1/endpoints", key, json=spec)
        assert deployed.status_code == 201, deployed.text
        endpoint = deployed.json()["endpoint_id"]
        dashboard = await open_dashboard(browser, server)
        page = dashboard.page
        await dashboard.sign_in(key)
        await page.click('#tabs button[data-tab="endpoints"]')
        row = page.locator(f'tr[data-endpoint="{endpoint}"]')

        def cell(column: str) -> Any:
            return row.locator(f'[data-col="{column}"]')

        await expect(cell("requests")).to_have_text("0")
        # The replica becomes ready: the page hears it on the feed.
        await expect(cell("replicas")).to_contain_text("1/1 ready", timeout=ST_READY_S * 1000)
        await expect(cell("state")).to_have_text("serving")
        [replica] = (await server.request("GET", f"/v1/endpoints/{endpoint}", key)).json()["replicas"]
        await expect(cell("where").locator(".sub")).to_have_text(replica["address"])

        # Traffic (not an event): the open view re-reads it every 5 s.
        api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120.0)
        for i in range(5):
            await api.embeddings.create(model="minilm", input=f"sentence number {i}")
        await expect(cell("requests")).to_have_text("5", timeout=20_000)
        traffic = (await server.request("GET", f"/v1/endpoints/{endpoint}", key)).json()["traffic"]
        assert traffic["requests"] == 5 and traffic["error_rate"] == 0
        for q in ("p50", "p95", "p99"):
            await expect(cell(q)).to_have_text(ms(traffic[f"{q}_ms"]))
            await expect(cell(q)).to_have_attribute("title", re.compile(r"^[0-9.]+ ms$"))
        await expect(cell("errors")).to_have_text("0%")
        await expect(cell("line")).to_have_text("0 waiting \u00b7 0 in flight")
        assert 0 < float(await cell("rps").inner_text()) <= 5
        await page.screenshot(path=str(tmp_path / "dashboard-traffic.png"))

        # A failure: the engine dies while its agent is paused (nothing has reported it lost yet),
        # so the gateway has no replica left for the next request and answers 503.
        engine = engine_pid([replica["address"]])
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            os.kill(engine, signal.SIGKILL)
            with pytest.raises(openai.APIStatusError) as failed:
                await api.embeddings.create(model="minilm", input="nobody answers")
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert failed.value.status_code == 503
        # The agent, running again, reports the replica lost: the page hears it on the feed (at once:
        # a replacement is placed and may be ready again within seconds).
        await expect(cell("replicas")).to_contain_text("0/1 ready", timeout=30_000)
        await expect(cell("requests")).to_have_text("6", timeout=20_000)
        await expect(cell("errors")).to_have_text("16.7%")
        traffic = (await server.request("GET", f"/v1/endpoints/{endpoint}", key)).json()["traffic"]
        assert traffic["requests"] == 6 and traffic["error_rate"] == 1 / 6
        # The CLI shows the same figures (checked while all six requests are in the 60 s window).
        await check_cli(server, key, endpoint, tmp_path)
    assert dashboard.errors == []


async def test_a_provider_sees_its_workers_with_telemetry_and_its_payouts(
    gateway_server: GatewayServer, log: EventLog, browser: Browser, tmp_path: Path
) -> None:
    server = gateway_server
    tenant, _ = await server.tenant()
    key = await known_provider_key(log, server, "prov-a")
    await known_provider_key(log, server, "prov-b")
    await register_with_telemetry(log, "w-a1", "prov-a", gpus=2, util=87.5)
    await register_with_telemetry(log, "w-b1", "prov-b", gpus=1, util=10.0)
    hour = 3_600_000
    tick = UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id="a-1",
        epoch=1,
        provider="prov-a",
        gpu_type="A100",
        pool="shared",
        start_ms=T0_MS,
        end_ms=T0_MS + hour,
        gpu_ms=hour,
        tier="gold",
    )
    await log.append(metering_subject(tenant, "w-a1", tick.assignment_id, UsageTick), tick)
    payouts = await until_http(
        server, "/v1/billing/payouts", key, lambda body: body["total"]["micros"] > 0, "the payout is priced"
    )
    await until_http(server, "/v1/workers", key, lambda body: len(body["items"]) == 1, "the worker is known")

    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(key)
    await expect(page.locator("#tabs button")).to_have_text(["Workers", "Payouts"])
    await expect(page.locator("#conn")).to_have_attribute("data-state", "polling")
    rows = page.locator("#workers-table tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("w-a1")
    await expect(rows.first).to_contain_text("2 \u00d7 NVIDIA A100-SXM4-80GB")
    await expect(page.locator('tr[data-worker="w-a1"] [data-col="state"]')).to_have_text("available online")
    await rows.first.click()
    await expect(page.locator("#worker-gpus tbody tr")).to_have_count(2)
    await expect(page.locator('#worker-gpus [data-col="util"]').first).to_have_text("88%")
    await page.screenshot(path=str(tmp_path / "dashboard-workers.png"))

    await page.click('#tabs button[data-tab="payouts"]')
    await expect(page.locator("#payouts-total")).to_contain_text("prov-a")
    await expect(page.locator("#payouts-table tbody tr")).to_have_count(1)
    await expect(page.locator("#payouts-table tbody tr").first).to_contain_text("gold")
    await expect(page.locator("#payouts-table tbody tr").first).to_contain_text(money(payouts["total"]))
    assert "w-b1" not in await page.content()
    assert dashboard.errors == []


async def test_the_page_and_its_files_are_served_locked_down(gateway_server: GatewayServer) -> None:
    client = gateway_server.client
    page = await client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "://" not in page.text  # nothing fetched from elsewhere
    script = await client.get("/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert (
        await client.get("/ui/app.js", headers={"If-None-Match": script.headers["etag"]})
    ).status_code == 304
    names = sorted(path.name for path in STATIC.glob("*.js"))  # every script, so each is checked below
    assert {"app.js", "table.js", "endpoints.js"} <= set(names)
    for name in (*names, "style.css"):
        assert (await client.get(f"/ui/{name}")).status_code == 200, name
    for missing in ("/ui/__init__.py", "/ui/index.html", "/ui/..%2F__init__.py", "/ui/nope.js"):
        response = await client.get(missing)
        assert response.status_code == 404, missing
        assert response.json()["error"]["code"] == "not_found"
    scripts = "".join([(await client.get(f"/ui/{name}")).text for name in names])
    assert not re.search(r"\.(innerHTML|outerHTML|insertAdjacentHTML)|document\.write", scripts)
    document = (await client.get("/openapi.json")).json()
    assert "/" not in document["paths"] and not any(p.startswith("/ui") for p in document["paths"])
