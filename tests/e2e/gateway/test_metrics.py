"""``GET /metrics``: operator only, request counts and latencies by route template, projection lag,
queues, workers by state, feed figures; the figures move with what happens."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from core.log import EventLog
from core.streams import job_subject, worker_subject
from schemas.jobs import JobSubmitted
from schemas.workers import WorkerCordoned, WorkerRegistered, WorkerVerified
from tests.support import until
from tests.support.gateway import Api


async def scrape(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as ``(name, sorted labels) -> value``."""
    response = await api.request("GET", "/metrics", api.operator_key)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_need_the_operator_key(api: Api) -> None:
    _, admin = await api.tenant()
    assert (await api.request("GET", "/metrics")).status_code == 401
    forbidden = await api.request("GET", "/metrics", admin)
    assert forbidden.status_code == 403
    assert "operator" in forbidden.json()["error"]["message"]
    assert (await api.request("GET", "/metrics", api.operator_key)).status_code == 200


async def test_requests_are_counted_and_timed_by_route_template_never_by_raw_path(api: Api) -> None:
    tenant, admin = await api.tenant()
    route = {"method": "GET", "route": "/v1/tenants/{tenant}"}
    before = await scrape(api)
    for _ in range(2):
        assert (await api.request("GET", f"/v1/tenants/{tenant}", admin)).status_code == 200
    assert (await api.request("GET", "/v1/tenants/someone-else", admin)).status_code == 404
    assert (await api.request("GET", "/no/such/route")).status_code == 404
    await api.request("BREW", "/v1/health")
    after = await scrape(api)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("resontech_http_requests_total", **route, status="200") == 2
    assert moved("resontech_http_requests_total", **route, status="404") == 1
    assert moved("resontech_http_request_duration_seconds_count", **route, status="200") == 2
    assert moved("resontech_http_request_duration_seconds_bucket", **route, status="200", le="+Inf") == 2
    assert value(after, "resontech_http_request_duration_seconds_sum", **route, status="200") > 0
    unmatched = {"method": "GET", "route": "unmatched", "status": "404"}
    assert moved("resontech_http_requests_total", **unmatched) == 1
    assert moved("resontech_http_requests_total", method="other", route="/v1/health", status="405") == 1
    text = (await api.request("GET", "/metrics", api.operator_key)).text
    assert tenant not in text and "someone-else" not in text and "/no/such" not in text


async def test_projection_lag_queues_and_workers_follow_the_log(api: Api, log: EventLog) -> None:
    high = JobSubmitted(name="urgent", kind="process", shards=1, priority=5)
    managed = JobSubmitted(name="reserved", kind="process", shards=1, pool="managed")
    await log.append(job_subject("acme", "j1", high), high)
    last = await log.append(job_subject("acme", "j2", managed), managed)
    for worker in ("w1", "w2"):
        registered = WorkerRegistered(provider="p1", hostname=worker)
        await log.append(worker_subject(worker, registered), registered)
        await log.append(worker_subject(worker, WorkerVerified), WorkerVerified(by="test"))
    cordoned = WorkerCordoned(reason="bad fan", by="operator")
    workers_last = await log.append(worker_subject("w2", cordoned), cordoned)
    kernel = api.kernel
    assert kernel is not None
    await until(lambda: kernel.runners["schedule"].seq == last.seq, "the schedule applied the jobs")
    await until(
        lambda: kernel.runners["registry"].seq == workers_last.seq, "the registry applied the workers"
    )

    samples = await scrape(api)
    assert value(samples, "resontech_jobs_queued", pool="shared", priority="high") == 1
    assert value(samples, "resontech_jobs_queued", pool="managed", priority="normal") == 1
    assert value(samples, "resontech_jobs", state="queued") == 2
    assert value(samples, "resontech_workers", state="available") == 1
    assert value(samples, "resontech_workers", state="cordoned") == 1
    assert value(samples, "resontech_workers", state="lost") == 0
    assert value(samples, "resontech_projection_applied_seq", projection="schedule") == last.seq
    assert value(samples, "resontech_projection_lag_events", projection="schedule") == 0
    age = value(samples, "resontech_projection_last_applied_age_seconds", projection="schedule")
    assert 0 <= age < 30
    assert ("resontech_feed_subscribers", ()) in samples
    assert ("resontech_feed_dropped_total", ()) in samples

    # A stalled projection shows as lag: stop following JOBS, then append three more jobs.
    follower = next(t for t in kernel._tasks if t.get_name() == "follow-schedule")
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    for n in range(3):
        event = JobSubmitted(name=f"late-{n}", kind="process", shards=1)
        await log.append(job_subject("acme", f"late-{n}", event), event)
    samples = await scrape(api)
    assert value(samples, "resontech_projection_lag_events", projection="schedule") == 3
    assert value(samples, "resontech_projection_lag_events", projection="registry") == 0
    await asyncio.sleep(1.1)
    later = await scrape(api)
    assert value(later, "resontech_projection_last_applied_age_seconds", projection="schedule") >= age + 1
