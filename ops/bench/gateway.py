"""Benchmark the gateway as served (granian, real sockets): job submit latency, live-feed delivery.

Submit: ``POST /v1/jobs`` open-loop at ``--submit-rate`` requests a second (default 500) for
``--submit-seconds``, each a realistic spec naming one workspace object (so every submit also HEADs
it in the object store); latency from sending to the 201. Baseline, same run, same rate: appending
the same ``job.submitted`` straight to the log with :meth:`core.log.EventLog.append` (the durable
append every submit includes), so ``submit_ratio`` is what the API (auth, validation, quota and fleet
checks, the object HEAD, read-your-writes, the audit record) adds on top of the log.

Feed (:mod:`ops.bench.feed`): ``--subscribers`` WebSocket clients (default 1,000: 100 tenants x 10
clients) follow the served gateway while events are appended at ``--rate`` per second (default
1,000/s, spread evenly over the tenants). Each event carries its append time; each client records
``now - that`` on receipt, and p50/p99 are over every delivery. Baseline, same run: a plain nats-py
subscription on ``job.>`` receiving the same events (the log's own delivery floor), so
``feed_ratio`` is the feed's p99 over the raw p99. Every client must receive every event of its
tenant (``feed_missing`` counts those that did not arrive).

The clients run in this process (:mod:`gateway.wsclient`), on the same 2 cores as the gateway and
nats-server, so the figure includes their cost too. Both parts run against one served stack
(:mod:`ops.bench.servedstack`).

Usage: ``python -m ops.bench.gateway [--quick] [--subscribers N] [--rate R] [--seconds S]
[--submit-rate R] [--submit-seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from typing import Any

import msgspec
import uvloop

from core.log import EventLog
from core.streams import job_subject
from ops.bench.common import emit, machine, process_peak_rss_mb, self_peak_rss_mb, table
from ops.bench.feed import bench_feed
from ops.bench.quantiles import percentile
from ops.bench.servedstack import ServedStack, create_tenants, served_stack


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
    # every subscriber connects from loopback: one client, over the default cap of feeds per client
    async with served_stack(RESONTECH_GATEWAY_MAX_FEEDS_PER_CLIENT=str(subscribers + 10)) as stack:
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


def latency_rows(
    figures: dict[str, Any], label: str, measured: str, baseline: str, target: str
) -> list[tuple[str, ...]]:
    """The p50 and p99 rows of one latency: ``measured`` against its ``baseline`` (figure name
    prefixes), and the p99 ratio (``<measured>_ratio``) with its ``target``."""
    return [
        (
            f"{label} p50 (ms)",
            f"{figures[f'{measured}_p50_ms']}",
            f"{figures[f'{baseline}_p50_ms']}",
            "-",
            "-",
        ),
        (
            f"{label} p99 (ms)",
            f"{figures[f'{measured}_p99_ms']}",
            f"{figures[f'{baseline}_p99_ms']}",
            f"{figures[f'{measured}_ratio']}",
            target,
        ),
    ]


def summary(figures: dict[str, Any]) -> str:
    """The human-readable report: submit and delivery latencies against their baselines, the counts."""
    rows: list[tuple[str, ...]] = [
        ("figure", "API", "log only", "ratio", "target"),
        *latency_rows(figures, "submit", "submit", "raw_submit", "API < 25"),
        ("", "feed", "raw nats-py", "", ""),
        *latency_rows(figures, "delivery", "feed", "raw", "feed < 250"),
    ]
    submit = (
        f"submit: {figures['submit_rate']} requests/s offered, {figures['submit_achieved_rps']} sent, "
        f"{figures['submit_ok']:,} created, {figures['submit_errors']} errors"
    )
    feed = (
        f"{figures['feed_subscribers']} subscribers on {figures['feed_tenants']} tenants, "
        f"{figures['feed_rate_eps']} events/s for {figures['feed_seconds']:g} s: "
        f"{figures['feed_deliveries']:,} deliveries, {figures['feed_missing']} missing; peak RSS: bench "
        f"{figures['peak_rss_mb']} MB, gateway {figures['gateway_peak_rss_mb']} MB"
    )
    return "\n".join([table(rows), submit, feed])


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
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
