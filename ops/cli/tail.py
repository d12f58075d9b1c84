"""``resontech tail SUBJECT``: events as JSON lines, like ``nats sub`` on a stream, from a sequence on."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec

from core.log import EventLog
from core.settings import Settings
from core.streams import stream_for_subject
from schemas.envelope import Recorded

_ENCODER = msgspec.json.Encoder()


def line(record: Recorded[Any]) -> bytes:
    """One JSON line: where and when the event was stored, and the event itself."""
    when = datetime.fromtimestamp(record.time_ns / 1e9, tz=UTC).isoformat(timespec="microseconds")
    return _ENCODER.encode(
        {
            "stream": record.stream,
            "seq": record.seq,
            "subject": record.subject,
            "time": when.replace("+00:00", "Z"),
            "id": record.msg_id,
            "event": record.event,
        }
    )


async def tail(settings: Settings, subject: str, *, start_seq: int = 1, follow: bool = True) -> int:
    """Print events on ``subject`` from ``start_seq``; with ``follow``, keep printing new ones."""
    stream = stream_for_subject(subject).name
    out = sys.stdout.buffer
    async with await EventLog.connect(settings, name="tail") as event_log:
        if stream == "QUARANTINE":
            for raw in await event_log.replay_raw(stream, start_seq=start_seq):
                out.write(
                    _ENCODER.encode(
                        {"seq": raw.seq, "id": raw.msg_id, "data": raw.data.decode(errors="replace")}
                    )
                )
                out.write(b"\n")
            out.flush()
            return 0
        if not follow:
            async for record in event_log.replay(stream, start_seq=start_seq, subjects=subject):
                out.write(line(record) + b"\n")
            out.flush()
            return 0

        def show(record: Recorded[Any]) -> None:
            out.write(line(record) + b"\n")
            out.flush()

        watch = await event_log.watch(stream, show, after_seq=start_seq - 1, subjects=subject)
        try:
            await asyncio.Event().wait()
        finally:
            await watch.stop()
    return 0
