"""Fold a stream into a projection, keep it live, snapshot it, resume from the snapshot.

A :class:`ProjectionRunner` owns one projection's state and the sequence of the last event applied
to it. It starts from the newest snapshot of the same projection version (checking the snapshot's
hash), catches up from the log, then follows the stream live, snapshotting every
``snapshot_every`` events or ``snapshot_interval_s`` seconds. :func:`rebuild` is the time machine:
any projection as of a sequence or a time, folded from sequence 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from core.log import EventLog
from projections.base import Projection, canonical_json, state_hash
from schemas.envelope import Recorded

S = TypeVar("S", bound=msgspec.Struct)
log = logging.getLogger(__name__)


class SnapshotHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot is of: enough to decide whether to trust it before decoding the state."""

    projection: str
    version: int
    stream: str
    seq: int
    hash: str
    taken_ns: int


def snapshot_name(projection: Projection[Any]) -> str:
    """The object name of a projection's snapshot (one per projection; the newest wins)."""
    return f"projection.{projection.name}"


def encode_snapshot(projection: Projection[S], state: S, seq: int) -> tuple[bytes, SnapshotHeader]:
    """Serialise a snapshot: one JSON header line, then the canonical state JSON."""
    body = canonical_json(state)
    header = SnapshotHeader(
        projection=projection.name,
        version=projection.version,
        stream=projection.stream,
        seq=seq,
        hash=state_hash(state),
        taken_ns=time.time_ns(),
    )
    return msgspec.json.encode(header) + b"\n" + body, header


def decode_snapshot(projection: Projection[S], data: bytes) -> tuple[SnapshotHeader, S] | None:
    """Parse a snapshot; ``None`` if it is of another projection version or fails its hash."""
    head, _, body = data.partition(b"\n")
    try:
        header = msgspec.json.decode(head, type=SnapshotHeader)
        if header.projection != projection.name or header.version != projection.version:
            return None
        state = msgspec.json.decode(body, type=projection.state_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("snapshot of %s is unreadable (%s); rebuilding from the log", projection.name, exc)
        return None
    if state_hash(state) != header.hash:
        log.warning("snapshot of %s fails its hash; rebuilding from the log", projection.name)
        return None
    return header, state


async def read_snapshot(event_log: EventLog, projection: Projection[S]) -> tuple[SnapshotHeader, S] | None:
    """The stored snapshot of ``projection``, if there is a usable one."""
    data = await event_log.get_snapshot(snapshot_name(projection))
    return None if data is None else decode_snapshot(projection, data)


class ProjectionRunner(Generic[S]):
    """One projection, kept up to date from the log.

    Args:
        event_log: the log to read and to store snapshots in.
        projection: what to fold.
        snapshot_every: snapshot after this many new events (default 10,000).
        snapshot_interval_s: ...or after this many seconds with at least one new event (default 30).
        write_snapshots: whether this runner stores snapshots (services that only read a projection
            leave that to the projector).

    Attributes:
        listeners: called with every record applied (after the state changed), on the event loop.
        caught_up: set once :meth:`run` has applied everything stored when it started and follows
            the stream live.
    """

    def __init__(
        self,
        event_log: EventLog,
        projection: Projection[S],
        *,
        snapshot_every: int = 10_000,
        snapshot_interval_s: float = 30.0,
        write_snapshots: bool = True,
    ) -> None:
        self.log = event_log
        self.write_snapshots = write_snapshots
        self.listeners: list[Callable[[Recorded[Any]], None]] = []
        self.caught_up = asyncio.Event()
        self.projection = projection
        self.state: S = projection.initial()
        self.seq = 0
        self.snapshot_every = snapshot_every
        self.snapshot_interval_s = snapshot_interval_s
        self.snapshot_seq = 0
        self._last_snapshot_at = time.monotonic()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []

    def apply(self, record: Recorded[Any]) -> None:
        """Apply one record (ignored if it is not newer than what was applied)."""
        if record.seq <= self.seq:
            return
        self.state = self.projection.evolve(self.state, record)
        self.seq = record.seq
        for listener in self.listeners:
            listener(record)
        self._wake()

    def admits(self, subject: str, seq: int, time_ns: int) -> bool:
        """Whether the stored message at ``seq`` is to be decoded and applied: the projection's
        :attr:`~projections.base.Projection.admit` (if any) asked; a message it refuses is passed
        over (:attr:`seq` moves past it, no listener hears of it)."""
        admit = self.projection.admit
        if admit is None:
            return True
        if seq <= self.seq:  # applied (or passed over) already
            return False
        if admit(self.state, subject, seq, time_ns):
            return True
        self.seq = seq
        self._wake()
        return False

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.seq:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    async def load(self) -> bool:
        """Start from the stored snapshot if there is a usable one. Returns whether it did."""
        found = await read_snapshot(self.log, self.projection)
        if found is None:
            return False
        header, self.state = found
        self.seq = self.snapshot_seq = header.seq
        return True

    async def catch_up(self) -> int:
        """Apply every event stored after :attr:`seq`, up to the stream's current end."""
        decode_record = self.log.record_decoder(self.projection.stream)
        applied = 0

        def apply(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
            nonlocal applied
            if not self.admits(subject, seq, time_ns):
                return
            record = decode_record(subject, seq, time_ns, msg_id, data)
            if record is not None:
                self.apply(record)
                applied += 1

        await self.log.scan(
            self.projection.stream, apply, start_seq=self.seq + 1, subjects=self.projection.subjects
        )
        return applied

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Load, catch up, then follow the stream live until ``stop`` is set (snapshots on the way)."""
        stop = stop or asyncio.Event()
        loaded = await self.load()
        catching_up = asyncio.ensure_future(self.catch_up())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({catching_up, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not catching_up.done():  # stopped mid catch-up: keep what was applied, it is consistent
            catching_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await catching_up
            await self.snapshot_if_due(force=self.seq > self.snapshot_seq)
            return
        catching_up.result()
        await self.snapshot_if_due(force=not loaded or self.seq > self.snapshot_seq)
        watch = await self.log.watch(
            self.projection.stream,
            self.apply,
            after_seq=self.seq,
            subjects=self.projection.subjects,
            admit=None if self.projection.admit is None else self.admits,
        )
        self.caught_up.set()  # and following: nothing stored from now on is missed
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=min(1.0, self.snapshot_interval_s))
                await self.snapshot_if_due()
        finally:
            await watch.stop()
            await self.snapshot_if_due(force=self.seq > self.snapshot_seq)

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until the event at ``seq`` has been applied (read-your-writes for services)."""
        if self.seq >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, id(future), future))
        await asyncio.wait_for(future, timeout)

    async def snapshot_if_due(self, *, force: bool = False) -> bool:
        """Store a snapshot if enough events or time passed since the last one."""
        if not self.write_snapshots:
            return False
        new = self.seq - self.snapshot_seq
        elapsed = time.monotonic() - self._last_snapshot_at
        if not force and (new == 0 or (new < self.snapshot_every and elapsed < self.snapshot_interval_s)):
            return False
        data, _ = encode_snapshot(self.projection, self.state, self.seq)
        await self.log.put_snapshot(snapshot_name(self.projection), data)
        self.snapshot_seq = self.seq
        self._last_snapshot_at = time.monotonic()
        return True

    def hash(self) -> str:
        """The state hash at :attr:`seq`."""
        return state_hash(self.state)


async def rebuild(
    event_log: EventLog,
    projection: Projection[S],
    *,
    until_seq: int | None = None,
    until_time: datetime | None = None,
) -> tuple[S, int]:
    """Fold ``projection`` from sequence 1, optionally only up to a sequence or a time (inclusive).

    Returns the state and the sequence of the last event applied. This is the fast path: the fold
    runs inside the log's delivery callback.
    """
    state = projection.initial()
    evolve, admit = projection.evolve, projection.admit
    last = 0
    decode_record = event_log.record_decoder(projection.stream)

    def apply(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        nonlocal state, last
        last = seq
        if admit is not None and not admit(state, subject, seq, time_ns):
            return
        record = decode_record(subject, seq, time_ns, msg_id, data)
        if record is not None:
            state = evolve(state, record)

    await event_log.scan(
        projection.stream, apply, until_seq=until_seq, until_time=until_time, subjects=projection.subjects
    )
    return state, last
