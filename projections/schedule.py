"""The schedule: the JOBS stream (``job.<tenant>.<job_id>.<event>``) folded into one record per job.

Rules, in the order the coordinator relies on them:

* Fencing. Every placement decision takes epochs above every epoch the job has seen: an assignment
  in a ``job.placed`` at or below the job's ``epoch`` is stale and ignored. An event about a slot
  (started, progress, checkpointed, failed, rejected) counts only if it comes from the slot's
  *current* assignment: the same epoch (and the same assignment id where the event carries one).
  Anything else is from a revoked or superseded placement (a zombie) and is ignored. A job-wide
  event (``slot`` is ``None``) with an epoch counts when that epoch lies between the lowest current
  assignment epoch and the job's epoch; with no current assignment it is ignored.
* A revocation removes the slot's assignment only if the assignment id matches (a revocation of an
  already superseded assignment is ignored).
* State is derived after every change: a job with any slot lacking an assignment is ``queued`` (it
  needs capacity, even if some shards still hold theirs: :func:`missing_slots` says which); with
  every slot assigned it is ``running`` once a current assignment has started, else ``placed``.
  So a revoked shard sends a running job back to ``queued``, keeping the surviving assignments, and
  :func:`pending` offers it to the coordinator, which re-places only the missing slots.
* ``completed``, ``cancelled`` and a non-retryable job-wide ``failed`` are terminal and sticky: later
  events change nothing but ``last_seq``. ``completed`` marks every current assignment ``done``: the
  coordinator completes a job once all its shards are done, but the kernel completes a federated job
  when its FL run ends, then stops its clients, which report nothing (their shards must not read as
  running forever). A shard failure or a retryable failure is counted
  (``failures``, and a retryable shard failure in the slot's ``retries``) and recorded; the
  coordinator's revocation that follows re-queues the shard, or it fails the job once the slot was
  retried too often.
* A federated job's ``job.federation_ready`` (the kernel's own, never fenced) records its
  federation; a later one (its FL server started again) replaces it; ``job.federation_stopped``
  clears it until then (the coordinator starts no client without one).
* ``last_seq`` is the JOBS sequence of the job's latest event, ignored events included: it is the
  expected last sequence of ``job.<tenant>.<job_id>.>`` for the coordinator's next append.
* Tenure (:mod:`projections.tenure`): ``placed_ns`` keeps when each slot's current assignment was
  placed; an assignment that is revoked or superseded moves to ``retired`` for a while, so that the
  intake can still accept the usage its agent meters until the workload exits.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from projections.base import Projection
from projections.tenure import Tenure, retire, seen, tenure
from schemas.envelope import Recorded
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCancelled,
    JobCheckpointed,
    JobCheckpointPartStored,
    JobCompleted,
    JobFailed,
    JobFederationReady,
    JobFederationStopped,
    JobPlaced,
    JobProgress,
    JobQueued,
    JobRejected,
    JobRoundCompleted,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.values import Assignment

JobState = Literal["queued", "placed", "running", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

_replace = msgspec.structs.replace


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The latest accepted checkpoint: where recovery resumes from (``seq`` is its JOBS sequence)."""

    object_key: str
    seq: int
    epoch: int
    round: int | None = None
    step: int | None = None
    slot: int | None = None
    parts: list[str] = []


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """The latest training progress; a value an event leaves ``None`` keeps the previous one.

    Attributes:
        seq / slot / epoch: of the latest accepted progress event.
    """

    seq: int = 0
    slot: int | None = None
    epoch: int = 0
    round: int | None = None
    train_epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    gpu_util_pct: float | None = None
    metrics: dict[str, float] = {}


class Federation(msgspec.Struct, frozen=True, kw_only=True):
    """A federated job's federation, from its latest ``job.federation_ready`` (see that event)."""

    server: str
    sites: list[str]
    kit_bucket: str
    kits: list[str]
    shards: list[str]


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One job: its submission whole (``spec``) and what has happened to it since.

    Attributes:
        state: see the module docstring.
        submitted_seq / submitted_ns: the JOBS sequence and envelope time (Unix ns) of the submission.
        queue_reason: while queued, why it waits (the latest ``job.queued`` reason, or the
            latest revocation's); cleared once every slot is placed.
        assignments: the current assignment of each slot, by ``str(slot)``.
        started: ``str(slot) -> epoch`` for current assignments that started.
        done: ``str(slot) -> epoch`` for current assignments whose shard completed (a done shard is
            never re-placed; the coordinator completes the job once every shard is done); every
            current assignment once the job completed.
        failed_slots: ``str(slot) -> retryable`` for current assignments whose shard failed: the
            coordinator fails the job (not retryable) or re-places the shard (retryable).
        epoch: the highest assignment epoch placed for this job.
        round: the highest federated round completed.
        checkpoint_parts: ``str(step) -> str(slot) -> key``: the parts of sharded checkpoints stored
            at the current epoch and newer than the last checkpoint, while their set is incomplete
            (:mod:`projections.checkpoints`); at most :data:`MAX_PENDING_SETS` steps.
        failures / revocations: counts of accepted ``failed`` and ``assignment_revoked`` events.
        retries: ``str(slot) -> count`` of the slot's accepted retryable failures (its agent stopped
            or restarted while running it), over every epoch.
        rejected_by: ``worker_id -> reason`` for workers whose policy refused this job.
        failure_reason / log_tail: of the latest accepted failure.
        ended_ns: envelope time of the terminal event.
        federation: a federated job's provisioned federation while its FL server serves (``None``
            until it is ready and while it is stopped: the coordinator starts no client then).
        placed_ns: ``str(slot) -> envelope time`` of the placement of the slot's current assignment.
        retired: assignments that ended recently (revoked or superseded), see :mod:`projections.tenure`.
        last_seq: JOBS sequence of the job's latest event (the expected sequence for its subjects).
    """

    tenant: str
    job_id: str
    spec: JobSubmitted
    state: JobState = "queued"
    submitted_seq: int = 0
    submitted_ns: int = 0
    queue_reason: str = ""
    assignments: dict[str, Assignment] = {}
    started: dict[str, int] = {}
    done: dict[str, int] = {}
    failed_slots: dict[str, bool] = {}
    epoch: int = 0
    last_checkpoint: Checkpoint | None = None
    checkpoint_parts: dict[str, dict[str, str]] = {}
    round: int = 0
    progress: Progress | None = None
    failures: int = 0
    revocations: int = 0
    retries: dict[str, int] = {}
    rejected_by: dict[str, str] = {}
    outputs: list[str] = []
    failure_reason: str = ""
    log_tail: str = ""
    cancelled_by: str = ""
    cancel_reason: str = ""
    ended_ns: int | None = None
    federation: Federation | None = None
    placed_ns: dict[str, int] = {}
    retired: list[Tenure] = []
    last_seq: int = 0


class ScheduleState(msgspec.Struct, kw_only=True):
    """Every job, by :func:`job_key`; ``seq`` is the last JOBS sequence applied."""

    seq: int = 0
    jobs: dict[str, JobRecord] = {}


def job_key(tenant: str, job_id: str) -> str:
    """The key of a job in :attr:`ScheduleState.jobs`: ``tenant/job_id``."""
    return f"{tenant}/{job_id}"


def _submitted(tenant: str, job_id: str, e: JobSubmitted, seq: int, t: int) -> JobRecord:
    return JobRecord(
        tenant=tenant,
        job_id=job_id,
        spec=e,
        submitted_seq=seq,
        submitted_ns=t,
        last_seq=seq,
    )


def _slot_current(job: JobRecord, slot: int, epoch: int | None, assignment_id: str | None = None) -> bool:
    """True if an event about ``slot`` comes from the slot's current assignment."""
    current = job.assignments.get(str(slot))
    if current is None:
        return False
    if epoch is not None and epoch != current.epoch:
        return False
    return assignment_id is None or assignment_id == current.assignment_id


def _job_current(job: JobRecord, epoch: int) -> bool:
    """True if a job-wide event of ``epoch`` belongs to a placement that still has assignments."""
    if not job.assignments:
        return False
    return min(a.epoch for a in job.assignments.values()) <= epoch <= job.epoch


def _derive(job: JobRecord) -> JobRecord:
    if job.state in TERMINAL:
        return job
    state: JobState
    if len(job.assignments) < job.spec.shards:
        state = "queued"
    elif job.started:
        state = "running"
    else:
        state = "placed"
    if job.state == state and (state == "queued" or not job.queue_reason):
        return job
    return _replace(job, state=state, queue_reason=job.queue_reason if state == "queued" else "")


MAX_PENDING_SETS = 8
"""Incomplete sharded checkpoints a job keeps (the newest steps): parts older than these never
complete."""
_SINCE_PLACED = ("started", "done", "failed_slots")
"""A job's maps of what each slot's current assignment has done since it was placed."""
_PER_SLOT = ("assignments", "placed_ns", *_SINCE_PLACED)
"""A job's maps of what belongs to each slot's current assignment, by ``str(slot)``."""


def _per_slot(job: JobRecord, without: str | None = None) -> dict[str, dict[str, Any]]:
    """Copies of ``job``'s per-slot maps (by field name), without slot ``without``."""
    return {name: {k: v for k, v in getattr(job, name).items() if k != without} for name in _PER_SLOT}


def _placed(job: JobRecord, event: JobPlaced, t: int) -> JobRecord | None:
    maps = _per_slot(job)
    superseded = []
    epoch = job.epoch
    for a in event.assignments:
        if a.epoch <= job.epoch or not 0 <= a.slot < job.spec.shards:
            continue
        slot = str(a.slot)
        old = maps["assignments"].get(slot)
        if old is not None:
            superseded.append(_tenure(job, old))
        maps["assignments"][slot] = a
        maps["placed_ns"][slot] = t
        for name in _SINCE_PLACED:
            maps[name].pop(slot, None)
        epoch = max(epoch, a.epoch)
    if epoch == job.epoch:
        return None
    retired = retire(job.retired, superseded, t) if superseded else job.retired
    return _replace(job, epoch=epoch, retired=retired, checkpoint_parts={}, **maps)


def _revoked(job: JobRecord, event: JobAssignmentRevoked, t: int) -> JobRecord | None:
    slot = str(event.slot)
    current = job.assignments.get(slot)
    if current is None or current.assignment_id != event.assignment_id:
        return None
    retired = retire(job.retired, [_tenure(job, current)], t)
    maps = _per_slot(job, without=slot)
    return _replace(job, retired=retired, revocations=job.revocations + 1, queue_reason=event.reason, **maps)


def _rejected(job: JobRecord, event: JobRejected) -> JobRecord | None:
    for a in job.assignments.values():
        if a.assignment_id == event.assignment_id and a.epoch == event.epoch:
            return _replace(job, rejected_by={**job.rejected_by, event.worker_id: event.reason})
    return None


def _progress(job: JobRecord, e: JobProgress, seq: int) -> JobRecord:
    p = job.progress or Progress()
    progress = Progress(
        seq=seq,
        slot=e.slot,
        epoch=e.epoch,
        round=p.round if e.round is None else e.round,
        train_epoch=p.train_epoch if e.train_epoch is None else e.train_epoch,
        step=p.step if e.step is None else e.step,
        loss=p.loss if e.loss is None else e.loss,
        gpu_util_pct=p.gpu_util_pct if e.gpu_util_pct is None else e.gpu_util_pct,
        metrics=e.metrics or p.metrics,
    )
    return _replace(job, progress=progress)


def _part_stored(job: JobRecord, e: JobCheckpointPartStored) -> JobRecord | None:
    last = job.last_checkpoint
    if last is not None and last.parts and last.epoch == e.epoch and e.step <= (last.step or 0):
        return None  # a step the job already has whole
    step = str(e.step)
    parts = {**job.checkpoint_parts.get(step, {}), str(e.slot): e.object_key}
    pending = {**job.checkpoint_parts, step: parts}
    while len(pending) > MAX_PENDING_SETS:  # a node that reports steps no other node saves
        del pending[min(pending, key=int)]
    return _replace(job, checkpoint_parts=pending)


def _fenced(job: JobRecord, slot: int | None, epoch: int | None) -> bool:
    """True if a slot or job-wide event of ``epoch`` is stale (a job-wide event without an epoch
    is the kernel's own and is never stale)."""
    if slot is not None:
        return not _slot_current(job, slot, epoch)
    return epoch is not None and not _job_current(job, epoch)


def _failed(job: JobRecord, e: JobFailed, t: int) -> JobRecord | None:
    if _fenced(job, e.slot, e.epoch):
        return None
    job = _replace(job, failures=job.failures + 1, failure_reason=e.reason, log_tail=e.log_tail)
    if e.slot is None and not e.retryable:
        job = _replace(job, state="failed", ended_ns=t)
    elif e.slot is not None:
        slot = str(e.slot)
        job = _replace(job, failed_slots={**job.failed_slots, slot: e.retryable})
        if e.retryable:
            job = _replace(job, retries={**job.retries, slot: job.retries.get(slot, 0) + 1})
    return job


def _changed(job: JobRecord, event: Any, seq: int, t: int) -> JobRecord | None:
    """The job after ``event``, or ``None`` when the event changes nothing (or is stale)."""
    match event:
        case JobQueued(reason=reason):
            return _replace(job, queue_reason=reason)
        case JobPlaced():
            return _placed(job, event, t)
        case JobAssignmentRevoked():
            return _revoked(job, event, t)
        case JobRejected():
            return _rejected(job, event)
        case JobStarted(assignment_id=assignment_id, slot=slot, epoch=epoch):
            if not _slot_current(job, slot, epoch, assignment_id) or str(slot) in job.started:
                return None
            return _replace(job, started={**job.started, str(slot): epoch})
        case JobProgress():
            return None if _fenced(job, event.slot, event.epoch) else _progress(job, event, seq)
        case JobCheckpointed(object_key=key, epoch=epoch, slot=slot, parts=parts):
            if not parts and _fenced(job, slot, epoch):
                return None
            step, pending = event.step, job.checkpoint_parts
            if parts:  # the kernel's complete set: the sets it supersedes never count
                pending = {s: p for s, p in pending.items() if int(s) > (step or 0)}
            checkpoint = Checkpoint(
                object_key=key, seq=seq, epoch=epoch, round=event.round, step=step, slot=slot, parts=parts
            )
            return _replace(job, last_checkpoint=checkpoint, checkpoint_parts=pending)
        case JobCheckpointPartStored():
            return None if _fenced(job, event.slot, event.epoch) else _part_stored(job, event)
        case JobShardCompleted(assignment_id=assignment_id, slot=slot, epoch=epoch):
            if not _slot_current(job, slot, epoch, assignment_id) or str(slot) in job.done:
                return None
            return _replace(job, done={**job.done, str(slot): epoch})
        case JobRoundCompleted(round=done):
            return _replace(job, round=done) if done > job.round else None
        case JobCompleted(outputs=outputs):
            every_shard = {slot: a.epoch for slot, a in job.assignments.items()}  # see the module docstring
            return _replace(job, state="completed", outputs=outputs, ended_ns=t, done=every_shard)
        case JobFailed():
            return _failed(job, event, t)
        case JobFederationReady(server=server, sites=sites, kit_bucket=bucket, kits=kits, shards=shards):
            federation = Federation(server=server, sites=sites, kit_bucket=bucket, kits=kits, shards=shards)
            return _replace(job, federation=federation)
        case JobFederationStopped():
            return _replace(job, federation=None) if job.federation is not None else None
        case JobCancelled(by=by, reason=reason):
            return _replace(job, state="cancelled", cancelled_by=by, cancel_reason=reason, ended_ns=t)
    return None


def evolve(state: ScheduleState, recorded: Recorded[Any]) -> ScheduleState:
    """Apply one JOBS event; records at or below ``state.seq`` are already applied and ignored;
    events of a job never submitted are ignored."""
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    tenant, job_id = recorded.token(1), recorded.token(2)
    key = job_key(tenant, job_id)
    job = state.jobs.get(key)
    event = recorded.event
    if job is None:
        if isinstance(event, JobSubmitted):
            state.jobs[key] = _submitted(tenant, job_id, event, seq, recorded.time_ns)
        return state
    changed = None if job.state in TERMINAL else _changed(job, event, seq, recorded.time_ns)
    job = job if changed is None else _derive(changed)
    state.jobs[key] = seen(job, job.retired, seq, recorded.time_ns)
    return state


SCHEDULE: Projection[ScheduleState] = Projection(
    name="schedule", stream="JOBS", version=10, state_type=ScheduleState, evolve=evolve
)


def _tenure(job: JobRecord, assignment: Assignment) -> Tenure:
    """The tenure of a current assignment of ``job`` (``ended_ns``: the job's end, if it ended)."""
    return tenure(assignment, job.placed_ns.get(str(assignment.slot), job.submitted_ns), job.ended_ns)


def find_tenure(job: JobRecord, assignment_id: str) -> Tenure | None:
    """The tenure of ``assignment_id`` in ``job``: a current assignment or a recently retired one."""
    for a in job.assignments.values():
        if a.assignment_id == assignment_id:
            return _tenure(job, a)
    for retired in job.retired:
        if retired.assignment_id == assignment_id:
            return retired
    return None


def pending(state: ScheduleState) -> list[JobRecord]:
    """Queued jobs in the order the coordinator places them: managed and private work before shared
    work (reserved capacity has priority queue access; it is also what capacity freed by
    a preemption was freed for), then priority (highest first), then submission order."""
    queued = [job for job in state.jobs.values() if job.state == "queued"]
    queued.sort(key=lambda job: (job.spec.pool == "shared", -job.spec.priority, job.submitted_seq))
    return queued


def missing_slots(job: JobRecord) -> list[int]:
    """The slots of a live job that have no current assignment (empty for a terminal job)."""
    if job.state in TERMINAL:
        return []
    return [slot for slot in range(job.spec.shards) if str(slot) not in job.assignments]


def active_assignments(state: ScheduleState, worker_id: str) -> list[tuple[JobRecord, Assignment]]:
    """The current assignments of live jobs on ``worker_id``, by job key then slot: what to revoke
    when the worker is lost, and its load."""
    found = []
    for key in sorted(state.jobs):
        job = state.jobs[key]
        if job.state in TERMINAL:
            continue
        for a in sorted(job.assignments.values(), key=lambda a: a.slot):
            if a.worker_id == worker_id:
                found.append((job, a))
    return found
