"""Audit export and queries, against a real nats-server: what is stored is what SQL sees."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, date, datetime
from pathlib import Path

import msgspec
import pytest

from core.errors import InvalidInput, NotFound
from core.log import EventLog
from core.streams import (
    command_subject,
    endpoint_subject,
    heartbeat_subject,
    job_subject,
    metering_subject,
    tenant_subject,
    worker_subject,
)
from projections import audit
from schemas.commands import StopWork
from schemas.endpoints import EndpointDeployed
from schemas.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobProgress,
    JobQueued,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import TokensServed, UsageTick
from schemas.tenants import TenantCreated
from schemas.values import Assignment, Provenance
from schemas.workers import Heartbeat, WorkerRegistered

COLUMNS = [
    ("stream", "VARCHAR"),
    ("seq", "BIGINT"),
    ("subject", "VARCHAR"),
    ("time", "TIMESTAMP WITH TIME ZONE"),
    ("time_ns", "BIGINT"),
    ("msg_id", "VARCHAR"),
    ("type", "VARCHAR"),
    ("data", "JSON"),
    ("raw", "VARCHAR"),
    ("tenant", "VARCHAR"),
    ("entity", "VARCHAR"),
]
BAD_PROGRESS = b'{"type":"job.progress","epoch":"x"}'


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp() * 1000)


def tick(provider: str, end: str, gpu_ms: int, cpu_ms: int = 0, tokens: int = 0) -> UsageTick:
    end_ms = ms(end)
    return UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id="a1",
        epoch=1,
        provider=provider,
        gpu_type="A100",
        pool="shared",
        start_ms=end_ms - 10_000,
        end_ms=end_ms,
        gpu_ms=gpu_ms,
        cpu_ms=cpu_ms,
        tokens=tokens,
    )


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def wait_for_messages(log: EventLog, stream: str, count: int) -> None:
    for _ in range(100):
        if await log.last_seq(stream) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{stream} never reached {count} messages")


async def append_history(log: EventLog) -> dict[str, int]:
    """A small log with every kind of stream in it; returns the JOBS sequences of the bad messages."""
    for tenant in ("acme", "globex"):
        await log.append(
            tenant_subject(tenant, TenantCreated), TenantCreated(display_name=tenant, bucket=tenant)
        )
    for worker, provider in (("w1", "p1"), ("w2", "p2"), ("w3", "p2")):
        registered = WorkerRegistered(provider=provider, hostname=f"{worker}.example")
        await log.append(worker_subject(worker, registered), registered)
    await log.append(heartbeat_subject("w1"), Heartbeat())
    await log.append(
        endpoint_subject("acme", "e1", EndpointDeployed), EndpointDeployed(name="chat", model="models/chat/")
    )

    submitted = JobSubmitted(name="train", kind="process", shards=1)
    placed = JobPlaced(
        assignments=[Assignment(assignment_id="a1", worker_id="w1", slot=0, epoch=1)],
        provenance=Provenance(candidates=3),
    )
    bad: dict[str, int] = {}
    for subject, event in [
        (job_subject("acme", "j1", submitted), submitted),
        (job_subject("acme", "j1", placed), placed),
        (
            job_subject("acme", "j1", JobStarted),
            JobStarted(assignment_id="a1", worker_id="w1", slot=0, epoch=1),
        ),
        (job_subject("acme", "j1", JobProgress), JobProgress(epoch=1, slot=0, step=10, loss=0.5)),
    ]:
        await log.append(subject, event)
    bad["progress"] = (await log.publish_raw("job.acme.j1.progress", BAD_PROGRESS)).seq
    bad["garbage"] = (await log.publish_raw("job.acme.j1.garbage", b"not json at all")).seq
    for subject, event in [
        (job_subject("acme", "j1", JobCompleted), JobCompleted(outputs=["model_out/final.pt"])),
        (job_subject("acme", "j2", JobSubmitted), submitted),
        (job_subject("acme", "j2", JobFailed), JobFailed(reason="out of memory")),
        (job_subject("globex", "j3", JobSubmitted), submitted),
        (job_subject("globex", "j3", JobCancelled), JobCancelled(by="ops")),
        (job_subject("globex", "j4", JobSubmitted), submitted),
        (job_subject("globex", "j4", JobFailed), JobFailed(reason="shard died", epoch=1, slot=0)),
        (job_subject("globex", "j4", JobQueued), JobQueued(reason="waiting for a GPU")),
    ]:
        await log.append(subject, event)
    # Usage near month end: the day and month come from end_ms, not from when it was stored. Both
    # subject layouts: the kernel's (one subject per assignment) and the legacy one of older logs.
    served = TokensServed(
        work_id="j1",
        assignment_id="a1",
        epoch=1,
        provider="p2",
        gpu_type="A100",
        start_ms=ms("2026-02-01T09:59:50"),
        end_ms=ms("2026-02-01T10:00:00"),
        tokens=40,
        source="gateway-a",
    )
    await log.append_many(
        [
            (metering_subject("acme", "w1", "a1", UsageTick), tick("p1", "2026-01-31T23:59:59", 3_600_000)),
            # an agent's own count of tokens, on the legacy agent subject: not a token count
            ("meter.acme.w2", tick("p2", "2026-01-31T12:00:00", 1_800_000, tokens=7)),
            (metering_subject("acme", "w1", "a1", UsageTick), tick("p1", "2026-02-01T00:00:05", 7_200_000)),
            ("meter.globex.w3", tick("p2", "2026-01-31T08:00:00", 600_000)),
            (
                metering_subject("globex", "w3", "a1", UsageTick),
                tick("p2", "2026-02-01T10:00:00", 1_000, cpu_ms=5_000),
            ),
            (metering_subject("globex", "w3", "a1", TokensServed), served),
            # a gateway's count on the legacy token subject
            (
                "meter.globex.w3.tokens",
                msgspec.structs.replace(tick("p2", "2026-02-01T10:00:00", 0, tokens=2), source="gateway-b"),
            ),
        ]
    )
    # Reading JOBS quarantines the two messages that do not decode.
    assert len([r async for r in log.replay("JOBS")]) == 12
    await wait_for_messages(log, "QUARANTINE", 2)
    await wait_for_messages(log, "HEARTBEATS_LATEST", 1)
    return bad


@pytest.fixture
async def exported(log: EventLog, tmp_path: Path) -> tuple[Path, dict[str, int], dict[str, int]]:
    bad = await append_history(log)
    counts = await audit.export(log, tmp_path / "audit")
    return tmp_path / "audit", counts, bad


async def test_export_writes_one_file_per_stream_with_its_rows(log: EventLog, tmp_path: Path) -> None:
    await append_history(log)
    seen: list[tuple[str, int]] = []
    counts = await audit.export(
        log, tmp_path / "audit", progress=lambda stream, rows: seen.append((stream, rows))
    )
    assert counts == {
        "TENANTS": 2,
        "WORKERS": 3,
        "HEARTBEATS": 1,
        "HEARTBEATS_LATEST": 1,
        "JOBS": 14,
        "FEDERATION": 0,
        "ENDPOINTS": 1,
        "METERING": 7,
        "COMMANDS": 0,
        "PROVIDERS": 0,
        "AUDIT": 0,
        "QUARANTINE": 2,
    }
    assert seen == list(counts.items())
    # Only finished files are left behind: no partial files, no temporary NDJSON.
    assert listing(tmp_path / "audit") == sorted(f"{s.lower()}.parquet" for s in counts)
    for stream, rows in counts.items():
        assert audit.sql(tmp_path / "audit", f"SELECT count(*) FROM {stream.lower()}")[1] == [(rows,)]


async def test_columns_and_subject_tokens(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    _, rows = audit.sql(directory, "DESCRIBE jobs")
    assert [(r[0], r[1]) for r in rows] == COLUMNS
    _, rows = audit.sql(directory, "DESCRIBE quarantine")
    assert [(r[0], r[1]) for r in rows] == [*COLUMNS, ("origin_stream", "VARCHAR"), ("origin_seq", "BIGINT")]
    _, rows = audit.sql(
        directory,
        "SELECT DISTINCT stream, tenant, entity FROM events "
        "WHERE stream NOT IN ('JOBS', 'QUARANTINE') ORDER BY ALL",
    )
    assert rows == [
        ("ENDPOINTS", "acme", "e1"),
        ("HEARTBEATS", None, "w1"),
        ("METERING", "acme", "w1"),
        ("METERING", "acme", "w2"),
        ("METERING", "globex", "w3"),
        ("TENANTS", "acme", None),
        ("TENANTS", "globex", None),
        ("WORKERS", None, "w1"),
        ("WORKERS", None, "w2"),
        ("WORKERS", None, "w3"),
    ]
    # The time column keeps the store time to the microsecond; the heartbeat copy is not in events.
    _, rows = audit.sql(
        directory,
        "SELECT count(*), count(*) FILTER (epoch_us(time) = time_ns // 1000), "
        "count(*) FILTER (stream = 'HEARTBEATS_LATEST') FROM events",
    )
    assert rows == [(30, 30, 0)]
    _, [(seq, time, time_ns, data)] = audit.sql(
        directory, "SELECT seq, time, time_ns, data FROM tenants WHERE tenant = 'globex'"
    )
    assert seq == 2
    assert time == datetime.fromtimestamp(time_ns // 1000 / 1e6, tz=UTC)
    assert data.startswith('{"type":"tenant.created"')


async def test_gpu_seconds_per_tenant_per_day(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    names, rows = audit.sql(directory, audit.EXAMPLE_QUERIES["gpu_seconds_per_tenant_per_day"])
    assert names == ["tenant", "day", "gpu_seconds", "cpu_seconds", "ticks"]
    assert rows == [
        ("acme", date(2026, 1, 31), 5400.0, 0.0, 2),
        ("acme", date(2026, 2, 1), 7200.0, 0.0, 1),
        ("globex", date(2026, 1, 31), 600.0, 0.0, 1),
        ("globex", date(2026, 2, 1), 1.0, 5.0, 1),
    ]


async def test_usage_per_provider_per_month(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    names, rows = audit.sql(directory, audit.EXAMPLE_QUERIES["usage_per_provider_per_month"])
    assert names == ["provider", "month", "gpu_seconds", "cpu_seconds", "tokens", "workers"]
    assert rows == [
        ("p1", "2026-01", 3600.0, 0.0, 0, 1),
        ("p1", "2026-02", 7200.0, 0.0, 0, 1),
        ("p2", "2026-01", 2400.0, 0.0, 0, 2),
        ("p2", "2026-02", 1.0, 5.0, 42, 1),  # tokens of the gateways' counts, not the agent's 7
    ]


async def test_job_history(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, bad = exported
    names, rows = audit.sql(directory, audit.example_query("job_history", job_id="j1"))
    assert names == ["seq", "time", "type", "tenant", "body"]
    assert [(seq, type_, tenant) for seq, _, type_, tenant, _ in rows] == [
        (1, "job.submitted", "acme"),
        (2, "job.placed", "acme"),
        (3, "job.started", "acme"),
        (4, "job.progress", "acme"),
        (bad["progress"], "job.progress", "acme"),
        (bad["garbage"], None, "acme"),
        (7, "job.completed", "acme"),
    ]
    assert rows[4][4] == BAD_PROGRESS.decode()
    assert rows[5][4] == "not json at all"
    assert all(r[1].tzinfo is UTC for r in rows)
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)
    # The placeholder is filled in as a literal, so an id cannot change the query.
    assert audit.sql(directory, audit.example_query("job_history", job_id="j1' OR '1'='1"))[1] == []


async def test_jobs_by_final_state(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    names, rows = audit.sql(directory, audit.EXAMPLE_QUERIES["jobs_by_final_state"])
    assert names == ["state", "jobs", "job_ids"]
    assert rows == [
        ("cancelled", 1, ["globex/j3"]),
        ("completed", 1, ["acme/j1"]),
        ("failed", 1, ["acme/j2"]),
        ("unfinished", 1, ["globex/j4"]),
    ]


async def test_quarantined(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, bad = exported
    names, rows = audit.sql(directory, audit.EXAMPLE_QUERIES["quarantined"])
    assert names == ["seq", "time", "origin_stream", "origin_seq", "origin_subject", "content", "body"]
    assert sorted((r[2:]) for r in rows) == [
        (
            "JOBS",
            bad["progress"],
            "job.acme.j1.progress",
            "does not decode as job.progress",
            BAD_PROGRESS.decode(),
        ),
        ("JOBS", bad["garbage"], "job.acme.j1.garbage", "not JSON", "not json at all"),
    ]


async def test_events_per_type(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    names, rows = audit.sql(directory, audit.EXAMPLE_QUERIES["events_per_type"])
    assert names == ["stream", "type", "events", "first", "last"]
    assert [r[:3] for r in rows] == [
        ("ENDPOINTS", "endpoint.deployed", 1),
        ("HEARTBEATS", "hb.beat", 1),
        ("JOBS", "(no event tag)", 1),
        ("JOBS", "job.cancelled", 1),
        ("JOBS", "job.completed", 1),
        ("JOBS", "job.failed", 2),
        ("JOBS", "job.placed", 1),
        ("JOBS", "job.progress", 2),
        ("JOBS", "job.queued", 1),
        ("JOBS", "job.started", 1),
        ("JOBS", "job.submitted", 4),
        ("METERING", "meter.tick", 6),
        ("METERING", "meter.tokens", 1),
        ("QUARANTINE", "(no event tag)", 1),
        ("QUARANTINE", "job.progress", 1),
        ("TENANTS", "tenant.created", 2),
        ("WORKERS", "worker.registered", 3),
    ]
    assert all(first.tzinfo is UTC and first <= last for *_, first, last in rows)


async def test_every_example_query_runs(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    for name in audit.EXAMPLE_QUERIES:
        columns, rows = audit.sql(directory, audit.example_query(name, job_id="j2"))
        assert columns and rows, name


async def test_bad_query_is_invalid_input(exported: tuple[Path, dict[str, int], dict[str, int]]) -> None:
    directory, _, _ = exported
    with pytest.raises(InvalidInput) as caught:
        audit.sql(directory, "SELECT no_such_column FROM jobs")
    assert "no_such_column" in caught.value.message
    assert "\n" not in caught.value.message
    with pytest.raises(InvalidInput) as caught:
        audit.sql(directory, "SELEC 1")
    assert caught.value.message == 'Parser Error: syntax error at or near "SELEC"'
    with pytest.raises(InvalidInput, match="needs job_id"):
        audit.example_query("job_history")
    with pytest.raises(NotFound):
        audit.example_query("no such query")


def test_querying_before_export_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="resontech audit export"):
        audit.sql(tmp_path, "SELECT 1")
    with pytest.raises(NotFound):
        audit.connect(tmp_path / "missing")


async def test_empty_stream_is_a_queryable_empty_table(log: EventLog, tmp_path: Path) -> None:
    counts = await audit.export(log, tmp_path, streams=["ENDPOINTS", "METERING"])
    assert counts == {"ENDPOINTS": 0, "METERING": 0}
    _, rows = audit.sql(tmp_path, "DESCRIBE endpoints")
    assert [(r[0], r[1]) for r in rows] == COLUMNS
    assert audit.sql(tmp_path, "SELECT count(*), max(time) FROM events")[1] == [(0, None)]
    assert audit.sql(tmp_path, audit.EXAMPLE_QUERIES["gpu_seconds_per_tenant_per_day"])[1] == []


async def test_unknown_stream_is_invalid_input(log: EventLog, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="NOPE"):
        await audit.export(log, tmp_path, streams=["NOPE"])


async def test_stored_bytes_are_kept_as_they_are(log: EventLog, tmp_path: Path) -> None:
    """Stored JSON is kept byte for byte; bytes that are not one UTF-8 JSON value are kept as text."""
    await log.publish_raw("job.acme.j5.queued", b'{\n  "type": "job.queued",\n  "reason": "x"\n}\n')
    await log.publish_raw("job.acme.j5.garbage", b'{"type":"job.queued","reason":"\xff"}')
    await log.publish_raw("job.acme.j5.empty", b"")
    await log.publish_raw("job.acme.j5.two", b'{"a":1}\n{"b":2}')
    await log.publish_raw("job.acme.j5.numbers", b'{"type":"job.queued","x":1e3,"y":0.1000,"z":"\\u00e9"}')
    assert await audit.export(log, tmp_path, streams=["JOBS"]) == {"JOBS": 5}
    _, rows = audit.sql(tmp_path, "SELECT type, CAST(data AS VARCHAR), raw FROM jobs ORDER BY seq")
    assert rows == [
        ("job.queued", '{\n  "type": "job.queued",\n  "reason": "x"\n}\n', None),
        (None, None, '{"type":"job.queued","reason":"\ufffd"}'),
        (None, None, ""),
        (None, None, '{"a":1}\n{"b":2}'),
        ("job.queued", '{"type":"job.queued","x":1e3,"y":0.1000,"z":"\\u00e9"}', None),
    ]


async def test_export_replaces_the_previous_export(log: EventLog, tmp_path: Path) -> None:
    await log.append(tenant_subject("acme", TenantCreated), TenantCreated(display_name="a", bucket="a"))
    assert await audit.export(log, tmp_path, streams=["TENANTS"]) == {"TENANTS": 1}
    await log.append(tenant_subject("globex", TenantCreated), TenantCreated(display_name="g", bucket="g"))
    assert await audit.export(log, tmp_path, streams=["TENANTS"]) == {"TENANTS": 2}
    assert audit.sql(tmp_path, "SELECT list(tenant ORDER BY seq) FROM tenants")[1] == [(["acme", "globex"],)]
    assert listing(tmp_path) == ["tenants.parquet"]


async def test_work_queue_stream_is_exported(log: EventLog, tmp_path: Path) -> None:
    stop = StopWork(work_id="j1", assignment_id="a1", epoch=1, reason="preempted")
    await log.append(command_subject("w1"), stop)
    assert await audit.export(log, tmp_path, streams=["COMMANDS"]) == {"COMMANDS": 1}


class FullDisk(io.BytesIO):
    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise OSError(28, "No space left on device")


def test_a_write_failure_during_the_scan_is_raised_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``EventLog.scan`` swallows exceptions from its callback, so the writer keeps and re-raises them."""
    monkeypatch.setattr(audit, "_BATCH_ROWS", 2)
    writer = audit._NdjsonWriter(FullDisk())
    for seq in (1, 2, 3):
        writer("job.acme.j1.queued", seq, 0, f"id{seq}", b"{}")
    with pytest.raises(OSError, match="No space left"):
        writer.close(delivered=3)
    ok = audit._NdjsonWriter(io.BytesIO())
    ok("job.acme.j1.queued", 1, 0, "id1", b"{}")
    with pytest.raises(RuntimeError, match="wrote 1 rows of 2 delivered"):
        ok.close(delivered=2)
