"""The endpoint table: the ENDPOINTS stream (``endpoint.<tenant>.<endpoint_id>.<event>``) folded into
one record per inference endpoint.

Rules (fencing as in :mod:`projections.schedule`):

* Every placement decision takes epochs above every epoch the endpoint has seen; a placed replica at
  or below the endpoint's ``epoch`` is stale and ignored. A replica event (starting, ready, lost)
  counts only if its assignment id is a current replica's and its epoch is that replica's epoch. A
  revocation removes the replica only if the assignment id matches.
* A replica moves ``placed`` -> ``starting`` -> ``ready``; ``lost`` is final for its assignment (only
  the revocation that follows removes it; a late ``ready`` does not revive it).
* A new endpoint wants ``max(min_replicas, 1)`` replicas (at most ``max_replicas``): deploying starts
  one even when it may scale to zero, and the idle timeout takes it down. ``scaled`` sets the wanted
  count (and, when a tenant set them, the bounds); ``scaled_to_zero`` removes every replica and wants
  none.
* ``start_failures`` counts the replicas lost in a row by their own failure (not ``retryable``) with
  none becoming ready since (a ready replica resets it); ``last_failure`` / ``last_failure_log_tail``
  keep the latest such loss. ``failed`` (the coordinator gave up) wants no replica; only a tenant's
  ``scaled`` (``by`` set) clears it and the count, so that the endpoint is tried again.
* State is derived: ``deleted`` (terminal, sticky) > ``failed`` > ``serving`` (a replica is ready) >
  ``scaled_to_zero`` (wants none and has none) > ``deploying``.
* ``last_seq`` is the ENDPOINTS sequence of the endpoint's latest event, ignored events included.
* Tenure (:mod:`projections.tenure`): each replica keeps when it was placed; a replica revoked,
  superseded or scaled away moves to ``retired`` for a while (its agent's last usage ticks arrive
  after it stopped); a deleted endpoint's replicas end with it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from core.autoscale import first_count
from projections.base import Projection
from projections.tenure import Tenure, retire, seen, tenure
from schemas.endpoints import (
    EndpointDeleted,
    EndpointDeployed,
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaRevoked,
    EndpointReplicaStarting,
    EndpointScaled,
    EndpointScaledToZero,
)
from schemas.envelope import Recorded
from schemas.values import Assignment

EndpointState = Literal["deploying", "serving", "scaled_to_zero", "failed", "deleted"]
ReplicaState = Literal["placed", "starting", "ready", "lost"]

_replace = msgspec.structs.replace


class ReplicaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One replica: the current assignment of one replica slot.

    Attributes:
        address: where it serves (``http://host:port``) while ``ready``, else empty.
        api_key: the key its engine takes while ``ready`` (empty: none); the kernel's, never shown.
        reason / log_tail: why it was lost.
        changed_seq: ENDPOINTS sequence of its latest accepted change.
        placed_ns: envelope time of its placement.
    """

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int
    gpus: int = 0
    state: ReplicaState = "placed"
    address: str = ""
    api_key: str = ""
    reason: str = ""
    log_tail: str = ""
    changed_seq: int = 0
    placed_ns: int = 0


class EndpointRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint: its deployment whole (``spec``, with the autoscaling bounds its tenant set since)
    and what has happened to it since.

    Attributes:
        desired_replicas: how many replicas it wants now (see the module docstring).
        scale_reason: the reason of the latest ``scaled`` / ``scaled_to_zero`` / ``failed``.
        start_failures: replicas lost in a row by their own failure, none ready since.
        last_failure / last_failure_log_tail: the reason and engine output of the latest of those.
        failed: the coordinator gave up on it (``endpoint.failed``) and no tenant scaled it since.
        replicas: current replicas by ``str(slot)``.
        epoch: the highest replica epoch placed.
        deployed_seq / deployed_ns: ENDPOINTS sequence and envelope time (Unix ns) of the deployment.
        deleted_ns: envelope time of the deletion.
        retired: replicas that ended recently (see :mod:`projections.tenure`).
        last_seq: ENDPOINTS sequence of the endpoint's latest event.
    """

    tenant: str
    endpoint_id: str
    spec: EndpointDeployed
    desired_replicas: int = 0
    scale_reason: str = ""
    start_failures: int = 0
    last_failure: str = ""
    last_failure_log_tail: str = ""
    failed: bool = False
    state: EndpointState = "deploying"
    replicas: dict[str, ReplicaRecord] = {}
    epoch: int = 0
    deployed_seq: int = 0
    deployed_ns: int = 0
    deleted_by: str = ""
    deleted_ns: int | None = None
    retired: list[Tenure] = []
    last_seq: int = 0


class EndpointsState(msgspec.Struct, kw_only=True):
    """Every endpoint, by :func:`endpoint_key`; ``seq`` is the last ENDPOINTS sequence applied."""

    seq: int = 0
    endpoints: dict[str, EndpointRecord] = {}


def endpoint_key(tenant: str, endpoint_id: str) -> str:
    """The key of an endpoint in :attr:`EndpointsState.endpoints`: ``tenant/endpoint_id``."""
    return f"{tenant}/{endpoint_id}"


def deployed(tenant: str, endpoint_id: str, e: EndpointDeployed, seq: int = 0, t: int = 0) -> EndpointRecord:
    """A new endpoint as ``e`` deploys it (``seq`` and ``t``: the deployment's sequence and time)."""
    return EndpointRecord(
        tenant=tenant,
        endpoint_id=endpoint_id,
        spec=e,
        desired_replicas=first_count(e),
        deployed_seq=seq,
        deployed_ns=t,
        last_seq=seq,
    )


def _derive(endpoint: EndpointRecord) -> EndpointRecord:
    if endpoint.state == "deleted":
        return endpoint
    state: EndpointState
    if endpoint.failed:
        state = "failed"
    elif any(r.state == "ready" for r in endpoint.replicas.values()):
        state = "serving"
    elif endpoint.desired_replicas == 0 and not endpoint.replicas:
        state = "scaled_to_zero"
    else:
        state = "deploying"
    return endpoint if endpoint.state == state else _replace(endpoint, state=state)


def _placed(
    endpoint: EndpointRecord, event: EndpointReplicaPlaced, seq: int, t: int
) -> EndpointRecord | None:
    replicas = dict(endpoint.replicas)
    superseded = []
    epoch = endpoint.epoch
    for a in event.assignments:
        if a.epoch <= endpoint.epoch or a.slot < 0:
            continue
        old = replicas.get(str(a.slot))
        if old is not None:
            superseded.append(_tenure(endpoint, old))
        replicas[str(a.slot)] = ReplicaRecord(**msgspec.structs.asdict(a), changed_seq=seq, placed_ns=t)
        epoch = max(epoch, a.epoch)
    if epoch == endpoint.epoch:
        return None
    retired = retire(endpoint.retired, superseded, t) if superseded else endpoint.retired
    return _replace(endpoint, replicas=replicas, epoch=epoch, retired=retired)


def _tenure(endpoint: EndpointRecord, replica: ReplicaRecord) -> Tenure:
    """The tenure of a current replica (``ended_ns``: the endpoint's deletion, if deleted)."""
    return tenure(replica_assignment(replica), replica.placed_ns, endpoint.deleted_ns)


def replica_assignment(replica: ReplicaRecord) -> Assignment:
    """The assignment ``replica`` holds, as it was placed (its fields of an :class:`Assignment`)."""
    return msgspec.convert(replica, Assignment, from_attributes=True)


def _retired(endpoint: EndpointRecord, gone: list[ReplicaRecord], t: int, **changes: Any) -> EndpointRecord:
    """``endpoint`` without the replicas ``gone`` (remembered in ``retired``), and ``changes``."""
    keys = {str(r.slot) for r in gone}
    replicas = {k: r for k, r in endpoint.replicas.items() if k not in keys}
    retired = retire(endpoint.retired, [_tenure(endpoint, r) for r in gone], t)
    return _replace(endpoint, replicas=replicas, retired=retired, **changes)


def _replica(endpoint: EndpointRecord, assignment_id: str, epoch: int) -> ReplicaRecord | None:
    """The current, not lost replica an event of ``(assignment_id, epoch)`` is about, if any."""
    for replica in endpoint.replicas.values():
        if replica.assignment_id == assignment_id:
            return replica if replica.epoch == epoch and replica.state != "lost" else None
    return None


def _with_replica(endpoint: EndpointRecord, replica: ReplicaRecord) -> EndpointRecord:
    return _replace(endpoint, replicas={**endpoint.replicas, str(replica.slot): replica})


def _replica_changed(endpoint: EndpointRecord, event: Any, seq: int) -> EndpointRecord | None:
    replica = _replica(endpoint, event.assignment_id, event.epoch)
    if replica is None:
        return None
    match event:
        case EndpointReplicaStarting():
            if replica.state != "placed":
                return None
            new = _replace(replica, state="starting", changed_seq=seq)
        case EndpointReplicaReady(address=address, api_key=api_key):
            new = _replace(replica, state="ready", address=address, api_key=api_key, changed_seq=seq)
            endpoint = _replace(endpoint, start_failures=0)
        case EndpointReplicaLost(reason=reason, log_tail=log_tail, retryable=retryable):
            new = _replace(
                replica,
                state="lost",
                address="",
                api_key="",
                reason=reason,
                log_tail=log_tail,
                changed_seq=seq,
            )
            if not retryable:
                endpoint = _replace(
                    endpoint,
                    start_failures=endpoint.start_failures + 1,
                    last_failure=reason,
                    last_failure_log_tail=log_tail,
                )
        case _:
            return None
    return _with_replica(endpoint, new)


def _changed(endpoint: EndpointRecord, event: Any, seq: int, t: int) -> EndpointRecord | None:
    """The endpoint after ``event``, or ``None`` when the event changes nothing (or is stale)."""
    match event:
        case EndpointScaled(replicas=replicas, reason=reason, min_replicas=low, max_replicas=high, by=by):
            if endpoint.failed and not by:
                return None  # only its tenant brings a failed endpoint back
            return _replace(
                endpoint,
                desired_replicas=replicas,
                scale_reason=reason,
                spec=_replace(
                    endpoint.spec,
                    min_replicas=endpoint.spec.min_replicas if low is None else low,
                    max_replicas=endpoint.spec.max_replicas if high is None else high,
                ),
                failed=False,
                start_failures=0 if by else endpoint.start_failures,
            )
        case EndpointFailed(reason=reason, log_tail=log_tail):
            return _replace(
                endpoint,
                failed=True,
                desired_replicas=0,
                scale_reason=reason,
                last_failure_log_tail=log_tail or endpoint.last_failure_log_tail,
            )
        case EndpointReplicaPlaced():
            return _placed(endpoint, event, seq, t)
        case EndpointReplicaRevoked(assignment_id=assignment_id, slot=slot):
            current = endpoint.replicas.get(str(slot))
            if current is None or current.assignment_id != assignment_id:
                return None
            return _retired(endpoint, [current], t)
        case EndpointReplicaStarting() | EndpointReplicaReady() | EndpointReplicaLost():
            return _replica_changed(endpoint, event, seq)
        case EndpointScaledToZero(idle_s=idle_s):
            if endpoint.failed:
                return None
            gone = list(endpoint.replicas.values())
            return _retired(endpoint, gone, t, desired_replicas=0, scale_reason=f"idle {idle_s:g}s")
        case EndpointDeleted(by=by):
            return _replace(endpoint, state="deleted", deleted_by=by, deleted_ns=t)
    return None


def evolve(state: EndpointsState, recorded: Recorded[Any]) -> EndpointsState:
    """Apply one ENDPOINTS event; records at or below ``state.seq`` are already applied and ignored;
    events of an endpoint never deployed are ignored."""
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    tenant, endpoint_id = recorded.token(1), recorded.token(2)
    key = endpoint_key(tenant, endpoint_id)
    endpoint = state.endpoints.get(key)
    event = recorded.event
    if endpoint is None:
        if isinstance(event, EndpointDeployed):
            state.endpoints[key] = deployed(tenant, endpoint_id, event, seq, recorded.time_ns)
        return state
    changed = None if endpoint.state == "deleted" else _changed(endpoint, event, seq, recorded.time_ns)
    endpoint = endpoint if changed is None else _derive(changed)
    state.endpoints[key] = seen(endpoint, endpoint.retired, seq, recorded.time_ns)
    return state


ENDPOINTS: Projection[EndpointsState] = Projection(
    name="endpoints", stream="ENDPOINTS", version=7, state_type=EndpointsState, evolve=evolve
)


def find_tenure(endpoint: EndpointRecord, assignment_id: str) -> Tenure | None:
    """The tenure of ``assignment_id`` in ``endpoint``: a current replica or a recently retired one."""
    for replica in endpoint.replicas.values():
        if replica.assignment_id == assignment_id:
            return _tenure(endpoint, replica)
    for retired in endpoint.retired:
        if retired.assignment_id == assignment_id:
            return retired
    return None


def ready_replicas(endpoint: EndpointRecord) -> list[ReplicaRecord]:
    """The replicas that serve requests now, by slot (none for a deleted endpoint)."""
    if endpoint.state == "deleted":
        return []
    return sorted((r for r in endpoint.replicas.values() if r.state == "ready"), key=lambda r: r.slot)


def missing_replicas(endpoint: EndpointRecord) -> list[int]:
    """Replica slots below ``desired_replicas`` with no current replica (none for a deleted endpoint)."""
    if endpoint.state == "deleted":
        return []
    return [slot for slot in range(endpoint.desired_replicas) if str(slot) not in endpoint.replicas]
