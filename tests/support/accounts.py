"""Test helpers for accounts and fleets the jobs, workers and billing tests need, made of real events.

Provider accounts are created by appending ``provider.created`` and ``provider.api_key_issued`` (the
provider-accounts routes are another area's); workers by appending ``worker.registered`` and a
heartbeat, as an agent would. :func:`provider` and :func:`token` go through the provider-accounts
routes instead, as the operator and a provider would: for the tests of those routes and of enrollment.
"""

from __future__ import annotations

import secrets
from typing import Any

from core.streams import heartbeat_subject, provider_subject, worker_subject
from gateway.auth import new_key
from projections import LIVENESS, PROVIDERS, REGISTRY
from schemas.providers import ProviderCreated, ProviderKeyIssued
from schemas.values import Gpu
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified
from tests.support.gateway import Api


async def provider_key(api: Api, provider: str) -> str:
    """Create provider account ``provider`` and return an API key of it."""
    created = ProviderCreated(display_name=provider, created_by="operator")
    await api.kernel.append(provider_subject(provider, created), created, visible_in=PROVIDERS)
    key_id, key, sha = new_key()
    issued = ProviderKeyIssued(key_id=key_id, key_sha256=sha, label="test", issued_by="operator")
    await api.kernel.append(provider_subject(provider, issued), issued, visible_in=PROVIDERS)
    return key


async def register_worker(
    api: Api,
    worker_id: str,
    *,
    provider: str = "prov",
    gpus: int = 0,
    model: str = "NVIDIA A100-SXM4-80GB",
    vram_mb: int = 81_920,
    pool: str = "shared",
    owner_tenant: str | None = None,
    beat: bool = True,
    verified: bool = True,
) -> None:
    """Append a worker's registration, its verification (``verified``: the kernel vouches for it, as
    if it had passed its verification job) and a heartbeat, visible to the gateway when this
    returns."""
    registered = WorkerRegistered(
        provider=provider,
        hostname=f"host-{worker_id}",
        region="eu-west",
        pool=pool,  # type: ignore[arg-type]
        owner_tenant=owner_tenant,
        gpus=[Gpu(index=i, model=model, vram_total_mb=vram_mb, vram_free_mb=vram_mb) for i in range(gpus)],
        cpus=16,
        memory_mb=64_000,
        agent_version="test",
    )
    await api.kernel.append(worker_subject(worker_id, registered), registered, visible_in=REGISTRY)
    if verified:
        passed = WorkerVerified(challenge_id="vc-test", elapsed_ms=200, by="test")
        await api.kernel.append(worker_subject(worker_id, passed), passed, visible_in=REGISTRY)
    if beat:
        heartbeat = Heartbeat(interval_s=30.0, cpu_pct=12.5, memory_used_mb=2048)
        await api.kernel.append(heartbeat_subject(worker_id), heartbeat, visible_in=LIVENESS)


async def provider(api: Api, name: str | None = None) -> tuple[str, str]:
    """Create a provider; returns ``(provider id, its first key)``."""
    name = name or f"p-{secrets.token_hex(4)}"
    response = await api.request(
        "POST", "/v1/providers", api.operator_key, json={"provider": name, "display_name": "GPU Co"}
    )
    assert response.status_code == 201, response.text
    return name, response.json()["api_key"]["key"]


async def token(api: Api, name: str, key: str, **body: Any) -> dict[str, Any]:
    response = await api.request("POST", f"/v1/providers/{name}/enrollment-tokens", key, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result
