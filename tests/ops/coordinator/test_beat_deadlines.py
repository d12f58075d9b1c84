"""The lost detector's heap of heartbeat deadlines against :func:`projections.liveness.overdue`."""

from __future__ import annotations

import random

from ops.coordinator.beat_deadlines import BeatDeadlines
from projections.liveness import LastBeat, LivenessState, overdue

S = 1_000_000_000


def test_silence_equals_overdue_and_names_the_next_real_deadline() -> None:
    rng = random.Random(1)
    silence, state = BeatDeadlines(), LivenessState()
    now = 0
    for seq in range(1, 2000):
        now += rng.choice([0, S // 10, S // 2])
        worker = f"w{rng.randrange(20)}"
        beat = LastBeat(seq=seq, time_ns=now - rng.choice([0, 2 * S]), interval_s=rng.choice([0.5, 1.0]))
        state.beats[worker] = beat
        silence.beat(worker, beat)
        silence.expire(now)
        assert sorted(silence.overdue) == overdue(state, now)
        pending = [
            b.time_ns + 3 * b.interval_s * S for w, b in state.beats.items() if w not in silence.overdue
        ]
        assert silence.next_deadline_ns() == min(pending, default=None)  # never one a newer beat replaced
