"""Liveness: the HEARTBEATS stream (``hb.<worker_id>``) folded into each worker's latest beat.

Time is the envelope's store time (the server's clock, the same clock for every worker), so a
silence is measured against a ``now_ns`` the caller takes from the same server.

Beside the latest beats, the state keeps what the fleet's agents reported of their GPUs'
utilisation, per fleet bucket of store time (:mod:`projections.days`): the sum of every ``util_pct``
reading and their number, for a mean (:func:`reported_util`). These are the agents' own words (NVML
as each host read it), kept for the operator's fleet chart and believed about nothing. The bucket of
the latest beat is summed in three plain fields (a beat costs two additions, not a dict update) and
moves into ``util`` when a beat of another bucket arrives; buckets older than
:data:`~projections.days.BUCKETS_KEPT` are dropped then.

**A worker's beat budget.** Agents publish their own beats (no intake judges them), so one agent can
publish thousands a second. The fold admits at most one beat of a worker per :data:`MIN_BEAT_GAP_NS`
of store time (:func:`admit_beat`, the projection's ``admit``): a beat stored sooner after the
worker's latest admitted one is passed over *before it is decoded* by every runner (the coordinator's,
the gateway's and so its feed, the projector's, :func:`projections.runner.rebuild`), so a flood costs
each of them a dictionary lookup per beat, is never decoded, never quarantined, never folded and
never fanned out, and leaves every other worker's beats as they were. Since a worker's believed
interval is at least :data:`schemas.workers.MIN_BEAT_INTERVAL_S` (twice the gap), an honest agent
loses no beat to it, and a worker is never declared silent between the beats the fold admits. Time
is the store time (the server's clock), and a beat stored *before* the latest admitted one (a new
stream leader's clock behind the old one's) is admitted: the budget never silences a worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from core.clock import LOST_AFTER_INTERVALS, NS_PER_S, silent_at
from projections.base import Projection
from projections.days import BUCKET_NS, BUCKETS_KEPT
from schemas.envelope import Recorded
from schemas.values import Gpu, GpuTelemetry
from schemas.workers import MIN_BEAT_INTERVAL_S, Heartbeat

MIN_BEAT_GAP_NS = int(MIN_BEAT_INTERVAL_S * NS_PER_S) // 2
"""The least store time between two beats of one worker the fold admits, nanoseconds (0.1 s: at most
ten beats of a worker a second are decoded and folded, whatever it publishes)."""
_HB_PREFIX = len("hb.")


class LastBeat(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's latest heartbeat.

    Attributes:
        seq: its HEARTBEATS sequence.
        time_ns: its envelope store time, Unix nanoseconds.
        interval_s: the agent's heartbeat interval, seconds.
        gpus / cpu_pct / memory_used_mb / running: as the heartbeat reported them.
    """

    seq: int
    time_ns: int
    interval_s: float
    gpus: list[GpuTelemetry] = []
    cpu_pct: float = 0.0
    memory_used_mb: int = 0
    running: list[str] = []


class LivenessState(msgspec.Struct, kw_only=True):
    """The latest beat of every worker that ever beat; ``seq`` is the last sequence applied.

    Attributes:
        admitted: worker id -> store time (Unix ns) of its latest beat :func:`admit_beat` admitted
            (decoded or not); admitted_seq: the last sequence it was asked about.
        util: fleet bucket -> ``(sum of util_pct, readings)`` of the GPU readings beats carried,
            for every bucket but the open one.
        util_bucket / util_sum / util_readings: the open bucket (of the latest beat with a
            reading) and its sum and readings.
    """

    seq: int = 0
    beats: dict[str, LastBeat] = {}
    admitted: dict[str, int] = {}
    admitted_seq: int = 0
    util: dict[str, tuple[float, int]] = {}
    util_bucket: int = 0
    util_sum: float = 0.0
    util_readings: int = 0


def evolve(state: LivenessState, recorded: Recorded[Any]) -> LivenessState:
    """Apply one heartbeat; records at or below ``state.seq`` are already applied and ignored."""
    if recorded.seq <= state.seq:
        return state
    state.seq = recorded.seq
    event = recorded.event
    match event:
        case Heartbeat():
            state.beats[recorded.token(1)] = LastBeat(
                seq=recorded.seq,
                time_ns=recorded.time_ns,
                interval_s=event.interval_s,
                gpus=event.gpus,
                cpu_pct=event.cpu_pct,
                memory_used_mb=event.memory_used_mb,
                running=event.running,
            )
            if event.gpus:
                _count_util(state, recorded.time_ns // BUCKET_NS, event.gpus)
    return state


def admit_beat(state: LivenessState, subject: str, seq: int, time_ns: int) -> bool:
    """Whether the message stored at ``seq`` on ``subject`` (``hb.<worker_id>``) at ``time_ns`` is
    within its worker's budget: none of the worker's beats was admitted in the :data:`MIN_BEAT_GAP_NS`
    before it. An admitted message is recorded in ``state`` (it is then decoded and folded, or
    quarantined); one at or below the last sequence asked about is not admitted again."""
    if seq <= state.admitted_seq:
        return False
    state.admitted_seq = seq
    worker_id = subject[_HB_PREFIX:]
    last = state.admitted.get(worker_id)
    if last is not None and 0 <= time_ns - last < MIN_BEAT_GAP_NS:
        return False  # over budget: passed over, undecoded
    state.admitted[worker_id] = time_ns
    return True


def util_reading(gpu: GpuTelemetry) -> float | None:
    """A GPU's ``util_pct`` when it is a percentage (0 to 100), else ``None``: an agent's heartbeat is
    its own word, and a reading of NaN, an infinity or 10**9 would spoil every mean it joined (the
    fleet's, a job's chart, the autoscaler's) instead of showing one host's claim."""
    util = gpu.util_pct
    return util if util is not None and 0.0 <= util <= 100.0 else None


def registered_readings(gpus: Sequence[GpuTelemetry], registered: Sequence[Gpu]) -> list[GpuTelemetry]:
    """The readings of ``gpus`` about GPUs the worker registered (by NVML index, the first reading of
    each), in the beat's order: a GPU reading is believed only of a GPU the kernel knows the worker
    has. A worker registered without GPUs has none to show, whatever its beats say (a CPU host's
    "100% busy" scales nothing and is shown to no tenant)."""
    indexes = {g.index for g in registered}
    if not indexes:
        return []
    out: list[GpuTelemetry] = []
    for reading in gpus:
        if reading.index in indexes:
            indexes.discard(reading.index)
            out.append(reading)
    return out


def _count_util(state: LivenessState, bucket: int, gpus: list[GpuTelemetry]) -> None:
    # one reading per GPU (the first of each NVML index, as registered_readings keeps): a beat that
    # repeats one index 64 times weighs as one GPU, not 64
    total, readings = 0.0, 0
    seen: set[int] = set()
    for gpu in gpus:
        if gpu.index in seen:
            continue
        seen.add(gpu.index)
        util = util_reading(gpu)
        if util is not None:
            total += util
            readings += 1
    if not readings:
        return
    if bucket == state.util_bucket:
        state.util_sum += total
        state.util_readings += readings
        return
    if state.util_readings:  # close the open bucket (adding to it if time went back and forth)
        key = str(state.util_bucket)
        closed = state.util.get(key, (0.0, 0))
        state.util[key] = (closed[0] + state.util_sum, closed[1] + state.util_readings)
    first = bucket - BUCKETS_KEPT
    if any(int(b) < first for b in state.util):
        state.util = {b: u for b, u in state.util.items() if int(b) >= first}
    state.util_bucket, state.util_sum, state.util_readings = bucket, total, readings


def reported_util(state: LivenessState, bucket: int) -> tuple[float, int]:
    """``(sum of util_pct, readings)`` of the GPU readings in the beats of fleet bucket ``bucket``."""
    total, readings = state.util.get(str(bucket), (0.0, 0))
    if bucket == state.util_bucket:
        return total + state.util_sum, readings + state.util_readings
    return total, readings


LIVENESS: Projection[LivenessState] = Projection(
    name="liveness",
    stream="HEARTBEATS",
    version=5,
    state_type=LivenessState,
    evolve=evolve,
    admit=admit_beat,
)
"""Version 4: beats are bounded where decoded (:class:`schemas.workers.Heartbeat`); a snapshot of an
older version may hold a beat that is now refused (an interval of ``1e308``), and is rebuilt.
Version 5: at most one beat of a worker per :data:`MIN_BEAT_GAP_NS` is admitted (:func:`admit_beat`),
and a beat's utilisation counts one reading per GPU index; an older snapshot may hold a beat now
passed over, and has no ``admitted``."""


def silent_for(state: LivenessState, worker_id: str, now_ns: int) -> float | None:
    """Seconds since the worker's latest beat at ``now_ns`` (0.0 if the beat is in the future);
    ``None`` for a worker that never beat."""
    beat = state.beats.get(worker_id)
    if beat is None:
        return None
    return max(0, now_ns - beat.time_ns) / NS_PER_S


def overdue(state: LivenessState, now_ns: int, intervals: float = LOST_AFTER_INTERVALS) -> list[str]:
    """Workers silent for more than ``intervals`` of their own heartbeat intervals, by worker id."""
    late = []
    for worker_id in sorted(state.beats):
        beat = state.beats[worker_id]
        if silent_at(now_ns, beat.time_ns, beat.interval_s, intervals):
            late.append(worker_id)
    return late
