"""Contract tests of the event log against a real nats-server."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import nats
import nats.js.api
import pytest
from nats.protocol.parser import Parser

import core.log.acks
import core.log.frames
import core.log.scan
from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict
from core.log import NO_RESPONDERS_RETRY_S, EventLog, new_event_id
from core.log.queues import Pulled
from core.settings import Settings
from core.streams import heartbeat_subject, intake_subject, job_filter, job_subject
from schemas.catalog import encode
from schemas.jobs import JobProgress, JobQueued, JobSubmitted
from schemas.workers import Heartbeat


def submitted(name: str = "train") -> JobSubmitted:
    return JobSubmitted(name=name, kind="process", shards=1)


async def all_records(log: EventLog, stream: str, **bounds: object) -> list[Any]:
    return [r async for r in log.replay(stream, **bounds)]  # type: ignore[arg-type]


@pytest.fixture(params=["pulled", "ordered"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a read test through both of ``scan``'s paths: the pull consumer whose messages the tap
    takes off the connection, and nats-py's ordered push consumer (where the tap cannot attach)."""
    if request.param == "ordered":
        monkeypatch.setattr(core.log.frames.RawTap, "attach", staticmethod(lambda nc: None))
    return str(request.param)


async def test_append_returns_position_and_replay_decodes(log: EventLog) -> None:
    position = await log.append(job_subject("acme", "j1", JobSubmitted), submitted(), event_id="e-1")
    assert (position.stream, position.seq, position.duplicate) == ("JOBS", 1, False)
    [record] = await all_records(log, "JOBS")
    assert record.seq == 1
    assert record.subject == "job.acme.j1.submitted"
    assert record.msg_id == "e-1"
    assert record.token(2) == "j1"
    assert record.event == submitted()
    assert record.time_ns > 0


async def test_retried_append_with_same_id_is_stored_once(log: EventLog) -> None:
    subject = job_subject("acme", "j1", JobSubmitted)
    first = await log.append(subject, submitted(), event_id="same")
    again = await log.append(subject, submitted(), event_id="same")
    assert again == first._replace(duplicate=True)
    assert len(await all_records(log, "JOBS")) == 1


async def test_expected_sequence_on_subject(log: EventLog) -> None:
    subject = job_subject("acme", "j1", JobQueued)
    first = await log.append(subject, JobQueued(reason="a"), expected_seq=0)
    await log.append(subject, JobQueued(reason="b"), expected_seq=first.seq)
    with pytest.raises(ConcurrencyConflict) as caught:
        await log.append(subject, JobQueued(reason="c"), expected_seq=first.seq)
    assert caught.value.code == "concurrency_conflict"
    assert caught.value.expected == first.seq
    with pytest.raises(ConcurrencyConflict):
        await log.append(subject, JobQueued(reason="d"), expected_seq=0)


async def test_expected_sequence_over_a_wildcard_filter(log: EventLog) -> None:
    """The subject-filter variant: any event of the job since I read it is a conflict."""
    seen = await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    # Another job's events do not conflict with j1.
    await log.append(job_subject("acme", "j2", JobSubmitted), submitted())
    decided = await log.append(
        job_subject("acme", "j1", JobQueued),
        JobQueued(reason="x"),
        expected_seq=seen.seq,
        expected_filter=job_filter("acme", "j1"),
    )
    # A progress event of j1 lands on a different subject but inside the filter.
    await log.append(job_subject("acme", "j1", JobProgress), JobProgress(epoch=1))
    with pytest.raises(ConcurrencyConflict):
        await log.append(
            job_subject("acme", "j1", JobQueued),
            JobQueued(reason="y"),
            expected_seq=decided.seq,
            expected_filter=job_filter("acme", "j1"),
        )
    # Nothing of a new job yet: 0 is the expected sequence for "create".
    await log.append(
        job_subject("acme", "j9", JobSubmitted),
        submitted(),
        expected_seq=0,
        expected_filter=job_filter("acme", "j9"),
    )


async def test_ten_concurrent_appenders_exactly_one_wins(settings: Settings, log: EventLog) -> None:
    """10 connections race with the same expected sequence, 200 times: one winner every time."""
    appenders = [await EventLog.connect(settings, name=f"appender-{i}") for i in range(10)]
    try:
        for round_ in range(200):
            job = f"race{round_}"
            filt = job_filter("acme", job)
            base = await log.append(job_subject("acme", job, JobSubmitted), submitted())

            async def attempt(
                appender: EventLog, i: int, job: str = job, filt: str = filt, seq: int = base.seq
            ) -> bool:
                try:
                    await appender.append(
                        job_subject("acme", job, JobQueued),
                        JobQueued(reason=f"appender {i}"),
                        expected_seq=seq,
                        expected_filter=filt,
                    )
                except ConcurrencyConflict:
                    return False
                return True

            results = await asyncio.gather(*(attempt(a, i) for i, a in enumerate(appenders)))
            assert sum(results) == 1, f"round {round_}: {sum(results)} winners"
        queued = [r async for r in log.replay("JOBS", subjects="job.acme.*.queued")]
        assert len(queued) == 200
    finally:
        for appender in appenders:
            await appender.close()


async def bulk_append(log: EventLog, items: Iterable[Any]) -> None:
    """Append many events to set a scene, on a connection that waits up to a minute for each
    acknowledgement: a server shared with a busy test session may take longer than the default 5 s
    to fsync thousands of appends, and these tests are about reading them back."""
    patient = await EventLog.connect(msgspec.structs.replace(log.settings, ack_timeout_s=60.0))
    try:
        await patient.append_many(items)
    finally:
        await patient.close()


async def test_append_many_keeps_order_and_ids(log: EventLog) -> None:
    ids = [new_event_id() for _ in range(2000)]
    assert len(set(ids)) == 2000
    items = [
        (job_subject("acme", f"j{i % 7}", JobProgress), JobProgress(epoch=1, step=i), ids[i])
        for i in range(2000)
    ]
    positions = await log.append_many(items, max_in_flight=64)
    assert [p.seq for p in positions] == list(range(1, 2001))
    records = await all_records(log, "JOBS")
    assert [r.event.step for r in records] == list(range(2000))
    assert [r.msg_id for r in records] == ids
    # The same batch again is all duplicates: nothing stored twice.
    again = await log.append_many(items)
    assert all(p.duplicate for p in again)
    assert len(await all_records(log, "JOBS")) == 2000


async def test_rejected_append_fails_instead_of_hanging(log: EventLog) -> None:
    """nats-py 2.16's publish_async never resolves on a rejection; ours raises."""
    with pytest.raises(AppendRejected, match="no stream captures"):
        await log.append("nostream.x", JobQueued(reason="x"))
    with pytest.raises(AppendRejected):
        await log.append_many(
            [
                (job_subject("acme", "j1", JobQueued), JobQueued(reason="ok")),
                ("nostream.y", JobQueued(reason="x")),
            ]
        )


async def test_an_append_nothing_answered_is_retried_until_a_stream_answers(log: EventLog) -> None:
    """What a server reloading its accounts looks like to an append: ~50 ms of no responders. The
    append is retried with the same message id and lands once, when something answers."""

    async def create_stream_later() -> None:
        await asyncio.sleep(0.2)
        await log._js.add_stream(nats.js.api.StreamConfig(name="LATE", subjects=["late.>"]))

    creating = asyncio.create_task(create_stream_later())
    try:
        started = time.monotonic()
        position = await log.append("late.x", JobQueued(reason="after a silence"))
        assert position.stream == "LATE" and position.seq == 1 and not position.duplicate
        assert 0.2 <= time.monotonic() - started < NO_RESPONDERS_RETRY_S + 0.5
    finally:
        await creating
        await log._js.delete_stream("LATE")


async def jobs_gone_for(log: EventLog, seconds: float) -> asyncio.Task[None]:
    """Delete JOBS and make it again ``seconds`` later (what a leaderless stream looks like to an
    append: nothing answers); the task that makes it again."""
    info = await log._js.stream_info("JOBS")
    await log._js.delete_stream("JOBS")

    async def recreate_later() -> None:
        await asyncio.sleep(seconds)
        await log._js.add_stream(info.config)

    return asyncio.create_task(recreate_later())


async def test_an_append_to_a_stream_of_ours_waits_for_a_leader_past_a_second(log: EventLog) -> None:
    """A replicated stream whose leader died answers nothing for 4-9 s: an append to a subject our
    streams capture keeps trying (with the same id) until a leader answers."""
    recreating = await jobs_gone_for(log, 2.0)
    started = time.monotonic()
    position = await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    assert position.stream == "JOBS" and position.seq == 1
    assert time.monotonic() - started >= 2.0
    await recreating


async def test_a_batch_to_a_stream_of_ours_waits_for_a_leader_too(log: EventLog) -> None:
    """``append_many`` (an agent's reports, a dispatcher's beats) waits for a leader as ``append``
    does, and stores each event once, in order."""
    recreating = await jobs_gone_for(log, 2.0)
    items = [(job_subject("acme", f"j{n}", JobSubmitted), submitted(), f"batch-{n}") for n in range(3)]
    started = time.monotonic()
    positions = await log.append_many(items)
    assert [(p.stream, p.seq) for p in positions] == [("JOBS", 1), ("JOBS", 2), ("JOBS", 3)]
    assert time.monotonic() - started >= 2.0
    assert [r.msg_id for r in await all_records(log, "JOBS")] == ["batch-0", "batch-1", "batch-2"]
    await recreating


async def test_a_pulled_message_handed_back_comes_again_after_its_delay(log: EventLog) -> None:
    """A claim the intake could not settle (the log it leads to had no leader) is delivered again
    after the delay it asks for, not after the consumer's 60 s ack wait."""
    claim = intake_subject("w1", job_subject("acme", "j1", JobQueued))
    await log.append(claim, JobQueued(reason="claimed"))
    pulling = log.pull("INTAKE", "test-retry", batch=1, wait_s=0.2)
    try:
        first = await next_pulled(pulling)
        await first.retry(0.5)
        handed_back = time.monotonic()
        again = await next_pulled(pulling)
        assert (again.seq, again.delivered) == (first.seq, 2)
        assert 0.4 <= time.monotonic() - handed_back < 5.0
        await again.ack()
    finally:
        await pulling.aclose()


async def next_pulled(pulling: AsyncIterator[list[Pulled]]) -> Pulled:
    while not (batch := await asyncio.wait_for(anext(pulling), 10)):
        pass
    [pulled] = batch
    return pulled


def test_a_lost_race_worded_by_a_replicated_streams_leader_is_a_conflict() -> None:
    for code in (10071, 10164):
        error = core.log.acks._AckError(code=400, err_code=code, description="wrong last sequence: 7")
        assert isinstance(
            core.log.acks._conflict_or_rejection("job.a.j.placed", 6, error), ConcurrencyConflict
        )
    other = core.log.acks._AckError(code=400, err_code=10060, description="expected stream does not match")
    assert not isinstance(
        core.log.acks._conflict_or_rejection("job.a.j.placed", 6, other), ConcurrencyConflict
    )


async def test_unacknowledged_append_times_out(nats_server: object, log: EventLog) -> None:
    """A subject answered by a plain subscriber that never replies: the ack never comes."""
    url = log.settings.nats_url
    silent = await nats.connect(url)

    async def ignore(msg: object) -> None:
        return None

    await silent.subscribe("void.>", cb=ignore)
    await silent.flush()
    quick = await EventLog.connect(Settings(nats_url=url, ack_timeout_s=0.5))
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(AppendTimeout):
            await quick.append("void.x", JobQueued(reason="x"))
        assert asyncio.get_running_loop().time() - started < 2.0
        with pytest.raises(AppendTimeout):
            await quick.append_many([("void.y", JobQueued(reason="x"))] * 10)
    finally:
        await quick.close()
        await silent.close()


async def test_replay_bounds_by_sequence_and_time(log: EventLog, read_path: str) -> None:
    for i in range(10):
        await log.append(job_subject("acme", "j1", JobProgress), JobProgress(epoch=1, step=i))
    middle = [r.seq for r in await all_records(log, "JOBS", start_seq=3, until_seq=6)]
    assert middle == [3, 4, 5, 6]
    assert await all_records(log, "JOBS", start_seq=11) == []
    records = await all_records(log, "JOBS")
    ns = records[4].time_ns  # floor to the microsecond a datetime holds
    cut = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC) + timedelta(
        microseconds=ns % 1_000_000_000 // 1000
    )
    before = await all_records(log, "JOBS", until_time=cut)
    after = await all_records(log, "JOBS", start_time=cut)
    assert before[-1].seq >= 4 and before[-1].seq < 10
    assert after[0].seq <= 5 and after[-1].seq == 10
    assert [r.seq for r in records] == list(range(1, 11))


async def test_replay_with_a_filter_that_matches_nothing_ends(log: EventLog, read_path: str) -> None:
    await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    assert await asyncio.wait_for(all_records(log, "JOBS", subjects="job.nobody.>"), timeout=5) == []
    assert await all_records(log, "ENDPOINTS") == []


async def test_a_read_covers_what_this_connection_had_acknowledged(
    log: EventLog, read_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's info can come from a replica behind its leader (a follower that knows no leader
    answers with its own store's state): a reader that wrote a moment before still reads its writes."""
    behind = await log._js.stream_info("JOBS")  # empty: what a replica that missed both would say
    first = await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    second = await log.append(job_subject("acme", "j1", JobQueued), JobQueued(reason="x"))

    async def stale(stream: str, *args: object, **kwargs: object) -> nats.js.api.StreamInfo:
        return behind

    monkeypatch.setattr(log._js, "stream_info", stale)
    assert await log.last_seq("JOBS") == second.seq
    read = await all_records(log, "JOBS", subjects=job_filter("acme", "j1"))
    assert [r.seq for r in read] == [first.seq, second.seq]


async def test_malformed_event_is_quarantined_and_skipped(log: EventLog) -> None:
    await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    await log.publish_raw("job.acme.j1.submitted", b'{"type":"job.submitted","shards":"many"}')
    await log.publish_raw("job.acme.j1.garbage", b"not json at all")
    await log.append(job_subject("acme", "j1", JobQueued), JobQueued(reason="after"))
    records = await all_records(log, "JOBS")
    assert [r.seq for r in records] == [1, 4]
    # Reading again quarantines nothing twice (the quarantine id is stream + sequence).
    await all_records(log, "JOBS")
    await asyncio.sleep(0.3)
    quarantined = await log.replay_raw("QUARANTINE")
    assert [q.msg_id for q in quarantined] == ["quarantine-JOBS-2", "quarantine-JOBS-3"]
    assert quarantined[1].data == b"not json at all"
    assert quarantined[0].subject == "quarantine.JOBS"


async def test_follow_yields_stored_then_live_events(log: EventLog) -> None:
    await log.append(job_subject("acme", "j1", JobSubmitted), submitted())
    follower = log.follow("JOBS")
    first = await asyncio.wait_for(anext(follower), 5)
    await log.append(job_subject("acme", "j1", JobQueued), JobQueued(reason="live"))
    second = await asyncio.wait_for(anext(follower), 5)
    await follower.aclose()
    assert (first.seq, second.seq) == (1, 2)
    assert second.event == JobQueued(reason="live")


async def test_latest_heartbeat_is_kept_per_worker(log: EventLog) -> None:
    for cpu in (10.0, 20.0, 30.0):
        await log.append(heartbeat_subject("w1"), Heartbeat(cpu_pct=cpu))
    await log.append(heartbeat_subject("w2"), Heartbeat(cpu_pct=99.0))
    for _ in range(50):
        latest = await log.get_last("HEARTBEATS_LATEST", heartbeat_subject("w1"))
        if latest is not None and latest.event.cpu_pct == 30.0:
            break
        await asyncio.sleep(0.05)
    assert latest is not None and latest.event.cpu_pct == 30.0
    assert await log.get_last("HEARTBEATS_LATEST", heartbeat_subject("nobody")) is None


async def test_snapshots_round_trip(log: EventLog) -> None:
    assert await log.get_snapshot("projection.x") is None
    blob = b"x" * 3_000_000
    await log.put_snapshot("projection.x", blob)
    assert await log.get_snapshot("projection.x") == blob


async def test_a_failing_scan_callback_raises_instead_of_being_swallowed(
    log: EventLog, read_path: str
) -> None:
    for i in range(3):
        await log.append(job_subject("acme", "j1", JobProgress), JobProgress(epoch=1, step=i))

    def explode(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        if seq == 3:
            raise RuntimeError("reducer bug")

    with pytest.raises(RuntimeError, match="reducer bug"):
        await asyncio.wait_for(log.scan("JOBS", explode), timeout=10)


async def test_scan_delivers_every_stored_message_once_in_order_up_to_its_start(
    log: EventLog, read_path: str
) -> None:
    """Several pull requests' worth of messages, a subject filter, bounds, an awaitable callback that
    appends while the scan runs (so that acknowledgements share the connection with the scan's
    messages): every message stored when the scan began, once, in order, and nothing after."""
    total = 9_000
    ids = [f"id-{i}" for i in range(total)]
    await bulk_append(
        log,
        (
            (job_subject("acme", f"j{i % 5}", JobProgress), JobProgress(epoch=1, step=i), ids[i])
            for i in range(total)
        ),
    )
    seen: list[tuple[str, int, int, str, bytes]] = []

    async def collect_and_append(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        seen.append((subject, seq, time_ns, msg_id, data))
        if seq % 1_000 == 0:  # stored after the scan began: not delivered
            await log.append(job_subject("acme", "late", JobQueued), JobQueued(reason=f"after {seq}"))

    assert await log.scan("JOBS", collect_and_append) == total
    assert [s[1] for s in seen] == list(range(1, total + 1))
    assert [s[3] for s in seen] == ids
    assert [s[0] for s in seen[:6]] == [f"job.acme.j{i % 5}.progress" for i in range(6)]
    assert seen[0][4] == encode(JobProgress(epoch=1, step=0))
    assert all(a[2] <= b[2] for a, b in itertools.pairwise(seen)) and seen[0][2] > 0
    assert await log.last_seq("JOBS") == total + 9

    some: list[int] = []
    delivered = await log.scan(
        "JOBS", lambda *m: some.append(m[1]), start_seq=4_000, until_seq=8_500, subjects="job.acme.j2.>"
    )
    assert some == [seq for seq in range(4_000, 8_501) if (seq - 1) % 5 == 2] and delivered == len(some)
    late: list[str] = []
    await log.scan("JOBS", lambda *m: late.append(m[3]), start_seq=total + 1)
    assert len(late) == 9


async def test_a_scan_whose_consumer_disappears_goes_on_after_its_last_message(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pull consumer deleted under a running scan (an operator, a server restart): the scan makes
    a new one after the last message it delivered, and delivers the rest once."""
    monkeypatch.setattr(core.log.scan, "_SCAN_STALL_S", 0.5)
    total = 10_000
    await bulk_append(
        log, ((job_subject("acme", "j1", JobProgress), JobProgress(epoch=1, step=i)) for i in range(total))
    )
    other = await nats.connect(log.settings.nats_url)
    deleted: list[str] = []
    seqs: list[int] = []

    async def deliver(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        seqs.append(seq)
        if seq in (3_000, 9_000):  # in the first consumer's second batch, in the next consumer's
            js = other.jetstream()
            for info in await js.consumers_info("JOBS"):
                await js.delete_consumer("JOBS", info.name)
                deleted.append(info.name)

    try:
        assert await asyncio.wait_for(log.scan("JOBS", deliver), timeout=30) == total
    finally:
        await other.close()
    assert len(deleted) == 2 and deleted[0] != deleted[1]
    assert seqs == list(range(1, total + 1))
    assert await other_consumers(log) == []


async def other_consumers(log: EventLog) -> list[str]:
    """The consumers left on JOBS (a finished scan deletes its own)."""
    return [info.name for info in await log._js.consumers_info("JOBS")]


class _Connection:
    """What nats-py's protocol parser calls on its connection, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self._ps = Parser(self)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        self.calls.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: dict[str, object]) -> None:
        self.calls.append(("info", info))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))


def _hmsg(subject: str, sid: int, reply: str, headers: bytes, data: bytes) -> bytes:
    size = f"{len(headers)} {len(headers) + len(data)}"
    return f"HMSG {subject} {sid} {reply} {size}\r\n".replace("  ", " ").encode() + headers + data + b"\r\n"


def _msg(subject: str, sid: int, reply: str, data: bytes) -> bytes:
    return f"MSG {subject} {sid} {reply} {len(data)}\r\n".replace("  ", " ").encode() + data + b"\r\n"


async def test_the_tap_takes_its_frames_and_leaves_every_other_one_to_nats_py() -> None:
    """Frames of tapped and other subscriptions and control lines, cut at every possible place:
    the tap's sink gets its messages, nats-py's parser everything else, each once and in order, even
    when the tap is installed in the middle of a frame."""
    headers = b"NATS/1.0\r\nNats-Msg-Id: e1\r\n\r\n"
    frames = [
        (_hmsg("meter.a.w.x.tick", 7, "$JS.ACK.M.c.1.1.1.5.9", headers, b'{"n":1}'), 7),
        (_msg("_INBOX.ack.1", 3, "", b'{"stream":"JOBS","seq":1}'), 3),
        (b"PING\r\n", 0),
        (_msg("meter.a.w.x.tick", 7, "$JS.ACK.M.c.1.2.2.6.8", b"{}"), 7),
        (_hmsg("_INBOX.x", 7, "", b"NATS/1.0 408 Request Timeout\r\n\r\n", b""), 7),
        (b"+OK\r\n", 0),
        (_hmsg("job.a.j.queued", 3, "reply.1", headers, b"x" * 3_000), 3),
        (b'INFO {"server_id":"s"}\r\n', 0),
        (_hmsg("meter.a.w.y.tick", 7, "$JS.ACK.M.c.1.3.3.7.7", headers, b"y" * 5_000), 7),
        (b"PONG\r\n", 0),
    ]
    stream = b"".join(frame for frame, _ in frames)
    expected = _Connection()
    for frame, _ in frames:
        await expected._ps.parse(frame)
    ours = [call for call in expected.calls if call[:2] == ("msg", 7)]
    theirs = [call for call in expected.calls if call[:2] != ("msg", 7)]
    assert len(ours) == 4 and len(theirs) == 5  # +OK calls nothing

    rng = random.Random(5)
    for case in range(300):
        connection = _Connection()
        tap = core.log.frames.RawTap.attach(connection)  # type: ignore[arg-type]
        assert tap is not None
        sink = core.log.frames.Sink()
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
        chunks = [stream[a:b] for a, b in itertools.pairwise([0, *cuts, len(stream)])]
        installed_after = rng.randrange(len(chunks)) if case % 2 else 0
        for i, chunk in enumerate(chunks):
            if i == installed_after:
                tap.add(7, sink)
            await connection._ps.parse(chunk)
        tapped = [("msg", 7, *frame) for frame in sink.frames]
        # frames of sid 7 completed before the tap was installed went to nats-py: fine, in order
        early = [call for call in connection.calls if call[:2] == ("msg", 7)]
        assert early + tapped == ours, case
        assert [call for call in connection.calls if call[:2] != ("msg", 7)] == theirs, case
        assert sink.arrived.is_set() == bool(tapped)
        tap.remove(7)
        assert "parse" not in vars(connection._ps)  # nats-py's own parser again
        await connection._ps.parse(_msg("after", 7, "", b"z"))
        assert connection.calls[-1] == ("msg", 7, b"after", b"", b"z", None)


async def test_work_queue_stream_is_read_without_consuming_it(log: EventLog) -> None:
    from core.streams import command_subject
    from schemas.commands import StopWork

    stop = StopWork(work_id="j1", assignment_id="a1", epoch=1, reason="preempted")
    await log.append(command_subject("w1"), stop)
    for _ in range(2):  # reading twice: nothing was taken off the queue
        assert [r.event for r in await all_records(log, "COMMANDS")] == [stop]


async def test_an_unreachable_server_fails_with_one_clear_error() -> None:
    from core.errors import LogUnavailable
    from ops.ports import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(LogUnavailable, match="cannot reach NATS"):
        await EventLog.connect(Settings(nats_url=url))


async def test_commands_wait_on_the_workers_durable_consumer_until_acknowledged(log: EventLog) -> None:
    from core.streams import command_subject
    from schemas.commands import StopWork

    first = StopWork(work_id="j1", assignment_id="a1", epoch=1, reason="one")
    second = StopWork(work_id="j1", assignment_id="a1", epoch=1, reason="two")
    await log.append(command_subject("w1"), first, event_id="cmd-1")
    await log.append(
        command_subject("w2"), StopWork(work_id="j2", assignment_id="a2", epoch=1, reason="not mine")
    )
    await log.append(command_subject("w1"), second, event_id="cmd-2")

    inbox = log.commands("w1", wait_s=0.2)
    record, ack = await asyncio.wait_for(anext(inbox), 5)
    assert (record.event, record.msg_id) == (first, "cmd-1")
    await ack()
    await inbox.aclose()  # the agent restarts before acknowledging the second command

    again = log.commands("w1", wait_s=0.2)
    record, ack = await asyncio.wait_for(anext(again), 5)
    assert (record.event, record.msg_id) == (second, "cmd-2")
    await ack()
    await again.aclose()
    assert [r.event.reason for r in await all_records(log, "COMMANDS")] == ["not mine"]


async def test_heartbeat_streams_persist_async_and_an_existing_stream_keeps_its_mode(log: EventLog) -> None:
    """Heartbeats are acknowledged before fsync (R1); every other stream waits for the disk. A stream
    created before (with the default mode) is updated without touching its mode, which the server
    refuses to change."""
    modes = {name: (await log._js.stream_info(name)).config.persist_mode for name in ("HEARTBEATS", "JOBS")}
    assert modes == {"HEARTBEATS": nats.js.api.PersistMode.ASYNC, "JOBS": None}
    await log._js.delete_stream("HEARTBEATS_LATEST")
    await log._js.add_stream(nats.js.api.StreamConfig(name="HEARTBEATS_LATEST", sources=[]))
    await log.ensure_streams()
    latest = (await log._js.stream_info("HEARTBEATS_LATEST")).config
    assert latest.persist_mode is None and [s.name for s in latest.sources or []] == ["HEARTBEATS"]
    await log.append(heartbeat_subject("w-1"), Heartbeat(running=[]))
    assert (await log.last_seq("HEARTBEATS")) == 1
