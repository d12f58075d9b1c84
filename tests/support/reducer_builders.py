"""Builders of event histories for unit tests of the pure reducers: :class:`Log` numbers records on one
stream and folds them into a projection's state; :class:`Job` and :class:`Endpoint` write one aggregate's
events on it; the functions build the events tests repeat (a worker registered and verified, an
assignment, a usage tick). Times are in seconds (``t_s``) unless a name says ``_ms`` or ``_ns``."""

from __future__ import annotations

from typing import Any

import msgspec

from core.streams import endpoint_subject, job_subject, stream_for_subject, worker_subject
from projections.base import Projection, canonical_json, state_hash
from projections.endpoints import EndpointsState
from projections.schedule import ScheduleState, job_key
from schemas._base import Event
from schemas.endpoints import EndpointReplicaPlaced, EndpointReplicaReady, EndpointReplicaStarting
from schemas.envelope import Recorded
from schemas.jobs import JobAssignmentRevoked, JobPlaced, JobStarted, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerRegistered, WorkerVerified

S = 1_000_000_000


HOUR_MS = 3_600_000


APRIL_MS = 1_775_001_600_000  # 2026-04-01T00:00:00Z


class Log:
    """A tiny stand-in for one stream: numbers records and folds them into a projection's state."""

    def __init__(self, projection: Projection[Any]) -> None:
        self.projection = projection
        self.state = projection.initial()
        self.seq = 0
        self.records: list[Recorded[Any]] = []

    def __call__(self, subject: str, event: Event, t_s: float = 0.0) -> Recorded[Any]:
        assert stream_for_subject(subject).name == self.projection.stream
        self.seq += 1
        record: Recorded[Any] = Recorded(
            stream=self.projection.stream,
            seq=self.seq,
            subject=subject,
            time_ns=round(t_s * S),
            msg_id=f"m{self.seq}",
            event=event,
        )
        self.records.append(record)
        self.state = self.projection.evolve(self.state, record)
        return record


def roundtrips(projection: Projection[Any], state: msgspec.Struct) -> None:
    decoded = msgspec.json.decode(canonical_json(state), type=projection.state_type)
    assert decoded == state
    assert state_hash(decoded) == state_hash(state)


def usage_tick(**kw: Any) -> UsageTick:
    fields: dict[str, Any] = {
        "work_id": "j1",
        "work_kind": "job",
        "assignment_id": "a1",
        "epoch": 1,
        "provider": "p1",
        "gpu_type": "H100",
        "pool": "shared",
        "start_ms": APRIL_MS,
        "end_ms": APRIL_MS + HOUR_MS,
        "gpu_ms": HOUR_MS,
        "tier": "platinum",
    }
    fields.update(kw)
    return UsageTick(**fields)


def register(log: Log, worker: str, t_s: float = 0.0, **kw: Any) -> None:
    fields: dict[str, Any] = {"provider": "p1", "hostname": f"{worker}.example", "cpus": 8}
    fields.update(kw)
    log(worker_subject(worker, WorkerRegistered), WorkerRegistered(**fields), t_s)


def verify(log: Log, worker: str, t_s: float = 0.0) -> None:
    log(worker_subject(worker, WorkerVerified), WorkerVerified(challenge_id=f"c-{worker}"), t_s)


def asg(slot: int, epoch: int, worker: str = "w1", work: str = "j1") -> Assignment:
    return Assignment(
        assignment_id=f"{work}-{slot}-{epoch}", worker_id=worker, slot=slot, epoch=epoch, gpus=1
    )


PROV = Provenance(candidates=1)


class Job:
    """One job's subject tree on a :class:`Log` of JOBS."""

    def __init__(self, log: Log, job_id: str = "j1", tenant: str = "acme") -> None:
        self.log, self.tenant, self.job_id = log, tenant, job_id

    def __call__(self, event: Event, t_s: float = 0.0) -> Recorded[Any]:
        return self.log(job_subject(self.tenant, self.job_id, event), event, t_s)

    def submit(self, shards: int = 2, priority: int = 0) -> None:
        self(JobSubmitted(name=self.job_id, kind="ddp", shards=shards, priority=priority))

    def place(self, *assignments: Assignment) -> None:
        self(JobPlaced(assignments=list(assignments), provenance=PROV))

    def start(self, a: Assignment) -> None:
        self(JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch))

    def revoke(self, a: Assignment, reason: str = "worker lost") -> None:
        self(
            JobAssignmentRevoked(
                assignment_id=a.assignment_id,
                worker_id=a.worker_id,
                slot=a.slot,
                epoch=a.epoch,
                reason=reason,
            )
        )

    @property
    def record(self) -> Any:
        state: ScheduleState = self.log.state
        return state.jobs[job_key(self.tenant, self.job_id)]


class Endpoint:
    def __init__(self, log: Log, endpoint_id: str = "e1") -> None:
        self.log, self.endpoint_id = log, endpoint_id

    def __call__(self, event: Event, t_s: float = 0.0) -> None:
        self.log(endpoint_subject("acme", self.endpoint_id, event), event, t_s)

    @property
    def record(self) -> Any:
        state: EndpointsState = self.log.state
        return state.endpoints[f"acme/{self.endpoint_id}"]

    def up(self, a: Assignment, address: str) -> None:
        self(EndpointReplicaPlaced(assignments=[a], provenance=PROV))
        self(EndpointReplicaStarting(assignment_id=a.assignment_id, worker_id=a.worker_id, epoch=a.epoch))
        self(EndpointReplicaReady(assignment_id=a.assignment_id, epoch=a.epoch, address=address))
