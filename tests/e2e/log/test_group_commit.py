"""Group commit (core.log.group_commit): concurrent appends to one stream go out as atomic batches,
and every append keeps its own meaning: its position, its conflict, its duplicate, its order."""

from __future__ import annotations

import asyncio
from collections import deque

import msgspec
import nats.js.api
import pytest

from core.errors import ConcurrencyConflict
from core.log import EventLog, new_event_id
from core.log.group_commit import MAX_BATCH, _Append, _take
from core.settings import Settings
from core.streams import STREAMS, job_filter, job_subject
from schemas.jobs import JobProgress, JobQueued, JobSubmitted


def submitted(name: str = "train") -> JobSubmitted:
    return JobSubmitted(name=name, kind="process", shards=1)


class Batches:
    """Counts the atomic batches a log sends, and their sizes."""

    def __init__(self, log: EventLog) -> None:
        self.sizes: list[int] = []
        original = log._publish_batch

        async def counting(messages, size):  # type: ignore[no-untyped-def]
            self.sizes.append(size)
            return await original(messages, size)

        assert log._group is not None
        log._group._publish_batch = counting


async def test_concurrent_appends_share_batches_and_each_gets_its_own_position(log: EventLog) -> None:
    batches = Batches(log)
    ids = [new_event_id() for _ in range(1200)]
    appends = [
        log.append(job_subject("acme", f"j{i % 50}", JobProgress), JobProgress(epoch=1, step=i), event_id=id_)
        for i, id_ in enumerate(ids)
    ]
    positions = await asyncio.gather(*appends)
    assert batches.sizes and max(batches.sizes) <= MAX_BATCH and sum(batches.sizes) >= 1000
    assert sorted(p.seq for p in positions) == list(range(1, 1201))
    records = [r async for r in log.replay("JOBS")]
    by_seq = {r.seq: r for r in records}
    for i, position in enumerate(positions):  # the position each append got holds that very event
        assert by_seq[position.seq].msg_id == ids[i]
        assert by_seq[position.seq].event.step == i
    assert [r.event.step for r in records] == list(range(1200)), "stored in the order appended"


async def test_racing_conditional_appends_on_one_connection_exactly_one_wins(log: EventLog) -> None:
    """The server checks a batch's expected sequences against the stream before the batch: two
    appends expecting the same sequence must never share one, or both would win."""
    batches = Batches(log)
    for round_ in range(30):
        job = f"race{round_}"
        base = await log.append(job_subject("acme", job, JobSubmitted), submitted())

        async def attempt(i: int, job: str = job, seq: int = base.seq) -> bool:
            try:
                await log.append(
                    job_subject("acme", job, JobQueued),
                    JobQueued(reason=f"attempt {i}"),
                    expected_seq=seq,
                    expected_filter=job_filter("acme", job),
                )
            except ConcurrencyConflict:
                return False
            return True

        others = [
            log.append(job_subject("acme", f"other{round_}-{i}", JobSubmitted), submitted()) for i in range(5)
        ]
        results = await asyncio.gather(*(attempt(i) for i in range(10)), *others)
        assert sum(1 for r in results[:10] if r is True) == 1, f"round {round_}"
    assert max(batches.sizes) > 1, "the unconditional appends beside them were batched"
    queued = [r async for r in log.replay("JOBS", subjects="job.acme.*.queued")]
    assert len(queued) == 30


async def test_a_conflict_in_a_batch_fails_that_append_alone(log: EventLog) -> None:
    first = await log.append(job_subject("acme", "busy", JobSubmitted), submitted())
    await log.append(job_subject("acme", "busy", JobQueued), JobQueued(reason="moved on"))
    stale = log.append(
        job_subject("acme", "busy", JobQueued),
        JobQueued(reason="stale"),
        expected_seq=first.seq,
        expected_filter=job_filter("acme", "busy"),
    )
    fine = [log.append(job_subject("acme", f"free{i}", JobSubmitted), submitted()) for i in range(20)]
    results = await asyncio.gather(stale, *fine, return_exceptions=True)
    assert isinstance(results[0], ConcurrencyConflict)
    assert all(not isinstance(r, BaseException) for r in results[1:])
    stored = [r async for r in log.replay("JOBS", subjects="job.acme.*.submitted")]
    assert len(stored) == 21


async def test_a_retried_id_in_a_batch_is_a_duplicate_and_the_rest_are_stored(log: EventLog) -> None:
    retried = new_event_id()
    original = await log.append(job_subject("acme", "r", JobSubmitted), submitted(), event_id=retried)
    again = log.append(job_subject("acme", "r", JobSubmitted), submitted(), event_id=retried)
    fresh = [log.append(job_subject("acme", f"n{i}", JobSubmitted), submitted()) for i in range(10)]
    positions = await asyncio.gather(again, *fresh)
    assert positions[0].duplicate and positions[0].seq == original.seq
    assert len({p.seq for p in positions[1:]}) == 10
    assert len([r async for r in log.replay("JOBS")]) == 11


async def test_a_stream_without_atomic_batches_still_takes_every_append(log: EventLog) -> None:
    """A stream created before group commit (no ``allow_atomic``) refuses batches: the appends go
    one by one instead, and nothing is lost or stored twice."""
    js = log._js
    jobs = next(s for s in STREAMS if s.name == "JOBS")
    info = await js.stream_info(jobs.name)
    info.config.allow_atomic = False
    await js.update_stream(info.config)
    batches = Batches(log)
    positions = await asyncio.gather(
        *(log.append(job_subject("acme", f"old{i}", JobSubmitted), submitted()) for i in range(50))
    )
    assert sorted(p.seq for p in positions) == list(range(1, 51))
    assert len(batches.sizes) == 1, "refused once, then one by one"
    assert log._group is not None and not log._group._queues["JOBS"].atomic


async def test_group_commit_off_sends_one_by_one(settings: Settings, log: EventLog) -> None:
    plain = await EventLog.connect(msgspec.structs.replace(settings, group_commit=False))
    try:
        assert plain._group is None
        positions = await asyncio.gather(
            *(plain.append(job_subject("acme", f"p{i}", JobSubmitted), submitted()) for i in range(20))
        )
        assert len({p.seq for p in positions}) == 20
    finally:
        await plain.close()


async def test_the_kernels_streams_allow_atomic_batches_and_those_agents_write_do_not(log: EventLog) -> None:
    agents_write = {"HEARTBEATS", "HEARTBEATS_LATEST", "INTAKE"}
    for spec in STREAMS:
        config = (await log._js.stream_info(spec.name)).config
        assert bool(config.allow_atomic) == (spec.name not in agents_write), spec.name
        if config.persist_mode == nats.js.api.PersistMode.ASYNC:
            assert not config.allow_atomic, spec.name  # the server refuses both together


# -- how a batch is cut (pure) -----------------------------------------------------------------------


def _item(subject: str, expected_filter: str | None = None) -> _Append:
    headers = {"Nats-Msg-Id": new_event_id()}
    if expected_filter is not None:
        headers["Nats-Expected-Last-Subject-Sequence"] = "1"
        if expected_filter != subject:
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = expected_filter
    return _Append(subject, b"{}", headers, 1 if expected_filter else None)


@pytest.mark.parametrize(
    ("earlier", "conditional", "joins"),
    [
        ("job.a.j1.progress", ("job.a.j2.placed", "job.a.j2.>"), True),
        ("job.a.j1.progress", ("job.a.j1.placed", "job.a.j1.>"), False),
        ("job.a.j1.placed", ("job.a.j1.placed", "job.a.j1.placed"), False),
        ("job.a.j10.x", ("job.a.j1.placed", "job.a.j1.>"), True),
        ("job.a.j1.x", ("job.a.j2.y", "job.*.j2.>"), False),  # past a wildcard: conservative
        ("worker.w1.registered", ("job.a.j1.placed", "job.a.j1.>"), True),
    ],
)
async def test_a_conditional_append_never_joins_a_batch_its_filter_covers(
    earlier: str, conditional: tuple[str, str], joins: bool
) -> None:
    pending = deque([_item(earlier), _item(*conditional)])
    batch = _take(pending, MAX_BATCH)
    assert len(batch) == (2 if joins else 1)


async def test_a_batch_holds_at_most_its_limit() -> None:
    pending = deque(_item(f"job.a.j{i}.x") for i in range(MAX_BATCH + 3))
    assert len(_take(pending, MAX_BATCH)) == MAX_BATCH
    assert len(pending) == 3
