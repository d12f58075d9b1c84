"""What the dashboard tests share: amounts and latencies formatted as the page shows them
(:func:`money`, :func:`ms`), a GET polled until the served gateway shows what a test appended
(:func:`until_http`), and a provider and its workers written straight to the log
(:func:`known_provider_key`, :func:`register_with_telemetry`)."""

from __future__ import annotations

import asyncio
from typing import Any

from core.log import EventLog
from core.streams import heartbeat_subject, provider_subject, worker_subject
from gateway.auth import new_key
from schemas.providers import ProviderCreated, ProviderKeyIssued
from schemas.values import Gpu, GpuTelemetry
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified
from tests.support.gateway import GatewayServer


def money(amount: dict[str, Any]) -> str:
    """An amount as the page shows it: dollars, at least two decimals, trailing zeros dropped."""
    dollars, cents = amount["usd"].split(".")
    return f"${int(dollars):,}.{cents.rstrip('0').ljust(2, '0')}"


async def until_http(server: GatewayServer, path: str, key: str, check: Any, what: str) -> Any:
    """Poll a GET until ``check(body)`` holds (the served gateway applies appended events shortly)."""
    for _ in range(200):
        response = await server.request("GET", path, key)
        if response.status_code == 200 and check(response.json()):
            return response.json()
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}")


def ms(value: float) -> str:
    """A latency as the page shows it (dom.js ``fmt.ms``)."""
    if value < 10:
        return f"{value:.1f} ms"
    return f"{round(value)} ms" if value < 1000 else f"{value / 1000:.2f} s"


async def known_provider_key(log: EventLog, server: GatewayServer, provider: str) -> str:
    """Append provider account ``provider`` and a key of it; the key, once the served gateway knows it."""
    created = ProviderCreated(display_name=provider, created_by="operator")
    await log.append(provider_subject(provider, created), created)
    key_id, key, sha = new_key()
    issued = ProviderKeyIssued(key_id=key_id, key_sha256=sha, label="test", issued_by="operator")
    await log.append(provider_subject(provider, issued), issued)
    await until_http(server, "/v1/me", key, lambda body: body["kind"] == "provider", "the key is known")
    return key


async def register_with_telemetry(
    log: EventLog, worker_id: str, provider: str, gpus: int, util: float
) -> None:
    """Append a verified worker of ``provider`` with ``gpus`` A100s and a heartbeat with each at ``util``
    percent busy."""
    registered = WorkerRegistered(
        provider=provider,
        hostname=f"host-{worker_id}",
        region="eu-west",
        gpus=[
            Gpu(index=i, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81_920, vram_free_mb=81_920)
            for i in range(gpus)
        ],
        cpus=32,
        memory_mb=256_000,
        agent_version="test",
    )
    await log.append(worker_subject(worker_id, registered), registered)
    await log.append(worker_subject(worker_id, WorkerVerified), WorkerVerified(by="test"))
    readings = [
        GpuTelemetry(index=i, util_pct=util, mem_used_mb=40_000, temp_c=61.0, power_w=290.0)
        for i in range(gpus)
    ]
    await log.append(heartbeat_subject(worker_id), Heartbeat(interval_s=30.0, gpus=readings, cpu_pct=20.0))
