"""Endpoint replica upkeep: pure decisions that return the events to append and the stops to send.

The coordinator (:mod:`ops.coordinator.replicas`) asks these about every live endpoint, each step,
and appends what they return at the endpoint's expected sequence:

1. **Give up** (:func:`give_up`). :data:`MAX_START_FAILURES` replicas lost in a row by their own
   failure without any becoming ready (a bad model path, an engine that runs out of memory; the
   projection's ``start_failures``) fail the endpoint: ``endpoint.failed`` with the last replica's
   reason and log tail. It then wants no replica, so placement never loops forever. A replica lost
   with its worker does not count.
2. **Retire** (:func:`retirements`). A replica that is ``lost`` (its engine exited, failed to start or
   was refused) is revoked, which frees its slot; one on a worker the registry shows lost or
   deregistered is lost (``retryable``); one whose slot is at or above ``desired_replicas`` is
   revoked (scale-in). One at a time: the next needs the projection to show this one.
3. **Place** the missing slots (:func:`projections.endpoints.missing_replicas`): ``replica_placed``
   carries the placement (:func:`placed`); a replica whose model is missing when it would start is
   lost (:func:`model_missing`).
4. **Stop strays** (:func:`stray_stops`): every replica a worker still runs by its latest heartbeat
   that is no longer current (revoked, scaled in or to zero, its endpoint failed or deleted). The
   workers' word, not the coordinator's memory: one that restarted still stops them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from core.placement.placing import is_work_ref, parse_assignment_id, work_ref
from core.placement.values import Placed
from projections.endpoints import EndpointRecord, EndpointsState, ReplicaRecord, replica_assignment
from projections.liveness import LastBeat
from projections.recovery import Stop, revoked_as
from projections.registry import WorkerRecord
from schemas.commands import StopWork
from schemas.endpoints import (
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaRevoked,
)

MAX_START_FAILURES = 3
"""Replicas lost in a row by their own failure, none ready since, that fail their endpoint."""
WORKER_LOST = "worker lost"
STRAY_REASON = "replica retired"

Upkeep = EndpointFailed | EndpointReplicaLost | EndpointReplicaRevoked


def gone_workers(workers: Mapping[str, WorkerRecord]) -> set[str]:
    """The workers the registry shows lost or deregistered: their replicas are retired."""
    return {worker_id for worker_id, record in workers.items() if record.state in ("lost", "deregistered")}


def current_replicas(endpoints: EndpointsState) -> set[str]:
    """The assignment ids of the replicas that should run: not lost, of endpoints not deleted."""
    return {
        replica.assignment_id
        for endpoint in endpoints.endpoints.values()
        if endpoint.state != "deleted"
        for replica in endpoint.replicas.values()
        if replica.state != "lost"
    }


def give_up(endpoint: EndpointRecord) -> EndpointFailed | None:
    """``endpoint.failed`` for an endpoint whose replicas keep failing (step 1), unless it failed
    already."""
    failed = endpoint.start_failures
    if failed < MAX_START_FAILURES or endpoint.failed:
        return None
    reason = f"{failed} replicas failed in a row without one ready; the last: {endpoint.last_failure}"
    return EndpointFailed(reason=reason, log_tail=endpoint.last_failure_log_tail)


def retirements(endpoint: EndpointRecord, gone_workers: Collection[str]) -> list[tuple[ReplicaRecord, str]]:
    """Replicas to retire now, by slot, with the reason (step 2)."""
    out = []
    for replica in sorted(endpoint.replicas.values(), key=lambda r: r.slot):
        if replica.state == "lost":
            out.append((replica, replica.reason or "replica lost"))
        elif replica.worker_id in gone_workers:
            out.append((replica, WORKER_LOST))
        elif replica.slot >= endpoint.desired_replicas:
            out.append((replica, f"scaled to {endpoint.desired_replicas}"))
    return out


def retirement(
    endpoint: EndpointRecord, gone_workers: Collection[str]
) -> EndpointReplicaLost | EndpointReplicaRevoked | None:
    """The first of :func:`retirements` as an event: a live replica on a gone worker is lost (and
    revoked once the projection shows it), any other revoked."""
    todo = retirements(endpoint, gone_workers)
    if not todo:
        return None
    replica, reason = todo[0]
    if replica.state != "lost" and replica.worker_id in gone_workers:
        return EndpointReplicaLost(
            assignment_id=replica.assignment_id, epoch=replica.epoch, reason=reason, retryable=True
        )
    return revoked_as(EndpointReplicaRevoked, replica_assignment(replica), reason)


def upkeep(endpoint: EndpointRecord, gone_workers: Collection[str]) -> Upkeep | None:
    """The one change to append about ``endpoint`` before it is placed or started: give up
    (:func:`give_up`), else retire a replica (:func:`retirement`); ``None`` for a deleted endpoint
    or one with nothing to change."""
    if endpoint.state == "deleted":
        return None
    failed = give_up(endpoint)
    return failed if failed is not None else retirement(endpoint, gone_workers)


def placed(decision: Placed) -> EndpointReplicaPlaced:
    """The ``endpoint.replica_placed`` that carries out a placement of replicas."""
    return EndpointReplicaPlaced(assignments=decision.assignments, provenance=decision.provenance)


def unstarted(endpoint: EndpointRecord, commanded: Collection[str]) -> list[ReplicaRecord]:
    """The placed replicas whose ``start_work`` has not been sent (``commanded``: those sent)."""
    return [r for r in endpoint.replicas.values() if r.state == "placed" and r.assignment_id not in commanded]


def model_missing(replica: ReplicaRecord, why: object) -> EndpointReplicaLost:
    """A replica lost before it started: its model is not in the workspace (``why``: the error)."""
    return EndpointReplicaLost(
        assignment_id=replica.assignment_id, epoch=replica.epoch, reason=f"model missing at start: {why}"
    )


def stray_stops(
    beats: Mapping[str, LastBeat],
    endpoints: EndpointsState,
    job_ids: Collection[str],
    current: Collection[str],
) -> list[Stop]:
    """The stop of every endpoint replica a worker runs by its latest beat that is not ``current``
    (:func:`current_replicas`), command id ``stop-<assignment>`` (step 4), naming the replica's
    endpoint, tenant and kind. An assignment id names its tenant and kind
    (:func:`core.placement.placing.work_ref`), so only an endpoint's replica is ever stopped here.
    An id stored before ids did (``<work_id>-s<slot>-e<epoch>``) is an endpoint's when its work id
    is an endpoint's and no job's (``job_ids``: else it may be that job's shard)."""
    refs = {work_ref(e.tenant, "endpoint", e.endpoint_id): e for e in endpoints.endpoints.values()}
    legacy: dict[str, list[EndpointRecord]] = {}
    for e in endpoints.endpoints.values():
        legacy.setdefault(e.endpoint_id, []).append(e)
    out = []
    for worker_id, beat in beats.items():
        for running in beat.running:
            parsed = parse_assignment_id(running) if running not in current else None
            if parsed is None:
                continue
            head, _, epoch = parsed
            if (endpoint := refs.get(head)) is not None:
                tenant, work_id = endpoint.tenant, endpoint.endpoint_id
            elif is_work_ref(head) or head not in legacy or head in job_ids:
                continue
            else:  # an id of before: its tenant only when one tenant has an endpoint of that id
                owners = legacy[head]
                tenant, work_id = owners[0].tenant if len(owners) == 1 else "", head
            command = StopWork(
                work_id=work_id,
                assignment_id=running,
                epoch=epoch,
                reason=STRAY_REASON,
                tenant=tenant,
                work_kind="endpoint",
            )
            out.append(Stop(worker_id, command, f"stop-{running}"))
    return out
