"""``GET /v1/endpoints/{endpoint_id}/traffic``: an endpoint's hour in 10-second buckets of the traffic
this gateway proxied (requests, errors, P50/P95/P99, its line's depth and 429s), with its replica
counts and scale events read from the log; tenant-scoped; the replica history outlives the gateway.

The replica is the real sentence-transformers engine (the shipped all-MiniLM-L6-v2) served on a
loopback port, made ready by the events the kernel would append for it; the requests go through the
app's own inference route."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from agent import models
from agent.engines.embeddings import create_app as engine_app
from core.streams import endpoint_subject
from gateway.app import create_app
from projections import ENDPOINTS
from schemas._base import Event
from schemas.endpoints import EndpointScaled
from tests.support.gateway import Api
from tests.support.inference import served, serving_endpoint


def appender(api: Api) -> Any:
    async def append(subject: str, event: Event) -> int:
        assert api.kernel is not None
        return (await api.kernel.append(subject, event, visible_in=ENDPOINTS)).seq

    return append


async def history(api: Api, key: str, endpoint_id: str, **query: Any) -> httpx.Response:
    return await api.request("GET", f"/v1/endpoints/{endpoint_id}/traffic", key, params=query)


async def test_an_endpoints_hour_shows_its_traffic_replicas_and_scale_events(
    api: Api, tmp_path: Path
) -> None:
    model = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    tenant, admin = await api.tenant()
    _, other_admin = await api.tenant()
    viewer = await api.key(tenant, admin, "viewer")
    append = appender(api)
    t0 = time.time()
    async with served(engine_app(model.path, "minilm")) as address:
        endpoint_id, _ = await serving_endpoint(api, admin, tenant, "minilm", append, address, "")
        body = {"model": "minilm", "input": ["a sentence to embed"]}
        for _ in range(8):
            answer = await api.request("POST", "/v1/embeddings", admin, json=body)
            assert answer.status_code == 200, answer.text
    failed = await api.request("POST", "/v1/embeddings", admin, json=body)  # its replica is gone
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "no_replica"

    got = await history(api, viewer, endpoint_id)
    assert got.status_code == 200, got.text
    shown = got.json()
    assert (shown["endpoint_id"], shown["window_s"], shown["bucket_s"]) == (endpoint_id, 3600, 10)
    buckets = shown["traffic"]
    assert sum(b["requests"] for b in buckets) == 9 and sum(b["errors"] for b in buckets) == 1
    for b in buckets:
        assert b["t"] % 10 == 0 and t0 - 10 < b["t"] <= shown["now"] and b["rps"] > 0
        assert 0 < b["p50_ms"] <= b["p95_ms"] <= b["p99_ms"] and b["wait_p99_ms"] is not None
        assert (b["queue_depth"], b["rejected"]) == (0, 0)
    # nine requests: a bucket's P99 is its slowest request, so the slowest bucket's P99 is the 60 s
    # figure's (exact) within the histogram's 2.5%
    traffic = (await api.request("GET", f"/v1/endpoints/{endpoint_id}", admin)).json()["traffic"]
    slowest = max(b["p99_ms"] for b in buckets)
    assert abs(slowest - traffic["p99_ms"]) <= 0.025 * traffic["p99_ms"], (slowest, traffic)

    # replicas from the log: deployed wanting one, ready; a scale-out the autoscaler would append
    assert [(r["wanted"], r["ready"]) for r in shown["replicas"]] == [(1, 0), (1, 1)]
    assert [e["type"] for e in shown["scale_events"]] == ["endpoint.deployed"]
    scaled = EndpointScaled(replicas=2, reason="rps 25.0 over 10.0 per replica", inputs={"rps": 25.0})
    seq = await append(endpoint_subject(tenant, endpoint_id, scaled), scaled)
    bounds = await api.request(
        "PUT", f"/v1/endpoints/{endpoint_id}/scale", admin, json={"min_replicas": 1, "max_replicas": 3}
    )
    assert bounds.status_code == 200, bounds.text
    again = (await history(api, admin, endpoint_id)).json()
    assert [(r["wanted"], r["ready"]) for r in again["replicas"]] == [(1, 0), (1, 1), (2, 1)]
    events = [(e["type"], e["label"]) for e in again["scale_events"]]
    assert events == [
        ("endpoint.deployed", "deployed"),
        ("endpoint.scaled", "scaled to 2"),
        ("endpoint.scaled", "bounds set"),
    ]
    assert again["scale_events"][1]["seq"] == seq
    times = [r["t"] for r in again["replicas"]] + [e["t"] for e in again["scale_events"]]
    assert all(t0 - 5 < t <= again["now"] for t in times)

    # the window narrows; bad windows are refused; another tenant's key finds nothing
    narrow = (await history(api, admin, endpoint_id, window_s=60)).json()
    assert narrow["window_s"] == 60 and sum(b["requests"] for b in narrow["traffic"]) == 9
    for bad in (59, 3601, "hour"):
        refused = await history(api, admin, endpoint_id, window_s=bad)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_query", bad
    assert (await history(api, other_admin, endpoint_id)).status_code == 404
    assert (await history(api, admin, "ep-nothere")).status_code == 404
    assert (await history(api, None, endpoint_id)).status_code == 401
    as_operator = await history(api, api.operator_key, endpoint_id, tenant=tenant)
    assert as_operator.json()["replicas"] == again["replicas"]
    await close_proxy(api.client)


async def test_a_restarted_gateway_draws_the_same_replicas_and_starts_its_traffic_afresh(
    api: Api, tmp_path: Path
) -> None:
    """The replica counts are the log's: a new app on the same streams (a restarted gateway, or
    another one) reads them again; the traffic was the old process's memory."""
    tenant, admin = await api.tenant()
    append = appender(api)
    model = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    async with served(engine_app(model.path, "minilm")) as address:
        endpoint_id, _ = await serving_endpoint(api, admin, tenant, "minilm", append, address, "")
        answer = await api.request("POST", "/v1/embeddings", admin, json={"model": "minilm", "input": "x"})
        assert answer.status_code == 200, answer.text
    before = (await history(api, admin, endpoint_id)).json()
    assert sum(b["requests"] for b in before["traffic"]) == 1
    assert api.kernel is not None
    restarted = create_app(api.kernel.settings, api.kernel.gateway, kernel=api.kernel)
    transport = httpx.ASGITransport(app=restarted)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        after = (
            await Api(client, api.kernel, api.operator_key).request(
                "GET", f"/v1/endpoints/{endpoint_id}/traffic", admin
            )
        ).json()
    assert after["replicas"] == before["replicas"] and after["scale_events"] == before["scale_events"]
    assert after["traffic"] == []
    await close_proxy(api.client)


async def test_the_line_depth_and_its_429s_show_in_the_buckets(api: Api) -> None:
    """No replica comes: one request waits in line until its deadline, one more finds the line full."""
    _, admin = await api.tenant()
    spec = {"name": "slow", "model": "all-MiniLM-L6-v2", "queue_timeout_s": 1.0, "max_queue": 1}
    deployed = await api.request("POST", "/v1/endpoints", admin, json=spec)
    assert deployed.status_code == 201, deployed.text
    body = {"model": "slow", "input": "x"}
    waiting = asyncio.create_task(api.request("POST", "/v1/embeddings", admin, json=body))
    await asyncio.sleep(0.3)
    assert (await api.request("POST", "/v1/embeddings", admin, json=body)).status_code == 429
    assert (await waiting).status_code == 429
    shown = (await history(api, admin, deployed.json()["endpoint_id"])).json()
    buckets = shown["traffic"]
    assert sum(b["rejected"] for b in buckets) == 2 and max(b["queue_depth"] for b in buckets) == 1
    assert all(b["requests"] == 0 and b["p50_ms"] is None and b["rps"] == 0 for b in buckets)


async def close_proxy(client: httpx.AsyncClient) -> None:
    """The fixture runs no lifespan: close the proxy's pool here."""
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    await transport.app.state.inference.close()  # type: ignore[attr-defined]
