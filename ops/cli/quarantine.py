"""``resontech quarantine``: what the kernel refused, for the operator.

QUARANTINE holds every stored message that failed to decode or to match its subject, and every
claim the intake refused (:mod:`ops.services.intake`), with the reason and, for a claim, the worker that sent
it. This prints them oldest first: one line each, or one JSON object per line with ``--json``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import msgspec

from core.log import EventLog, Quarantined
from core.settings import Settings

_ENCODER = msgspec.json.Encoder()
PREVIEW = 160


def as_dict(q: Quarantined) -> dict[str, object]:
    """One quarantined message as JSON-ready data (its bytes as text, replacement characters for
    what is not UTF-8)."""
    return {
        "seq": q.seq,
        "time": _iso(q.time_ns),
        "stream": q.stream,
        "origin_seq": q.origin_seq,
        "subject": q.subject,
        "sender": q.sender,
        "reason": q.reason,
        "data": q.data.decode(errors="replace"),
    }


async def show(settings: Settings, *, after_seq: int = 0, limit: int = 100, as_json: bool = False) -> int:
    """Print up to ``limit`` quarantined messages after ``after_seq``; the exit status (0)."""
    async with await EventLog.connect(settings, name="quarantine") as event_log:
        found = await event_log.quarantined(after_seq=after_seq, limit=limit)
    out = sys.stdout
    if not found and not as_json:
        print("nothing quarantined" + (f" after {after_seq}" if after_seq else ""))
    for q in found:
        if as_json:
            out.write(_ENCODER.encode(as_dict(q)).decode() + "\n")
            continue
        who = f" from {q.sender}" if q.sender else ""
        print(f"#{q.seq} {_iso(q.time_ns)} {q.stream}#{q.origin_seq} {q.subject}{who}: {q.reason}")
        preview = q.data.decode(errors="replace")
        print(f"    {preview[:PREVIEW]}{'...' if len(preview) > PREVIEW else ''}")
    return 0


def _iso(ns: int) -> str:
    when = datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")
    return when.replace("+00:00", "Z")
