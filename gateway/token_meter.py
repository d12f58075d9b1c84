"""Token metering: the tokens each endpoint replica served, as ``meter.tokens`` events on METERING.

The gateway counts them (:mod:`gateway.token_counts` reads them off every proxied response) because the
tenant is billed for what the kernel measured, not for what the provider's agent reports. Tokens are
summed per replica (assignment) and appended every :data:`INTERVAL_S` seconds, and once more when the
gateway stops, as one :class:`~schemas.metering.TokensServed` per replica that served any, with the
replica's provider, GPU family, pool and tier, so that its tokens land on the same invoice line as
its GPU-seconds. It goes on ``meter.<tenant>.<worker>.<assignment>.tokens``: only the kernel writes
on METERING.

Identity: every gateway process is its own ``source`` (``gateway-<random>``), and its ticks' event ids
are ``<source>-<n>``: a retried append is stored once, and several gateway workers never collide
(the ledger counts a source's ticks of one assignment once per interval). A process's intervals of
one assignment are contiguous. A tick whose append failed is kept and appended again, with the same
id, at the next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass

from core.errors import ResontechError
from core.pricing import CPU_GPU_TYPE, gpu_family
from core.streams import metering_subject
from gateway.kernel import Kernel
from projections import REGISTRY
from projections.candidates import tier_of
from projections.endpoints import EndpointRecord, ReplicaRecord
from projections.registry import WorkerRecord
from schemas.metering import TokensServed

log = logging.getLogger("resontech.gateway")
INTERVAL_S = 10.0
Append = tuple[str, TokensServed, str]


@dataclass(slots=True)
class ReplicaTokens:
    """Tokens ``replica`` of ``endpoint`` (both as first counted) served since its last tick from
    this process."""

    endpoint: EndpointRecord
    replica: ReplicaRecord
    since_ms: int
    tokens: int = 0


def token_tick(
    counted: ReplicaTokens, worker: WorkerRecord | None, *, source: str, end_ms: int, now_ns: int
) -> TokensServed:
    """The tick of ``counted`` for ``[since_ms, end_ms]`` (at least one millisecond long, so that
    the next interval, which starts at its end, never starts where it did)."""
    gpu_type = CPU_GPU_TYPE
    registered = None if worker is None else worker.registration
    if counted.replica.gpus and registered is not None and registered.gpus:
        gpu_type = gpu_family(registered.gpus[0].model)
    return TokensServed(
        work_id=counted.endpoint.endpoint_id,
        work_kind="endpoint",
        assignment_id=counted.replica.assignment_id,
        epoch=counted.replica.epoch,
        provider=registered.provider if registered is not None else "",
        gpu_type=gpu_type,
        pool=counted.endpoint.spec.pool,
        start_ms=counted.since_ms,
        end_ms=max(end_ms, counted.since_ms + 1),
        tier=tier_of(worker, now_ns) if worker is not None else "unverified",
        tokens=counted.tokens,
        source=source,
    )


class TokenMeter:
    """Counts tokens per replica and appends them as ticks (see the module docstring)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.source = f"gateway-{secrets.token_hex(6)}"
        self.counted: dict[str, ReplicaTokens] = {}  # assignment id -> tokens not in a tick yet
        self.next_ms: dict[str, int] = {}  # assignment id -> where its next interval starts (those
        # ticked at the last cut: a later one starts at least an interval after it anyway)
        self.pending: list[Append] = []  # ticks built but not stored yet
        self.appended = 0
        self._n = 0

    def add(self, endpoint: EndpointRecord, replica: ReplicaRecord, tokens: int) -> None:
        """Count ``tokens`` served by ``replica`` of ``endpoint``."""
        if tokens <= 0:
            return
        counted = self.counted.get(replica.assignment_id)
        if counted is None:
            now_ms = time.time_ns() // 1_000_000
            since_ms = max(now_ms, self.next_ms.get(replica.assignment_id, 0))
            counted = self.counted[replica.assignment_id] = ReplicaTokens(endpoint, replica, since_ms)
        counted.tokens += tokens

    def cut(self, workers: dict[str, WorkerRecord], now_ns: int) -> list[Append]:
        """Turn every count into a tick (``workers``: the registry's records, for the replicas'
        providers, GPU families and tiers), queued with those not stored yet; what to append now."""
        end_ms = now_ns // 1_000_000
        self.next_ms = {}
        for assignment_id, counted in self.counted.items():
            self._n += 1
            tick = token_tick(
                counted,
                workers.get(counted.replica.worker_id),
                source=self.source,
                end_ms=end_ms,
                now_ns=now_ns,
            )
            self.next_ms[assignment_id] = tick.end_ms
            subject = metering_subject(
                counted.endpoint.tenant, counted.replica.worker_id, assignment_id, TokensServed
            )
            self.pending.append((subject, tick, f"{self.source}-{self._n}"))
        self.counted.clear()
        return list(self.pending)

    async def flush(self, kernel: Kernel) -> bool:
        """Append every count as a tick now; whether everything is stored (else kept for later)."""
        items = self.cut(kernel.state(REGISTRY).workers, time.time_ns())
        if not items:
            return True
        try:
            await kernel.event_log.append_many(items)
        except ResontechError as exc:
            log.warning("%d token tick(s) not stored yet, kept for later: %s", len(items), exc.message)
            return False
        del self.pending[: len(items)]
        self.appended += len(items)
        return True

    async def run(self, kernel: Kernel, stop: asyncio.Event) -> None:
        """Flush every ``interval_s`` until ``stop``, then once more."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            await self.flush(kernel)
