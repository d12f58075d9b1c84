"""The coordinator's judge of whose silence it is (ops.coordinator.silence): pure, with a stand-in
for the log's one read."""

from __future__ import annotations

from typing import Any

from core.errors import LogUnavailable
from ops.coordinator.silence import BEHIND_NS, SilenceJudge

S = 1_000_000_000


class Newest:
    """What ``get_last("HEARTBEATS", "hb.>")`` answers: a beat stored at ``time_ns``, or an error."""

    def __init__(self) -> None:
        self.answer: Any = None

    async def get_last(self, stream: str, subject: str) -> Any:
        assert (stream, subject) == ("HEARTBEATS", "hb.>")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Beat:
    def __init__(self, time_ns: int) -> None:
        self.time_ns = time_ns


def judge() -> tuple[SilenceJudge, Newest]:
    newest = Newest()
    return SilenceJudge(newest), newest  # type: ignore[arg-type]


async def test_a_silence_the_stream_confirms_is_the_workers() -> None:
    silence, newest = judge()
    silence.beat(100 * S)
    newest.answer = Beat(100 * S)  # nothing newer than what we received: they are silent
    assert await silence.workers_to_blame(104 * S, {"w1"}, 1.0)
    assert not silence.postponed


async def test_a_lone_worker_that_died_is_still_blamed() -> None:
    silence, newest = judge()
    silence.beat(100 * S)
    newest.answer = Beat(100 * S)
    assert await silence.workers_to_blame(200 * S, {"only"}, 1.0)


async def test_a_stream_that_does_not_answer_postpones_until_the_workers_had_time_to_beat() -> None:
    silence, newest = judge()
    silence.beat(100 * S)
    newest.answer = LogUnavailable("the HEARTBEATS stream did not answer: its leader may be changing")
    assert not await silence.workers_to_blame(104 * S, {"w1", "w2"}, 1.0)
    assert silence.postponed == {"w1", "w2"}
    newest.answer = Beat(109 * S)  # a leader again; the beats stored since are reaching us
    silence.beat(109 * S)
    assert not await silence.workers_to_blame(106 * S, {"w1", "w2"}, 1.0), "within 3 intervals of the outage"
    assert await silence.workers_to_blame(108 * S, {"w2"}, 1.0), "w2 did not beat again in time"
    assert silence.postponed == {"w1"}


async def test_beats_the_stream_holds_but_we_did_not_receive_postpone() -> None:
    silence, newest = judge()
    silence.beat(100 * S)
    newest.answer = Beat(100 * S + BEHIND_NS + 1)  # our consumer is behind the stream
    assert not await silence.workers_to_blame(104 * S, {"w1"}, 2.0)
    assert silence.postponed == {"w1"}
    silence.beat(103 * S)
    newest.answer = Beat(103 * S)
    assert not await silence.workers_to_blame(105 * S, {"w1"}, 2.0), "6 s allowance after the delay"
    assert await silence.workers_to_blame(111 * S, {"w1"}, 2.0)
