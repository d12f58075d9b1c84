"""Endpoint replicas, placed like job shards: the coordinator's inference half.

Kept apart from :mod:`ops.coordinator.service` (which calls :meth:`Replicas.step` once per step) so
that the jobs' decisions and the endpoints' evolve independently. Each step, for every endpoint, it
appends what :mod:`projections.replica_upkeep` decides (give up on an endpoint whose replicas keep
failing, retire one replica, or place the missing ones with the same pure placement as jobs through
the coordinator's live capacity), sends ``start_work`` (``work_kind="endpoint"``, runtime ``vllm``)
for each placed replica not yet commanded, and ``stop_work`` for each replica that a worker still
runs, by its latest heartbeat, but that is no longer current, again every :data:`STOP_RESEND_S`
while it runs: a coordinator that restarted, or was down while an endpoint scaled to zero, still
stops them, and their metering (billing) stops with them.

Every append carries the endpoint's expected sequence: a conflict (another writer) drops this
step's decision about that endpoint, and the next step decides again.

It is built from what it uses: the appender, read-only views of the registry, liveness, schedule
and endpoints, the live capacity (by a function that builds it when it is not yet), the presigner
and the clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from core.placement.values import Placed
from core.pricing import list_price_micros
from ops.coordinator.appender import Appender
from ops.coordinator.inputs import InputError, Presigner
from ops.coordinator.live_capacity import LiveCapacity
from ops.coordinator.views import SYSTEM_CLOCK, Clock, View
from projections import replica_upkeep
from projections.admission import request_for_endpoint
from projections.candidates import tier_of
from projections.endpoints import EndpointRecord, EndpointsState, ReplicaRecord, missing_replicas
from projections.liveness import LivenessState
from projections.registry import RegistryState
from projections.replica_upkeep import MAX_START_FAILURES, retirements
from projections.schedule import ScheduleState
from schemas.commands import StartWork, WorkSpec
from schemas.endpoints import EndpointFailed
from schemas.values import Assignment

log = logging.getLogger("resontech.coordinator")
STOP_RESEND_S = 30.0
"""A replica still running this long after its stop was sent is sent it again."""
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
    model = endpoint.spec.model
    if endpoint.spec.model_source == "workspace":
        prefix = model if model.endswith("/") else model.rsplit("/", 1)[0] + "/"
        downloads = {f"{MODEL_DIR}/{k[len(prefix) :]}": url for k, url in (downloads or {}).items()}
        model = MODEL_DIR
    options = {"model": model, "served_name": endpoint.spec.name}
    if endpoint.spec.engine:
        options["engine"] = endpoint.spec.engine
    gpu_type = endpoint.spec.gpu_type if replica.gpus else None
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
            vram_mb=endpoint.spec.vram_mb,
            pool=endpoint.spec.pool,
            tier=tier,
            options=options,
            image=endpoint.spec.image,
        ),
        price_micros_per_gpu_hour=list_price_micros(gpu_type, endpoint.spec.pool) if gpu_type else 0,
    )


class Replicas:
    """The replica half of a :class:`~ops.coordinator.Coordinator` (see the module docstring).

    Args:
        appender: where its appends and commands go.
        registry: the workers (gone ones, tiers), read-only.
        liveness: the latest heartbeats (what each worker still runs), read-only.
        schedule: the jobs (whose shards are never stopped as stray replicas), read-only.
        endpoints: the endpoints, read-only.
        capacity: the live capacity at a time (nanoseconds), built if it was not yet.
        presigner: signs a workspace model's files.
        clock: the wall clock a worker's tier is read at; when a stop is sent again.

    Attributes:
        commanded: current replicas whose ``start_work`` this process sent.
        stopping: assignment -> when its stop was sent (the clock's monotonic seconds).
    """

    def __init__(
        self,
        *,
        appender: Appender,
        registry: View[RegistryState],
        liveness: View[LivenessState],
        schedule: View[ScheduleState],
        endpoints: View[EndpointsState],
        capacity: Callable[[int], LiveCapacity],
        presigner: Presigner,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.appender, self.capacity, self.presigner, self.clock = appender, capacity, presigner, clock
        self.registry, self.liveness, self.schedule, self.endpoints = registry, liveness, schedule, endpoints
        self.commanded: set[str] = set()  # current replicas whose start_work this process sent
        self.stopping: dict[str, float] = {}  # assignment -> when its stop was sent (monotonic s)

    async def step(self, now_ns: int) -> None:
        """One round of decisions about every endpoint."""
        gone = replica_upkeep.gone_workers(self.registry.state.workers)
        endpoints = self.endpoints.state
        current = replica_upkeep.current_replicas(endpoints)
        for endpoint in list(endpoints.endpoints.values()):
            if endpoint.state == "deleted":
                continue
            change = replica_upkeep.upkeep(endpoint, gone)
            if change is not None:  # decide again once the projection shows the change
                if isinstance(change, EndpointFailed):
                    log.warning("endpoint %s failed: %s", endpoint.endpoint_id, change.reason)
                await self.appender.append_endpoint(endpoint, change)
                continue
            if missing_replicas(endpoint):
                await self._place(endpoint, now_ns)
            await self._start(endpoint)
        self.commanded &= current
        await self._stop_strays(current)

    async def _place(self, endpoint: EndpointRecord, now_ns: int) -> None:
        capacity = self.capacity(now_ns)
        decision = capacity.index.place(request_for_endpoint(endpoint), now_ns=now_ns)
        if not isinstance(decision, Placed):
            return  # tried again next step; the endpoint stays ``deploying``
        if await self.appender.append_endpoint(endpoint, replica_upkeep.placed(decision)):
            log.info("endpoint %s: placed %s", endpoint.endpoint_id, _where(decision.assignments))

    async def _start(self, endpoint: EndpointRecord) -> None:
        for replica in replica_upkeep.unstarted(endpoint, self.commanded):
            worker = self.registry.state.workers.get(replica.worker_id)
            tier = tier_of(worker, self.clock.wall_ns()) if worker else "unverified"
            downloads: dict[str, str] = {}
            if endpoint.spec.model_source == "workspace":
                try:
                    downloads = await self.presigner.downloads_async(endpoint.tenant, [endpoint.spec.model])
                except InputError as exc:
                    await self.appender.append_endpoint(endpoint, replica_upkeep.model_missing(replica, exc))
                    continue
            command = start_command(endpoint, replica, tier, downloads)
            if await self.appender.send(replica.worker_id, command, f"start-{replica.assignment_id}"):
                self.commanded.add(replica.assignment_id)

    async def _stop_strays(self, current: set[str]) -> None:
        """Stop every replica a worker still runs that is no longer current
        (:func:`projections.replica_upkeep.stray_stops`), again every :data:`STOP_RESEND_S`."""
        job_ids = {job.job_id for job in self.schedule.state.jobs.values()}  # never stop a job's shard
        beats, endpoints = self.liveness.state.beats, self.endpoints.state
        stops = replica_upkeep.stray_stops(beats, endpoints, job_ids, current)
        running = {stop.command.assignment_id for stop in stops}
        self.stopping = {a: t for a, t in self.stopping.items() if a in running}
        now = self.clock.monotonic()
        for stop in stops:
            assignment_id = stop.command.assignment_id
            if now - self.stopping.get(assignment_id, -math.inf) < STOP_RESEND_S:
                continue
            if await self.appender.send(*stop):
                log.info("replica %s on %s is no longer current: stopping it", assignment_id, stop.worker_id)
                self.stopping[assignment_id] = now


def _where(assignments: list[Assignment]) -> str:
    return ", ".join(f"replica {a.slot} on {a.worker_id}" for a in assignments)


__all__ = ["MAX_START_FAILURES", "STOP_RESEND_S", "Replicas", "retirements", "start_command"]
