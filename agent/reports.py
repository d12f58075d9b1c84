"""What the agent says about an assignment. The reports themselves are built by :mod:`core.reports`
(pure, shared with the Kubernetes dispatcher; see its table of what is reported when an assignment
ends); here are what only the agent keeps: its usage meter and the coalescing of progress reports.
"""

from __future__ import annotations

import math

from core.protocol import ProgressLine
from core.reports import (
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    MAX_METRICS,
    Append,
    EndCause,
    cut_tail,
    ended,
    exit_reason,
    failed,
    lost,
    merge_progress,
    rejected,
    reported,
    start_failed,
    started,
    tail_of,
)
from core.streams import metering_subject
from schemas.commands import StartWork
from schemas.metering import UsageTick

__all__ = [
    "LOG_TAIL_BYTES",
    "LOG_TAIL_LINES",
    "MAX_METRICS",
    "PROGRESS_INTERVAL_S",
    "Append",
    "EndCause",
    "Meter",
    "ProgressCoalescer",
    "cut_tail",
    "ended",
    "exit_reason",
    "failed",
    "lost",
    "merge_progress",
    "rejected",
    "reported",
    "start_failed",
    "started",
    "tail_of",
]
PROGRESS_INTERVAL_S = 1.0
"""An assignment's progress reports go out at most this often (:class:`ProgressCoalescer`)."""


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
