"""Replica keys at the gateway: the inference proxy calls each replica with the key its agent's
runtime made for it, never with the caller's; and no tenant ever reads that key, in the endpoint's
API body, the list, or the live or replayed feed (the kernel's raw log keeps it).

The replicas are the real sentence-transformers engine (the shipped all-MiniLM-L6-v2) served on
loopback ports, one with a key and one without (a replica of an older event); the requests they
receive are recorded at their door."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from agent import models
from agent.engines.embeddings import create_app
from agent.engines.keys import RequireKey
from core.log import EventLog
from projections import ENDPOINTS
from schemas._base import Event
from schemas.endpoints import EndpointReplicaReady
from tests.support import of, records
from tests.support.feed import open_feed
from tests.support.gateway import Api, GatewayServer
from tests.support.inference import served, serving_endpoint


class Door:
    """ASGI middleware in front of an engine: the headers of every request that reached it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


async def test_the_proxy_calls_a_replica_with_its_own_key_never_the_callers(api: Api, tmp_path: Path) -> None:
    model = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    engine = create_app(model.path, "minilm")
    replica_key = secrets.token_urlsafe(32)
    keyed, keyless = Door(RequireKey(engine, replica_key)), Door(engine)
    tenant, admin = await api.tenant()
    assert api.kernel is not None

    async def append(subject: str, event: Event) -> int:
        assert api.kernel is not None
        return (await api.kernel.append(subject, event, visible_in=ENDPOINTS)).seq

    async with served(keyed) as keyed_at, served(keyless) as keyless_at:
        await serving_endpoint(api, admin, tenant, "keyed", append, keyed_at, replica_key)
        await serving_endpoint(api, admin, tenant, "old", append, keyless_at, "")
        # the caller's key, in every header it could hide in
        sneaky = {"x-api-key": admin, "cookie": f"key={admin}", "openai-organization": admin}
        for name, door in (("keyed", keyed), ("old", keyless)):
            answer = await api.request(
                "POST", "/v1/embeddings", admin, json={"model": name, "input": ["hello"]}, headers=sneaky
            )
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["data"][0]["embedding"]) == 384
            [headers] = door.seen
            assert not any(admin in value for value in headers.values()), headers
        assert keyed.seen[0]["authorization"] == f"Bearer {replica_key}"
        assert "authorization" not in keyless.seen[0]  # a replica of an older event takes none

        # a replica that refuses the kernel's key for it: the caller is not told its own key is wrong
        await serving_endpoint(api, admin, tenant, "stale", append, keyed_at, "not-its-key")
        failed = await api.request("POST", "/v1/embeddings", admin, json={"model": "stale", "input": "x"})
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "no_replica", failed.text
        assert "refused its key" in failed.json()["error"]["message"]

        # another workload of the host, with no key or a tenant's, is refused at the replica
        async with httpx.AsyncClient(base_url=keyed_at) as http:
            body = {"model": "keyed", "input": ["x"]}
            for headers in ({}, api.auth(admin)):
                refused = await http.post("/v1/embeddings", json=body, headers=headers)
                assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            assert (await http.get("/health")).status_code == 200
    transport = api.client._transport  # the fixture runs no lifespan: close the proxy's pool here
    assert isinstance(transport, httpx.ASGITransport)
    await transport.app.state.inference.close()  # type: ignore[attr-defined]


async def test_a_tenant_never_reads_its_replicas_key(gateway_server: GatewayServer, log: EventLog) -> None:
    server = gateway_server
    tenant, admin = await server.tenant()
    viewer = await server.key(tenant, admin, "viewer")
    replica_key = secrets.token_urlsafe(32)
    live = await open_feed(server, viewer)

    async def append(subject: str, event: Event) -> int:
        return (await log.append(subject, event)).seq

    endpoint_id, ready_seq = await serving_endpoint(
        server, admin, tenant, "chat", append, "http://10.0.0.5:8000", replica_key
    )
    replayed = await open_feed(server, viewer, f"?after=endpoints:{ready_seq - 1}")
    for feed in (live, replayed):
        while True:
            text = await asyncio.wait_for(feed.recv(), 15.0)
            assert replica_key not in text and "api_key" not in text, text
            if '"endpoint.replica_ready"' in text:
                break
        assert '"address":"http://10.0.0.5:8000"' in text  # the rest of the event is shown

    path = f"/v1/endpoints/{endpoint_id}"
    deadline = time.monotonic() + 15
    while (await server.request("GET", path, viewer)).json()["ready_replicas"] != 1:
        assert time.monotonic() < deadline, "the gateway never applied the ready replica"
        await asyncio.sleep(0.05)
    for key, query in ((viewer, ""), (admin, ""), (server.operator_key, f"?tenant={tenant}")):
        for url in (path, "/v1/endpoints"):
            answer = await server.request("GET", url + query, key)
            assert answer.status_code == 200 and "10.0.0.5:8000" in answer.text, answer.text
            assert replica_key not in answer.text and "api_key" not in answer.text

    # the kernel's own log keeps it: the gateway reads it from there to call the replica
    stored = of(await records(log, "ENDPOINTS", f"endpoint.{tenant}.{endpoint_id}.>"), EndpointReplicaReady)
    assert [e.api_key for e in stored] == [replica_key]


async def test_every_engine_route_but_health_needs_the_key() -> None:
    """vLLM checks its key on /v1 only; the agent's middleware closes its other routes too
    (/tokenize, /pooling, /metrics...), for the CPU engine and vLLM alike."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse("served")

    paths = ["/health", "/tokenize", "/pooling", "/metrics", "/v1/models"]
    app = RequireKey(Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths]), "k3y")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as client:
        for path in paths[1:]:
            answer = await client.post(path)
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", path
            assert (await client.post(path, headers={"Authorization": "Bearer k3y"})).text == "served"
        assert (await client.get("/health")).text == "served"
