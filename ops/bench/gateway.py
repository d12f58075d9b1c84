"""Benchmark the gateway as served (granian, real sockets): live-feed delivery latency.

(Just over 500 lines, most of them the served stack and the feed clients the other benchmarks reuse:
a program run by hand.)

Feed: ``--subscribers`` WebSocket clients (default 1,000: 100 tenants x 10 clients) follow a served
gateway while events are appended at ``--rate`` per second (default 1,000/s, spread evenly over the
tenants). Each event carries its append time; each client records ``now - that`` on receipt, and
p50/p99 are over every delivery. Baseline, same run: a plain nats-py subscription on ``job.>``
receiving the same events (the log's own delivery floor), so ``feed_ratio`` is the feed's p99 over
the raw p99. Every client must receive every event of its tenant (``feed_missing`` counts those
that did not arrive).

The clients run in this process (:mod:`gateway.wsclient`), on the same 2 cores as the gateway and
nats-server, so the figure includes their cost too.

Submit: ``POST /v1/jobs`` open-loop at ``--submit-rate`` requests a second (default 500) for
``--submit-seconds``, each a realistic spec naming one workspace object (so every submit also HEADs
it in the object store); latency from sending to the 201. Baseline, same run, same rate: appending
the same ``job.submitted`` straight to the log with :meth:`core.log.EventLog.append` (the durable
append every submit includes), so ``submit_ratio`` is what the API (auth, validation, quota and fleet
checks, the object HEAD, read-your-writes, the audit record) adds on top of the log.

Usage: ``python -m ops.bench.gateway [--quick] [--subscribers N] [--rate R] [--seconds S]
[--submit-rate R] [--submit-seconds S]``.

One file on purpose: a benchmark is one program; the submit and feed parts share the served stack,
the load generator and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
import uvloop

from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from gateway.auth import digest
from gateway.wsclient import WebSocket, connect
from ops.bench.common import emit, machine, private_nats, process_peak_rss_mb, self_peak_rss_mb, table
from ops.devstack.objectstore import ObjectStoreServer
from ops.ports import free_port
from ops.process import log_tail, spawn, terminate
from schemas.jobs import JobProgress

REPO = Path(__file__).resolve().parents[2]
_DECODE = msgspec.json.Decoder().decode


@dataclass
class ServedStack:
    """nats-server, the object store and a served gateway, with the operator key."""

    url: str
    operator_key: str
    settings: Settings
    gateway_pid: int

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def gateway_cpu_s(self) -> float:
        """CPU seconds used so far by the gateway's processes (user + system)."""
        total = 0.0
        for pid in [self.gateway_pid, *self.gateway_worker_pids()]:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def gateway_worker_pids(self) -> list[int]:
        """granian's worker processes (children of its main process)."""
        path = Path(f"/proc/{self.gateway_pid}/task/{self.gateway_pid}/children")
        with contextlib.suppress(OSError):
            return [int(pid) for pid in path.read_text().split()]
        return []


@contextlib.asynccontextmanager
async def served_stack(**gateway_env: str) -> AsyncIterator[ServedStack]:
    """Start the stack on free loopback ports (the shipped ``sync_interval: always`` NATS)."""
    operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
    with (
        private_nats(sync_always=True) as nats_server,
        tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp,
    ):
        store = ObjectStoreServer(Path(tmp) / "objects")
        store.start()
        port = free_port()
        settings = Settings(
            nats_url=nats_server.url,
            s3_endpoint=store.endpoint,
            s3_access_key=store.access_key,
            s3_secret_key=store.secret_key,
            ack_timeout_s=30.0,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        env.update(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_GATEWAY_PORT=str(port),
            RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(operator_key),
            PYTHONPATH=str(REPO),
            **gateway_env,
        )
        log_file = Path(tmp) / "gateway.log"
        proc = spawn([sys.executable, "-m", "ops.cli", "gateway"], log_file, env)
        url = f"http://127.0.0.1:{port}"
        try:
            await _wait_served(url, proc, log_file)
            yield ServedStack(url=url, operator_key=operator_key, settings=settings, gateway_pid=proc.pid)
        finally:
            await asyncio.to_thread(terminate, proc, 10.0)
            store.stop()


async def _wait_served(url: str, proc: Any, log_file: Path) -> None:
    deadline = time.monotonic() + 60.0
    async with httpx.AsyncClient(base_url=url) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log_tail(log_file, 10)}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/v1/health")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the gateway did not serve within 60 s: {log_tail(log_file, 10)}")


async def create_tenants(stack: ServedStack, count: int, prefix: str = "bench") -> list[tuple[str, str]]:
    """``count`` tenants through the API: ``(tenant, admin key)``."""
    limit = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:

        async def one(n: int) -> tuple[str, str]:
            async with limit:
                response = await client.post(
                    "/v1/tenants",
                    json={"tenant": f"{prefix}-{n}", "display_name": f"{prefix} {n}"},
                    headers={"Authorization": f"Bearer {stack.operator_key}"},
                )
            response.raise_for_status()
            return f"{prefix}-{n}", response.json()["admin_key"]["key"]

        return list(await asyncio.gather(*(one(n) for n in range(count))))


# -- feed ------------------------------------------------------------------------------------------


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


# -- submit ----------------------------------------------------------------------------------------


class Connections:
    """Keep-alive HTTP/1.1 connections for the load generator: each request takes an idle
    connection (or opens one), writes, reads one response by its Content-Length, and gives the
    connection back. httpx's pool spends milliseconds of CPU per request once hundreds are
    pending, which made the client, not the gateway, the bottleneck on two cores."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened: list[asyncio.StreamWriter] = []

    async def post(self, path: str, body: bytes) -> int:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.opened.append(writer)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        self.idle.append((reader, writer))
        return int(status_line.split()[1])

    async def close(self) -> None:
        for writer in self.opened:
            writer.close()


async def open_loop(rate: int, seconds: float, one: Any) -> tuple[list[float], float]:
    """Start ``one()`` ``rate`` times a second for ``seconds`` without waiting for answers (an open
    loop: a slow answer does not slow the offered load); returns its latencies and the time taken."""
    latencies: list[float] = []

    async def timed() -> None:
        started = time.perf_counter()
        await one()
        latencies.append(time.perf_counter() - started)

    tasks = []
    begin = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed()))
    await asyncio.gather(*tasks)
    return latencies, time.perf_counter() - begin


async def bench_submit(stack: ServedStack, rate: int, seconds: float) -> dict[str, Any]:
    from gateway.client import AsyncClient
    from schemas.jobs import JobSubmitted

    [(tenant, key)] = await create_tenants(stack, 1, prefix="submit")
    with tempfile.NamedTemporaryFile(suffix=".py") as script:
        script.write(b"print('train')\n")
        script.flush()
        async with AsyncClient(stack.url, key) as rt:
            await rt.upload(script.name, "scripts/train.py")
    spec = {
        "name": "bench",
        "kind": "process",
        "command": ["python", "scripts/train.py"],
        "inputs": ["scripts/train.py"],
    }
    statuses: Counter[int] = Counter()
    client = Connections(stack.url, {"Authorization": f"Bearer {key}"})
    body = msgspec.json.encode(spec)

    async def submit() -> None:
        statuses[await client.post("/v1/jobs", body)] += 1

    await open_loop(min(rate, 100), 1.0, submit)  # warm the connections and the gateway's caches
    statuses.clear()
    cpu_before = stack.gateway_cpu_s()
    api, api_s = await open_loop(rate, seconds, submit)
    gateway_cpu = stack.gateway_cpu_s() - cpu_before
    await client.close()
    log = await EventLog.connect(stack.settings, name="bench-submit")
    event = JobSubmitted(name="bench", kind="process", shards=1, command=["python", "scripts/train.py"])
    n = 0

    async def append() -> None:
        nonlocal n
        n += 1
        await log.append(job_subject(tenant, f"raw-{n}", event), event, expected_seq=0)

    raw, _ = await open_loop(rate, seconds, append)
    await log.close()
    p50, p99 = percentile(api, 0.5) * 1000, percentile(api, 0.99) * 1000
    raw_p99 = percentile(raw, 0.99) * 1000
    return {
        "submit_p50_ms": round(p50, 1),
        "submit_p99_ms": round(p99, 1),
        "raw_submit_p50_ms": round(percentile(raw, 0.5) * 1000, 1),
        "raw_submit_p99_ms": round(raw_p99, 1),
        "submit_ratio": round(p99 / raw_p99, 1) if raw_p99 > 0 else None,
        "submit_rate": rate,
        "submit_achieved_rps": round(len(api) / api_s),
        "submit_ok": statuses.get(201, 0),
        "submit_errors": sum(v for k, v in statuses.items() if k != 201),
        "submit_gateway_cpu_ms": round(gateway_cpu / max(1, len(api)) * 1000, 2),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def bench_feed(stack: ServedStack, subscribers: int, rate: int, seconds: float) -> dict[str, Any]:
    per_tenant = 10
    tenants = await create_tenants(stack, max(1, subscribers // per_tenant))
    deliveries = Deliveries()
    sockets: list[WebSocket] = []
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

    tasks: list[asyncio.Task[None]] = []
    connect_started = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(subscribers)))
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


async def run(
    quick: bool,
    subscribers: int | None,
    rate: int | None,
    seconds: float | None,
    submit_rate: int | None = None,
    submit_seconds: float | None = None,
) -> dict[str, Any]:
    subscribers = subscribers or (200 if quick else 1000)
    rate = rate or (500 if quick else 1000)
    seconds = seconds or (5.0 if quick else 20.0)
    submit_rate = submit_rate or 500
    submit_seconds = submit_seconds or (3.0 if quick else 20.0)
    async with served_stack() as stack:
        print(f"submit: {submit_rate} requests/s for {submit_seconds:g} s", flush=True)
        submit = await bench_submit(stack, submit_rate, submit_seconds)
        print(f"feed: {subscribers} subscribers, {rate} events/s for {seconds:g} s", flush=True)
        feed = await bench_feed(stack, subscribers, rate, seconds)
        gateway_rss = max(
            [process_peak_rss_mb(pid) for pid in stack.gateway_worker_pids()]
            or [process_peak_rss_mb(stack.gateway_pid)]
        )
    return {
        "bench": "gateway",
        "quick": quick,
        **submit,
        **feed,
        "peak_rss_mb": round(self_peak_rss_mb()),
        "gateway_peak_rss_mb": round(gateway_rss),
        **machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument("--subscribers", type=int, help="WebSocket clients (default 1,000; 200 with --quick)")
    parser.add_argument(
        "--rate", type=int, help="events appended per second (default 1,000; 500 with --quick)"
    )
    parser.add_argument("--seconds", type=float, help="how long to append (default 20; 5 with --quick)")
    parser.add_argument("--submit-rate", type=int, help="job submissions per second (default 500)")
    parser.add_argument(
        "--submit-seconds", type=float, help="how long to submit (default 20; 3 with --quick)"
    )
    args = parser.parse_args()
    figures = uvloop.run(
        run(args.quick, args.subscribers, args.rate, args.seconds, args.submit_rate, args.submit_seconds)
    )
    print()
    print(
        table(
            [
                ("figure", "API", "log only", "ratio", "target"),
                (
                    "submit p50 (ms)",
                    f"{figures['submit_p50_ms']}",
                    f"{figures['raw_submit_p50_ms']}",
                    "-",
                    "-",
                ),
                (
                    "submit p99 (ms)",
                    f"{figures['submit_p99_ms']}",
                    f"{figures['raw_submit_p99_ms']}",
                    f"{figures['submit_ratio']}",
                    "API < 25",
                ),
                ("", "feed", "raw nats-py", "", ""),
                (
                    "delivery p50 (ms)",
                    f"{figures['feed_p50_ms']}",
                    f"{figures['raw_p50_ms']}",
                    "-",
                    "-",
                ),
                (
                    "delivery p99 (ms)",
                    f"{figures['feed_p99_ms']}",
                    f"{figures['raw_p99_ms']}",
                    f"{figures['feed_ratio']}",
                    "feed < 250",
                ),
            ]
        )
    )
    print(
        f"submit: {figures['submit_rate']} requests/s offered, {figures['submit_achieved_rps']} sent, "
        f"{figures['submit_ok']:,} created, {figures['submit_errors']} errors"
    )
    print(
        f"{figures['feed_subscribers']} subscribers on {figures['feed_tenants']} tenants, "
        f"{figures['feed_rate_eps']} events/s for {figures['feed_seconds']:g} s: "
        f"{figures['feed_deliveries']:,} deliveries, {figures['feed_missing']} missing; peak RSS: bench "
        f"{figures['peak_rss_mb']} MB, gateway {figures['gateway_peak_rss_mb']} MB"
    )
    emit(figures)


if __name__ == "__main__":
    main()
