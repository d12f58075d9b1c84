"""The inference proxy: each endpoint's line and slots, routing, failover, and its figures.

Why it sits apart from the routes (:mod:`gateway.routes.openai`): this is the part with state (each
endpoint's :class:`gateway.queueing.Line` with its replicas' in-flight counts, ejected replicas, the
latency windows) and the part the benchmark measures.

* **Slots and the line.** A request takes a slot on one replica (at most the endpoint's
  ``max_concurrency`` each) or waits in the endpoint's line, fairly across API keys, bounded, with a
  deadline (:mod:`gateway.queueing`); its slot is released when its answer ends, however it ends.
* **Routing.** Which replica a slot is taken on is the endpoint's ``routing`` policy: round robin,
  by session, or by prompt prefix (:mod:`gateway.routing`), among the ready replicas (from the
  ENDPOINTS projection) that are not ejected.
* **Failover.** A replica that refuses the connection, times out or answers 502/503/504 before the
  response started is ejected for :data:`EJECT_S` seconds (a passive health check), and the request
  is retried on the other replicas (its slot moves with it); once a response's headers went out, a
  failure ends that response (a stream cannot be replayed). Ejected replicas are probed with
  ``GET /health`` (the active check) and return when it answers 200.
* **Keys.** Each replica takes its own key (made by its agent's runtime, from the ENDPOINTS
  projection): a request goes to a replica with ``Authorization: Bearer <that key>`` and never with
  the caller's own (a replica of an older event, without a key, is called without one). A replica
  that answers 401 refused the key the kernel holds for it, not the caller's: it fails over like a
  502, so that no client is told its own key is wrong.
* **Where.** A replica's address is checked again when the proxy connects to it
  (:mod:`gateway.replica_guard`): a name resolves through a resolver that keeps only addresses a
  replica may have, and an address that is an IP address is checked before the request; one that
  fails is skipped (never ejected and probed), as if it were not ready.
* **Figures.** Per endpoint, over a sliding :data:`WINDOW_S` window: requests per second, error rate
  and latency percentiles (P50/P95/P99, from the request's arrival to the last byte of its response),
  and the line's depth, slots held, time in line and refusals; and the same over the last hour in
  10-second buckets (:attr:`InferenceProxy.history`, :mod:`gateway.traffic_history`).

The upstream client is aiohttp's, not httpx (which the SDK uses): measured here against the same
local replica, a small request costs ~0.45 ms through aiohttp and ~4.5-6 ms through httpx, and the
proxy's overhead target is 2 ms in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from core.addresses import ANY_NETWORK
from core.errors import ResontechError
from gateway.queueing import Line, percentile
from gateway.replica_guard import ReplicaGuard
from gateway.routing import Picker
from gateway.traffic_history import TrafficBuckets
from schemas.endpoints import EndpointDeployed

EJECT_S = 5.0
WINDOW_S = 60.0
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=2.0, sock_read=300.0)
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
RETRYABLE_STATUS = frozenset({502, 503, 504})
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


@dataclass(frozen=True, slots=True)
class Figures:
    """An endpoint's traffic over the last window (latencies in milliseconds)."""

    requests: int
    rps: float
    error_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    queue_depth: int = 0
    in_flight: int = 0
    wait_p50_ms: float = 0.0
    wait_p99_ms: float = 0.0
    rejected: int = 0


@dataclass(slots=True)
class EndpointTraffic:
    """Recent requests of one endpoint: ``(finished at, seconds, ok)`` in finishing order."""

    samples: deque[tuple[float, float, bool]] = field(default_factory=deque)
    cursor: int = 0
    last_request_at: float = 0.0
    total: int = 0
    errors: int = 0

    def record(self, now: float, seconds: float, ok: bool) -> None:
        self.samples.append((now, seconds, ok))
        self.total += 1
        self.errors += 0 if ok else 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.samples and self.samples[0][0] < now - WINDOW_S:
            self.samples.popleft()

    def figures(self, now: float, window_s: float = WINDOW_S) -> Figures:
        """The figures of the requests finished in the last ``window_s`` seconds (at most WINDOW_S)."""
        self._trim(now)
        samples = [s for s in self.samples if s[0] >= now - window_s]
        n = len(samples)
        if n == 0:
            return Figures(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        latencies = sorted(s[1] for s in samples)
        errors = sum(1 for s in samples if not s[2])
        span = max(1.0, min(window_s, now - samples[0][0]))
        return Figures(
            requests=n,
            rps=n / span,
            error_rate=errors / n,
            p50_ms=percentile(latencies, 0.50) * 1000,
            p95_ms=percentile(latencies, 0.95) * 1000,
            p99_ms=percentile(latencies, 0.99) * 1000,
        )


class NoReplica(ResontechError):
    """No ready replica could take the request (all ejected, or every attempt failed)."""

    code = "no_replica"


@dataclass(slots=True)
class Upstream:
    """A replica's response whose headers arrived; iterate :meth:`body` (or :meth:`read`) to pass it
    through."""

    response: aiohttp.ClientResponse
    address: str
    attempts: int

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def content_type(self) -> str:
        return self.response.headers.get("content-type", "")

    def headers(self) -> dict[str, str]:
        return {k: v for k, v in self.response.headers.items() if k.lower() not in _HOP_HEADERS}

    async def read(self) -> bytes:
        """The whole body (an answer that is not a stream)."""
        try:
            return await self.response.read()
        finally:
            self.response.release()

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        finally:
            self.response.release()  # back to the pool when read to the end, else closed


UpstreamError = (aiohttp.ClientError, TimeoutError)
"""What a replica that cannot answer raises: refused, reset, timed out."""


class InferenceProxy:
    """Forwards OpenAI-shaped requests to replicas (see the module docstring).

    Args:
        guard: where replicas may be (default: any address but loopback and the others
            :func:`core.addresses.ip_refusal` refuses).
    """

    def __init__(self, guard: ReplicaGuard | None = None) -> None:
        self.guard = guard or ReplicaGuard(ANY_NETWORK, ())
        self._session: aiohttp.ClientSession | None = None
        self.traffic: dict[str, EndpointTraffic] = {}
        self.history = TrafficBuckets()
        self.lines: dict[str, Line] = {}
        self.ejected: dict[str, float] = {}  # address -> until (monotonic)
        self._probes: dict[str, asyncio.Task[None]] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled client, made on first use (it belongs to the event loop that serves)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=UPSTREAM_TIMEOUT,
                connector=aiohttp.TCPConnector(
                    limit=512, limit_per_host=0, keepalive_timeout=30.0, resolver=self.guard.resolver()
                ),
                auto_decompress=False,  # bytes pass through as the replica sent them
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    def traffic_of(self, key: str) -> EndpointTraffic:
        traffic = self.traffic.get(key)
        if traffic is None:
            traffic = self.traffic[key] = EndpointTraffic()
        return traffic

    def line_of(self, key: str, spec: EndpointDeployed) -> Line:
        """Endpoint ``key``'s line, made on first use with its deployment's limits and policy."""
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = Line(spec.max_concurrency, spec.max_queue, Picker(spec.routing))
        return line

    def candidates(self, addresses: Sequence[str]) -> list[str]:
        """The ready replicas a slot may be taken on: those not ejected."""
        now = time.monotonic()
        return [a for a in addresses if self.ejected.get(a, 0.0) <= now]

    def replicas_in_turn(self, key: str, addresses: Sequence[str]) -> list[str]:
        """The replicas to try for the next request of endpoint ``key``, round robin, ejected last
        out (an ejected replica is not tried while any other is in)."""
        traffic = self.traffic_of(key)
        n = len(addresses)
        if n == 0:
            return []
        start = traffic.cursor % n
        traffic.cursor += 1
        rotated = [addresses[(start + i) % n] for i in range(n)]
        now = time.monotonic()
        return [a for a in rotated if self.ejected.get(a, 0.0) <= now]

    def eject(self, address: str) -> None:
        """Take a failing replica out for :data:`EJECT_S` and probe it until it is healthy again."""
        self.ejected[address] = time.monotonic() + EJECT_S
        if address not in self._probes:
            self._probes[address] = asyncio.create_task(self._probe(address))

    async def _probe(self, address: str) -> None:
        try:
            while self.ejected.get(address, 0.0) > 0.0 and self.guard.refusal(address) is None:
                await asyncio.sleep(1.0)
                with contextlib.suppress(*UpstreamError):
                    async with self.session.get(f"{address}/health", timeout=PROBE_TIMEOUT) as answer:
                        if answer.status == 200:
                            self.ejected.pop(address, None)
        finally:
            self._probes.pop(address, None)

    async def send(
        self,
        key: str,
        addresses: Sequence[str],
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        api_keys: Mapping[str, str] | None = None,
    ) -> Upstream:
        """Send ``body`` to ``path`` on the endpoint's replicas until one answers without a retryable
        failure; the response's body is not read yet.

        Args:
            addresses: the replicas to try, in order (the routing's choice first; ejected ones
                are skipped).
            headers: what to send every replica (an ``authorization`` among them is dropped).
            api_keys: each replica's key by address; a replica with none is sent no key.

        Raises:
            NoReplica: every replica was ejected or failed; the message says what happened last.
        """
        self.traffic_of(key).last_request_at = time.monotonic()
        last = "no ready replica"
        attempts = 0
        common = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        for address in self.candidates(addresses):
            refusal = self.guard.refusal(address)
            if refusal is not None:  # not where a replica may be: skipped, never called nor probed
                last = f"replica {address} refused: {refusal}"
                continue
            attempts += 1
            sent = common
            if api_key := (api_keys or {}).get(address):
                sent = {**common, "authorization": f"Bearer {api_key}"}
            try:
                response = await self.session.post(f"{address}{path}", data=body, headers=sent)
            except UpstreamError as exc:
                last = f"replica {address}: {type(exc).__name__}"
                self.eject(address)
                continue
            if response.status in RETRYABLE_STATUS or response.status == 401:
                response.release()
                what = "refused its key" if response.status == 401 else f"answered {response.status}"
                last = f"replica {address} {what}"
                self.eject(address)
                continue
            return Upstream(response, address, attempts)
        raise NoReplica(last)

    def record(self, key: str, started: float, ok: bool, waited_s: float = 0.0) -> None:
        """A request of endpoint ``key`` that arrived at ``started`` (monotonic) finished now, after
        ``waited_s`` in line for a slot."""
        now = time.monotonic()
        self.traffic_of(key).record(now, now - started, ok)
        self.history.record(key, time.time(), now - started, ok, waited_s)

    def refused(self, key: str) -> None:
        """A request of endpoint ``key`` was answered 429 (its line full, or waited too long)."""
        self.history.refused(key, time.time())

    def sample_line(self, key: str) -> None:
        """Remember the depth of endpoint ``key``'s line now, for its history's peak depth."""
        line = self.lines.get(key)
        if line is not None:
            self.history.depth(key, time.time(), line.depth)

    def figures(self, key: str, window_s: float = WINDOW_S) -> Figures:
        now = time.monotonic()
        figures = self.traffic_of(key).figures(now, window_s)
        line = self.lines.get(key)
        if line is None:
            return figures
        return replace(
            figures,
            queue_depth=line.depth,
            in_flight=line.held,
            wait_p50_ms=line.wait_ms(now, 0.50),
            wait_p99_ms=line.wait_ms(now, 0.99),
            rejected=sum(line.rejected.values()),
        )

    async def close(self) -> None:
        for task in list(self._probes.values()):
            task.cancel()
        if self._session is not None:
            await self._session.close()
