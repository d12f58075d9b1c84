"""The live feed under load: WebSocket clients following a served gateway while events are appended
(part of ``python -m ops.bench.gateway``).

``subscribers`` WebSocket clients (:mod:`gateway.wsclient`, 10 per tenant) follow the gateway's
``/v1/feed`` while :func:`produce` appends ``job.progress`` events at a steady rate, spread evenly
over the tenants. Each event carries its append time; each client records ``now - that`` on
receipt. Baseline, same run: a plain nats-py subscription on ``job.>`` receiving the same events
(:func:`raw_floor`, the log's own delivery floor). Every client must receive every event of its
tenant (``feed_missing`` counts those that did not arrive).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import msgspec
import nats

from core.log import EventLog
from core.streams import job_subject
from gateway.wsclient import WebSocket, connect
from ops.bench.quantiles import percentile
from ops.bench.servedstack import ServedStack, create_tenants
from schemas.jobs import JobProgress

_DECODE = msgspec.json.Decoder().decode
PER_TENANT = 10
"""Feed clients per tenant."""


class Deliveries:
    """Latencies (seconds) of every delivery, and how many each tenant's clients got."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.received: dict[str, int] = {}

    def record(self, tenant: str, message: bytes | str) -> None:
        data = _DECODE(message)
        if data.get("kind") == "job.progress":
            self.latencies.append(time.time() - data["event"]["metrics"]["t"])
            self.received[tenant] = self.received.get(tenant, 0) + 1


async def subscriber(ws: WebSocket, tenant: str, deliveries: Deliveries) -> None:
    with contextlib.suppress(Exception):
        async for message in ws:
            deliveries.record(tenant, message)


async def connect_subscribers(
    stack: ServedStack, tenants: list[tuple[str, str]], count: int, deliveries: Deliveries
) -> tuple[list[WebSocket], list[asyncio.Task[None]]]:
    """``count`` feed clients, round-robin over ``tenants`` (at most 50 connecting at once), each
    recording into ``deliveries`` once the feed said it is ready: their sockets and their tasks."""
    sockets: list[WebSocket] = []
    tasks: list[asyncio.Task[None]] = []
    limit = asyncio.Semaphore(50)

    async def open_one(i: int) -> None:
        tenant, key = tenants[i % len(tenants)]
        async with limit:
            ws = await connect(
                f"{stack.ws_url}/v1/feed?kind=job.progress", {"Authorization": f"Bearer {key}"}
            )
            ready = _DECODE(await ws.recv())
        assert ready["kind"] == "feed.ready", ready
        sockets.append(ws)
        tasks.append(asyncio.create_task(subscriber(ws, tenant, deliveries)))

    await asyncio.gather(*(open_one(i) for i in range(count)))
    return sockets, tasks


async def produce(log: EventLog, tenants: list[str], rate: int, seconds: float) -> dict[str, int]:
    """Append ``rate`` events a second for ``seconds``, round-robin over ``tenants``, in 10 ms ticks."""
    per_tick = max(1, rate // 100)
    ticks = int(seconds * rate / per_tick)
    sent: dict[str, int] = {}
    started = time.monotonic()
    n = 0
    for tick in range(ticks):
        delay = started + tick * per_tick / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        batch = []
        now = time.time()
        for _ in range(per_tick):
            tenant = tenants[n % len(tenants)]
            event = JobProgress(epoch=1, step=n, metrics={"t": now})
            batch.append((job_subject(tenant, "bench", event), event))
            sent[tenant] = sent.get(tenant, 0) + 1
            n += 1
        await log.append_many(batch)
    return sent


async def raw_floor(url: str) -> tuple[Any, list[float]]:
    """A plain core-NATS subscription on ``job.>``: the delivery floor the feed builds on."""
    nc = await nats.connect(url, name="bench-raw")
    latencies: list[float] = []

    async def on_message(msg: Any) -> None:
        latencies.append(time.time() - _DECODE(msg.data)["metrics"]["t"])

    await nc.subscribe("job.>", cb=on_message)
    return nc, latencies


async def bench_feed(stack: ServedStack, subscribers: int, rate: int, seconds: float) -> dict[str, Any]:
    """``subscribers`` feed clients while ``rate`` events a second are appended for ``seconds``."""
    tenants = await create_tenants(stack, max(1, subscribers // PER_TENANT))
    deliveries = Deliveries()
    connect_started = time.perf_counter()
    sockets, tasks = await connect_subscribers(stack, tenants, subscribers, deliveries)
    connect_s = time.perf_counter() - connect_started
    print(f"  {subscribers} subscribers on {len(tenants)} tenants connected in {connect_s:.1f} s", flush=True)
    nc, raw = await raw_floor(stack.settings.nats_url)
    log = await EventLog.connect(stack.settings, name="bench-producer")
    cpu_before = stack.gateway_cpu_s()
    sent = await produce(log, [t for t, _ in tenants], rate, seconds)
    clients = Counter(tenants[i % len(tenants)][0] for i in range(subscribers))
    expected = sum(sent.get(tenant, 0) * count for tenant, count in clients.items())
    deadline = time.monotonic() + 30.0
    while len(deliveries.latencies) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    gateway_cpu = stack.gateway_cpu_s() - cpu_before
    await log.close()
    await nc.close()
    for ws in sockets:
        await ws.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    feed_p99, raw_p99 = percentile(deliveries.latencies, 0.99) * 1000, percentile(raw, 0.99) * 1000
    return {
        "feed_p50_ms": round(percentile(deliveries.latencies, 0.5) * 1000, 1),
        "feed_p99_ms": round(feed_p99, 1),
        "raw_p50_ms": round(percentile(raw, 0.5) * 1000, 1),
        "raw_p99_ms": round(raw_p99, 1),
        "feed_ratio": round(feed_p99 / raw_p99, 1) if raw_p99 > 0 else None,
        "feed_subscribers": subscribers,
        "feed_tenants": len(tenants),
        "feed_rate_eps": rate,
        "feed_seconds": seconds,
        "feed_deliveries": len(deliveries.latencies),
        "feed_missing": expected - len(deliveries.latencies),
        "feed_connect_s": round(connect_s, 1),
        "feed_gateway_cpu_us_per_delivery": round(gateway_cpu / max(1, len(deliveries.latencies)) * 1e6, 1),
    }
