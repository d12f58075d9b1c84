"""The live feed against a served gateway (granian, real sockets, real NATS): delivery, tenant
isolation, filters, resume without gap or duplicate, auth close codes, pings, telemetry, and a slow
client closed with 4008 while the server and other clients carry on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from core.log import EventLog
from core.streams import endpoint_subject, heartbeat_subject, job_subject, provider_subject, worker_subject
from gateway.auth import new_key
from gateway.feed_filter import FeedClose, FeedFilter, format_cursor, parse_cursor
from gateway.wsclient import ConnectionClosed, WebSocket, connect
from schemas.endpoints import EndpointDeployed, EndpointScaled
from schemas.jobs import JobCompleted, JobPlaced, JobProgress, JobSubmitted
from schemas.providers import ProviderCreated, ProviderKeyIssued
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import Heartbeat, WorkerRegistered
from tests.support import records
from tests.support.feed import auth, open_feed, progress, recv, submit
from tests.support.gateway import Api, GatewayServer, ServeGateway

FAST_PING = {"RESONTECH_GATEWAY_FEED_PING_S": "0.3"}


def cursor_of(text: str) -> dict[str, int]:
    return {name: int(seq) for name, seq in (part.split(":") for part in text.split(","))}


async def refused(
    server: GatewayServer, query: str = "", headers: dict[str, str] | None = None, first: str | None = None
) -> tuple[dict[str, Any], ConnectionClosed]:
    """The ``feed.error`` and the close of a refused connection (nothing else may come first)."""
    ws = await connect(f"{server.ws_url}/v1/feed{query}", headers)
    if first is not None:
        await ws.send(first)
    error = await recv(ws)
    assert error["kind"] == "feed.error", error
    with pytest.raises(ConnectionClosed) as closed:
        await recv(ws)
    return error["error"], closed.value


async def until_cursor(ws: WebSocket, jobs: int, endpoints: int = 0) -> list[dict[str, Any]]:
    """Events received until a ``feed.ping`` says everything up to ``jobs`` / ``endpoints`` was sent."""
    events = []
    while True:
        message = await recv(ws)
        if message["kind"] == "feed.ping":
            cursor = cursor_of(message["cursor"])
            if cursor["jobs"] >= jobs and cursor["endpoints"] >= endpoints:
                return events
        elif not message["kind"].startswith("feed."):
            events.append(message)


def per_stream(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The sequences of ``events`` by stream, each in the order received: what the feed orders."""
    seqs: dict[str, list[int]] = {}
    for m in events:
        seqs.setdefault(m["stream"], []).append(m["seq"])
    return seqs


async def until_known(server: GatewayServer, key: str) -> None:
    """Wait until the served gateway's key index has a key appended straight to the log."""
    for _ in range(100):
        if (await server.request("GET", "/v1/me", key)).status_code == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the gateway never learned the key")


async def deploy(log: EventLog, tenant: str, endpoint: str) -> int:
    event = EndpointDeployed(name=endpoint, model="models/tiny/")
    return (await log.append(endpoint_subject(tenant, endpoint, event), event)).seq


async def scale(log: EventLog, tenant: str, endpoint: str, replicas: int) -> int:
    event = EndpointScaled(replicas=replicas, reason="test")
    return (await log.append(endpoint_subject(tenant, endpoint, event), event)).seq


async def test_live_events_carry_only_the_callers_tenant(serve_gateway: ServeGateway, log: EventLog) -> None:
    server = await serve_gateway(**FAST_PING)
    acme, acme_key = await server.tenant()
    beta, beta_key = await server.tenant()
    acme_feed = await open_feed(server, acme_key)
    beta_feed = await open_feed(server, beta_key)
    operator_feed = await open_feed(server, server.operator_key, f"?tenant={acme}")
    mine = [await submit(log, acme, "train"), await progress(log, acme, "train", 1)]
    theirs = [await submit(log, beta, "secret"), await progress(log, beta, "secret", 1)]
    mine.append(await progress(log, acme, "train", 2))
    mine_ep = await deploy(log, acme, "chat")
    last = mine[-1]

    got = await until_cursor(acme_feed, last, mine_ep)
    assert per_stream(got) == {"JOBS": mine, "ENDPOINTS": [mine_ep]}  # ordered per stream, not across
    first = next(m for m in got if m["kind"] == "job.progress")
    assert first["subject"] == f"job.{acme}.train.progress"
    assert (first["tenant"], first["job"], first["event"]["loss"]) == (acme, "train", 0.5)
    assert first["time"].endswith("Z")
    [deployed] = [m for m in got if m["stream"] == "ENDPOINTS"]
    assert deployed["endpoint"] == "chat" and deployed["event"]["type"] == "endpoint.deployed"
    assert all(beta not in json.dumps(m) for m in got)

    beta_got = await until_cursor(beta_feed, last, mine_ep)
    assert [m["seq"] for m in beta_got] == theirs
    operator_got = await until_cursor(operator_feed, last, mine_ep)
    assert per_stream(operator_got) == {"JOBS": mine, "ENDPOINTS": [mine_ep]}


async def test_a_browser_authenticates_with_its_first_message(
    gateway_server: GatewayServer, log: EventLog
) -> None:
    tenant, key = await gateway_server.tenant()
    feed = await open_feed(gateway_server, key, header=False)
    seq = await submit(log, tenant, "j1")
    message = await recv(feed)
    assert (message["kind"], message["seq"]) == ("job.submitted", seq)
    await feed.send(json.dumps({"kind": "auth", "key": key}))  # the feed takes nothing after auth
    error = await recv(feed)
    assert error["error"]["code"] == "invalid_message"
    with pytest.raises(ConnectionClosed) as closed:
        await recv(feed)
    assert closed.value.code == 4400


async def test_bad_keys_and_bad_queries_close_with_a_code_before_any_event(
    gateway_server: GatewayServer, log: EventLog
) -> None:
    server = gateway_server
    tenant, admin = await server.tenant()
    other, _ = await server.tenant()
    await submit(log, tenant, "j1")  # an event that must not leak to any refused connection
    unknown = "rt_000000000000_" + "x" * 43
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"headers": auth(unknown)}, 4401, "unauthenticated"),
        ({"headers": {"Authorization": "Basic abc"}}, 4401, "unauthenticated"),
        ({"first": "hello"}, 4401, "unauthenticated"),
        ({"first": json.dumps({"kind": "auth", "key": unknown})}, 4401, "unauthenticated"),
        ({"query": f"?key={admin}"}, 4400, "invalid_query"),
        ({"query": "?after=jobs:x", "headers": auth(admin)}, 4400, "invalid_query"),
        ({"query": "?after=jobs:999999", "headers": auth(admin)}, 4400, "invalid_query"),
        ({"query": "?kind=job.exploded", "headers": auth(admin)}, 4400, "invalid_query"),
        ({"query": "?job=a.b", "headers": auth(admin)}, 4400, "invalid_query"),
        ({"query": "?colour=red", "headers": auth(admin)}, 4400, "invalid_query"),
        ({"query": f"?tenant={other}", "headers": auth(admin)}, 4404, "not_found"),
        ({"headers": auth(server.operator_key)}, 4400, "tenant_required"),
        ({"query": "?tenant=*", "headers": auth(server.operator_key)}, 4400, "invalid_query"),
    ]
    for options, code, error_code in cases:
        error, closed = await refused(server, **options)
        assert (closed.code, error["code"]) == (code, error_code), (options, error)
        assert error["message"] and closed.reason, options
    error, _ = await refused(server, f"?key={admin}")
    assert "never put an API key in a URL" in error["message"]

    provider_key_id, provider_key, provider_sha = new_key()
    created = ProviderCreated(display_name="gpu farm")
    await log.append(provider_subject("farm", created), created)
    issued = ProviderKeyIssued(key_id=provider_key_id, key_sha256=provider_sha)
    await log.append(provider_subject("farm", issued), issued)
    await until_known(server, provider_key)
    error, closed = await refused(server, headers=auth(provider_key))
    assert (closed.code, error["code"]) == (4403, "forbidden")

    revoked = await server.key(tenant, admin, "viewer")
    key_id = revoked.split("_")[1]
    response = await server.request("DELETE", f"/v1/tenants/{tenant}/keys/{key_id}", admin)
    assert response.status_code == 204
    error, closed = await refused(server, headers=auth(revoked))
    assert (closed.code, error["code"]) == (4401, "key_revoked")


async def test_filters_by_job_endpoint_and_kind(serve_gateway: ServeGateway, log: EventLog) -> None:
    server = await serve_gateway(**FAST_PING)
    tenant, key = await server.tenant()
    feeds = {
        query: await open_feed(server, key, query)
        for query in (
            "?job=j1",
            "?kind=job.progress",
            "?endpoint=e1",
            "?job=j2&endpoint=e1",
            "?kind=endpoint",
        )
    }
    j1 = [await submit(log, tenant, "j1"), await progress(log, tenant, "j1", 1)]
    j2 = [await submit(log, tenant, "j2"), await progress(log, tenant, "j2", 1)]
    e1 = [await deploy(log, tenant, "e1"), await scale(log, tenant, "e1", 2)]
    e2 = [await deploy(log, tenant, "e2")]
    expected = {
        "?job=j1": j1,
        "?kind=job.progress": [j1[1], j2[1]],
        "?endpoint=e1": e1,
        "?job=j2&endpoint=e1": j2 + e1,
        "?kind=endpoint": e1 + e2,
    }
    for query, feed in feeds.items():
        got = await until_cursor(feed, j2[-1], e2[-1])
        assert sorted(m["seq"] for m in got) == sorted(expected[query]), query


@pytest.mark.parametrize("queue", ["1000", "16"])
async def test_resume_after_a_cursor_misses_nothing_and_repeats_nothing(
    serve_gateway: ServeGateway, log: EventLog, queue: str
) -> None:
    """With a queue of 16 every reconnect is far enough behind to replay before joining the hub."""
    server = await serve_gateway(RESONTECH_GATEWAY_FEED_QUEUE=queue, **FAST_PING)
    tenant, key = await server.tenant()
    other, _ = await server.tenant()
    await submit(log, tenant, "j1")
    await deploy(log, tenant, "e1")
    await submit(log, other, "noise")
    steps = 240

    async def produce() -> None:
        for step in range(steps):
            await progress(log, tenant, "j1", step)
            if step % 3 == 0:
                await scale(log, tenant, "e1", step)
                await progress(log, other, "noise", step)
            await asyncio.sleep(0.004)
        await log.append(job_subject(tenant, "j1", JobCompleted()), JobCompleted())

    received: list[tuple[str, int]] = []
    position = {"JOBS": 0, "ENDPOINTS": 0}

    async def read(feed: WebSocket, stop: int) -> None:
        while len(received) < stop:
            message = await recv(feed)
            if message["kind"].startswith("feed."):
                continue
            received.append((message["stream"], message["seq"]))
            position[message["stream"]] = message["seq"]

    feed = await open_feed(server, key, "?after=jobs:0,endpoints:0")
    producer = asyncio.create_task(produce())
    await read(feed, stop=60)
    await feed.close()
    for _ in range(3):  # disconnected while events keep coming, then back: three times
        await asyncio.sleep(0.15)
        feed = await open_feed(
            server, key, f"?after=jobs:{position['JOBS']},endpoints:{position['ENDPOINTS']}"
        )
        await read(feed, stop=len(received) + 50)
        await feed.close()
    feed = await open_feed(server, key, f"?after=jobs:{position['JOBS']},endpoints:{position['ENDPOINTS']}")
    stored: list[tuple[str, int]] = []
    while not stored or any(position[stream] < seq for stream, seq in stored):
        # to the end of both streams: the feed orders each stream, not across them, so the last
        # scale may come after job.completed (pings every 0.3 s keep recv from waiting for nothing)
        if producer.done() and not stored:
            stored = [("JOBS", r.seq) for r in await records(log, "JOBS", f"job.{tenant}.>")]
            stored += [("ENDPOINTS", r.seq) for r in await records(log, "ENDPOINTS", f"endpoint.{tenant}.>")]
            continue
        message = await recv(feed)
        if not message["kind"].startswith("feed."):
            received.append((message["stream"], message["seq"]))
            position[message["stream"]] = message["seq"]
    await producer
    assert len(received) == len(set(received)), "an event was sent twice"
    assert sorted(received) == sorted(stored), "an event was missed"
    for stream in ("JOBS", "ENDPOINTS"):
        seqs = [seq for s, seq in received if s == stream]
        assert seqs == sorted(seqs), f"{stream} out of order"


async def test_pings_advance_the_cursor_and_a_revoked_key_is_closed(
    serve_gateway: ServeGateway, log: EventLog
) -> None:
    server = await serve_gateway(**FAST_PING)
    tenant, admin = await server.tenant()
    other, _ = await server.tenant()
    viewer = await server.key(tenant, admin, "viewer")
    feed = await open_feed(server, viewer)
    seq = await submit(log, other, "theirs")
    assert await until_cursor(feed, seq) == []  # the ping moved past an event the tenant may not see
    key_id = viewer.split("_")[1]
    assert (await server.request("DELETE", f"/v1/tenants/{tenant}/keys/{key_id}", admin)).status_code == 204
    while (message := await recv(feed))["kind"] == "feed.ping":
        pass
    assert message["error"]["code"] == "key_revoked"  # as when a revoked key connects
    with pytest.raises(ConnectionClosed) as closed:
        await recv(feed)
    assert closed.value.code == 4401


async def test_telemetry_of_workers_running_the_tenants_work(
    gateway_server: GatewayServer, log: EventLog
) -> None:
    server = gateway_server
    tenant, key = await server.tenant()
    other, other_key = await server.tenant()
    everything = await open_feed(server, key)
    telemetry_of_j2 = await open_feed(server, key, "?job=j2&kind=telemetry")
    theirs = await open_feed(server, other_key)
    # w1 registered one GPU: readings of GPUs a worker did not register are shown to nobody
    gpu = Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81_559, vram_free_mb=81_000)
    registered = WorkerRegistered(provider="p1", hostname="h1", gpus=[gpu])
    await log.append(worker_subject("w1", registered), registered)
    for _ in range(100):  # shown by the gateway: its registry has it
        if (await server.request("GET", "/v1/workers/w1", server.operator_key)).status_code == 200:
            break
        await asyncio.sleep(0.05)
    await submit(log, tenant, "j1")
    assignment = Assignment(assignment_id="a-1", worker_id="w1", slot=0, epoch=1, gpus=1)
    placed = JobPlaced(assignments=[assignment], provenance=Provenance(candidates=1))
    await log.append(job_subject(tenant, "j1", placed), placed)
    assert [(await recv(everything))["kind"] for _ in range(2)] == ["job.submitted", "job.placed"]
    beat = Heartbeat(interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=87.5)], running=["a-1", "a-x"])
    first = await log.append(heartbeat_subject("w1"), beat)
    await log.append(heartbeat_subject("w1"), beat)  # within the rate limit: not sent again

    message = await recv(everything)
    assert message["kind"] == "telemetry"
    assert (message["seq"], message["stream"], message["worker"]) == (first.seq, "HEARTBEATS", "w1")
    assert (message["jobs"], message["endpoints"], message["tenant"]) == (["j1"], [], tenant)
    assert message["event"]["gpus"][0]["util_pct"] == 87.5
    marker = await submit(log, tenant, "j2")
    await submit(log, other, "marker")
    assert (await recv(everything))["seq"] == marker  # no second telemetry message before it
    assert (await recv(theirs))["kind"] == "job.submitted"  # never another tenant's telemetry
    with pytest.raises(TimeoutError):
        await recv(telemetry_of_j2, timeout=1.0)


async def test_a_slow_client_is_closed_with_4008_and_the_server_carries_on(
    serve_gateway: ServeGateway, log: EventLog
) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_FEED_QUEUE="64")
    tenant, key = await server.tenant()
    await submit(log, tenant, "big")
    slow = await open_feed(server, key, "?after=jobs:0", receive_buffer=4096, read_limit=4096)
    healthy = await open_feed(server, key, "?kind=job.completed")
    metrics = {"text": ""}

    async def dropped() -> bool:
        response = await server.request("GET", "/metrics", server.operator_key)
        metrics["text"] = response.text
        return "resontech_feed_dropped_total 1.0" in response.text

    heavy = JobProgress(epoch=1, metrics={f"metric_{i}": float(i) for i in range(200)})  # ~3 KB a message
    for batch in range(200):
        await log.append_many([(job_subject(tenant, "big", heavy), heavy)] * 20)
        await asyncio.sleep(0.01)
        if batch % 10 == 9 and await dropped():
            break
    assert await dropped(), metrics["text"]
    assert "resontech_feed_subscribers 1.0" in metrics["text"]  # the slow one is gone, the other stays
    done = await log.append(job_subject(tenant, "big", JobCompleted()), JobCompleted())
    assert (await recv(healthy))["seq"] == done.seq
    assert (await server.client.get("/v1/health")).status_code == 200

    seqs = []
    while (message := await recv(slow))["kind"] != "feed.error":
        if message["kind"] != "feed.ready":  # after the replay of the one stored event
            seqs.append(message["seq"])
    assert message["error"]["code"] == "too_slow"
    with pytest.raises(ConnectionClosed) as closed:
        await recv(slow)
    assert closed.value.code == 4008
    after = closed.value.reason.rpartition("after=")[2]
    assert cursor_of(after)["jobs"] == seqs[-1]
    assert seqs == list(range(1, seqs[-1] + 1))
    resumed = await open_feed(server, key, f"?after={after}")
    while (message := await recv(resumed))["kind"] != "job.completed":
        seqs.append(message["seq"])
    assert [*seqs, message["seq"]] == list(range(1, done.seq + 1))


async def test_plain_http_on_the_feed_is_426_and_openapi_documents_the_protocol(api: Api) -> None:
    response = await api.request("GET", "/v1/feed")
    assert response.status_code == 426
    assert response.json()["error"]["code"] == "upgrade_required"
    assert response.headers["upgrade"] == "websocket"
    document = (await api.request("GET", "/openapi.json")).json()
    operation = document["paths"]["/v1/feed"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"after", "job", "endpoint", "kind", "tenant"}
    assert "101" in operation["responses"]
    assert "after=jobs:<seq>,endpoints:<seq>" in document["info"]["description"]


def test_cursors_and_filters_in_isolation() -> None:
    assert parse_cursor("jobs:120,endpoints:7") == {"JOBS": 120, "ENDPOINTS": 7}
    assert parse_cursor("endpoints:7") == {"ENDPOINTS": 7}
    assert format_cursor(parse_cursor("endpoints:7,jobs:120")) == "jobs:120,endpoints:7"
    for bad in ("120", "jobs:-1", "jobs:1,jobs:2", "workers:3", "jobs:"):
        with pytest.raises(FeedClose) as refused:
            parse_cursor(bad)
        assert refused.value.code == 4400
    both = FeedFilter("acme", jobs="j1", endpoints="e1", kinds="job.progress,endpoint,telemetry")
    assert both.wants_event("JOBS", "job.progress", "j1")
    assert not both.wants_event("JOBS", "job.submitted", "j1")
    assert not both.wants_event("JOBS", "job.progress", "j2")
    assert both.wants_event("ENDPOINTS", "endpoint.scaled", "e1")
    assert both.wants_telemetry(["j1"], []) and not both.wants_telemetry(["j2"], ["e2"])
    assert both.subjects("JOBS") == "job.acme.j1.>" and both.replays("ENDPOINTS")
    only_jobs = FeedFilter("acme", jobs="j1,j2", kinds="job")
    assert only_jobs.subjects("JOBS") == "job.acme.>"
    assert not only_jobs.replays("ENDPOINTS") and not only_jobs.wants_telemetry(["j1"], [])
    assert not FeedFilter("acme", kinds="telemetry").replays("JOBS")


async def test_environment_values_never_travel_on_the_feed(
    gateway_server: GatewayServer, log: EventLog
) -> None:
    tenant, admin = await gateway_server.tenant()
    viewer = await gateway_server.key(tenant, admin, "viewer")
    live = await open_feed(gateway_server, viewer)
    event = JobSubmitted(name="train", kind="process", shards=1, env={"WANDB_API_KEY": "secret"})
    seq = (await log.append(job_subject(tenant, "j1", event), event)).seq
    replayed = await open_feed(gateway_server, viewer, f"?after=jobs:{seq - 1}")
    for feed in (live, replayed):
        message = await recv(feed)
        if message["kind"] == "feed.ready":  # the gateway had not applied it yet: it follows live
            message = await recv(feed)
        assert (message["seq"], message["event"]["name"]) == (seq, "train")
        assert message["event"]["env"] == {"WANDB_API_KEY": "<redacted>"}, message
