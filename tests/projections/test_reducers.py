"""Unit tests of the pure reducers and of pricing: each rule the services rely on, one at a time."""

from __future__ import annotations

import itertools
import random
from typing import Any

import msgspec
import pytest

from core.streams import (
    endpoint_subject,
    heartbeat_subject,
    job_subject,
    metering_subject,
    provider_subject,
    tenant_subject,
    worker_subject,
)
from projections import ALL, BY_NAME, ENDPOINTS, LEDGER, LIVENESS, REGISTRY, SCHEDULE, ledger
from projections.base import Projection, canonical_json, copy_state, state_hash
from projections.endpoints import EndpointsState, missing_replicas, ready_replicas
from projections.ledger import (
    RANGE_CAP,
    RANGES_KEPT,
    LedgerState,
    charges,
    compact_ranges,
    invoice,
    payouts,
    period_of,
)
from projections.liveness import LivenessState, overdue, silent_for
from projections.registry import RegistryState, available, downtime, uptime
from projections.schedule import ScheduleState, active_assignments, job_key, missing_slots, pending
from schemas._base import Event
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
from schemas.jobs import (
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobQueued,
    JobRejected,
    JobRoundCompleted,
    JobShardCompleted,
    JobSubmitted,
)
from schemas.metering import TokensServed, UsageTick
from schemas.providers import ProviderKeyRevoked
from schemas.tenants import QuotaSet
from schemas.values import Assignment, Gpu
from schemas.workers import (
    Heartbeat,
    WorkerCordoned,
    WorkerDeregistered,
    WorkerLost,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRecovered,
    WorkerRegistered,
    WorkerUncordoned,
)
from tests.support.reducer_builders import (
    APRIL_MS,
    HOUR_MS,
    PROV,
    Endpoint,
    Job,
    Log,
    S,
    asg,
    register,
    roundtrips,
    usage_tick,
    verify,
)


def test_projection_table() -> None:
    assert [p.name for p in ALL] == [
        "tenants",
        "providers",
        "registry",
        "liveness",
        "schedule",
        "endpoints",
        "ledger",
    ]
    assert BY_NAME["ledger"] is LEDGER
    assert {p.stream for p in ALL} == {
        "TENANTS",
        "PROVIDERS",
        "WORKERS",
        "HEARTBEATS",
        "JOBS",
        "ENDPOINTS",
        "METERING",
    }


# --- pricing ------------------------------------------------------------------------------------


# --- registry -----------------------------------------------------------------------------------


def test_registry_register_cordon_and_reregister() -> None:
    log = Log(REGISTRY)
    register(log, "w1", gpus=[Gpu(index=0, model="T4", vram_total_mb=15_000, vram_free_mb=15_000)])
    register(log, "w2")
    state: RegistryState = log.state
    assert [w.state for w in state.workers.values()] == ["unverified", "unverified"]
    assert available(state) == []  # no tenant work before verification
    verify(log, "w1")
    verify(log, "w2")
    assert [w.worker_id for w in available(state)] == ["w1", "w2"]
    assert state.workers["w1"].since_ns == 0 and state.workers["w1"].last_change_seq == 3

    log(worker_subject("w1", WorkerCordoned), WorkerCordoned(reason="bad fan", by="ops"), 5)
    assert state.workers["w1"].state == "cordoned"
    assert [w.worker_id for w in available(state)] == ["w2"]

    register(log, "w1", 7, driver="560.1", cpus=16)  # an agent restart: new hardware facts, same cordon
    w1 = state.workers["w1"]
    assert (
        w1.state,
        w1.cordon_reason,
        w1.registration.driver,
        w1.registration.cpus,
        w1.registration.gpus,
    ) == (
        "cordoned",
        "bad fan",
        "560.1",
        16,
        [],
    )
    assert w1.since_ns == 0 and w1.registered_ns == 7 * S and w1.last_change_seq == 6
    assert not w1.verified  # its GPUs changed: verified again before it takes work

    log(worker_subject("w1", WorkerPolicySet), WorkerPolicySet(policy=WorkerPolicy(allowed_tenants=["acme"])))
    assert state.workers["w1"].policy.allowed_tenants == ["acme"]
    log(worker_subject("w1", WorkerUncordoned), WorkerUncordoned(by="ops"))
    uncordoned = state.workers["w1"]
    assert (uncordoned.state, uncordoned.cordon_reason) == ("unverified", "")
    verify(log, "w1", 9)
    assert (state.workers["w1"].state, state.workers["w1"].verified_ns) == ("available", 9 * S)
    roundtrips(REGISTRY, state)


def test_registry_lost_and_recovered_accumulate_downtime() -> None:
    log = Log(REGISTRY)
    register(log, "w1", 100)
    log(worker_subject("w1", WorkerCordoned), WorkerCordoned(reason="r", by="ops"), 105)
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), 110)
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=9), 115)  # already lost: keeps the first
    state: RegistryState = log.state
    w1 = state.workers["w1"]
    assert (w1.state, w1.lost_since_ns, w1.lost_count) == ("lost", 110 * S, 1)
    assert downtime(w1, 130 * S) == 20 * S

    log(worker_subject("w1", WorkerRecovered), WorkerRecovered(down_s=999), 140)  # time from the envelope
    w1 = state.workers["w1"]
    assert (w1.state, w1.lost_since_ns, w1.downtime_ns) == ("cordoned", None, 30 * S)
    log(worker_subject("w1", WorkerRecovered), WorkerRecovered(), 150)  # not lost: no change...
    assert state.workers["w1"] == msgspec.structs.replace(w1, last_seq=w1.last_seq + 1)  # ...but it was seen

    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), 160)
    log(worker_subject("w1", WorkerRecovered), WorkerRecovered(), 170)
    w1 = state.workers["w1"]
    assert (w1.downtime_ns, w1.lost_count) == (40 * S, 2)
    assert uptime(w1, 200 * S) == pytest.approx(1 - 40 / 100)
    assert uptime(w1, 100 * S) == 1.0


def test_registry_deregistration_closes_downtime_and_excludes_its_interval() -> None:
    log = Log(REGISTRY)
    register(log, "w1", 0)
    verify(log, "w1", 0)
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), 50)
    log(worker_subject("w1", WorkerDeregistered), WorkerDeregistered(reason="sold"), 60)
    state: RegistryState = log.state
    w1 = state.workers["w1"]
    assert (w1.state, w1.downtime_ns, w1.lost, w1.deregistered_ns) == ("deregistered", 10 * S, False, 60 * S)
    assert uptime(w1, 10_000 * S) == pytest.approx(50 / 60)
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), 70)  # deregistered: not lost
    assert state.workers["w1"] == msgspec.structs.replace(w1, last_seq=w1.last_seq + 1)
    assert available(state) == []

    register(log, "w1", 100)  # the same (no) GPUs: still verified
    w1 = state.workers["w1"]
    assert (w1.state, w1.excluded_ns, w1.deregistered_ns, w1.since_ns) == ("available", 40 * S, None, 0)
    assert uptime(w1, 160 * S) == pytest.approx(1 - 10 / 120)
    roundtrips(REGISTRY, state)


def test_registry_ignores_unknown_workers_and_applied_sequences() -> None:
    log = Log(REGISTRY)
    log(worker_subject("ghost", WorkerCordoned), WorkerCordoned(reason="r", by="ops"))
    log(worker_subject("ghost", WorkerLost), WorkerLost(silent_s=3))
    state: RegistryState = log.state
    assert state.workers == {} and state.seq == 2
    record = log(worker_subject("w1", WorkerRegistered), WorkerRegistered(provider="p", hostname="h"))
    before = state_hash(state)
    cordon = msgspec.structs.replace(record, event=WorkerCordoned(reason="late", by="x"))
    assert state_hash(REGISTRY.evolve(state, cordon)) == before  # seq 3 was applied already


# --- liveness -----------------------------------------------------------------------------------


def test_liveness_keeps_the_latest_beat() -> None:
    log = Log(LIVENESS)
    log(heartbeat_subject("w1"), Heartbeat(interval_s=2.0, cpu_pct=10.0, running=["a1"]), 100)
    log(heartbeat_subject("w2"), Heartbeat(interval_s=1.0), 101)
    log(heartbeat_subject("w1"), Heartbeat(interval_s=2.0, cpu_pct=55.5, memory_used_mb=900), 104)
    state: LivenessState = log.state
    beat = state.beats["w1"]
    assert (beat.seq, beat.time_ns, beat.cpu_pct, beat.memory_used_mb, beat.running) == (
        3,
        104 * S,
        55.5,
        900,
        [],
    )
    assert silent_for(state, "w1", 110 * S) == 6.0
    assert silent_for(state, "w1", 100 * S) == 0.0
    assert silent_for(state, "nobody", 110 * S) is None
    assert overdue(state, 105 * S) == ["w2"]  # w2: 4 s > 3 x 1 s; w1: 1 s < 3 x 2 s
    assert overdue(state, 111 * S) == ["w1", "w2"]
    roundtrips(LIVENESS, state)


# --- schedule -----------------------------------------------------------------------------------


def test_schedule_lifecycle_to_running() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit()
    assert (job.record.state, job.record.submitted_seq, job.record.last_seq) == ("queued", 1, 1)
    job(JobQueued(reason="no H100 free"))
    assert job.record.queue_reason == "no H100 free"
    job.place(asg(0, 1), asg(1, 1, "w2"))
    assert (job.record.state, job.record.epoch, sorted(job.record.assignments)) == ("placed", 1, ["0", "1"])
    assert job.record.queue_reason == ""
    job.start(asg(0, 1))
    assert job.record.state == "running" and job.record.started == {"0": 1}
    job.start(asg(1, 1, "w2"))
    assert missing_slots(job.record) == []
    assert [a.assignment_id for _, a in active_assignments(log.state, "w2")] == ["j1-1-1"]
    roundtrips(SCHEDULE, log.state)


def test_schedule_revocation_requeues_and_replacement_supersedes() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit()
    job.place(asg(0, 1), asg(1, 1, "w2"))
    job.start(asg(0, 1))
    job.start(asg(1, 1, "w2"))

    job.revoke(asg(1, 1, "w2"))
    record = job.record
    assert (record.state, sorted(record.assignments), record.started) == ("queued", ["0"], {"0": 1})
    assert (missing_slots(record), record.revocations, record.queue_reason) == ([1], 1, "worker lost")
    assert [j.job_id for j in pending(log.state)] == ["j1"]

    job.revoke(asg(1, 1, "w2"))  # a repeated revocation: no assignment to take back
    assert job.record.revocations == 1
    job.place(asg(1, 1, "w3"))  # an epoch the job has already seen: stale placement
    assert missing_slots(job.record) == [1]

    job.place(asg(1, 2, "w3"))
    record = job.record
    assert (record.state, record.epoch, record.assignments["1"].worker_id) == ("running", 2, "w3")
    job.revoke(asg(1, 1, "w2"))  # the old assignment of slot 1 again: the new one survives
    assert job.record.assignments["1"].epoch == 2 and job.record.state == "running"
    assert pending(log.state) == []


def test_schedule_ignores_events_of_a_stale_epoch() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=1)
    job.place(asg(0, 1))
    job.start(asg(0, 1))
    job(JobProgress(epoch=1, slot=0, step=10, loss=2.0))
    job.revoke(asg(0, 1))
    job(JobProgress(epoch=1, slot=0, step=11, loss=1.9))  # revoked: nobody's progress
    assert job.record.progress.step == 10
    job.place(asg(0, 2, "w2"))
    job.start(asg(0, 1))  # the zombie starts again: stale
    assert job.record.state == "placed" and job.record.started == {}
    job.start(asg(0, 2, "w2"))
    before = job.record

    job(JobProgress(epoch=1, slot=0, step=99, loss=9.9))
    job(JobProgress(epoch=1, step=99, loss=9.9))  # job-wide, below every current epoch
    job(JobCheckpointed(epoch=1, slot=0, object_key="ckpt/zombie.pt"))
    job(JobFailed(reason="zombie died", epoch=1, slot=0))
    job(JobFailed(reason="zombie job-wide", epoch=1))
    job(JobRejected(assignment_id="j1-0-1", worker_id="w1", epoch=1, reason="policy"))
    job(JobProgress(epoch=3, slot=0, step=99))  # from an epoch never placed
    record = job.record
    assert msgspec.structs.replace(record, last_seq=before.last_seq) == before
    assert record.last_seq == log.seq  # ignored events still move the expected sequence

    job(JobProgress(epoch=2, slot=0, step=12, loss=1.5, metrics={"acc": 0.5}))
    job(JobProgress(epoch=2, round=3))  # job-wide, current: merges, keeping the loss
    job(JobCheckpointed(epoch=2, slot=0, step=12, object_key="ckpt/12.pt"))
    record = job.record
    assert record.progress is not None and record.last_checkpoint is not None
    assert (record.progress.step, record.progress.loss, record.progress.round) == (12, 1.5, 3)
    assert record.progress.metrics == {"acc": 0.5}
    assert (record.last_checkpoint.object_key, record.last_checkpoint.seq) == ("ckpt/12.pt", log.seq)
    assert record.state == "running"


def test_schedule_failures_and_rejections() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=1)
    job.place(asg(0, 1))
    job(JobRejected(assignment_id="j1-0-1", worker_id="w1", epoch=1, reason="tenant not allowed"))
    assert job.record.rejected_by == {"w1": "tenant not allowed"}
    job.start(asg(0, 1))
    job(JobFailed(reason="OOM", epoch=1, slot=0, log_tail="killed"))  # a shard failure: counted
    assert (job.record.state, job.record.failures, job.record.log_tail) == ("running", 1, "killed")
    job(JobFailed(reason="flaky", epoch=1, retryable=True))  # retryable: counted, not terminal
    assert (job.record.state, job.record.failures) == ("running", 2)
    job(JobFailed(reason="bad config"), t_s=42)  # the kernel's own verdict: terminal
    record = job.record
    assert (record.state, record.failures, record.failure_reason, record.ended_ns) == (
        "failed",
        3,
        "bad config",
        42 * S,
    )
    assert missing_slots(record) == []
    assert active_assignments(log.state, "w1") == []


@pytest.mark.parametrize(
    "terminal",
    [
        JobCompleted(outputs=["model_out/m.pt"]),
        JobCancelled(by="alice", reason="x"),
        JobFailed(reason="fatal"),
    ],
    ids=["completed", "cancelled", "failed"],
)
def test_schedule_terminal_states_are_sticky(terminal: Event) -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=1)
    job.place(asg(0, 1))
    job.start(asg(0, 1))
    job(terminal, t_s=9)
    ended = job.record
    assert ended.state in {"completed", "cancelled", "failed"} and ended.ended_ns == 9 * S
    job.revoke(asg(0, 1))
    job.place(asg(0, 2))
    job(JobProgress(epoch=1, slot=0, step=5))
    job(JobRoundCompleted(round=7))
    job(JobCompleted(outputs=["other"]))
    job(JobCancelled(by="bob"))
    job(JobFailed(reason="late"))
    job(JobQueued(reason="again"))
    assert msgspec.structs.replace(job.record, last_seq=ended.last_seq) == ended
    assert job.record.last_seq == log.seq
    assert pending(log.state) == []


def test_schedule_a_completed_job_has_every_current_shard_done() -> None:
    """A federated job is completed by the kernel (its FL server's run ended), not by its shards: its
    clients are then stopped and never report ``shard_completed``. Its shards must not read as still
    running (issue 13: ``resontech status`` listed a completed job's shards as ``running``)."""
    log = Log(SCHEDULE)
    job = Job(log)
    job(JobSubmitted(name="fl", kind="federated", shards=3, rounds=2))
    first, second, third = asg(0, 1), asg(1, 1, "w2"), asg(2, 1, "w3")
    job.place(first, second, third)
    for a in (first, second, third):
        job.start(a)
    job(JobShardCompleted(assignment_id=third.assignment_id, worker_id="w3", slot=2, epoch=1))
    job.revoke(first)  # lost after the last round: the job completes all the same
    job.place(asg(0, 2, "w4"))
    job(JobCompleted(outputs=["jobs/fl/model_out/model.npz"]), t_s=30)
    record = job.record
    assert (record.state, record.ended_ns) == ("completed", 30 * S)
    assert record.done == {"0": 2, "1": 1, "2": 1}
    # A client's late report (it exited before its stop arrived) changes nothing.
    job(JobShardCompleted(assignment_id=second.assignment_id, worker_id="w2", slot=1, epoch=1))
    assert msgspec.structs.replace(job.record, last_seq=record.last_seq) == record
    roundtrips(SCHEDULE, log.state)


def test_schedule_pending_order_and_unknown_jobs() -> None:
    log = Log(SCHEDULE)
    Job(log, "ghost")(JobProgress(epoch=1, slot=0))  # never submitted: ignored
    Job(log, "low").submit(priority=0)
    Job(log, "high", tenant="globex").submit(priority=5)
    Job(log, "low2").submit(priority=0)
    Job(log, "mid").submit(priority=3)
    placed = Job(log, "placed")
    placed.submit(priority=9, shards=1)
    placed.place(asg(0, 1, work="placed"))
    Job(log, "low").submit(priority=99)  # a duplicate submission changes nothing
    state: ScheduleState = log.state
    assert "acme/ghost" not in state.jobs
    assert [j.job_id for j in pending(state)] == ["high", "mid", "low", "low2"]
    assert state.jobs["acme/low"].spec.priority == 0 and state.jobs["acme/low"].last_seq == log.seq
    assert job_key("globex", "high") in state.jobs


def test_schedule_round_completed_only_moves_forward() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=1)
    job(JobRoundCompleted(round=2))
    job(JobRoundCompleted(round=1))
    assert job.record.round == 2


# --- endpoints ----------------------------------------------------------------------------------


def test_endpoint_lifecycle_and_fencing() -> None:
    log = Log(ENDPOINTS)
    ep = Endpoint(log)
    ep(EndpointDeployed(name="chat", model="m", min_replicas=0, max_replicas=3, scale_to_zero_after_s=60))
    assert (ep.record.state, ep.record.desired_replicas, missing_replicas(ep.record)) == ("deploying", 1, [0])

    r0, r1 = asg(0, 1, "w1", "e1"), asg(1, 2, "w2", "e1")
    ep(EndpointReplicaPlaced(assignments=[r0], provenance=PROV))
    assert ep.record.replicas["0"].state == "placed" and ep.record.state == "deploying"
    ep(EndpointReplicaStarting(assignment_id=r0.assignment_id, worker_id="w1", epoch=1))
    ep(EndpointReplicaReady(assignment_id=r0.assignment_id, epoch=1, address="http://a:1"))
    assert ep.record.state == "serving"
    ep(EndpointScaled(replicas=2, reason="rps"))
    assert missing_replicas(ep.record) == [1]
    ep.up(r1, "http://b:2")
    assert [r.address for r in ready_replicas(ep.record)] == ["http://a:1", "http://b:2"]

    ep(EndpointReplicaLost(assignment_id=r0.assignment_id, epoch=1, reason="worker lost"))
    ep(EndpointReplicaReady(assignment_id=r0.assignment_id, epoch=1, address="http://a:1"))  # lost is final
    assert (ep.record.replicas["0"].state, ep.record.replicas["0"].reason) == ("lost", "worker lost")
    assert [r.slot for r in ready_replicas(ep.record)] == [1] and ep.record.state == "serving"

    ep(EndpointReplicaPlaced(assignments=[asg(0, 2, "w3", "e1")], provenance=PROV))  # stale epoch
    assert ep.record.replicas["0"].assignment_id == r0.assignment_id
    ep(
        EndpointReplicaRevoked(assignment_id="e1-1-2", worker_id="w2", slot=0, epoch=2, reason="x")
    )  # wrong id
    assert "0" in ep.record.replicas
    ep(EndpointReplicaRevoked(assignment_id=r0.assignment_id, worker_id="w1", slot=0, epoch=1, reason="lost"))
    assert missing_replicas(ep.record) == [0]
    r0b = asg(0, 3, "w3", "e1")
    ep(EndpointReplicaPlaced(assignments=[r0b], provenance=PROV))
    ep(EndpointReplicaReady(assignment_id=r0b.assignment_id, epoch=2, address="http://zombie"))  # wrong epoch
    ep(EndpointReplicaReady(assignment_id=r0.assignment_id, epoch=1, address="http://zombie"))  # revoked
    assert ep.record.replicas["0"].state == "placed" and ep.record.epoch == 3
    roundtrips(ENDPOINTS, log.state)


def test_endpoint_scale_to_zero_and_back_and_delete() -> None:
    log = Log(ENDPOINTS)
    ep = Endpoint(log)
    ep(EndpointDeployed(name="chat", model="m", min_replicas=1, max_replicas=2))
    a = asg(0, 1, "w1", "e1")
    ep.up(a, "http://a:1")
    ep(EndpointScaledToZero(idle_s=300.0))
    record = ep.record
    assert (record.state, record.replicas, record.desired_replicas) == ("scaled_to_zero", {}, 0)
    ep(EndpointReplicaReady(assignment_id=a.assignment_id, epoch=1, address="http://a:1"))
    assert ep.record.replicas == {}
    ep(EndpointScaled(replicas=1, reason="request at zero"))
    assert (ep.record.state, missing_replicas(ep.record)) == ("deploying", [0])
    ep.up(asg(0, 2, "w2", "e1"), "http://b:2")
    assert ep.record.state == "serving"
    ep(EndpointDeleted(by="alice"), t_s=50)
    deleted = ep.record
    assert (deleted.state, deleted.deleted_ns, ready_replicas(deleted), missing_replicas(deleted)) == (
        "deleted",
        50 * S,
        [],
        [],
    )
    ep(EndpointScaled(replicas=2, reason="late"))
    ep(EndpointReplicaLost(assignment_id="e1-0-2", epoch=2, reason="late"))
    assert msgspec.structs.replace(ep.record, last_seq=deleted.last_seq) == deleted
    assert ep.record.last_seq == log.seq


def test_endpoint_counts_replicas_failing_in_a_row_fails_and_only_its_tenant_revives_it() -> None:
    log = Log(ENDPOINTS)
    ep = Endpoint(log)
    ep(EndpointDeployed(name="emb", model="does/not/exist", max_replicas=2))

    def fail(slot: int, epoch: int, retryable: bool = False) -> None:
        a = asg(slot, epoch, work="e1")
        ep(EndpointReplicaPlaced(assignments=[a], provenance=PROV))
        ep(
            EndpointReplicaLost(
                assignment_id=a.assignment_id,
                epoch=epoch,
                reason=f"exit status {epoch}",
                log_tail=f"tail {epoch}",
                retryable=retryable,
            )
        )
        ep(
            EndpointReplicaRevoked(
                assignment_id=a.assignment_id, worker_id="w1", slot=slot, epoch=epoch, reason="lost"
            )
        )

    fail(0, 1)
    fail(0, 2, retryable=True)  # its worker was lost: not the replica's failure
    assert (ep.record.start_failures, ep.record.last_failure, ep.record.last_failure_log_tail) == (
        1,
        "exit status 1",
        "tail 1",
    )
    ep.up(asg(0, 3, work="e1"), "http://a:1")  # a ready replica resets the count
    assert (ep.record.start_failures, ep.record.state) == (0, "serving")
    ep(EndpointReplicaLost(assignment_id="e1-0-3", epoch=3, reason="exit status 3", log_tail="tail 3"))
    ep(EndpointReplicaRevoked(assignment_id="e1-0-3", worker_id="w1", slot=0, epoch=3, reason="lost"))
    fail(0, 4)
    assert ep.record.start_failures == 2
    ep(EndpointFailed(reason="2 replicas failed in a row", log_tail="tail 4"))
    failed = ep.record
    assert (failed.state, failed.desired_replicas, failed.scale_reason, missing_replicas(failed)) == (
        "failed",
        0,
        "2 replicas failed in a row",
        [],
    )
    ep(EndpointScaled(replicas=1, reason="a request arrived at zero replicas"))  # the autoscaler: ignored
    ep(EndpointScaledToZero(idle_s=300))
    assert ep.record.state == "failed" and ep.record.desired_replicas == 0
    ep(EndpointScaled(replicas=1, reason="bounds set", min_replicas=1, max_replicas=2, by="alice"))
    revived = ep.record
    assert (revived.state, revived.failed, revived.start_failures, missing_replicas(revived)) == (
        "deploying",
        False,
        0,
        [0],
    )
    assert revived.last_failure == "exit status 4"  # the history of why stays visible


def test_endpoint_events_before_deploy_are_ignored() -> None:
    log = Log(ENDPOINTS)
    Endpoint(log, "ghost")(EndpointScaled(replicas=3, reason="x"))
    state: EndpointsState = log.state
    assert state.endpoints == {} and state.seq == 1


# --- ledger -------------------------------------------------------------------------------------


def _meter(log: Log, tenant: str = "acme", worker: str = "w1", t_s: float = 0.0, **kw: Any) -> Recorded[Any]:
    """A usage tick on its assignment's subject (the kernel's layout)."""
    tick = usage_tick(**kw)
    return log(metering_subject(tenant, worker, tick.assignment_id, UsageTick), tick, t_s)


def _served(log: Log, tokens: int, tenant: str = "acme", worker: str = "w1", **kw: Any) -> Recorded[Any]:
    """A gateway's count of tokens on the replica's subject (the kernel's layout)."""
    fields: dict[str, Any] = {
        "work_id": "j1",
        "work_kind": "endpoint",
        "assignment_id": "a1",
        "epoch": 1,
        "provider": "p1",
        "gpu_type": "H100",
        "start_ms": APRIL_MS,
        "end_ms": APRIL_MS + 10_000,
        "tier": "platinum",
        "source": "gateway-a",
    }
    fields.update(kw)
    served = TokensServed(tokens=tokens, **fields)
    return log(metering_subject(tenant, worker, served.assignment_id, TokensServed), served)


def _seqs(ranges: list[tuple[int, int]]) -> list[int]:
    return [seq for first, last in ranges for seq in range(first, last + 1)]


def test_ledger_prices_ticks_into_lines_with_their_ranges() -> None:
    log = Log(LEDGER)
    ten_s = 10_000
    start = APRIL_MS - 2 * ten_s - 1  # the second tick ends 1 ms before midnight
    for i in range(4):  # two ticks end in March, two in April
        t0 = start + i * ten_s
        _meter(log, start_ms=t0, end_ms=t0 + ten_s, gpu_ms=ten_s, tokens=5)
        _meter(
            log, "globex", "w2", assignment_id="b1", work_id="j9", start_ms=t0, end_ms=t0 + ten_s, gpu_ms=60
        )
    state: LedgerState = log.state
    assert sorted(state.lines) == [
        "acme/2026-03/job/j1/H100/shared/v1",
        "acme/2026-04/job/j1/H100/shared/v1",
        "globex/2026-03/job/j9/H100/shared/v1",
        "globex/2026-04/job/j9/H100/shared/v1",
    ]
    march = state.lines["acme/2026-03/job/j1/H100/shared/v1"]
    # an agent's own count of tokens is not billed: tokens come from the gateways' counts
    assert (march.ticks, march.gpu_ms, march.tokens, march.source_ranges) == (2, 20_000, 0, [(1, 1), (3, 3)])
    assert march.charge_micros == 2 * 6_917  # 6_916.67 per tick, each rounded on its own
    assert state.lines["acme/2026-04/job/j1/H100/shared/v1"].source_ranges == [(5, 5), (7, 7)]
    assert state.lines["globex/2026-04/job/j9/H100/shared/v1"].charge_micros == 2 * 42
    assert charges(state, "acme") == 4 * 6_917
    assert charges(state, "acme", "2026-04") == 2 * 6_917
    assert charges(state, "globex") == 4 * 42
    assert charges(state, "nobody") == 0
    (p_march, p_april) = payouts(state, "p1")
    assert (p_march.period, p_march.tier, p_march.ticks, p_march.gpu_ms) == ("2026-03", "platinum", 4, 20_120)
    assert p_march.payout_micros == 2 * 5_534 + 2 * 34  # 80% of each tick's charge, rounded half up
    assert p_april.period == "2026-04"
    assert (state.workers["w1"].gpu_ms, state.workers["w2"].ticks) == (40_000, 4)
    money = [line.charge_micros for line in state.lines.values()] + [
        p.payout_micros for p in state.payouts.values()
    ]
    assert all(type(m) is int for m in money)
    roundtrips(LEDGER, state)


def test_ledger_reads_the_legacy_layouts_like_the_kernels() -> None:
    """Old logs hold an agent's ticks on meter.<tenant>.<worker> and a gateway's token counts as
    ticks on meter.<tenant>.<worker>.tokens: they bill exactly as the kernel's subjects do."""
    legacy, current = Log(LEDGER), Log(LEDGER)
    for i in range(3):
        interval = {"start_ms": APRIL_MS + i * 10_000, "end_ms": APRIL_MS + (i + 1) * 10_000}
        usage = usage_tick(gpu_ms=10_000, tokens=999, **interval)  # an agent's claim of tokens: ignored
        legacy("meter.acme.w1", usage)
        _meter(current, gpu_ms=10_000, tokens=999, **interval)
        counted = usage_tick(gpu_ms=0, tokens=40 + i, source="gateway-a", **interval)
        legacy("meter.acme.w1.tokens", counted)
        _served(current, 40 + i, work_kind="job", **interval)
    old: LedgerState = legacy.state
    new: LedgerState = current.state
    assert old.lines == new.lines and old.payouts == new.payouts and old.workers == new.workers
    assert (
        old.marks
        == new.marks
        == {
            "acme.w1.a1": (APRIL_MS + 30_000, 0),
            "acme.w1.a1:gateway-a": (APRIL_MS + 30_000, 0),
        }
    )
    (line,) = new.lines.values()
    assert (line.gpu_ms, line.tokens, line.ticks, line.source_ranges) == (30_000, 123, 6, [(1, 6)])
    assert line.charge_micros == 3 * 6_917  # tokens are not priced
    # a token count pays nobody: payouts and earnings hold the usage ticks only
    assert (new.payouts["p1/2026-04/platinum"].ticks, new.workers["w1"].ticks) == (3, 3)
    assert (old.duplicates, old.invalid) == (0, 0)


def test_ledger_takes_tokens_only_from_the_kernels_counts() -> None:
    log = Log(LEDGER)
    _meter(log, tokens=500)  # the kernel's usage tick carries the agent's claim: not billed
    log("meter.acme.w1", usage_tick(assignment_id="a2", tokens=500))  # nor on the legacy agent subject
    _served(log, 40)
    log("meter.acme.w1.tokens", usage_tick(assignment_id="a3", gpu_ms=0, tokens=2, source="gateway-b"))
    state: LedgerState = log.state
    # the endpoint j1's count, and the legacy tick's (of the job j1): each on its own kind's line
    assert state.lines["acme/2026-04/endpoint/j1/H100/shared/v1"].tokens == 40
    assert state.lines["acme/2026-04/job/j1/H100/shared/v1"].tokens == 2
    assert state.invalid == 0
    # shapes the ledger does not bill: a tick on a 4-token subject that is not a gateway's, a count
    # of tokens on a usage subject, a negative count
    log("meter.acme.w1.a4", usage_tick(assignment_id="a4"))
    served = TokensServed(
        work_id="j1",
        assignment_id="a5",
        epoch=1,
        start_ms=APRIL_MS,
        end_ms=APRIL_MS + 1,
        tokens=7,
        source="gateway-a",
    )
    log("meter.acme.w1.a5.tick", served)
    log("meter.acme.w1", served)
    _served(log, -1, assignment_id="a6")
    assert (state.invalid, state.lines["acme/2026-04/endpoint/j1/H100/shared/v1"].tokens) == (4, 40)
    assert state.seq == 8 and len(state.marks) == 4


def test_ledger_counts_a_retried_tick_once() -> None:
    log = Log(LEDGER)
    first = _meter(log, start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000, gpu_ms=10_000)
    _meter(log, start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000, gpu_ms=10_000)  # agent retry, new event id
    _meter(log, start_ms=APRIL_MS, end_ms=APRIL_MS + 9_000, gpu_ms=9_000)  # same interval, other numbers
    _meter(log, start_ms=APRIL_MS + 5_000, end_ms=APRIL_MS + 15_000, gpu_ms=10_000)  # overlaps the billed
    _meter(log, assignment_id="a2", start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000, gpu_ms=10_000)
    _meter(log, start_ms=APRIL_MS + 10_000, end_ms=APRIL_MS + 20_000, gpu_ms=10_000)  # the next interval
    _meter(log, "globex", start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000, gpu_ms=10_000)  # another tenant's a1
    state: LedgerState = log.state
    line = state.lines["acme/2026-04/job/j1/H100/shared/v1"]
    assert (line.ticks, line.gpu_ms, line.source_ranges) == (3, 30_000, [(1, 1), (5, 6)])
    assert state.duplicates == 3
    assert state.marks == {
        "acme.w1.a1": (APRIL_MS + 20_000, 0),
        "acme.w1.a2": (APRIL_MS + 10_000, 0),
        "globex.w1.a1": (APRIL_MS + 10_000, 0),
    }
    before = state_hash(state)
    assert state_hash(LEDGER.evolve(state, first)) == before  # redelivery of seq 1: no-op
    # each gateway process counts on its own: the same interval from two sources is two counts
    _served(log, 40)
    _served(log, 2, source="gateway-b")
    _served(log, 40)  # gateway-a's retry
    assert (state.lines["acme/2026-04/endpoint/j1/H100/shared/v1"].tokens, state.duplicates) == (42, 4)


def test_ledger_tiers_pools_versions_and_invalid_ticks() -> None:
    log = Log(LEDGER)
    _meter(log, provider="p2", tier="unverified", assignment_id="u")
    _meter(log, pool="private", assignment_id="v")
    _meter(log, pool="managed", assignment_id="w")
    _meter(log, gpu_ms=-1, assignment_id="x")
    _meter(log, start_ms=APRIL_MS + 5, end_ms=APRIL_MS, assignment_id="y")
    _meter(log, start_ms=-5, end_ms=10, assignment_id="z")  # before 1970: a broken agent clock
    _meter(log, end_ms=10**15, assignment_id="z")  # beyond 2199
    state: LedgerState = log.state
    assert state.invalid == 4 and len(state.marks) == 3  # an invalid tick leaves no mark
    assert payouts(state, "p2")[0].payout_micros == 0
    assert state.lines["acme/2026-04/job/j1/H100/private/v1"].charge_micros == 0
    assert state.lines["acme/2026-04/job/j1/H100/private/v1"].gpu_ms == HOUR_MS  # metered all the same
    assert state.lines["acme/2026-04/job/j1/H100/managed/v1"].charge_micros == 3_112_500
    assert charges(state, "acme") == 2_490_000 + 3_112_500


def test_ledger_invoice_returns_copies() -> None:
    log = Log(LEDGER)
    _meter(log)
    state: LedgerState = log.state
    (line,) = invoice(state, "acme", "2026-04")
    line.source_ranges.append((99, 99))
    line.charge_micros = 0
    assert state.lines["acme/2026-04/job/j1/H100/shared/v1"].source_ranges == [(1, 1)]
    assert invoice(state, "acme", "2026-04")[0].charge_micros == 2_490_000
    assert invoice(state, "acme", "2026-03") == [] and invoice(state, "globex", "2026-04") == []


def test_ledger_ranges_are_exact_runs_of_a_lines_ticks() -> None:
    log = Log(LEDGER)
    interval = iter(range(APRIL_MS, APRIL_MS + 10**9, 10_000))

    def usage(work: str) -> None:
        start = next(interval)
        _meter(log, work_id=work, assignment_id=f"{work}-s0", start_ms=start, end_ms=start + 10_000)

    for work in ["j1", "j1", "j1", "j2", "j1", "j2", "j2", "j1", "j1"]:
        usage(work)
    _meter(log, work_id="j1", assignment_id="j1-s0", start_ms=APRIL_MS, end_ms=APRIL_MS + 1)  # a retry
    usage("j1")
    lines = log.state.lines
    assert lines["acme/2026-04/job/j1/H100/shared/v1"].source_ranges == [(1, 3), (5, 5), (8, 9), (11, 11)]
    assert lines["acme/2026-04/job/j2/H100/shared/v1"].source_ranges == [(4, 4), (6, 7)]
    assert lines["acme/2026-04/job/j1/H100/shared/v1"].ticks == 7


def _nearest_first(ranges: list[tuple[int, int]], seq: int) -> list[tuple[int, int]]:
    """The rule, step by step: extend or open a run; past the cap, merge the two nearest ranges (the
    earliest pair among equally near ones) until RANGES_KEPT are left."""
    ranges = list(ranges)
    if ranges and ranges[-1][1] == seq - 1:
        ranges[-1] = (ranges[-1][0], seq)
        return ranges
    ranges.append((seq, seq))
    if len(ranges) > RANGE_CAP:
        while len(ranges) > RANGES_KEPT:
            holes = [b[0] - a[1] for a, b in itertools.pairwise(ranges)]
            i = holes.index(min(holes))
            ranges[i : i + 2] = [(ranges[i][0], ranges[i + 1][1])]
    return ranges


def test_ledger_caps_a_lines_ranges_by_merging_the_nearest() -> None:
    rng = random.Random(11)
    log = Log(LEDGER)
    expected: list[tuple[int, int]] = []
    mine: list[int] = []
    start = APRIL_MS
    for _ in range(1_000):
        # other lines' ticks in between: gaps of 0 to 40 sequences, wide ones now and then
        for _ in range(rng.choice([0, 0, 1, 2, 3, 5, 8, 40])):
            _meter(log, work_id="other", assignment_id=f"o{log.seq}")
        start += 10_000
        record = _meter(log, start_ms=start, end_ms=start + 10_000)
        mine.append(record.seq)
        expected = _nearest_first(expected, record.seq)
        line = log.state.lines["acme/2026-04/job/j1/H100/shared/v1"]
        assert line.source_ranges == expected
    assert len(expected) <= RANGE_CAP
    # the rule an auditor checks: the line's ticks are the ticks of its key within its ranges
    within = set(_seqs(line.source_ranges))
    assert set(mine) <= within and line.ticks == len(mine) == 1_000
    ours = [seq for seq in sorted(within) if log.records[seq - 1].event.work_id == "j1"]
    assert ours == mine


def test_compact_ranges_keeps_the_widest_holes_and_the_later_of_equal_ones() -> None:
    ranges = [(1, 1), (3, 4), (10, 10), (12, 12), (20, 21), (23, 23)]
    # holes (sequences in between): 1, 5, 1, 7, 1
    assert compact_ranges(ranges, 3) == [(1, 4), (10, 12), (20, 23)]
    assert compact_ranges(ranges, 4) == [(1, 4), (10, 12), (20, 21), (23, 23)]  # the later 1 is kept
    assert compact_ranges(ranges, 1) == [(1, 23)]
    assert compact_ranges(ranges, 6) == ranges and compact_ranges(ranges, 6) is not ranges


def test_ledger_marks_are_dropped_after_their_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "PRUNE_EVERY", 4)
    day = 24 * 3600
    log = Log(LEDGER)
    _meter(log, t_s=0, start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000)  # seq 1: pruning is due at 5
    assert log.state.next_prune_seq == 5
    _meter(log, t_s=day - 1, start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000)  # a retry within the day
    for i in range(3):  # other assignments, a day later: the pruning at seq 5 keeps a1 (touched at seq 2)
        _meter(log, t_s=day + 10 * i, assignment_id=f"b{i}")
    state: LedgerState = log.state
    assert (state.duplicates, "acme.w1.a1" in state.marks, state.next_prune_seq) == (1, True, 9)
    for i in range(4):  # two days after a1's last tick: the pruning at seq 9 drops a1
        _meter(log, t_s=2 * day + i, assignment_id=f"c{i}")
    assert "acme.w1.a1" not in state.marks
    # b0, touched a day and 3 s before that pruning, went with it; c3 came after it
    assert sorted(state.marks) == [
        "acme.w1.b1",
        "acme.w1.b2",
        "acme.w1.c0",
        "acme.w1.c1",
        "acme.w1.c2",
        "acme.w1.c3",
    ]
    # a retry later than the retention is counted again: the intake's sequence check is what stops it
    _meter(log, t_s=2 * day + 9, start_ms=APRIL_MS, end_ms=APRIL_MS + 10_000)
    assert state.lines["acme/2026-04/job/j1/H100/shared/v1"].ticks == 9 and state.duplicates == 1


def _churn(ticks: int, start_s: float = 0.0) -> list[tuple[str, Event, float]]:
    """20 endpoints of 2 replicas metered every minute; each replica moves to a new assignment every
    hour. Token counts for a fifth of them, and a retried tick now and then."""
    out: list[tuple[str, Event, float]] = []
    for i in range(ticks):
        round_, slot = divmod(i, 40)
        t_s = start_s + 60 * round_
        epoch = round_ // 60
        work = f"e{slot // 2}"
        assignment = f"{work}-s{slot % 2}-e{epoch}"
        begin = APRIL_MS + 60_000 * round_
        if i % 5 == 4:
            served = TokensServed(
                work_id=work,
                assignment_id=assignment,
                epoch=epoch,
                provider="p1",
                gpu_type="H100",
                start_ms=begin,
                end_ms=begin + 60_000,
                tokens=7,
                source=f"gateway-{round_ % 2}",
            )
            out.append((metering_subject("acme", f"w{slot}", assignment, TokensServed), served, t_s))
            continue
        if i % 97 == 0 and round_:
            begin -= 60_000  # a retry of the interval before
        usage = usage_tick(
            work_id=work,
            work_kind="endpoint",
            assignment_id=assignment,
            epoch=epoch,
            start_ms=begin,
            end_ms=begin + 60_000,
            gpu_ms=60_000,
        )
        out.append((metering_subject("acme", f"w{slot}", assignment, UsageTick), usage, t_s))
    return out


def test_ledger_state_stays_bounded_over_a_long_run_of_many_assignments() -> None:
    log = Log(LEDGER)
    history = _churn(200_000)  # 5,000 minutes (3.5 days), 3,360 assignments
    sizes, marks = [], []
    for i, (subject, event, t_s) in enumerate(history, 1):
        log(subject, event, t_s)
        if i % 50_000 == 0:
            sizes.append(len(canonical_json(log.state)))
            marks.append(len(log.state.marks))
    state: LedgerState = log.state
    assert len(state.lines) == 20 and state.duplicates > 1_000
    assert all(len(line.source_ranges) <= RANGE_CAP for line in state.lines.values())
    # 48 marks an hour (32 assignments metered, 8 counted by two gateways): a day's worth at least,
    # a day, a pruning interval (10,000 ticks: 4 h) and the current hour at most, not all 3.5 days
    assert 48 * 24 <= max(marks) <= 48 * 30
    assert sizes[-1] < 1.2 * sizes[1], sizes


def test_ledger_fold_is_the_same_however_it_is_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots cut the fold anywhere (and a snapshot decodes its dicts in sorted order): the state
    hash is the same for every chunking, and for every record applied twice."""
    monkeypatch.setattr(ledger, "PRUNE_EVERY", 500)
    log = Log(LEDGER)
    for subject, event, t_s in _churn(6_000):
        log(subject, event, 300 * t_s)  # minutes stored 5 hours apart: marks expire on the way
    legacy = usage_tick(assignment_id="old", start_ms=APRIL_MS, end_ms=APRIL_MS + 60_000)
    log("meter.acme.w9", legacy, 10**7)
    log("meter.acme.w9", legacy, 10**7)
    log("meter.acme.w9.tokens", msgspec.structs.replace(legacy, tokens=3, source="gateway-a"), 10**7)
    log("meter.acme.w9", usage_tick(gpu_ms=-5), 10**7)
    expected = state_hash(log.state)
    assert log.state.duplicates > 0 and log.state.invalid == 1
    assert len(log.state.marks) < 100  # the marks of the older assignments were pruned on the way
    for chunk in (1, 7, 500, 2_048):
        state = LEDGER.initial()
        for first in range(0, len(log.records), chunk):
            state = copy_state(LEDGER, LEDGER.fold(log.records[first : first + chunk], state))
        assert state_hash(state) == expected, chunk
    twice = LEDGER.fold(r for record in log.records for r in (record, record))
    assert state_hash(twice) == expected
    assert state_hash(LEDGER.fold(log.records)) == expected


def test_period_of_is_the_utc_month() -> None:
    assert period_of(APRIL_MS) == "2026-04"
    assert period_of(APRIL_MS - 1) == "2026-03"
    assert period_of(0) == "1970-01"
    assert period_of(7_258_118_399_999) == "2199-12"
    with pytest.raises(ValueError):
        period_of(-1)
    with pytest.raises(ValueError):
        period_of(7_258_118_400_000)
    assert period_of(1_767_225_599_999) == "2025-12"


# --- every reducer ------------------------------------------------------------------------------


@pytest.mark.parametrize("projection", ALL, ids=[p.name for p in ALL])
def test_every_reducer_ignores_foreign_events_and_keeps_its_sequence(projection: Projection[Any]) -> None:
    subject = {
        "WORKERS": worker_subject("w1", WorkerUncordoned),
        "HEARTBEATS": heartbeat_subject("w1"),
        "JOBS": job_subject("acme", "j1", JobQueued),
        "ENDPOINTS": endpoint_subject("acme", "e1", EndpointScaled),
        "METERING": metering_subject("acme", "w1", "a1", UsageTick),
        "TENANTS": tenant_subject("acme", QuotaSet),
        "PROVIDERS": provider_subject("gpuco", ProviderKeyRevoked),
    }[projection.stream]
    foreign = JobQueued(reason="x") if projection.stream != "JOBS" else WorkerUncordoned(by="x")
    record: Recorded[Any] = Recorded(
        stream=projection.stream, seq=7, subject=subject, time_ns=1, msg_id="m", event=foreign
    )
    state = projection.evolve(projection.initial(), record)
    assert state_hash(state) == state_hash(msgspec.structs.replace(projection.initial(), seq=7))


def test_schedule_shard_completion_counts_only_the_current_assignment() -> None:
    from schemas.jobs import JobShardCompleted

    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=2)
    job.place(asg(0, 1), asg(1, 1, "w2"))

    def shard_done(a: Assignment) -> None:
        done = JobShardCompleted(
            assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch
        )
        job(done)

    shard_done(asg(0, 1))
    shard_done(asg(1, 0, "w9"))  # a zombie of an older epoch: ignored
    assert job.record.done == {"0": 1}
    job.revoke(asg(1, 1, "w2"))
    job.place(asg(1, 2, "w3"))
    shard_done(asg(1, 2, "w3"))
    assert job.record.done == {"0": 1, "1": 2}
    assert job.record.state != "completed"  # completion is the coordinator's job.completed event
    roundtrips(SCHEDULE, log.state)


def test_tenants_keys_and_quotas() -> None:
    from projections.tenants import TENANTS, quotas
    from schemas.tenants import ApiKeyIssued, ApiKeyRevoked, TenantCreated

    log = Log(TENANTS)
    log(tenant_subject("acme", ApiKeyIssued), ApiKeyIssued(key_id="k0", key_sha256="0" * 64, role="admin"))
    assert log.state.tenants == {}  # not created yet: ignored
    log(tenant_subject("acme", TenantCreated), TenantCreated(display_name="Acme", bucket="rt-acme"))
    log(tenant_subject("acme", ApiKeyIssued), ApiKeyIssued(key_id="k1", key_sha256="1" * 64, role="member"))
    log(tenant_subject("acme", QuotaSet), QuotaSet(pool="shared", gpus=4))
    log(tenant_subject("acme", ApiKeyRevoked), ApiKeyRevoked(key_id="k1"))
    acme = log.state.tenants["acme"]
    assert acme.keys["k1"].revoked and acme.keys["k1"].role == "member"
    assert quotas(log.state) == {"acme": {"shared": 4}}
    log(tenant_subject("acme", QuotaSet), QuotaSet(pool="shared", gpus=None))
    assert quotas(log.state) == {} and log.state.tenants["acme"].last_seq == 6
    roundtrips(TENANTS, log.state)


def test_schedule_remembers_failed_shards_until_they_are_placed_again() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=2)
    job.place(asg(0, 1), asg(1, 1, "w2"))
    job(JobFailed(reason="exit status 7", epoch=1, slot=1, log_tail="boom"))
    job(JobFailed(reason="agent stopped", epoch=1, slot=0, retryable=True))
    assert job.record.failed_slots == {"1": False, "0": True}
    assert job.record.state != "failed"  # the coordinator decides: fail the job or retry the shard
    job.revoke(asg(0, 1), "retry: agent stopped")
    job.place(asg(0, 2, "w3"))
    assert job.record.failed_slots == {"1": False}


def test_schedule_counts_each_slots_retryable_failures_over_its_epochs() -> None:
    log = Log(SCHEDULE)
    job = Job(log)
    job.submit(shards=2)
    job.place(asg(0, 1), asg(1, 1, "w2"))
    job(JobFailed(reason="agent stopped", epoch=1, slot=0, retryable=True))
    job(JobFailed(reason="exit status 7", epoch=1, slot=1))  # not retryable: not a retry
    job.revoke(asg(0, 1), "retry: agent stopped")
    job.place(asg(0, 2, "w3"))
    job(JobFailed(reason="agent restarted", epoch=2, slot=0, retryable=True))
    job(JobFailed(reason="agent stopped", epoch=1, slot=0, retryable=True))  # a stale epoch: fenced
    assert job.record.retries == {"0": 2}
    roundtrips(SCHEDULE, log.state)
