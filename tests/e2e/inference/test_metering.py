"""Inference metering and failures end to end, with the sentence-transformers engine (``engine:
cpu``: ready in seconds, and fails as fast): tokens counted by the gateway reach METERING and the
billing API; a replica's own usage ticks reach the ledger while it runs and stop once it scaled to
zero, even when the coordinator restarted in between; an engine that cannot start fails its endpoint,
which says why and stops being placed; a model served from a workspace folder."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from agent.models import MINILM, _package_dir
from core.log import EventLog
from gateway.client import Client
from ops.coordinator.replicas import MAX_START_FAILURES
from schemas.endpoints import EndpointFailed, EndpointReplicaPlaced
from schemas.metering import TokensServed, UsageTick
from schemas.workers import Heartbeat
from tests.support import REPO, AgentProcess, coordinator, of, records, registered
from tests.support.gateway import GatewayServer, ServeGateway
from tests.support.inference import SLOW_HOST, ST_READY_S, create_endpoint, openai_client, until_awaited


async def _endpoint(server: GatewayServer, key: str, endpoint_id: str) -> dict[str, Any]:
    response = await server.request("GET", f"/v1/endpoints/{endpoint_id}", key)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def _billed(server: GatewayServer, key: str, endpoint_id: str) -> dict[str, Any] | None:
    """The endpoint's usage line of ``GET /v1/billing/usage`` (all periods summed), or ``None``."""
    body = (await server.request("GET", "/v1/billing/usage", key)).json()
    work = [w for p in body["periods"] for w in p["work"] if w["work_id"] == endpoint_id]
    if not work:
        return None
    return {
        "tokens": sum(w["tokens"] for w in work),
        "cpu_seconds": sum(w["cpu_seconds"] for w in work),
        "period_tokens": sum(p["tokens"] for p in body["periods"]),
    }


async def _ticks(log: EventLog, endpoint_id: str) -> tuple[list[UsageTick], list[TokensServed]]:
    """The endpoint's usage ticks: the agents' (replica time), the gateways' (tokens)."""
    found = await records(log, "METERING")
    agent = [r.event for r in found if r.event.work_id == endpoint_id and not r.subject.endswith(".tokens")]
    gateway = [r.event for r in found if r.event.work_id == endpoint_id and r.subject.endswith(".tokens")]
    return agent, gateway


async def _runs(log: EventLog, worker_id: str) -> list[str]:
    """What the worker's latest heartbeat says it runs."""
    beats = of(await records(log, "HEARTBEATS", f"hb.{worker_id}"), Heartbeat)
    return list(beats[-1].running) if beats else []


async def test_tokens_and_replica_time_are_metered_and_billing_stops_at_zero(
    log: EventLog, agents: Callable[..., AgentProcess], serve_gateway: ServeGateway
) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_TOKEN_TICK_S="1")
    worker_id = await registered(log, agents("m1", *SLOW_HOST))
    tenant, admin = await server.tenant()
    async with coordinator(log):
        endpoint = await create_endpoint(
            server, admin, name="emb", model="all-MiniLM-L6-v2", engine="cpu", scale_to_zero_after_s=10
        )
        endpoint_id = endpoint["endpoint_id"]
        await until_awaited(
            lambda: _ready_replica(server, admin, endpoint_id), "a replica ready", timeout=ST_READY_S
        )
        api = openai_client(server, admin)
        served = 0
        for text in ("hello world", "tokens are counted by the gateway", ["two inputs", "in one request"]):
            result = await api.embeddings.create(model="emb", input=text)
            assert result.usage.prompt_tokens > 0
            served += result.usage.total_tokens
        billed = await until_awaited(
            lambda: _billed_tokens(server, admin, endpoint_id, served), "the tokens billed", timeout=30
        )
        assert billed["tokens"] == billed["period_tokens"] == served
        agent_ticks, token_ticks = await _ticks(log, endpoint_id)
        assert sum(t.tokens for t in token_ticks) == served
        assert all(isinstance(t, TokensServed) and t.source.startswith("gateway-") for t in token_ticks)
        assert agent_ticks and all(t.work_kind == "endpoint" and t.cpu_ms > 0 for t in agent_ticks)
        assert {t.assignment_id for t in token_ticks} <= {t.assignment_id for t in agent_ticks}
        assignment = agent_ticks[0].assignment_id
    print(f"{served} tokens metered on {len(token_ticks)} tick(s)")

    # A new coordinator, which never commanded the replica, must still stop it at zero.
    async with coordinator(log):
        await until_awaited(
            lambda: _state_is(server, admin, endpoint_id, "scaled_to_zero"), "scaled to zero", 60
        )
        await until_awaited(lambda: _stopped(log, worker_id, assignment), "the replica stopped", timeout=30)
    stopped_ms = time.time_ns() // 1_000_000  # after the first beat without it: its process had ended
    # The replica's last tick (up to its process's end) travels through the intake, the beat that
    # leaves it out does not: which lands first is not promised, so give the intake six of the agents'
    # metering intervals, then hold the replica's ticks to what the agent promises.
    await asyncio.sleep(3.0)
    ticks = sorted(
        (t for t in (await _ticks(log, endpoint_id))[0] if t.assignment_id == assignment),
        key=lambda t: t.start_ms,
    )
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(ticks)), "gaps or overlaps in the ticks"
    assert ticks[-1].end_ms <= stopped_ms, "usage metered after the replica stopped"
    before = await _billed(server, admin, endpoint_id)
    assert before is not None and before["cpu_seconds"] > 0  # the replica's time reached the ledger
    await asyncio.sleep(3.0)
    assert len([t for t in (await _ticks(log, endpoint_id))[0] if t.assignment_id == assignment]) == len(
        ticks
    )
    assert await _billed(server, admin, endpoint_id) == before, "billing went on after scale to zero"
    assert tenant


async def _ready_replica(server: GatewayServer, key: str, endpoint_id: str) -> bool:
    return bool((await _endpoint(server, key, endpoint_id))["ready_replicas"] >= 1)


async def _billed_tokens(server: GatewayServer, key: str, endpoint_id: str, n: int) -> dict[str, Any] | None:
    billed = await _billed(server, key, endpoint_id)
    return billed if billed is not None and billed["tokens"] >= n else None


async def _state_is(server: GatewayServer, key: str, endpoint_id: str, state: str) -> bool:
    return bool((await _endpoint(server, key, endpoint_id))["state"] == state)


async def _stopped(log: EventLog, worker_id: str, assignment_id: str) -> bool:
    return assignment_id not in await _runs(log, worker_id)


async def test_engines_that_cannot_start_fail_their_endpoints_with_the_reason(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer, tmp_path: Path
) -> None:
    server = gateway_server
    await registered(log, agents("f1", *SLOW_HOST))
    tenant, admin = await server.tenant()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    await asyncio.to_thread(_upload, server, admin, {notes: "models/notes/notes.txt"})
    async with coordinator(log):
        # a repo no host's Hugging Face cache holds (hosts are offline): refused before the engine starts
        ghost = (
            await create_endpoint(server, admin, name="ghost", model="nobody/no-such-model", engine="cpu")
        )["endpoint_id"]
        # a workspace folder that is not a model: the engine starts and fails, its log says why
        folder = await create_endpoint(
            server, admin, name="notes", model="models/notes/", model_source="workspace", engine="cpu"
        )
        folder_id = folder["endpoint_id"]
        for endpoint_id in (ghost, folder_id):
            await until_awaited(
                lambda endpoint_id=endpoint_id: _state_is(server, admin, endpoint_id, "failed"),  # type: ignore[misc]
                f"endpoint {endpoint_id} failed",
                timeout=MAX_START_FAILURES * ST_READY_S,
            )
        refused = await _endpoint(server, admin, ghost)
        assert (
            "cannot start: model 'nobody/no-such-model': nobody/no-such-model is not in this host's Hugging "
            "Face cache" in refused["scale_reason"]
        )
        broken = await _endpoint(server, admin, folder_id)
        assert broken["desired_replicas"] == 0 and broken["start_failures"] == MAX_START_FAILURES
        assert broken["scale_reason"].startswith(f"{MAX_START_FAILURES} replicas failed in a row")
        assert broken["last_failure"] == "exit status 1" and "config.json" in broken["last_failure_log_tail"]
        await asyncio.sleep(3.0)  # placement does not loop
        for endpoint_id in (ghost, folder_id):
            history = await records(log, "ENDPOINTS", f"endpoint.*.{endpoint_id}.>")
            assert len(of(history, EndpointReplicaPlaced)) == MAX_START_FAILURES
            assert (await _endpoint(server, admin, endpoint_id))["replicas"] == []
        (gave_up,) = of(await records(log, "ENDPOINTS", f"endpoint.*.{folder_id}.>"), EndpointFailed)
        assert gave_up.log_tail == broken["last_failure_log_tail"]  # the feed shows the same event

        api = openai_client(server, admin)
        with pytest.raises(openai.InternalServerError) as caught:
            await api.embeddings.create(model="ghost", input="x")
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "endpoint_failed"  # type: ignore[index]

        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ops.cli", "status", folder_id, "--url", server.url, "--key", admin],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert cli.returncode == 0 and "failed: " in cli.stdout and "config.json" in cli.stdout, cli
        # its tenant tries again: the failure is cleared and a replica placed
        scaled = await server.request(
            "PUT", f"/v1/endpoints/{ghost}/scale", admin, json={"min_replicas": 1, "max_replicas": 1}
        )
        assert scaled.status_code == 200 and scaled.json()["state"] == "deploying", scaled.text
        await until_awaited(lambda: _placed_again(log, ghost), "a replica placed after the scale", timeout=30)
    print(f"failed endpoint: {broken['scale_reason']}")
    assert tenant


def _upload(server: GatewayServer, key: str, files: dict[Path, str]) -> None:
    with Client(server.url, key, timeout=120.0) as sdk:
        for path, object_key in files.items():
            sdk.upload(path, object_key)


async def _placed_again(log: EventLog, endpoint_id: str) -> bool:
    history = await records(log, "ENDPOINTS", f"endpoint.*.{endpoint_id}.>")
    return len(of(history, EndpointReplicaPlaced)) > MAX_START_FAILURES


async def test_a_model_uploaded_to_the_workspace_is_served(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    server = gateway_server
    await registered(log, agents("w1", *SLOW_HOST))
    tenant, admin = await server.tenant()
    folder = _package_dir(MINILM.package) / MINILM.file
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")]

    keys = {path: f"models/minilm/{path.relative_to(folder).as_posix()}" for path in files}
    await asyncio.to_thread(_upload, server, admin, keys)
    async with coordinator(log):
        endpoint = await create_endpoint(
            server, admin, name="mine", model="models/minilm/", model_source="workspace", engine="cpu"
        )
        await until_awaited(
            lambda: _ready_replica(server, admin, endpoint["endpoint_id"]), "a replica ready", ST_READY_S
        )
        result = await openai_client(server, admin).embeddings.create(
            model="mine", input=["from my workspace"]
        )
        assert len(result.data[0].embedding) == 384 and result.usage.total_tokens > 0
    assert tenant and any(p.name == "config.json" for p in files)
