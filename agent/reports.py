"""What the agent says about an assignment: pure functions from a ``StartWork`` (and what happened)
to the events to append, as ``(subject, event, event_id)``.

Event ids are derived from the assignment id, so an append retried after a time-out, or repeated by
an agent that restarted within the server's duplicate window, is stored once. The subjects are the
canonical ones the events are about; the agent claims them on the intake
(:func:`core.streams.intake_subject`), and the kernel decides what is stored there.

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

import math
import signal
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec

from agent.protocol import CheckpointLine, ProgressLine, ReadyLine
from core.streams import endpoint_subject, job_subject, metering_subject
from schemas._base import Event
from schemas.commands import StartWork
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import JobCheckpointed, JobFailed, JobProgress, JobRejected, JobShardCompleted, JobStarted
from schemas.metering import UsageTick

Append = tuple[str, Event, str]
PROGRESS_INTERVAL_S = 1.0
"""An assignment's progress reports go out at most this often (:class:`ProgressCoalescer`)."""
MAX_METRICS = 64
"""Most metrics one progress report carries (the kernel refuses more)."""
EndCause = Literal["exited", "stopped", "superseded", "agent_stopped", "agent_restarted"]
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 16 * 1024
"""A log tail is cut to its last this many bytes (a workload may print very long lines)."""


def _subject(cmd: StartWork, event: Event) -> str:
    if cmd.work_kind == "endpoint":
        return endpoint_subject(cmd.tenant, cmd.work_id, event)
    return job_subject(cmd.tenant, cmd.work_id, event)


def _one(cmd: StartWork, event: Event, suffix: str) -> Append:
    return _subject(cmd, event), event, f"{cmd.assignment_id}-{suffix}"


E = TypeVar("E", bound=Event)


def _about(cmd: StartWork, kind: Callable[..., E], **fields: Any) -> E:
    """A ``kind`` event about ``cmd``'s assignment: it names the assignment and its epoch."""
    return kind(assignment_id=cmd.assignment_id, epoch=cmd.epoch, **fields)


def started(cmd: StartWork, worker_id: str) -> Append:
    """The workload started."""
    if cmd.work_kind == "endpoint":
        event: Event = _about(cmd, EndpointReplicaStarting, worker_id=worker_id)
    else:
        event = _about(cmd, JobStarted, worker_id=worker_id, slot=cmd.slot)
    return _one(cmd, event, "started")


def rejected(cmd: StartWork, worker_id: str, reason: str) -> Append:
    """The agent refused the assignment (policy, capacity, unknown runtime)."""
    if cmd.work_kind == "endpoint":
        event: Event = _about(
            cmd, EndpointReplicaLost, reason=f"rejected by worker: {reason}", retryable=True
        )
    else:
        event = _about(cmd, JobRejected, worker_id=worker_id, reason=reason)
    return _one(cmd, event, "rejected")


def reported(cmd: StartWork, report: ProgressLine | CheckpointLine | ReadyLine, n: int) -> Append | None:
    """The event for the workload's ``n``-th protocol line, or ``None`` if it does not apply."""
    if isinstance(report, ReadyLine):
        if cmd.work_kind != "endpoint":
            return None
        ready = _about(cmd, EndpointReplicaReady, address=report.address, api_key=report.api_key)
        return _one(cmd, ready, f"ready-{n}")
    if cmd.work_kind != "job":
        return None
    if isinstance(report, CheckpointLine):
        if report.object_key is None:
            return None  # a file not uploaded yet (agent.checkpoints uploads it and reports the key)
        event: Event = _about(
            cmd,
            JobCheckpointed,
            slot=cmd.slot,
            object_key=report.object_key,
            round=report.round,
            step=report.step,
        )
        return _one(cmd, event, f"checkpointed-{n}")
    # Every field of the workload's report, stamped with the assignment that ran it.
    event = _about(cmd, JobProgress, slot=cmd.slot, **msgspec.structs.asdict(report))
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
            return [_one(cmd, _about(cmd, EndpointReplicaLost, reason=exit_reason(0)), "lost")]
        done = _about(cmd, JobShardCompleted, worker_id=worker_id, slot=cmd.slot)
        return [_one(cmd, done, "shard-completed")]
    return [_failure(cmd, exit_reason(code if code is not None else -1), log_tail, retryable=False)]


def start_failed(cmd: StartWork, reason: str, *, retryable: bool = False) -> Append:
    """The workload could not be started (``retryable``: not its fault; placed again at once)."""
    return _failure(cmd, f"cannot start: {reason}", "", retryable=retryable)


def _failure(cmd: StartWork, reason: str, log_tail: str, *, retryable: bool) -> Append:
    log_tail = cut_tail(log_tail)
    if cmd.work_kind == "endpoint":
        lost = _about(cmd, EndpointReplicaLost, reason=reason, log_tail=log_tail, retryable=retryable)
        return _one(cmd, lost, "lost")
    failed = _about(cmd, JobFailed, slot=cmd.slot, reason=reason, log_tail=log_tail, retryable=retryable)
    return _one(cmd, failed, "failed")


def cut_tail(text: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of ``text``, at most ``limit`` bytes of UTF-8 (marked when cut)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return "[...]\n" + data[-limit:].decode(errors="ignore")


class Meter:
    """Usage of one assignment, interval after contiguous interval, as the agent claims it on
    ``meter.<tenant>.<worker>.<assignment>.tick``: GPU work in GPU-milliseconds (GPUs x wall time),
    CPU work in CPU-milliseconds (``spec.cpus`` x wall time). Who is billed, at which price and who is
    paid are the kernel's to say: the claim carries none of it.

    Args:
        cmd: the assignment.
        worker_id: this worker.
        start_ms: when the workload started, Unix milliseconds.
    """

    def __init__(self, cmd: StartWork, *, worker_id: str, start_ms: int) -> None:
        self.cmd = cmd
        self.subject = metering_subject(cmd.tenant, worker_id, cmd.assignment_id, UsageTick)
        self.gpus = cmd.spec.gpus
        self.cpus = cmd.spec.cpus if cmd.spec.cpus > 0 else 1.0
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
            start_ms=self.last_ms,
            end_ms=now_ms,
            gpu_ms=self.gpus * elapsed,
            cpu_ms=0 if self.gpus else round(self.cpus * elapsed),
        )
        self.last_ms = now_ms
        self.count += 1
        return self.subject, tick, f"{cmd.assignment_id}-tick-{self.count}"


class ProgressCoalescer:
    """At most one progress report per :data:`PROGRESS_INTERVAL_S` for one assignment: a workload
    printing a line per step would otherwise append an event per step. Reports in between are merged
    into the latest (a value a later line leaves out keeps the earlier one; metrics merge, at most
    :data:`MAX_METRICS`), and the merged report goes out when the interval has passed, before any
    other report of the assignment, and at its end.
    """

    def __init__(self, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.pending: ProgressLine | None = None
        self.sent_at = -math.inf

    def offer(self, line: ProgressLine, now: float) -> ProgressLine | None:
        """Take one line; the report to send now, if the interval has passed."""
        self.pending = line if self.pending is None else merge_progress(self.pending, line)
        return self.take(now) if now - self.sent_at >= self.interval_s else None

    def take(self, now: float) -> ProgressLine | None:
        """The pending report, if any (it counts as sent now)."""
        line, self.pending = self.pending, None
        if line is not None:
            self.sent_at = now
        return line

    def due_in(self, now: float) -> float:
        """Seconds until the pending report is due (0 when none is pending or it is due)."""
        return 0.0 if self.pending is None else max(0.0, self.sent_at + self.interval_s - now)


def merge_progress(old: ProgressLine, new: ProgressLine) -> ProgressLine:
    """``new`` over ``old``: ``None`` in ``new`` keeps ``old``'s value; metrics merge (capped)."""
    fields = {
        name: getattr(new, name) if getattr(new, name) is not None else getattr(old, name)
        for name in ("round", "train_epoch", "step", "loss", "gpu_util_pct")
    }
    metrics = {**old.metrics, **new.metrics}
    if len(metrics) > MAX_METRICS:
        metrics = dict(list(metrics.items())[-MAX_METRICS:])
    return msgspec.structs.replace(new, metrics=metrics, **fields)
