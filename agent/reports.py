"""What the agent says about an assignment: pure functions from a ``StartWork`` (and what happened)
to the events to append, as ``(subject, event, event_id)``.

Event ids are derived from the assignment id, so an append retried after a time-out, or repeated by
an agent that restarted within the server's duplicate window, is stored once.

Jobs and endpoints differ in where events go: a job's shard reports ``job.<tenant>.<job>.<event>``;
an endpoint replica reports ``endpoint.<tenant>.<endpoint>.<event>`` (starting, ready, lost).

When an assignment ends:

=====================  ==========================================================================
how                    events (after the final usage tick)
=====================  ==========================================================================
exit 0                 ``job.shard_completed`` (the coordinator completes the job once every
                       shard has); ``endpoint.replica_lost`` for a replica
exit N != 0 / signal   ``job.failed`` (reason ``exit status N``, epoch, slot, the log's last 40
                       lines) or ``endpoint.replica_lost`` with the same
could not start        ``job.failed`` (``cannot start: ...``; ``retryable`` when the runtime says
                       so, e.g. a rendezvous port already taken) / ``endpoint.replica_lost``
                       (``retryable`` likewise: only a replica's own failures count towards
                       failing its endpoint; a rejection is retryable)
stopped (StopWork) or  nothing: the kernel asked for it and already knows
superseded by a newer
epoch
agent stopping or      ``job.failed`` with ``retryable=True`` (``agent stopped`` / ``agent
restarted after crash  restarted``), so the kernel re-places it at once instead of waiting for
                       the worker to be declared lost
=====================  ==========================================================================
"""

from __future__ import annotations

import signal
from typing import Literal

from agent.protocol import CheckpointLine, ProgressLine, ReadyLine
from core.pricing import CPU_GPU_TYPE
from core.streams import endpoint_subject, job_subject, metering_subject
from schemas import Event
from schemas.commands import StartWork
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import JobCheckpointed, JobFailed, JobProgress, JobRejected, JobShardCompleted, JobStarted
from schemas.metering import UsageTick

Append = tuple[str, Event, str]
EndCause = Literal["exited", "stopped", "superseded", "agent_stopped", "agent_restarted"]
LOG_TAIL_LINES = 40
_POOLS = ("shared", "managed", "private")


def _subject(cmd: StartWork, event: Event) -> str:
    if cmd.work_kind == "endpoint":
        return endpoint_subject(cmd.tenant, cmd.work_id, event)
    return job_subject(cmd.tenant, cmd.work_id, event)


def _one(cmd: StartWork, event: Event, suffix: str) -> Append:
    return _subject(cmd, event), event, f"{cmd.assignment_id}-{suffix}"


def started(cmd: StartWork, worker_id: str) -> Append:
    """The workload started."""
    if cmd.work_kind == "endpoint":
        event: Event = EndpointReplicaStarting(
            assignment_id=cmd.assignment_id, worker_id=worker_id, epoch=cmd.epoch
        )
    else:
        event = JobStarted(
            assignment_id=cmd.assignment_id, worker_id=worker_id, slot=cmd.slot, epoch=cmd.epoch
        )
    return _one(cmd, event, "started")


def rejected(cmd: StartWork, worker_id: str, reason: str) -> Append:
    """The agent refused the assignment (policy, capacity, unknown runtime)."""
    if cmd.work_kind == "endpoint":
        event: Event = EndpointReplicaLost(
            assignment_id=cmd.assignment_id,
            epoch=cmd.epoch,
            reason=f"rejected by worker: {reason}",
            retryable=True,
        )
    else:
        event = JobRejected(
            assignment_id=cmd.assignment_id, worker_id=worker_id, epoch=cmd.epoch, reason=reason
        )
    return _one(cmd, event, "rejected")


def reported(cmd: StartWork, report: ProgressLine | CheckpointLine | ReadyLine, n: int) -> Append | None:
    """The event for the workload's ``n``-th protocol line, or ``None`` if it does not apply."""
    if isinstance(report, ReadyLine):
        if cmd.work_kind != "endpoint":
            return None
        ready = EndpointReplicaReady(assignment_id=cmd.assignment_id, epoch=cmd.epoch, address=report.address)
        return _one(cmd, ready, f"ready-{n}")
    if cmd.work_kind != "job":
        return None
    if isinstance(report, CheckpointLine):
        if report.object_key is None:
            return None  # a file not uploaded yet (agent.checkpoints uploads it and reports the key)
        event: Event = JobCheckpointed(
            epoch=cmd.epoch, object_key=report.object_key, round=report.round, slot=cmd.slot, step=report.step
        )
        return _one(cmd, event, f"checkpointed-{n}")
    event = JobProgress(
        epoch=cmd.epoch,
        slot=cmd.slot,
        round=report.round,
        train_epoch=report.train_epoch,
        step=report.step,
        loss=report.loss,
        metrics=report.metrics,
        gpu_util_pct=report.gpu_util_pct,
    )
    return _one(cmd, event, f"progress-{n}")


def exit_reason(code: int) -> str:
    """``exit status N``, or ``killed by SIGNAME`` for a negative (signal) status."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def ended(
    cmd: StartWork, cause: EndCause, code: int | None = None, log_tail: str = "", *, worker_id: str = ""
) -> list[Append]:
    """The events when an assignment ends (see the module's table)."""
    if cause in ("stopped", "superseded"):
        return []
    if cause in ("agent_stopped", "agent_restarted"):
        return [_failure(cmd, cause.replace("_", " "), log_tail, retryable=True)]
    if code == 0:
        if cmd.work_kind == "endpoint":
            lost = EndpointReplicaLost(
                assignment_id=cmd.assignment_id, epoch=cmd.epoch, reason=exit_reason(0)
            )
            return [_one(cmd, lost, "lost")]
        done = JobShardCompleted(
            assignment_id=cmd.assignment_id, worker_id=worker_id, slot=cmd.slot, epoch=cmd.epoch
        )
        return [_one(cmd, done, "shard-completed")]
    return [_failure(cmd, exit_reason(code if code is not None else -1), log_tail, retryable=False)]


def start_failed(cmd: StartWork, reason: str, *, retryable: bool = False) -> Append:
    """The workload could not be started (``retryable``: not its fault; placed again at once)."""
    return _failure(cmd, f"cannot start: {reason}", "", retryable=retryable)


def _failure(cmd: StartWork, reason: str, log_tail: str, *, retryable: bool) -> Append:
    if cmd.work_kind == "endpoint":
        lost = EndpointReplicaLost(
            assignment_id=cmd.assignment_id,
            epoch=cmd.epoch,
            reason=reason,
            log_tail=log_tail,
            retryable=retryable,
        )
        return _one(cmd, lost, "lost")
    failed = JobFailed(reason=reason, epoch=cmd.epoch, slot=cmd.slot, log_tail=log_tail, retryable=retryable)
    return _one(cmd, failed, "failed")


class Meter:
    """Usage of one assignment, interval after contiguous interval, as ``meter.<tenant>.<worker>``
    ticks. GPU work is metered in GPU-milliseconds (GPUs x wall time) at ``gpu_type``; CPU work in
    CPU-milliseconds (``spec.cpus`` x wall time) at ``cpu``.

    Args:
        cmd: the assignment.
        worker_id / provider / worker_pool: the worker; the tick's pool is ``spec.pool`` when
            valid, else the worker's.
        gpu_type: the GPU family billed (``core.pricing.gpu_family`` of the model), ignored for CPU work.
        start_ms: when the workload started, Unix milliseconds.
    """

    def __init__(
        self, cmd: StartWork, *, worker_id: str, provider: str, worker_pool: str, gpu_type: str, start_ms: int
    ) -> None:
        self.cmd = cmd
        self.subject = metering_subject(cmd.tenant, worker_id)
        self.provider = provider
        pool = cmd.spec.pool or worker_pool
        self.pool = pool if pool in _POOLS else worker_pool
        self.gpus = cmd.spec.gpus
        self.gpu_type = gpu_type if self.gpus > 0 else CPU_GPU_TYPE
        self.cpus = cmd.spec.cpus if cmd.spec.cpus > 0 else 1.0
        self.tier = cmd.spec.tier
        self.last_ms = start_ms
        self.count = 0

    def tick(self, now_ms: int) -> Append | None:
        """The tick for ``[last end, now_ms]``, or ``None`` for an empty interval."""
        if now_ms <= self.last_ms:
            return None
        elapsed = now_ms - self.last_ms
        cmd = self.cmd
        tick = UsageTick(
            work_id=cmd.work_id,
            work_kind=cmd.work_kind,
            assignment_id=cmd.assignment_id,
            epoch=cmd.epoch,
            provider=self.provider,
            gpu_type=self.gpu_type,
            pool=self.pool,  # type: ignore[arg-type]
            start_ms=self.last_ms,
            end_ms=now_ms,
            gpu_ms=self.gpus * elapsed,
            cpu_ms=0 if self.gpus else round(self.cpus * elapsed),
            tier=self.tier,
        )
        self.last_ms = now_ms
        self.count += 1
        return self.subject, tick, f"{cmd.assignment_id}-tick-{self.count}"
