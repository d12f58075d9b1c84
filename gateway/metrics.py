"""Prometheus metrics of one gateway process: ``GET /metrics`` (the operator's key).

Operator-only because the figures describe the whole platform (queue lengths, worker counts); a
Prometheus scrape job sends the key with ``authorization: {credentials_file: ...}``. Labels are
bounded: the route *template* (``/v1/tenants/{tenant}``, never the raw path), the method (unknown
ones as ``other``), the status, the pool and a priority band, projection and worker-state names;
never a tenant, job or worker id.

Request counts and latencies are recorded by :class:`RequestMetrics` as requests finish; everything
else is read from the kernel at scrape time (:class:`KernelCollector`), so it costs nothing between
scrapes. Each granian worker process has its own figures (the dev stack runs one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api import Call, Router
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE
from projections.endpoints import ready_replicas
from projections.liveness import overdue

if TYPE_CHECKING:
    from gateway.inference import InferenceProxy
    from gateway.kernel import Kernel

log = logging.getLogger("resontech.gateway")
router = Router("metrics")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds; dense below 25 ms, the submit target."""


def priority_band(priority: int) -> str:
    """Job priorities are free integers: a label takes only ``high`` (> 0), ``normal`` or ``low``."""
    return "high" if priority > 0 else "low" if priority < 0 else "normal"


class GatewayMetrics:
    """The process's registry, its request metrics, and the kernel figures read at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "resontech_http_requests",
            "HTTP requests finished, by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "resontech_http_request_duration_seconds",
            "HTTP request latency in seconds, by method, route template and status",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.kernel: Kernel | None = None
        self.inference: InferenceProxy | None = None  # set by the app
        self.stream_last: dict[str, int] = {}
        self.registry.register(KernelCollector(self))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = (method if method in METHODS else "other", route, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)

    async def refresh(self, kernel: Kernel) -> None:
        """Read each served projection's stream end (the one figure that needs the server)."""
        self.kernel = kernel
        streams = sorted({runner.projection.stream for runner in kernel.runners.values()})
        ends = await asyncio.gather(*(kernel.event_log.last_seq(s) for s in streams), return_exceptions=True)
        self.stream_last = {s: end for s, end in zip(streams, ends, strict=True) if isinstance(end, int)}

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _each_or_none(families: Callable[[Kernel], Iterator[Metric]], kernel: Kernel) -> list[Metric]:
    """The metric families ``families`` reads off the kernel, or none (logged) when one value cannot be
    read: a scrape answers with the rest, never a 500 for one worker's or one endpoint's bad figure."""
    try:
        return list(families(kernel))
    except Exception:
        log.exception("metrics: %s left out of this scrape", getattr(families, "__name__", families))
        return []


class KernelCollector(Collector):
    """Projection lag, queues, workers and feed figures, computed from the kernel at each scrape."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: its families depend on what the kernel serves

    def collect(self) -> Iterator[Metric]:
        kernel = self.metrics.kernel
        if kernel is None:
            return
        for families in (self._projections, self._work, self._inference):
            yield from _each_or_none(families, kernel)
        feed = kernel.feed
        yield GaugeMetricFamily(
            "resontech_feed_subscribers", "Connected feed clients", value=feed.subscribers
        )
        yield CounterMetricFamily("resontech_feed_messages", "Feed messages sent to clients", value=feed.sent)
        yield CounterMetricFamily(
            "resontech_feed_dropped", "Feed clients closed as too slow (4008)", value=feed.dropped
        )

    def _projections(self, kernel: Kernel) -> Iterator[Metric]:
        applied = GaugeMetricFamily(
            "resontech_projection_applied_seq", "Last stream sequence applied", labels=["projection"]
        )
        lag = GaugeMetricFamily(
            "resontech_projection_lag_events",
            "Stream's last sequence minus the last sequence applied",
            labels=["projection"],
        )
        age = GaugeMetricFamily(
            "resontech_projection_last_applied_age_seconds",
            "Seconds since this process last applied an event to the projection",
            labels=["projection"],
        )
        now = time.time()
        for name, runner in sorted(kernel.runners.items()):
            applied.add_metric([name], runner.seq)
            end = self.metrics.stream_last.get(runner.projection.stream)
            if end is not None:
                lag.add_metric([name], max(0, end - runner.seq))
            if name in kernel.applied_at:
                age.add_metric([name], now - kernel.applied_at[name])
        yield from (applied, lag, age)

    def _work(self, kernel: Kernel) -> Iterator[Metric]:
        jobs: Tally[str] = Tally()
        queued: Tally[tuple[str, str]] = Tally()
        for job in kernel.state(SCHEDULE).jobs.values():
            jobs[job.state] += 1
            if job.state == "queued":
                queued[job.spec.pool, priority_band(job.spec.priority)] += 1
        by_state = GaugeMetricFamily("resontech_jobs", "Jobs by state", labels=["state"])
        for state, count in sorted(jobs.items()):
            by_state.add_metric([state], count)
        queue = GaugeMetricFamily(
            "resontech_jobs_queued", "Queued jobs by pool and priority band", labels=["pool", "priority"]
        )
        for (pool, band), count in sorted(queued.items()):
            queue.add_metric([pool, band], count)
        workers = GaugeMetricFamily("resontech_workers", "Registered workers by state", labels=["state"])
        states = Tally(w.state for w in kernel.state(REGISTRY).workers.values())
        for state in ("available", "cordoned", "lost", "deregistered"):
            workers.add_metric([state], states.get(state, 0))
        silent = GaugeMetricFamily(
            "resontech_workers_silent", "Workers whose heartbeats stopped (three intervals or more)"
        )
        silent.add_metric([], len(overdue(kernel.state(LIVENESS), time.time_ns())))
        yield from (by_state, queue, workers, silent)

    def _inference(self, kernel: Kernel) -> Iterator[Metric]:
        """Per endpoint: ready replicas, and (from this gateway's proxy, last 60 s) requests per
        second, error rate and latency percentiles, and its line (:meth:`_line`)."""
        proxy = self.metrics.inference
        labels = ["tenant", "endpoint"]
        ready = GaugeMetricFamily("resontech_endpoint_ready_replicas", "Ready replicas", labels=labels)
        rps = GaugeMetricFamily(
            "resontech_endpoint_rps", "Inference requests per second, last 60 s", labels=labels
        )
        errors = GaugeMetricFamily(
            "resontech_endpoint_error_rate", "Share of failed requests, last 60 s", labels=labels
        )
        latency = GaugeMetricFamily(
            "resontech_endpoint_latency_seconds",
            "Inference latency percentiles, last 60 s",
            labels=[*labels, "quantile"],
        )
        served = []
        for key, endpoint in sorted(kernel.state(ENDPOINTS).endpoints.items()):
            if endpoint.state == "deleted":
                continue
            names = [endpoint.tenant, endpoint.spec.name]
            ready.add_metric(names, len(ready_replicas(endpoint)))
            if proxy is None or key not in proxy.traffic:
                continue
            served.append((key, names))
            f = proxy.figures(key)
            rps.add_metric(names, f.rps)
            errors.add_metric(names, f.error_rate)
            for q, ms in (("0.5", f.p50_ms), ("0.95", f.p95_ms), ("0.99", f.p99_ms)):
                latency.add_metric([*names, q], ms / 1000)
        yield from (ready, rps, errors, latency)
        if proxy is not None:
            yield from self._line(proxy, served)

    def _line(self, proxy: InferenceProxy, served: list[tuple[str, list[str]]]) -> Iterator[Metric]:
        """Per endpoint, its line in this gateway: depth, slots held, time in line (last 60 s),
        requests refused (429) by reason and requests whose client left while waiting."""
        labels = ["tenant", "endpoint"]
        depth = GaugeMetricFamily(
            "resontech_endpoint_queue_depth", "Requests waiting in line for a replica", labels=labels
        )
        held = GaugeMetricFamily(
            "resontech_endpoint_in_flight", "Requests the endpoint's replicas hold now", labels=labels
        )
        wait = GaugeMetricFamily(
            "resontech_endpoint_queue_wait_seconds",
            "Time in line of the requests that got a replica, percentiles over the last 60 s",
            labels=[*labels, "quantile"],
        )
        rejected = CounterMetricFamily(
            "resontech_endpoint_rejected",
            "Requests answered 429: the line full (queue_full) or waited past its deadline (queue_timeout)",
            labels=[*labels, "reason"],
        )
        abandoned = CounterMetricFamily(
            "resontech_endpoint_queue_abandoned", "Requests whose client left while in line", labels=labels
        )
        now = time.monotonic()
        for key, names in served:
            line = proxy.lines.get(key)
            if line is None:
                continue
            depth.add_metric(names, line.depth)
            held.add_metric(names, line.held)
            for q in (0.5, 0.95, 0.99):
                wait.add_metric([*names, str(q)], line.wait_ms(now, q) / 1000)
            for reason in ("queue_full", "queue_timeout"):
                rejected.add_metric([*names, reason], line.rejected.get(reason, 0))
            abandoned.add_metric(names, line.abandoned)
        yield from (depth, held, wait, rejected, abandoned)


class RequestMetrics:
    """ASGI middleware: count and time every HTTP request by its route template."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope["method"], route, status, time.perf_counter() - started)


@router.get("/metrics", access="operator")
async def metrics(call: Call[None, None]) -> Response:
    """Prometheus metrics of this gateway process (text exposition format; the operator's key)."""
    registry: GatewayMetrics = call.request.app.state.metrics
    await registry.refresh(call.kernel)
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
