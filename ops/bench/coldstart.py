"""Cold starts from zero replicas, and where each second of one goes (``python -m ops.bench.inference``).

A sample: the endpoint is at zero replicas and its engine stopped; one request is sent through the
gateway, streamed where the engine streams; ``total_s`` is from sending it to its first token (to its
whole answer, for an embedding). The phases come from the endpoint's events, stamped by the NATS
server on this same host:

* ``scale_s``: the request to ``endpoint.scaled`` (the gateway's scale-up from zero);
* ``place_s``: to ``endpoint.replica_placed`` (the coordinator's placement);
* ``agent_s``: to ``endpoint.replica_starting`` (the command reaches the agent, which fetches the
  inputs and starts the engine);
* ``engine_s``: to ``endpoint.replica_ready`` (the engine loads the model, sizes its KV cache and
  answers its health check; the agent polls it every 0.1 s);
* ``first_token_s``: to the first token (the gateway sees the replica ready and forwards the request).

``warm`` says whether the replica became a warm engine (:mod:`agent.runtimes.warm`): the agent logs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from core.clock import NS_PER_S
from core.log import EventLog
from core.settings import Settings
from schemas.endpoints import (
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaStarting,
    EndpointScaled,
)

PHASES = (
    ("scale_s", EndpointScaled),
    ("place_s", EndpointReplicaPlaced),
    ("agent_s", EndpointReplicaStarting),
    ("engine_s", EndpointReplicaReady),
)
WARM_LOG = "starts from a warm engine"
WARM_IMPORT_S = 300.0


async def first_token(
    http: httpx.AsyncClient, headers: dict[str, str], path: str, body: dict[str, Any]
) -> float:
    """Seconds from sending ``body`` to its first streamed chunk (to the whole answer if not a stream)."""
    started = time.perf_counter()
    async with http.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"the cold request answered {response.status_code}: {await response.aread()!r}"
            )
        async for chunk in response.aiter_text():
            if not body.get("stream") or '"text"' in chunk or '"content"' in chunk:
                return time.perf_counter() - started
    return time.perf_counter() - started


async def phases(settings: Settings, endpoint_id: str, since_ns: int) -> dict[str, float]:
    """The phases of the first replica started after ``since_ns`` (see the module docstring)."""
    async with await EventLog.connect(settings, name="bench-cold-start") as log:
        found = [r async for r in log.replay("ENDPOINTS", subjects=f"endpoint.*.{endpoint_id}.>")]
    stamps: dict[str, int] = {}
    for record in found:
        for name, kind in PHASES:
            if record.time_ns >= since_ns and isinstance(record.event, kind):
                stamps.setdefault(name, record.time_ns)
    figures, last = {}, since_ns
    for name, _ in PHASES:
        if name in stamps:
            figures[name] = (stamps[name] - last) / NS_PER_S
            last = stamps[name]
    figures["ready_ns"] = float(last)
    return figures


def warm_engine_imported(work_dir: Path) -> bool:
    """Whether the agent keeps a warm engine that imported torch and vLLM."""
    for folder in work_dir.glob("warm-*"):
        log = folder / "log.txt"
        if log.exists() and "warm engine: imported" in log.read_text(errors="replace"):
            return True
    return False


async def warm_engine_waiting(work_dir: Path, timeout: float = WARM_IMPORT_S) -> bool:
    """Wait until :func:`warm_engine_imported`; whether it happened in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(warm_engine_imported, work_dir):
            return True
        await asyncio.sleep(0.2)
    return False


async def sample(
    http: httpx.AsyncClient,
    settings: Settings,
    key: str,
    endpoint_id: str,
    request: tuple[str, dict[str, Any]],
    agent_log: Callable[[], str],
) -> dict[str, Any]:
    """One cold start of an endpoint at zero replicas (see the module docstring)."""
    headers = {"authorization": f"Bearer {key}"}
    warm_before = agent_log().count(WARM_LOG)
    since_ns = time.time_ns()
    path, body = request
    total = await first_token(http, headers, path, body)
    figures: dict[str, Any] = {"total_s": total, **(await phases(settings, endpoint_id, since_ns))}
    ready_ns = figures.pop("ready_ns")
    figures["first_token_s"] = total - (ready_ns - since_ns) / NS_PER_S
    figures["warm"] = agent_log().count(WARM_LOG) > warm_before
    return figures
