"""What a worker says about an assignment: pure functions from a ``StartWork`` (and what happened)
to the events to append, as ``(subject, event, event_id)``. Both edges that run work build their
reports here, so that each report is made by one function: the agent (:mod:`agent.reports` adds its
meter and progress coalescing) and the Kubernetes dispatcher (:mod:`ops.dispatcher.reporting`, from a
pod's state and log).

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
                       the worker to be declared lost (:func:`lost`)
=====================  ==========================================================================
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from core.protocol import CheckpointLine, ProgressLine, ReadyLine
from core.streams import endpoint_subject, job_subject
from schemas._base import Event
from schemas.commands import StartWork
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import (
    JobCheckpointed,
    JobCheckpointPartStored,
    JobFailed,
    JobProgress,
    JobRejected,
    JobShardCompleted,
    JobStarted,
)

Append = tuple[str, Event, str]
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
            return None  # a file or part not uploaded yet (agent.checkpoints uploads it, then reports)
        if report.dir is not None and report.step is not None:
            key, step = report.object_key, report.step
            part = _about(cmd, JobCheckpointPartStored, slot=cmd.slot, object_key=key, step=step)
            return _one(cmd, part, f"part-{n}")
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
        return [lost(cmd, cause.replace("_", " "), log_tail)]
    if code == 0:
        if cmd.work_kind == "endpoint":
            return [_one(cmd, _about(cmd, EndpointReplicaLost, reason=exit_reason(0)), "lost")]
        done = _about(cmd, JobShardCompleted, worker_id=worker_id, slot=cmd.slot)
        return [_one(cmd, done, "shard-completed")]
    return [failed(cmd, exit_reason(code if code is not None else -1), log_tail, retryable=False)]


def start_failed(cmd: StartWork, reason: str, *, retryable: bool = False) -> Append:
    """The workload could not be started (``retryable``: not its fault; placed again at once)."""
    return failed(cmd, f"cannot start: {reason}", "", retryable=retryable)


def lost(cmd: StartWork, reason: str, log_tail: str = "") -> Append:
    """The worker lost the workload through no fault of the work (the agent stopped or restarted, a
    pod vanished): failed, ``retryable``, so that the kernel places it again at once."""
    return failed(cmd, reason, log_tail, retryable=True)


def failed(cmd: StartWork, reason: str, log_tail: str, *, retryable: bool) -> Append:
    """The assignment failed: ``job.failed`` or ``endpoint.replica_lost``, with ``reason`` and the log's
    end (cut by :func:`cut_tail`)."""
    log_tail = cut_tail(log_tail)
    if cmd.work_kind == "endpoint":
        lost = _about(cmd, EndpointReplicaLost, reason=reason, log_tail=log_tail, retryable=retryable)
        return _one(cmd, lost, "lost")
    failed = _about(cmd, JobFailed, slot=cmd.slot, reason=reason, log_tail=log_tail, retryable=retryable)
    return _one(cmd, failed, "failed")


def cut_tail(text: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of ``text``, at most ``limit`` bytes of UTF-8 (marked when cut; a lone surrogate,
    which is no UTF-8, becomes ``?``)."""
    data = text.encode(errors="replace")
    if len(data) <= limit:
        return data.decode()
    return "[...]\n" + data[-limit:].decode(errors="ignore")


def tail_of(lines: Sequence[str], n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` of a log's ``lines``, joined: a failure's log tail before :func:`cut_tail`."""
    return "\n".join(lines[-n:]) if n > 0 else ""


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
