"""The audit check: rebuild every projection from sequence 1 and compare it with the live snapshot."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from core.log import EventLog
from projections.base import Projection, state_hash
from projections.runner import read_snapshot, rebuild


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome for one projection.

    Attributes:
        projection: its name.
        seq: the sequence compared at (the live snapshot's), or the stream end without a snapshot.
        live_hash: the snapshot's hash, ``None`` when no live snapshot exists.
        rebuilt_hash: the hash of the state folded from sequence 1 up to ``seq``.
        status: ``match``, ``differ`` or ``no-snapshot``.
    """

    projection: str
    stream: str
    seq: int
    live_hash: str | None
    rebuilt_hash: str
    status: str


async def verify(event_log: EventLog, projection: Projection[Any]) -> Verdict:
    """Rebuild ``projection`` up to its live snapshot's sequence and compare the hashes."""
    found = await read_snapshot(event_log, projection)
    header = None if found is None else found[0]
    state, last = await rebuild(event_log, projection, until_seq=None if header is None else header.seq)
    rebuilt = state_hash(state)
    status = "no-snapshot" if header is None else "match" if rebuilt == header.hash else "differ"
    return Verdict(
        projection=projection.name,
        stream=projection.stream,
        seq=last if header is None else header.seq,
        live_hash=None if header is None else header.hash,
        rebuilt_hash=rebuilt,
        status=status,
    )


async def verify_all(event_log: EventLog, projections: Iterable[Projection[Any]]) -> list[Verdict]:
    """:func:`verify` every projection, in order."""
    return [await verify(event_log, projection) for projection in projections]
