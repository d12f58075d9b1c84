"""The job view's charts (``gateway/dashboard/static/jobcharts.js``) in real headless Chromium against
a served gateway on real NATS: a DDP job's loss per shard and a federated job's per-round curve with
its aggregated line growing live, a stale agent's reports never drawn, the GPU charts of the job's
workers, a recovery marked after a real agent is killed (the kernel itself declares its worker lost
and re-places the shard), and a late viewer (or a reload) seeing the whole curve of a job with more
than a thousand events. Each view's screenshot goes to ``docs/screenshots/job-*.png``.

The DDP and federated jobs' events are appended to the log as their agents and the kernel's
federation service write them (real torchrun and NVFlare runs take minutes here and are covered by
``tests/e2e/training/test_ddp.py`` and ``tests/e2e/training/test_federated.py``); the recovery runs
real agents, intake and coordinator."""

from __future__ import annotations

import asyncio
import math
import random
import re
import sys
from collections.abc import Callable
from typing import Any

import msgspec
from playwright.async_api import Browser, Page, expect

from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, worker_subject
from projections.schedule import ScheduleState, evolve
from schemas.envelope import Recorded
from schemas.jobs import (
    FederatedTraining,
    JobAssignmentRevoked,
    JobCheckpointed,
    JobCompleted,
    JobFederationReady,
    JobFederationRun,
    JobPlaced,
    JobProgress,
    JobResources,
    JobRoundCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerRegistered
from tests.support import AgentProcess, coordinator, registered
from tests.support.gateway import GatewayServer
from tests.support.inference import SLOW_HOST
from tests.support.pages import Dashboard, open_dashboard

LIVE_MS = 30_000
"""How long the page may take to show what was just appended (two busy cores, other tests running)."""


def placed(*assignments: Assignment) -> JobPlaced:
    return JobPlaced(assignments=list(assignments), provenance=Provenance(candidates=len(assignments)))


def started(a: Assignment) -> JobStarted:
    return JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch)


def loss(step: float, shard: int) -> float:
    return 2.0 * math.exp(-step / 40) + 0.1 + 0.05 * shard + 0.03 * math.sin(step / 3 + shard)


def beat(a: Assignment, util: float, mem: int) -> tuple[str, Heartbeat]:
    gpus = [GpuTelemetry(index=0, util_pct=util, mem_used_mb=mem)]
    return heartbeat_subject(a.worker_id), Heartbeat(interval_s=1.0, gpus=gpus, running=[a.assignment_id])


async def register_gpu_hosts(server: GatewayServer, log: EventLog, workers: list[str]) -> None:
    """Register each worker with the one GPU its beats report (readings of GPUs a worker never
    registered are charted for nobody), once the gateway's registry has them."""
    gpu = Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81_559, vram_free_mb=81_000)
    for worker in workers:
        registration = WorkerRegistered(provider="p1", hostname=worker, gpus=[gpu])
        await log.append(worker_subject(worker, registration), registration)
    for worker in workers:
        for _ in range(100):
            if (await server.request("GET", f"/v1/workers/{worker}", server.operator_key)).status_code == 200:
                break
            await asyncio.sleep(0.05)


async def append(log: EventLog, tenant: str, job: str, events: list[Any]) -> None:
    await log.append_many((job_subject(tenant, job, e), e) for e in events)


async def open_job(browser: Browser, server: GatewayServer, key: str, job: str) -> Dashboard:
    """A signed-in page with the job's detail panel open and its history read."""
    dashboard = await open_dashboard(browser, server)
    page = dashboard.page
    await dashboard.sign_in(key)
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await page.click(f'tr[data-job="{job}"]')
    await expect(page.locator("#job-charts")).to_have_attribute("data-history", "loaded", timeout=LIVE_MS)
    return dashboard


def chart(page: Page, title: str) -> Any:
    return page.locator(f'#job-charts figure[data-chart="{title}"]')


async def lines(page: Page, title: str) -> list[str]:
    """The labels of a chart's lines (its legend, without the x axis)."""
    labels = chart(page, title).locator(".u-legend .u-series .u-label")
    await expect(labels.first).to_be_visible()
    texts = await labels.all_inner_texts()
    return texts[1:]


async def points_of(page: Page, title: str) -> int:
    await expect(chart(page, title)).to_have_attribute("data-points", re.compile(r"^[1-9]"))
    return int(await chart(page, title).get_attribute("data-points") or 0)


async def show(dashboard: Dashboard, name: str) -> None:
    """Scroll the panel to the charts and take the view's screenshot for the README."""
    await dashboard.page.locator("#job-charts").scroll_into_view_if_needed()
    await dashboard.screenshot(name)


def ddp_steps(shards: list[Assignment], steps: range) -> list[Any]:
    events: list[Any] = []
    for step in steps:
        for a in shards:
            accuracy = 1 - loss(step, a.slot) / 2.5
            events.append(
                JobProgress(
                    epoch=a.epoch,
                    slot=a.slot,
                    assignment_id=a.assignment_id,
                    step=step,
                    train_epoch=1 + step // 25,
                    loss=loss(step, a.slot),
                    metrics={"accuracy": accuracy},
                )
            )
        if step % 25 == 0:
            events.append(JobCheckpointed(epoch=1, slot=0, step=step, object_key=f"ckpt/step-{step}.pt"))
    return events


async def test_a_ddp_jobs_loss_per_shard_grows_live_and_a_stale_agent_is_never_drawn(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    server = gateway_server
    tenant, key = await server.tenant()
    job = "ddp-mlp-1"
    shards = [
        Assignment(assignment_id=f"a-{s}", worker_id=f"gpu-host-{s}", slot=s, epoch=1, gpus=1) for s in (0, 1)
    ]
    submitted = JobSubmitted(
        name="ddp-mlp",
        kind="ddp",
        shards=2,
        command=["train.py"],
        resources=JobResources(gpus=1),
        submitted_by=f"tenant:{tenant}",
    )
    await register_gpu_hosts(server, log, [a.worker_id for a in shards])
    await append(log, tenant, job, [submitted, placed(*shards), *map(started, shards)])
    for step in range(0, 60, 10):
        await log.append_many(beat(a, 60 + step / 2 + 10 * a.slot, 30_000 + 100 * step) for a in shards)
        await append(log, tenant, job, ddp_steps(shards, range(step + 1, step + 11)))

    dashboard = await open_job(browser, server, key, job)
    page = dashboard.page
    await expect(chart(page, "loss")).to_have_attribute("data-points", "120")  # 60 steps x 2 shards
    await expect(chart(page, "accuracy")).to_have_attribute("data-points", "120")
    await expect(chart(page, "loss")).to_have_attribute("data-marks", "2")  # checkpoints at 25 and 50
    assert await lines(page, "loss") == ["shard 0", "shard 1"]
    assert await page.locator("#job-metric-charts figure").evaluate_all(
        "fs => fs.map(f => f.dataset.chart)"
    ) == [
        "loss",
        "accuracy",
    ]
    gpu_points = await points_of(page, "GPU utilisation")
    assert gpu_points >= 4  # 6 beats x 2 hosts, some perhaps averaged together (the API's 300 buckets)
    assert await lines(page, "GPU utilisation") == ["gpu-host-0", "gpu-host-1"]
    await expect(chart(page, "GPU memory")).to_have_attribute("data-marks", "2")

    # Live: more steps; a zombie (an epoch the shard no longer holds, a slot the job does not have)
    # reports between them and is never drawn, as the schedule reducer never counts it.
    zombie = JobProgress(epoch=0, slot=0, assignment_id="a-old", step=999, loss=50.0)
    stranger = JobProgress(epoch=1, slot=7, step=61, loss=50.0)
    await append(log, tenant, job, [*ddp_steps(shards, range(61, 71)), zombie, stranger])
    await expect(chart(page, "loss")).to_have_attribute("data-points", "140", timeout=LIVE_MS)
    await append(log, tenant, job, ddp_steps(shards, range(71, 81)))
    await expect(chart(page, "loss")).to_have_attribute("data-points", "160", timeout=LIVE_MS)
    await expect(chart(page, "accuracy")).to_have_attribute("data-points", "160")
    await expect(chart(page, "loss")).to_have_attribute("data-marks", "3")  # and the checkpoint at 75
    await log.append_many(beat(a, 95.0, 40_000) for a in shards)  # live telemetry, from the feed
    await expect(chart(page, "GPU utilisation")).to_have_attribute(
        "data-points", str(gpu_points + 2), timeout=LIVE_MS
    )
    assert await page.locator("#job-recoveries").is_hidden()  # nothing was recovered
    await show(dashboard, "job-ddp")
    assert dashboard.errors == []
    assert await page.locator("#banner").is_hidden()


def federated_round(shards: list[Assignment], r: int, local_epochs: int) -> list[Any]:
    events: list[Any] = [
        JobProgress(
            epoch=1,
            slot=a.slot,
            assignment_id=a.assignment_id,
            round=r,
            train_epoch=e,
            loss=loss(10 * (r - 1) + 5 * e, a.slot),
        )
        for a in shards
        for e in range(1, local_epochs + 1)
    ]
    aggregated = {"loss": loss(10 * r, 0) - 0.05, "accuracy": 0.5 + 0.045 * r}
    return [
        *events,
        JobCheckpointed(epoch=1, object_key=f"jobs/fl/model_out/round-{r}.npz", round=r),
        JobRoundCompleted(round=r, metrics=aggregated),
        JobProgress(epoch=1, round=r, loss=aggregated["loss"], metrics=aggregated),  # the kernel's copy
    ]


async def test_a_federated_jobs_per_round_curve_and_its_aggregated_line_grow_live(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    server = gateway_server
    tenant, key = await server.tenant()
    job = "fedavg-1"
    shards = [Assignment(assignment_id=f"f-{s}", worker_id=f"site-host-{s}", slot=s, epoch=1) for s in (0, 1)]
    submitted = JobSubmitted(
        name="fedavg",
        kind="federated",
        shards=2,
        rounds=8,
        local_epochs=2,
        federated=FederatedTraining(script="jobs/fedavg/scripts/train.py"),
        submitted_by=f"tenant:{tenant}",
    )
    ready = JobFederationReady(
        server="127.0.0.1:8002", sites=["site-1", "site-2"], kit_bucket="kits", kits=["k1", "k2"], shards=[]
    )
    run = JobFederationRun(run_id="run-1", first_round=1, rounds=8)
    history = [submitted, placed(*shards), ready, run, *map(started, shards)]
    for r in range(1, 5):
        history += federated_round(shards, r, 2)
    await append(log, tenant, job, history)

    dashboard = await open_job(browser, server, key, job)
    page = dashboard.page
    # 4 rounds x 2 sites x 2 local epochs, and 4 aggregated points (the kernel's copy is not drawn twice)
    await expect(chart(page, "loss")).to_have_attribute("data-points", "20")
    await expect(chart(page, "accuracy")).to_have_attribute("data-points", "4")
    await expect(chart(page, "loss")).to_have_attribute("data-marks", "4")  # a checkpoint per round
    assert await lines(page, "loss") == ["aggregated", "shard 0", "shard 1"]  # aggregated: one colour
    assert await lines(page, "accuracy") == ["aggregated"]
    x_axis = chart(page, "loss").locator(".u-legend .u-series .u-label").first
    await expect(x_axis).to_have_text("round")

    for r in (5, 6):
        await append(log, tenant, job, federated_round(shards, r, 2))
        await expect(chart(page, "accuracy")).to_have_attribute("data-points", str(r), timeout=LIVE_MS)
        await expect(chart(page, "loss")).to_have_attribute("data-points", str(5 * r), timeout=LIVE_MS)
    await expect(chart(page, "loss")).to_have_attribute("data-marks", "6")
    # A round reported twice (a retried append under a new id) is counted once, as the reducer does.
    await append(log, tenant, job, [JobRoundCompleted(round=6, metrics={"accuracy": 0.0})])
    await append(log, tenant, job, federated_round(shards, 7, 2))
    await expect(chart(page, "accuracy")).to_have_attribute("data-points", "7", timeout=LIVE_MS)
    await expect(page.locator("#job-gpu-charts figure")).to_have_count(0)
    await expect(page.locator("#job-charts")).to_contain_text("No GPU readings")
    await show(dashboard, "job-federated")
    assert dashboard.errors == []


RESUMING_TRAINER = """
import json, math, os, time
work = os.environ["RESONTECH_WORK_ID"]
resume = os.environ.get("RESONTECH_RESUME_FROM", "")
first = int(resume.rsplit("-", 1)[1]) + 1 if resume else 1
for step in range(first, 91):
    loss = 2.0 * math.exp(-step / 30) + 0.1
    print("RESONTECH_PROGRESS " + json.dumps({"step": step, "loss": loss}), flush=True)
    if step % 10 == 0:
        key = f"jobs/recover/checkpoints/{work}/step-{step}"
        print("RESONTECH_CHECKPOINT " + json.dumps({"object_key": key, "step": step}), flush=True)
    time.sleep(0.15)
"""
"""Reports a falling loss every 0.15 s (its agent forwards a few reports a second) and a checkpoint every
10 steps up to step 90; a replacement resumes after the step of the checkpoint it is given."""


async def test_a_recovery_is_marked_on_the_chart_after_a_real_agent_is_killed(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer, browser: Browser
) -> None:
    server = gateway_server
    gpu = {"RESONTECH_AGENT_SIMULATED_GPUS": "1"}
    first = agents("rec-1", "--devices", "simulated", *SLOW_HOST, env=gpu)
    second = agents("rec-2", "--devices", "simulated", *SLOW_HOST, env=gpu)
    by_worker = {await registered(log, first): first, await registered(log, second): second}
    _, key = await server.tenant()
    spec = {
        "name": "recover", "kind": "process", "command": [sys.executable, "-c", RESUMING_TRAINER],
        "resources": {"gpus": 1, "vram_mb": 1000},
    }  # fmt: skip
    async with coordinator(log):
        submitted = await server.request("POST", "/v1/jobs", key, json=spec)
        assert submitted.status_code == 201, submitted.text
        job = submitted.json()["job_id"]
        dashboard = await open_job(browser, server, key, job)
        page = dashboard.page
        loss_chart = chart(page, "loss")
        await expect(loss_chart).to_have_attribute("data-marks", "2", timeout=LIVE_MS)  # 2 checkpoints
        [held] = (await server.request("GET", f"/v1/jobs/{job}", key)).json()["assignments"]
        victim = held["worker_id"]
        by_worker[victim].kill()  # SIGKILL: the kernel alone notices (no heartbeat) and recovers

        recoveries = page.locator("#job-recoveries li")
        await expect(recoveries).to_have_count(2, timeout=LIVE_MS)
        await expect(recoveries.nth(0)).to_have_attribute("data-kind", "recovery")
        await expect(recoveries.nth(0)).to_contain_text("shard 0: worker lost")
        await expect(recoveries.nth(1)).to_have_attribute("data-kind", "epoch")
        await expect(recoveries.nth(1)).to_contain_text("epoch 2: shard 0 re-placed")
        await expect(page.locator("#job-title")).to_contain_text("completed", timeout=60_000)
    body = (await server.request("GET", f"/v1/jobs/{job}", key)).json()
    [replacement] = body["assignments"]
    assert replacement["worker_id"] != victim and replacement["epoch"] == 2
    resumed = int(body["last_checkpoint"]["step"] or 0)
    assert resumed >= 20 and body["progress"]["step"] == 90
    # Every checkpoint step (10 to 90), the recovery and the new epoch are marked; every progress
    # report the schedule accepted is drawn (the agent sends at most a few a second, not every step):
    # the victim's until its assignment was revoked, the replacement's once it was placed.
    await expect(loss_chart).to_have_attribute("data-marks", str(9 + 2))
    items = (await server.request("GET", f"/v1/jobs/{job}/events?limit=500", key)).json()["items"]
    [revoked_at] = [i["seq"] for i in items if i["type"] == "job.assignment_revoked"]
    replaced_at = [i["seq"] for i in items if i["type"] == "job.placed"][-1]
    reports = [i for i in items if i["type"] == "job.progress"]
    before = [i for i in reports if i["event"]["epoch"] == 1 and i["seq"] < revoked_at]
    after = [i for i in reports if i["event"]["epoch"] == 2 and i["seq"] > replaced_at]
    assert before and after and after[-1]["event"]["step"] == 90
    await expect(loss_chart).to_have_attribute("data-points", str(len(before) + len(after)))
    assert await lines(page, "loss") == ["shard 0"]
    # The GPU charts hold both workers' real heartbeats (simulated GPUs), each only while it held the job.
    assert sorted(await lines(page, "GPU utilisation")) == sorted([victim, replacement["worker_id"]])
    gpu_marks = await chart(page, "GPU utilisation").get_attribute("data-marks")
    assert gpu_marks is not None and int(gpu_marks) >= 9 + 2  # at each event's time
    await show(dashboard, "job-recovery")
    assert dashboard.errors == []


async def test_a_late_viewer_and_a_reload_see_the_whole_curve_of_a_long_job(
    gateway_server: GatewayServer, log: EventLog, browser: Browser
) -> None:
    """1,200 accepted reports (three pages of events), a shard lost and re-placed half-way, and its
    old agent going on reporting after it lost the shard: none of the zombie's points is drawn."""
    server = gateway_server
    tenant, key = await server.tenant()
    job = "long-1"
    shards = [Assignment(assignment_id=f"l-{s}", worker_id=f"host-{s}", slot=s, epoch=1) for s in (0, 1, 2)]
    again = Assignment(assignment_id="l-2b", worker_id="host-3", slot=2, epoch=2)
    events: list[Any] = [
        JobSubmitted(name="long", kind="ddp", shards=3, command=["train.py"]),
        placed(*shards),
    ]
    for step in range(1, 401):
        if step == 200:
            events += [
                JobAssignmentRevoked(
                    assignment_id="l-2", worker_id="host-2", slot=2, epoch=1, reason="worker lost"
                ),
                placed(again),
            ]
        current = [shards[0], shards[1], again if step >= 200 else shards[2]]
        events += [
            JobProgress(epoch=a.epoch, slot=a.slot, step=step, loss=loss(step, a.slot)) for a in current
        ]
        if step >= 200:  # the lost worker's agent still runs its old workload and reports
            events.append(JobProgress(epoch=1, slot=2, step=step, loss=9.0))
    await append(log, tenant, job, events)
    assert len(events) > 1_000

    late = await open_job(browser, server, key, job)
    page = late.page
    await expect(chart(page, "loss")).to_have_attribute("data-points", "1200")
    await expect(page.locator("#job-recoveries li")).to_have_text(
        ["step 199: shard 2: worker lost", "step 199: epoch 2: shard 2 re-placed"]
    )
    await append(log, tenant, job, [JobProgress(epoch=1, slot=0, step=401, loss=0.1)])
    await expect(chart(page, "loss")).to_have_attribute("data-points", "1201", timeout=LIVE_MS)
    await page.reload()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await page.click(f'tr[data-job="{job}"]')
    await expect(page.locator("#job-charts")).to_have_attribute("data-history", "loaded", timeout=LIVE_MS)
    await expect(chart(page, "loss")).to_have_attribute("data-points", "1201")
    assert await lines(page, "loss") == ["shard 0", "shard 1", "shard 2"]
    assert late.errors == []


FOLD = """
async (events) => {
  const {JobCurves} = await import('/ui/jobcharts.js');
  let drawn = 0;
  const curves = new JobCurves({point: () => { drawn += 1; }, mark: () => {}});
  const accepted = [];
  for (const [seq, type, body] of events) {
    const before = drawn;
    curves.apply(type, body, seq);
    if (drawn > before) accepted.push(seq);
  }
  return accepted;
}
"""


def random_history(rng: random.Random, n: int) -> list[Any]:
    """A job's events as a buggy or hostile world might order them: placements (some stale),
    revocations (some of superseded assignments), reports from any slot and epoch (some job-wide),
    then the job's end and reports after it."""
    events: list[Any] = [JobSubmitted(name="fuzz", kind="ddp", shards=3, command=["train.py"])]
    epoch, held = 0, {}
    for step in range(1, n + 1):
        roll = rng.random()
        if roll < 0.08:
            slots = rng.sample(range(3), rng.randint(1, 3))
            stale = rng.random() < 0.3
            epoch = epoch if stale else epoch + 1
            made = [
                Assignment(assignment_id=f"a{epoch}-{s}", worker_id=f"w{s}", slot=s, epoch=epoch)
                for s in slots
            ]
            held.update({} if stale else {a.slot: a for a in made})
            events.append(placed(*made))
        elif roll < 0.14 and held:
            a = rng.choice(list(held.values()))
            wrong = rng.random() < 0.3
            events.append(
                JobAssignmentRevoked(
                    assignment_id=a.assignment_id + ("-old" if wrong else ""),
                    worker_id=a.worker_id,
                    slot=a.slot,
                    epoch=a.epoch,
                    reason="worker lost",
                )
            )
            if not wrong:
                held.pop(a.slot)
        else:
            slot = rng.choice([0, 1, 2, 3, None])
            report_epoch = rng.choice([None, max(epoch - 1, 0), epoch, epoch + 1])
            events.append(JobProgress(epoch=report_epoch or 0, slot=slot, step=step, loss=1.0 / step))
    events.append(JobCompleted())
    events += [JobProgress(epoch=epoch, slot=s, step=n + 1, loss=0.0) for s in range(3)]
    return events


def reducer_accepts(events: list[Any]) -> list[int]:
    """The sequences of the progress reports the schedule reducer counts."""
    state, accepted = ScheduleState(), []
    for seq, event in enumerate(events, 1):
        subject = job_subject("acme", "j1", event)
        state = evolve(
            state, Recorded(stream="JOBS", seq=seq, subject=subject, time_ns=seq, msg_id="", event=event)
        )
        progress = state.jobs["acme/j1"].progress
        if progress is not None and progress.seq == seq:
            accepted.append(seq)
    return accepted


async def test_the_page_draws_exactly_the_reports_the_schedule_reducer_counts(
    gateway_server: GatewayServer, browser: Browser
) -> None:
    """The charts' fold against the reducer itself, on random histories full of stale placements,
    superseded revocations, zombie and job-wide reports and reports after the end."""
    dashboard = await open_dashboard(browser, gateway_server)
    for seed in range(5):
        events = random_history(random.Random(seed), 400)
        expected = reducer_accepts(events)
        shown = [[seq, type(e).event_tag(), msgspec.to_builtins(e)] for seq, e in enumerate(events, 1)]
        assert await dashboard.page.evaluate(FOLD, shown) == expected, seed
        assert 20 < len(expected) < 300, len(expected)  # both kinds are well represented
    assert dashboard.errors == []
