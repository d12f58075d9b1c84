"""SIGKILL nats-server during continuous appends: every acknowledged event survives, none twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from core.errors import AppendRejected, AppendTimeout, LogUnavailable
from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from ops.devstack.natsserver import NatsServer
from schemas.jobs import JobProgress

TOTAL = 3000
BATCH = 50


async def append_until_acknowledged(log: EventLog, acked: list[str]) -> None:
    """Append TOTAL events in batches; a failed batch is retried with the same ids until acknowledged."""
    for start in range(0, TOTAL, BATCH):
        batch = [
            (job_subject("acme", f"j{i % 13}", JobProgress), JobProgress(epoch=1, step=i), f"ev-{i}")
            for i in range(start, start + BATCH)
        ]
        while True:
            try:
                await log.append_many(batch)
            except (AppendTimeout, LogUnavailable, AppendRejected):
                await asyncio.sleep(0.1)
                continue
            acked.extend(event_id for _, _, event_id in batch)
            break


async def test_sigkill_during_appends_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "store", log_file=tmp_path / "nats.log")
    server.start()
    try:
        log = await EventLog.connect(Settings(nats_url=server.url, ack_timeout_s=1.0))
        await log.ensure_streams()
        acked: list[str] = []
        writer = asyncio.create_task(append_until_acknowledged(log, acked))
        for threshold in (TOTAL // 4, TOTAL // 2):
            while len(acked) < threshold:
                await asyncio.sleep(0.01)
            server.kill()
            await asyncio.sleep(0.3)
            await asyncio.to_thread(server.restart)
        await asyncio.wait_for(writer, timeout=120)

        stored = await log.replay_raw("JOBS")
        counts = Counter(record.msg_id for record in stored)
        assert not [msg_id for msg_id, n in counts.items() if n > 1], "an event was stored twice"
        assert set(acked) <= set(counts), "an acknowledged event was lost"
        assert set(counts) <= {f"ev-{i}" for i in range(TOTAL)}
        assert len(acked) == TOTAL
        await log.close()
    finally:
        server.stop()
