"""Endpoint replicas, placed like job shards: the coordinator's inference half.

Kept apart from :mod:`ops.coordinator` (which calls :meth:`Replicas.step` once per step) so that the
jobs' decisions and the endpoints' evolve independently. Each step, for every endpoint:

1. **Retire.** A replica that is ``lost`` (its engine exited, failed to start or was refused) is
   revoked, which frees its slot; so is one on a worker the registry shows lost or deregistered, and
   one whose slot is at or above ``desired_replicas`` (scale-in).
2. **Give up.** :data:`MAX_START_FAILURES` replicas lost in a row by their own failure without any
   becoming ready (a bad model path, an engine that runs out of memory; the projection's
   ``start_failures``) fail the endpoint: ``endpoint.failed`` with the last replica's reason and log
   tail. It then wants no replica, so placement never loops forever, and the endpoint shows why
   until its tenant scales it again. A replica lost with its worker does not count.
3. **Place** the missing slots (``projections.endpoints.missing_replicas``) with the same pure
   placement as jobs (:func:`core.placement.place` through the coordinator's live capacity),
   appending ``endpoint.replica_placed`` at the endpoint's expected sequence.
4. **Command.** ``start_work`` (``work_kind="endpoint"``, runtime ``vllm``) for each placed replica
   not yet commanded; ``stop_work`` for each replica that a worker still runs, by its latest
   heartbeat, but that is no longer current (revoked, scaled in or to zero, its endpoint failed or
   deleted). The workers' word, not this process's memory: a coordinator that restarted, or was down
   while an endpoint scaled to zero, still stops them, and their metering (billing) stops with them.

Every append carries the endpoint's expected sequence: a conflict (another writer) drops this
step's decision about that endpoint, and the next step decides again.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from core import placement
from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.placement import parse_assignment_id
from core.pricing import list_price_micros
from core.streams import command_subject, endpoint_filter, endpoint_subject
from ops.coordinator.inputs import InputError
from projections.admission import request_for_endpoint
from projections.capacity import tier_of
from projections.endpoints import EndpointRecord, ReplicaRecord, missing_replicas
from schemas.commands import StartWork, StopWork, WorkSpec
from schemas.endpoints import (
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaRevoked,
)
from schemas.values import Assignment

if TYPE_CHECKING:
    from ops.coordinator import Coordinator

log = logging.getLogger("resontech.coordinator")
MAX_START_FAILURES = 3
STOP_RESEND_S = 30.0
"""A replica still running this long after its stop was sent is sent it again."""
WORKER_LOST = "worker lost"
ENGINE_RUNTIME = "vllm"
MODEL_DIR = "model"
"""Where a workspace model lands in the replica's directory."""


def start_command(
    endpoint: EndpointRecord,
    replica: ReplicaRecord,
    tier: str = "unverified",
    downloads: dict[str, str] | None = None,
) -> StartWork:
    """The ``start_work`` of one replica: the engine serves the endpoint's model under its name."""
    model = endpoint.model
    if endpoint.model_source == "workspace":
        prefix = model if model.endswith("/") else model.rsplit("/", 1)[0] + "/"
        downloads = {f"{MODEL_DIR}/{k[len(prefix) :]}": url for k, url in (downloads or {}).items()}
        model = MODEL_DIR
    options = {"model": model, "served_name": endpoint.name}
    if endpoint.engine:
        options["engine"] = endpoint.engine
    gpu_type = endpoint.gpu_type if replica.gpus else None
    return StartWork(
        tenant=endpoint.tenant,
        work_id=endpoint.endpoint_id,
        work_kind="endpoint",
        assignment_id=replica.assignment_id,
        slot=replica.slot,
        epoch=replica.epoch,
        spec=WorkSpec(
            runtime=ENGINE_RUNTIME,
            downloads=dict(downloads or {}),
            gpus=replica.gpus,
            vram_mb=endpoint.vram_mb,
            pool=endpoint.pool,
            tier=tier,
            options=options,
        ),
        price_micros_per_gpu_hour=list_price_micros(gpu_type, endpoint.pool) if gpu_type else 0,
    )


def retirements(endpoint: EndpointRecord, gone_workers: set[str]) -> list[tuple[ReplicaRecord, str]]:
    """Replicas to revoke now, with the reason (pure: see step 1 of the module docstring)."""
    out = []
    for replica in sorted(endpoint.replicas.values(), key=lambda r: r.slot):
        if replica.state == "lost":
            out.append((replica, replica.reason or "replica lost"))
        elif replica.worker_id in gone_workers:
            out.append((replica, WORKER_LOST))
        elif replica.slot >= endpoint.desired_replicas:
            out.append((replica, f"scaled to {endpoint.desired_replicas}"))
    return out


class Replicas:
    """The replica half of a :class:`~ops.coordinator.Coordinator` (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator
        self.commanded: set[str] = set()  # current replicas whose start_work this process sent
        self.stopping: dict[str, float] = {}  # assignment -> when its stop was sent (monotonic s)

    async def step(self, now_ns: int) -> None:
        """One round of decisions about every endpoint."""
        registry = self.c.registry.state.workers
        gone = {w for w, r in registry.items() if r.state in ("lost", "deregistered")}
        current: set[str] = set()
        for endpoint in list(self.c.endpoints.state.endpoints.values()):
            if endpoint.state == "deleted":
                continue
            current.update(r.assignment_id for r in endpoint.replicas.values() if r.state != "lost")
            if await self._give_up(endpoint) or await self._retire(endpoint, gone):
                continue  # decide again once the projection shows the change
            if missing_replicas(endpoint):
                await self._place(endpoint, now_ns)
            await self._start(endpoint)
        self.commanded &= current
        await self._stop_strays(current)

    async def _give_up(self, endpoint: EndpointRecord) -> bool:
        """Fail an endpoint whose replicas keep failing (step 2); whether anything was tried."""
        failed = endpoint.start_failures
        if failed < MAX_START_FAILURES or endpoint.failed:
            return False
        reason = f"{failed} replicas failed in a row without one ready; the last: {endpoint.last_failure}"
        log.warning("endpoint %s failed: %s", endpoint.endpoint_id, reason)
        await self._append(endpoint, EndpointFailed(reason=reason, log_tail=endpoint.last_failure_log_tail))
        return True

    async def _retire(self, endpoint: EndpointRecord, gone: set[str]) -> bool:
        """Retire one replica (the next append needs the projection to show this one); whether
        anything was appended or tried."""
        todo = retirements(endpoint, gone)
        if not todo:
            return False
        replica, reason = todo[0]
        event: Any
        if replica.state != "lost" and replica.worker_id in gone:
            event = EndpointReplicaLost(
                assignment_id=replica.assignment_id, epoch=replica.epoch, reason=reason, retryable=True
            )
        else:
            event = EndpointReplicaRevoked(
                assignment_id=replica.assignment_id, worker_id=replica.worker_id,
                slot=replica.slot, epoch=replica.epoch, reason=reason,
            )  # fmt: skip
        await self._append(endpoint, event)
        return True

    async def _place(self, endpoint: EndpointRecord, now_ns: int) -> None:
        capacity = self.c._ensure_capacity(now_ns)
        request = request_for_endpoint(endpoint)
        decision = capacity.index.place(request, now_ns=now_ns)
        if not isinstance(decision, placement.Placed):
            return  # tried again next step; the endpoint stays ``deploying``
        event = EndpointReplicaPlaced(assignments=decision.assignments, provenance=decision.provenance)
        if await self._append(endpoint, event):
            log.info("endpoint %s: placed %s", endpoint.endpoint_id, _where(decision.assignments))

    async def _start(self, endpoint: EndpointRecord) -> None:
        for replica in endpoint.replicas.values():
            if replica.state != "placed" or replica.assignment_id in self.commanded:
                continue
            worker = self.c.registry.state.workers.get(replica.worker_id)
            tier = tier_of(worker, time.time_ns()) if worker else "unverified"
            downloads: dict[str, str] = {}
            if endpoint.model_source == "workspace":
                try:
                    downloads = await self.c.presigner.downloads_async(endpoint.tenant, [endpoint.model])
                except InputError as exc:
                    lost = EndpointReplicaLost(assignment_id=replica.assignment_id, epoch=replica.epoch,
                                               reason=f"model missing at start: {exc}")  # fmt: skip
                    await self._append(endpoint, lost)
                    continue
            command = start_command(endpoint, replica, tier, downloads)
            try:
                await self.c.log.append(command_subject(replica.worker_id), command,
                                        event_id=f"start-{replica.assignment_id}")  # fmt: skip
            except (AppendTimeout, AppendRejected) as exc:
                log.warning("start of replica %s not sent yet: %s", replica.assignment_id, exc)
                continue
            self.commanded.add(replica.assignment_id)

    async def _stop_strays(self, current: set[str]) -> None:
        """Stop every replica a worker still runs (its latest heartbeat lists it) that is no longer
        current (step 4), again every :data:`STOP_RESEND_S` while it runs."""
        endpoint_ids = {e.endpoint_id for e in self.c.endpoints.state.endpoints.values()}
        strays = [
            (worker_id, running, parsed)
            for worker_id, beat in self.c.liveness.state.beats.items()
            for running in beat.running
            if running not in current
            and (parsed := parse_assignment_id(running)) is not None
            and parsed[0] in endpoint_ids
        ]
        self.stopping = {a: t for a, t in self.stopping.items() if any(a == s[1] for s in strays)}
        if not strays:
            return
        job_ids = {job.job_id for job in self.c.schedule.state.jobs.values()}  # never stop a job's shard
        now = time.monotonic()
        for worker_id, assignment_id, (endpoint_id, _, epoch) in strays:
            if endpoint_id in job_ids or now - self.stopping.get(assignment_id, -math.inf) < STOP_RESEND_S:
                continue
            stop = StopWork(
                work_id=endpoint_id, assignment_id=assignment_id, epoch=epoch, reason="replica retired"
            )
            try:
                await self.c.log.append(command_subject(worker_id), stop, event_id=f"stop-{assignment_id}")
            except (AppendTimeout, AppendRejected) as exc:
                log.warning("stop of replica %s not sent yet: %s", assignment_id, exc)
                continue
            log.info("replica %s on %s is no longer current: stopping it", assignment_id, worker_id)
            self.stopping[assignment_id] = now

    async def _append(self, endpoint: EndpointRecord, event: Any) -> bool:
        try:
            await self.c.log.append(
                endpoint_subject(endpoint.tenant, endpoint.endpoint_id, event),
                event,
                expected_seq=endpoint.last_seq,
                expected_filter=endpoint_filter(endpoint.tenant, endpoint.endpoint_id),
            )
        except ConcurrencyConflict:
            self.c.conflicts += 1
            return False
        return True


def _where(assignments: list[Assignment]) -> str:
    return ", ".join(f"replica {a.slot} on {a.worker_id}" for a in assignments)
