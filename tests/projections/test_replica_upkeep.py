"""Endpoint replica upkeep (:mod:`projections.replica_upkeep`), without a server: each folds real events
through the endpoint and registry reducers, then asks what the coordinator should append or send
(``retirements`` itself is in tests/agent/test_gguf.py)."""

from __future__ import annotations

from core.placement.placing import assignment_id
from core.placement.values import Placed
from projections import ENDPOINTS, REGISTRY, replica_upkeep
from projections.endpoints import EndpointRecord, EndpointsState
from projections.liveness import LastBeat
from projections.recovery import Stop
from projections.replica_upkeep import MAX_START_FAILURES
from schemas.commands import StopWork
from schemas.endpoints import (
    EndpointDeleted,
    EndpointDeployed,
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaRevoked,
    EndpointScaled,
)
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerLost
from tests.support.reducer_builders import Endpoint, Log, register, verify

PROV = Provenance(candidates=1)


def _replica(slot: int, epoch: int, worker: str = "w1", endpoint: str = "e1") -> Assignment:
    return Assignment(
        assignment_id=assignment_id(endpoint, slot, epoch, tenant="acme", kind="endpoint"),
        worker_id=worker,
        slot=slot,
        epoch=epoch,
        gpus=1,
    )


def _deployed(log: Log, endpoint_id: str = "e1", replicas: int = 1) -> Endpoint:
    ep = Endpoint(log, endpoint_id)
    ep(EndpointDeployed(name=endpoint_id, model="m", min_replicas=replicas, max_replicas=4))
    return ep


def _lose(ep: Endpoint, a: Assignment, reason: str, *, retryable: bool = False) -> None:
    ep(EndpointReplicaPlaced(assignments=[a], provenance=PROV))
    ep(EndpointReplicaLost(assignment_id=a.assignment_id, epoch=a.epoch, reason=reason, retryable=retryable))


def _revoke(ep: Endpoint, a: Assignment) -> None:
    ep(
        EndpointReplicaRevoked(
            assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch, reason="lost"
        )
    )


def test_an_endpoint_whose_replicas_keep_failing_is_given_up_once() -> None:
    log = Log(ENDPOINTS)
    ep = _deployed(log)
    for epoch in range(1, MAX_START_FAILURES + 1):
        assert replica_upkeep.give_up(ep.record) is None
        _lose(ep, _replica(0, epoch), f"exit status {epoch}")
        _revoke(ep, _replica(0, epoch))
    failed = replica_upkeep.give_up(ep.record)
    assert failed == EndpointFailed(
        reason="3 replicas failed in a row without one ready; the last: exit status 3", log_tail=""
    )
    assert replica_upkeep.upkeep(ep.record, set()) == failed  # before anything else
    ep(failed)
    assert replica_upkeep.give_up(ep.record) is None


def test_a_lost_replica_is_revoked_one_on_a_gone_worker_lost_and_a_scaled_in_one_revoked() -> None:
    log = Log(ENDPOINTS)
    ep = _deployed(log, replicas=3)
    r0, r1, r2 = _replica(0, 1, "w1"), _replica(1, 1, "w2"), _replica(2, 1, "w3")
    ep(EndpointReplicaPlaced(assignments=[r0, r1, r2], provenance=PROV))
    assert replica_upkeep.upkeep(ep.record, set()) is None
    assert replica_upkeep.upkeep(ep.record, {"w2"}) == EndpointReplicaLost(
        assignment_id=r1.assignment_id, epoch=1, reason="worker lost", retryable=True
    )
    ep(EndpointReplicaLost(assignment_id=r0.assignment_id, epoch=1, reason="exit status 1"))
    assert replica_upkeep.upkeep(ep.record, {"w2"}) == EndpointReplicaRevoked(
        assignment_id=r0.assignment_id, worker_id="w1", slot=0, epoch=1, reason="exit status 1"
    )  # the lowest slot first: one at a time
    _revoke(ep, r0)
    ep(EndpointScaled(replicas=2, reason="rps"))
    assert replica_upkeep.upkeep(ep.record, set()) == EndpointReplicaRevoked(
        assignment_id=r2.assignment_id, worker_id="w3", slot=2, epoch=1, reason="scaled to 2"
    )
    ep(EndpointDeleted(by="alice"))
    assert replica_upkeep.upkeep(ep.record, {"w2"}) is None  # deleted: nothing to keep


def test_a_placement_a_start_and_a_missing_model() -> None:
    log = Log(ENDPOINTS)
    ep = _deployed(log, replicas=2)
    r0, r1 = _replica(0, 1, "w1"), _replica(1, 1, "w2")
    placed = replica_upkeep.placed(Placed(assignments=[r0, r1], provenance=PROV))
    assert placed == EndpointReplicaPlaced(assignments=[r0, r1], provenance=PROV)
    ep(placed)
    record: EndpointRecord = ep.record
    assert [r.slot for r in replica_upkeep.unstarted(record, {r0.assignment_id})] == [1]
    assert replica_upkeep.model_missing(record.replicas["1"], "no object at m") == EndpointReplicaLost(
        assignment_id=r1.assignment_id, epoch=1, reason="model missing at start: no object at m"
    )


def test_gone_workers_are_the_lost_and_the_deregistered() -> None:
    log = Log(REGISTRY)
    for worker in ("w1", "w2"):
        register(log, worker)
        verify(log, worker)
    log("worker.w2.lost", WorkerLost(silent_s=3.0, last_heartbeat_seq=1), 5.0)
    assert replica_upkeep.gone_workers(log.state.workers) == {"w2"}


def test_replicas_a_worker_still_runs_but_are_no_longer_current_are_stopped() -> None:
    log = Log(ENDPOINTS)
    ep = _deployed(log)
    stale, current = _replica(0, 1), _replica(0, 2)
    _lose(ep, stale, "exit status 1")
    _revoke(ep, stale)
    ep(EndpointReplicaPlaced(assignments=[current], provenance=PROV))
    gone = _deployed(log, "e2")
    deleted = _replica(0, 1, endpoint="e2")
    gone(EndpointReplicaPlaced(assignments=[deleted], provenance=PROV))
    gone(EndpointDeleted(by="alice"))
    state: EndpointsState = log.state
    live = replica_upkeep.current_replicas(state)
    assert live == {current.assignment_id}
    running = [
        stale.assignment_id,
        current.assignment_id,
        deleted.assignment_id,  # its endpoint was deleted: stopped too
        assignment_id("job7", 0, 1, tenant="acme", kind="job"),  # no endpoint's: not ours to stop
        assignment_id("e1", 0, 1, tenant="acme", kind="job"),  # a job of the same id: not ours either
        assignment_id("e1", 0, 1, tenant="other", kind="endpoint"),  # another tenant's: not one we know
        assignment_id("e1", 3, 9, tenant="acme", kind="endpoint"),  # a slot e1 never had at this epoch
        "e1-s4-e9",  # an id stored before ids named their tenant: e1's as long as no job is e1
        "not-an-assignment",
    ]
    beats = {"w1": LastBeat(seq=1, time_ns=0, interval_s=1.0, running=running)}
    stops = replica_upkeep.stray_stops(beats, state, job_ids=set(), current=live)
    e1_s3 = assignment_id("e1", 3, 9, tenant="acme", kind="endpoint")
    expected = [stale.assignment_id, deleted.assignment_id, e1_s3, "e1-s4-e9"]
    assert [s.command.assignment_id for s in stops] == expected
    assert stops[0] == Stop(
        "w1",
        StopWork(
            work_id="e1",
            assignment_id=stale.assignment_id,
            epoch=1,
            reason="replica retired",
            tenant="acme",
            work_kind="endpoint",
        ),
        f"stop-{stale.assignment_id}",
    )
    assert stops[3].command.tenant == "acme"  # the only tenant with an endpoint e1
    spared = replica_upkeep.stray_stops(beats, state, job_ids={"e1"}, current=live)
    # a job e1 may run e1-s4-e9 (an id of before): never stopped here; ids of now say their kind
    assert [s.command.assignment_id for s in spared] == [stale.assignment_id, deleted.assignment_id, e1_s3]
