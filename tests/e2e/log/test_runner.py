"""The projection runner against a real log: snapshots, resume, time travel, live follow, audit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec

from core.log import EventLog
from core.streams import job_subject, metering_subject
from projections import LEDGER, SCHEDULE
from projections.base import state_hash
from projections.ledger import LedgerState, charges
from projections.runner import ProjectionRunner, encode_snapshot, read_snapshot, rebuild, snapshot_name
from projections.schedule import job_key
from projections.verify import verify, verify_all
from schemas.jobs import JobCompleted, JobQueued, JobSubmitted
from schemas.metering import UsageTick


def tick(i: int, tenant_ms: int = 1_795_000_000_000) -> UsageTick:
    start = tenant_ms + i * 10_000
    return UsageTick(
        work_id=f"j{i % 3}",
        work_kind="job",
        assignment_id=f"a{i % 3}",
        epoch=1,
        provider="p1",
        gpu_type="A100",
        pool="shared",
        start_ms=start,
        end_ms=start + 10_000,
        gpu_ms=10_000,
        tier="gold",
    )


def metered(i: int) -> tuple[str, UsageTick]:
    """Tick ``i`` on its assignment's subject."""
    usage = tick(i)
    return metering_subject("acme", "w1", usage.assignment_id, UsageTick), usage


async def append_jobs(log: EventLog, count: int, prefix: str = "j") -> None:
    await log.append_many(
        (
            job_subject("acme", f"{prefix}{i}", JobSubmitted),
            JobSubmitted(name=f"n{i}", kind="process", shards=1),
        )
        for i in range(count)
    )


async def test_snapshot_then_resume_applies_only_newer_events(log: EventLog) -> None:
    await append_jobs(log, 50)
    first = ProjectionRunner(log, SCHEDULE, snapshot_every=10)
    assert not await first.load()
    assert await first.catch_up() == 50
    assert await first.snapshot_if_due()
    await append_jobs(log, 20, prefix="k")

    resumed = ProjectionRunner(log, SCHEDULE)
    assert await resumed.load()
    assert resumed.seq == 50
    assert await resumed.catch_up() == 20
    rebuilt, last = await rebuild(log, SCHEDULE)
    assert last == 70
    assert resumed.hash() == state_hash(rebuilt)


async def test_snapshot_of_another_version_or_with_a_bad_hash_is_ignored(log: EventLog) -> None:
    await append_jobs(log, 5)
    runner = ProjectionRunner(log, SCHEDULE)
    await runner.catch_up()
    data, header = encode_snapshot(SCHEDULE, runner.state, runner.seq)
    newer = msgspec.structs.replace(header, version=SCHEDULE.version + 1)
    await log.put_snapshot(
        snapshot_name(SCHEDULE), msgspec.json.encode(newer) + b"\n" + data.partition(b"\n")[2]
    )
    assert await read_snapshot(log, SCHEDULE) is None
    tampered = data.replace(b'"n1"', b'"evil"')
    await log.put_snapshot(snapshot_name(SCHEDULE), tampered)
    assert await read_snapshot(log, SCHEDULE) is None
    await log.put_snapshot(snapshot_name(SCHEDULE), b"garbage")
    assert await read_snapshot(log, SCHEDULE) is None


async def test_time_travel_by_sequence_and_by_time(log: EventLog) -> None:
    await log.append_many(metered(i) for i in range(30))
    records = [r async for r in log.replay("METERING")]
    at_ten, seq = await rebuild(log, LEDGER, until_seq=10)
    assert seq == 10
    assert state_hash(at_ten) == state_hash(LEDGER.fold(records[:10]))
    ns = records[19].time_ns
    cut = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC) + timedelta(
        microseconds=ns % 1_000_000_000 // 1000
    )
    as_of, seq = await rebuild(log, LEDGER, until_time=cut)
    assert 0 < seq <= 20
    assert state_hash(as_of) == state_hash(LEDGER.fold(records[:seq]))
    full, _ = await rebuild(log, LEDGER)
    assert charges(full, "acme") > charges(as_of, "acme") > 0
    assert isinstance(full, LedgerState)


async def test_live_run_follows_new_events_and_snapshots_on_stop(log: EventLog) -> None:
    await append_jobs(log, 3)
    runner = ProjectionRunner(log, SCHEDULE, snapshot_interval_s=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    position = await log.append(
        job_subject("acme", "j1", JobCompleted), JobCompleted(outputs=["model_out/m.pt"])
    )
    await runner.wait_for(position.seq, timeout=10)
    assert runner.state.jobs[job_key("acme", "j1")].state == "completed"
    more = await log.append(job_subject("acme", "j2", JobQueued), JobQueued(reason="waiting for an A100"))
    await runner.wait_for(more.seq, timeout=10)
    stop.set()
    await asyncio.wait_for(task, 10)
    found = await read_snapshot(log, SCHEDULE)
    assert found is not None and found[0].seq == more.seq


async def test_replay_reports_match_and_finds_a_difference(log: EventLog) -> None:
    await append_jobs(log, 10)
    await log.append_many(metered(i) for i in range(10))
    for projection in (SCHEDULE, LEDGER):
        runner = ProjectionRunner(log, projection)
        await runner.catch_up()
        await runner.snapshot_if_due(force=True)
    verdicts = {v.projection: v for v in await verify_all(log, (SCHEDULE, LEDGER))}
    assert verdicts["schedule"].status == "match" and verdicts["schedule"].seq == 10
    assert verdicts["ledger"].status == "match"

    # A live state that drifted from the log (a reducer bug, a hand edit): replay must say so.
    drifted = ProjectionRunner(log, SCHEDULE)
    await drifted.catch_up()
    key = job_key("acme", "j3")
    drifted.state.jobs[key] = msgspec.structs.replace(drifted.state.jobs[key], state="completed")
    await drifted.snapshot_if_due(force=True)
    verdict = await verify(log, SCHEDULE)
    assert verdict.status == "differ"
    assert verdict.live_hash != verdict.rebuilt_hash
