"""Helpers for tests that serve endpoints: agents beating often enough while an engine loads
(:data:`SLOW_HOST`), an endpoint created and watched through a served gateway, the official ``openai``
client on it, the engine process behind a replica, and an ASGI app served on a free loopback port as an
engine's own process serves it (:func:`served`). Times are in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import uvicorn
from starlette.types import ASGIApp

from core.streams import endpoint_subject
from ops.ports import free_port
from schemas.endpoints import EndpointReplicaPlaced, EndpointReplicaReady
from schemas.values import Assignment, Provenance
from tests.support.gateway import Api, GatewayServer

ST_READY_S = 180.0


SLOW_HOST = ("--heartbeat", "2")
"""Engines load torch on a shared 2-core host: beats 10x sparser than the tests' default keep the
agents from being declared lost while an engine starts beside them (at 1 s, two CI runs with CPU
burners beside them lost a healthy agent and replaced its replica)."""


async def until_awaited(predicate: Callable[[], Awaitable[Any]], what: str, timeout: float) -> Any:
    """Await ``predicate()`` until it is truthy (every 0.2 s), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await predicate():
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting until {what}")


async def create_endpoint(server: GatewayServer, key: str, **body: Any) -> dict[str, Any]:
    response = await server.request("POST", "/v1/endpoints", key, json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def ready_count(server: GatewayServer, key: str, endpoint_id: str) -> int:
    response = await server.request("GET", f"/v1/endpoints/{endpoint_id}", key)
    return int(response.json()["ready_replicas"])


def openai_client(server: GatewayServer, key: str, **kwargs: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120.0, **kwargs
    )


async def in_state(server: GatewayServer, key: str, endpoint_id: str, state: str) -> bool:
    return bool((await server.request("GET", f"/v1/endpoints/{endpoint_id}", key)).json()["state"] == state)


async def has_ready(server: GatewayServer, key: str, endpoint_id: str, n: int) -> bool:
    return await ready_count(server, key, endpoint_id) >= n


async def ready_addresses(server: GatewayServer, key: str, endpoint_id: str) -> list[str]:
    body = (await server.request("GET", f"/v1/endpoints/{endpoint_id}", key)).json()
    return [r["address"] for r in body["replicas"] if r["state"] == "ready"]


def engine_pid(addresses: list[str]) -> int:
    """The pid of the engine listening on the first address (found through /proc, as ss would)."""
    port = int(addresses[0].rsplit(":", 1)[1])
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    return int(out.stdout.split("pid=")[1].split(",")[0])


@contextlib.asynccontextmanager
async def served(app: ASGIApp) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free loopback port, as the engine's own process serves it."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the engine did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def serving_endpoint(
    api: Api, key: str, tenant: str, name: str, append: Any, address: str, api_key: str
) -> tuple[str, int]:
    """Deploy ``name`` through the API and make one replica of it ready at ``address`` with
    ``api_key``, as the kernel would once its agent's claim is judged; its id and the ready event's
    ENDPOINTS sequence."""
    deployed = await api.request("POST", "/v1/endpoints", key, json={"name": name, "model": name})
    assert deployed.status_code == 201, deployed.text
    endpoint_id = str(deployed.json()["endpoint_id"])
    replica = Assignment(assignment_id=f"{endpoint_id}-s0-e1", worker_id="w-serve", slot=0, epoch=1)
    ready = EndpointReplicaReady(
        assignment_id=replica.assignment_id, epoch=1, address=address, api_key=api_key
    )
    seq = 0
    for event in (EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1)), ready):
        seq = await append(endpoint_subject(tenant, endpoint_id, event), event)
    return endpoint_id, seq
