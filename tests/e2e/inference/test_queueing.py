"""The line and routing end to end: the official ``openai`` client against a served gateway, replicas of
the sentence-transformers engine (``engine: cpu``, ready in seconds) placed on real agents.

A request of :data:`SLOW` (32 texts of ~256 tokens each) keeps a replica busy for a good part of a
second on this host, long beside the milliseconds a burst takes to arrive: with one slot per replica
and a line of two, a burst of ten is three answered and seven refused, every time.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec
import openai
import pytest

from core.log import EventLog
from gateway.routing import RoutedBody, leading_text, rendezvous, route_key
from schemas.endpoints import EndpointScaled
from tests.support import AgentProcess, coordinator, of, records, registered
from tests.support.gateway import GatewayServer
from tests.support.inference import (
    SLOW_HOST,
    ST_READY_S,
    create_endpoint,
    engine_pid,
    has_ready,
    openai_client,
    until_awaited,
)

SLOW = [f"text {i}: " + "the quick brown fox jumps over the lazy dog " * 30 for i in range(32)]


async def _metrics(server: GatewayServer) -> str:
    return (await server.request("GET", "/metrics", server.operator_key)).text


async def _view(server: GatewayServer, key: str, endpoint_id: str) -> dict[str, Any]:
    return dict((await server.request("GET", f"/v1/endpoints/{endpoint_id}", key)).json())


async def test_a_burst_beyond_the_line_gets_429s_every_admitted_request_is_answered_and_the_line_scales_out(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    server = gateway_server
    await registered(log, agents("q1", *SLOW_HOST))
    tenant, admin = await server.tenant()
    member = await server.key(tenant, admin, "member")
    async with coordinator(log):
        endpoint = await create_endpoint(
            server,
            admin,
            name="busy",
            model="all-MiniLM-L6-v2",
            engine="cpu",
            min_replicas=1,
            max_replicas=2,
            max_concurrency=1,
            max_queue=2,
            target_rps_per_replica=1000,
        )
        endpoint_id = endpoint["endpoint_id"]
        assert endpoint["spec"]["max_queue"] == 2 and endpoint["spec"]["routing"] == "round_robin"
        await until_awaited(
            lambda: has_ready(server, admin, endpoint_id, 1), "a replica ready", timeout=ST_READY_S
        )
        apis = [openai_client(server, admin), openai_client(server, member)]
        await apis[0].embeddings.create(model="busy", input="warm up")

        results = await asyncio.gather(
            *(apis[i % 2].embeddings.create(model="busy", input=SLOW) for i in range(10)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        answered = [r for r in results if not isinstance(r, BaseException)]
        assert len(answered) == 3 and len(refused) == 7, results
        assert all(len(r.data) == 32 for r in answered)
        assert int(refused[0].response.headers["retry-after"]) >= 1
        assert refused[0].body["type"] == "requests" and refused[0].body["code"] == "rate_limit_exceeded"  # type: ignore[index]
        view = await _view(server, admin, endpoint_id)
        assert view["traffic"]["rejected"] == 7 and view["traffic"]["queue_depth"] == 0
        assert view["traffic"]["wait_p99_ms"] > 0 and view["traffic"]["in_flight"] == 0

        # a client that gives up while in line leaves it
        held = [asyncio.create_task(apis[0].embeddings.create(model="busy", input=SLOW)) for _ in range(2)]
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(timeout=0.3) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(
                    f"{server.url}/v1/embeddings",
                    json={"model": "busy", "input": "x"},
                    headers={"authorization": f"Bearer {admin}"},
                )
        await asyncio.gather(*held)
        abandoned = f'resontech_endpoint_queue_abandoned_total{{endpoint="busy",tenant="{tenant}"}} 1.0'
        await until_awaited(lambda: _has(server, abandoned), "the client that left counted", timeout=10)
        metrics = await _metrics(server)
        assert (
            f'resontech_endpoint_rejected_total{{endpoint="busy",reason="queue_full",tenant="{tenant}"}} 7.0'
            in metrics
        )
        assert f'resontech_endpoint_queue_depth{{endpoint="busy",tenant="{tenant}"}} 0.0' in metrics

        # a line that lasts, under the RPS target: one more replica, with what it saw in the event
        stop = asyncio.Event()
        loads = [asyncio.create_task(_keep_busy(apis[i % 2], stop)) for i in range(3)]
        try:
            scaled = await until_awaited(
                lambda: _scaled_on_the_line(log, endpoint_id), "a scale-out on the line", 30
            )
        finally:
            stop.set()
            await asyncio.gather(*loads)
        assert scaled.replicas == 2 and scaled.inputs["queue_depth"] >= 1 and scaled.inputs["rps"] < 1000


async def _has(server: GatewayServer, line: str) -> bool:
    return line in await _metrics(server)


async def _keep_busy(api: openai.AsyncOpenAI, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await api.embeddings.create(model="busy", input=SLOW)
        except openai.RateLimitError:
            await asyncio.sleep(0.05)


async def _scaled_on_the_line(log: EventLog, endpoint_id: str) -> EndpointScaled | None:
    scaled = of(await records(log, "ENDPOINTS", f"endpoint.*.{endpoint_id}.scaled"), EndpointScaled)
    return next((s for s in scaled if "wait in line" in s.reason), None)


async def test_session_routing_keeps_a_user_on_its_replica_until_it_dies_and_prefix_routing_groups_prompts(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    server = gateway_server
    await registered(log, agents("s1", *SLOW_HOST))
    await registered(log, agents("s2", *SLOW_HOST))
    tenant, admin = await server.tenant()
    async with coordinator(log):
        common = {"model": "all-MiniLM-L6-v2", "engine": "cpu", "min_replicas": 2, "max_replicas": 2}
        sessions = await create_endpoint(server, admin, name="sessions", routing="session", **common)
        prefixes = await create_endpoint(server, admin, name="prefixes", routing="prefix", **common)
        for endpoint_id in (sessions["endpoint_id"], prefixes["endpoint_id"]):
            await until_awaited(_ready_two(server, admin, endpoint_id), "two replicas ready", ST_READY_S)
        api = openai_client(server, admin)

        async def slot(model: str, text: str = "x", **kwargs: Any) -> str:
            raw = await api.embeddings.with_raw_response.create(model=model, input=text, **kwargs)
            return raw.headers["x-resontech-replica"]

        # session: one user, one replica; users spread over both; the header is a session key too
        home = {await slot("sessions", user="alice") for _ in range(4)}
        assert len(home) == 1
        assert len({await slot("sessions", user=f"user-{i}") for i in range(12)}) == 2
        assert len({await slot("sessions", extra_headers={"x-session-id": "s-7"}) for _ in range(3)}) == 1

        # prefix: a shared leading text on one replica, within the load bound; others spread
        shared = "Background for every question. " + "A long shared system prompt. " * 40
        assert len({await slot("prefixes", shared + f" question {i}?") for i in range(6)}) == 1
        assert len({await slot("prefixes", f"{i}: " + shared) for i in range(12)}) == 2
        view = await _view(server, admin, prefixes["endpoint_id"])
        addresses = {str(r["slot"]): r["address"] for r in view["replicas"]}
        key = route_key("prefix", _body(shared + " question 0?"), {})
        assert key is not None and leading_text(_body(shared)) is not None
        expected = rendezvous(key, sorted(addresses.values()))[0]
        assert addresses[await slot("prefixes", shared + " question 9?")] == expected

        # alice's replica dies: her requests still succeed, on the other replica, and stay there
        replicas = {
            str(r["slot"]): r["address"]
            for r in (await _view(server, admin, sessions["endpoint_id"]))["replicas"]
        }
        (alice,) = home
        os.kill(engine_pid([replicas[alice]]), signal.SIGKILL)
        moved = [await slot("sessions", user="alice") for _ in range(4)]
        assert alice not in moved and len(set(moved)) == 1
    assert tenant


def _ready_two(server: GatewayServer, key: str, endpoint_id: str) -> Callable[[], Awaitable[bool]]:
    return lambda: has_ready(server, key, endpoint_id, 2)


def _body(text: str) -> RoutedBody:
    return msgspec.json.decode(msgspec.json.encode({"model": "m", "input": text}), type=RoutedBody)
