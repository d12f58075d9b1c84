"""A job's GPU telemetry over time (``GET /v1/jobs/{job_id}/telemetry``): the heartbeats of the
workers that held its assignments, read only for the time they held them, downsampled.

Who held what, and when, is the schedule's own belief: the job's events are folded through the
schedule reducer (:mod:`projections.schedule`), and an assignment's tenure runs from the event that
placed it to the one that revoked or superseded it, or ended the job. Heartbeats (HEARTBEATS, kept
7 days) are read per worker, by subject, between those times only: a tenant never sees a worker's
readings from before or after it ran the tenant's work.

A heartbeat carries the readings of the worker's whole host, so a beat counts for the job only when
everything the worker ran then was this job's (its ``running`` list names only assignments of the
job, or nothing): a beat from a host shared with other work, another tenant's or another job's,
would show figures that are not this job's, and is left out (counted in ``withheld``). A beat is its
agent's word: only the beats of the worker the schedule placed the work on are read (another
agent naming the job's assignment in its ``running`` is never read), and only the readings of the
GPUs that worker registered are shown.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from core.log import EventLog
from core.streams import heartbeat_subject, job_filter
from gateway.scope import iso
from projections.liveness import registered_readings, util_reading
from projections.registry import RegistryState
from projections.schedule import TERMINAL, JobRecord, ScheduleState, evolve
from projections.tenure import Tenure, tenure
from schemas.api.jobs import GpuSample, JobTelemetry, TelemetrySpan, WorkerTelemetry
from schemas.envelope import Recorded
from schemas.values import Gpu
from schemas.workers import Heartbeat

Span = tuple[int, int | None]
"""A stretch of time in Unix ns: start, end (``None``: still going)."""


class Tenures:
    """Every assignment the schedule held for one job, with when it held it.

    Feed it the job's events in log order from its submission (:meth:`add`); each is folded through
    the schedule reducer, so a stale placement, or a revocation of an assignment already superseded,
    changes nothing here either. An assignment ends when it leaves the job's current assignments, or
    when the job ends (completed, failed or cancelled).
    """

    def __init__(self) -> None:
        self.state = ScheduleState()
        self.held: dict[str, Tenure] = {}
        self.ended: list[Tenure] = []

    def add(self, record: Recorded[Any]) -> None:
        self.state = evolve(self.state, record)
        job = next(iter(self.state.jobs.values()), None)
        if job is None:
            return
        current = _current(job)
        for assignment_id in [a for a in self.held if a not in current]:
            end = job.ended_ns if job.ended_ns is not None else record.time_ns
            self.ended.append(msgspec.structs.replace(self.held.pop(assignment_id), ended_ns=end))
        for assignment_id, assignment in current.items():
            if assignment_id not in self.held:
                self.held[assignment_id] = tenure(assignment, record.time_ns, None)

    def all(self) -> list[Tenure]:
        """Every tenure so far, oldest placement first (``ended_ns`` ``None``: still held)."""
        return sorted([*self.ended, *self.held.values()], key=lambda t: (t.placed_ns, t.slot))


def _current(job: JobRecord) -> dict[str, Any]:
    if job.state in TERMINAL:
        return {}
    return {a.assignment_id: a for a in job.assignments.values()}


def merged(spans: Iterable[Span]) -> list[Span]:
    """``spans`` in time order with overlapping ones joined (a worker holding two shards at once is
    read once)."""
    out: list[Span] = []
    for start, end in sorted(spans, key=lambda s: s[0]):
        if out and (out[-1][1] is None or start <= out[-1][1]):
            last_start, last_end = out[-1]
            out[-1] = (last_start, None if end is None or last_end is None else max(end, last_end))
        else:
            out.append((start, end))
    return out


def readings(beat: Heartbeat, registered: Sequence[Gpu] | None = None) -> tuple[float | None, float | None]:
    """A heartbeat's mean GPU utilisation (percent) and total GPU memory used (MiB), ``None`` where
    no GPU reported the value; with ``registered`` (the GPUs the worker registered), only the
    readings of those GPUs (:func:`projections.liveness.registered_readings`)."""
    gpus = beat.gpus if registered is None else registered_readings(beat.gpus, registered)
    utils = [util for g in gpus if (util := util_reading(g)) is not None]
    mems = [g.mem_used_mb for g in gpus if g.mem_used_mb is not None]
    return (sum(utils) / len(utils) if utils else None, float(sum(mems)) if mems else None)


@dataclass
class _Bucket:
    beats: int = 0
    time_ns: int = 0
    util: float = 0.0
    utils: int = 0
    mem: float = 0.0
    mems: int = 0

    def add(self, time_ns: int, util: float | None, mem: float | None) -> None:
        self.beats += 1
        self.time_ns += time_ns
        if util is not None:
            self.util, self.utils = self.util + util, self.utils + 1
        if mem is not None:
            self.mem, self.mems = self.mem + mem, self.mems + 1

    def sample(self) -> GpuSample:
        return GpuSample(
            time_s=self.time_ns / self.beats / 1e9,
            util_pct=self.util / self.utils if self.utils else None,
            mem_used_mb=self.mem / self.mems if self.mems else None,
            beats=self.beats,
        )


class Downsampled:
    """At most ``points`` samples over ``[start_ns, end_ns]``: the time is cut into ``points`` equal
    buckets and each bucket's heartbeats are averaged (an empty bucket gives no sample)."""

    def __init__(self, start_ns: int, end_ns: int, points: int) -> None:
        self.start_ns = start_ns
        self.points = points
        self.width = max(1, -(-(end_ns - start_ns + 1) // points))
        self.buckets: dict[int, _Bucket] = {}

    def add(self, time_ns: int, util: float | None, mem: float | None) -> None:
        if util is None and mem is None:
            return
        index = min(self.points - 1, max(0, (time_ns - self.start_ns) // self.width))
        self.buckets.setdefault(index, _Bucket()).add(time_ns, util, mem)

    def samples(self) -> list[GpuSample]:
        return [self.buckets[i].sample() for i in sorted(self.buckets)]


async def _beats(log: EventLog, worker_id: str, spans: list[Span]) -> AsyncIterator[Recorded[Any]]:
    for start, end in spans:
        replay = log.replay(
            "HEARTBEATS",
            start_time=dt.datetime.fromtimestamp(start / 1e9, dt.UTC),
            until_time=None if end is None else dt.datetime.fromtimestamp(end / 1e9, dt.UTC),
            subjects=heartbeat_subject(worker_id),
        )
        async with contextlib.aclosing(replay) as records:
            async for record in records:
                if record.time_ns >= start and (end is None or record.time_ns <= end):
                    yield record


async def worker_telemetry(
    log: EventLog,
    worker_id: str,
    held: list[Tenure],
    job_assignments: set[str],
    points: int,
    now_ns: int,
    registered: Sequence[Gpu] | None = None,
) -> WorkerTelemetry:
    """The readings of ``worker_id`` while it held the tenures ``held`` of one job (of the GPUs
    ``registered``, when given)."""
    spans = merged((t.placed_ns, t.ended_ns) for t in held)
    last = spans[-1][1]
    series = Downsampled(spans[0][0], now_ns if last is None else last, points)
    beats = withheld = 0
    async for record in _beats(log, worker_id, spans):
        beat = record.event
        if not isinstance(beat, Heartbeat):
            continue
        beats += 1
        if not set(beat.running) <= job_assignments:
            withheld += 1
            continue
        series.add(record.time_ns, *readings(beat, registered))
    shown = [
        TelemetrySpan(
            assignment_id=t.assignment_id,
            slot=t.slot,
            epoch=t.epoch,
            placed_at=iso(t.placed_ns),
            ended_at=None if t.ended_ns is None else iso(t.ended_ns),
        )
        for t in held
    ]
    return WorkerTelemetry(
        worker_id=worker_id, spans=shown, beats=beats, withheld=withheld, samples=series.samples()
    )


async def job_telemetry(
    log: EventLog, job: JobRecord, points: int, now_ns: int, registry: RegistryState | None = None
) -> JobTelemetry:
    """GPU utilisation and memory of every worker that held an assignment of ``job``, while it did,
    at most ``points`` samples per worker (workers in the order they were first placed); with
    ``registry``, only readings of the GPUs each worker registered (a worker it does not know, or one
    registered without GPUs, shows none)."""
    replay = log.replay("JOBS", start_seq=job.submitted_seq, subjects=job_filter(job.tenant, job.job_id))
    fold = Tenures()
    async with contextlib.aclosing(replay) as records:
        async for record in records:
            fold.add(record)
    held = fold.all()
    by_worker: dict[str, list[Tenure]] = {}
    for t in held:
        by_worker.setdefault(t.worker_id, []).append(t)
    ids = {t.assignment_id for t in held}
    workers = [
        await worker_telemetry(
            log, worker_id, tenures_of, ids, points, now_ns, _registered_gpus(registry, worker_id)
        )
        for worker_id, tenures_of in by_worker.items()
    ]
    return JobTelemetry(job_id=job.job_id, points=points, workers=workers)


def _registered_gpus(registry: RegistryState | None, worker_id: str) -> Sequence[Gpu] | None:
    if registry is None:
        return None
    record = registry.workers.get(worker_id)
    return record.registration.gpus if record is not None else []
