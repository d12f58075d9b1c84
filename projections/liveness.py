"""Liveness: the HEARTBEATS stream (``hb.<worker_id>``) folded into each worker's latest beat.

Time is the envelope's store time (the server's clock, the same clock for every worker), so a
silence is measured against a ``now_ns`` the caller takes from the same server.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.clock import LOST_AFTER_INTERVALS, NS_PER_S, silent_at
from projections.base import Projection
from schemas.envelope import Recorded
from schemas.values import GpuTelemetry
from schemas.workers import Heartbeat

"""A worker silent for this many of its own heartbeat intervals is lost."""


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
    """The latest beat of every worker that ever beat; ``seq`` is the last sequence applied."""

    seq: int = 0
    beats: dict[str, LastBeat] = {}


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
    return state


LIVENESS: Projection[LivenessState] = Projection(
    name="liveness", stream="HEARTBEATS", version=1, state_type=LivenessState, evolve=evolve
)


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
