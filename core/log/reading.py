"""Reading events back: the last one on a subject, an ordered replay between two bounds, and
watching a stream (stored events first, then live ones)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from core.clock import ns_of
from core.errors import LogUnavailable
from core.log.connection import UNANSWERED, Patience
from core.log.decoding import Decoding
from core.log.frames import parse_reply
from core.log.scan import Scanning, all_subjects
from core.wire import MSG_ID, RawRecord
from schemas.envelope import Recorded

WATCH_IDLE_HEARTBEAT_S = 1.0
"""How often the server tells a live watch it is still there when no event comes."""
WATCH_RETRY_S = 5.0
"""How long :meth:`EventLog.watch` retries creating its consumer while the JetStream API is silent."""


class Reading(Scanning, Decoding):
    """The decoded reads of :class:`core.log.EventLog`."""

    async def last_seq(self, stream: str, subject: str | None = None) -> int:
        """The stream's last sequence, or the last sequence of ``subject`` in it (0 if none)."""
        if subject is None:
            return (await self.stream_bounds(stream)).last_seq
        msg = await self._last_msg(stream, subject)
        return int(msg.seq or 0) if msg is not None else 0

    async def get_last(self, stream: str, subject: str) -> Recorded[Any] | None:
        """The newest event on exactly ``subject``, decoded, or ``None``."""
        raw = await self._last_msg(stream, subject)
        if raw is None:
            return None
        headers = raw.headers or {}
        record = self.record_decoder(stream)(
            raw.subject or subject,
            int(raw.seq or 0),
            ns_of(raw.time),
            headers.get(MSG_ID, ""),
            raw.data or b"",
        )
        return record

    async def _last_msg(self, stream: str, subject: str) -> api.RawStreamMsg | None:
        try:
            return await self._js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except UNANSWERED as exc:
            raise _unavailable(stream, exc) from None

    async def replay(
        self,
        stream: str,
        *,
        start_seq: int = 1,
        start_time: datetime | None = None,
        until_seq: int | None = None,
        until_time: datetime | None = None,
        subjects: str | None = None,
    ) -> AsyncGenerator[Recorded[Any], None]:
        """Yield the stream's events in order, decoded, between the given bounds (inclusive).

        Bounds are by sequence or by store time; without an upper bound the replay ends at the
        stream's end as it was when the replay began. A message that fails to decode is quarantined
        and skipped.
        """
        batch: list[Recorded[Any]] = []
        ready = asyncio.Event()
        finished = False
        decode_record = self.record_decoder(stream)

        def collect(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
            record = decode_record(subject, seq, time_ns, msg_id, data)
            if record is not None:
                batch.append(record)
                ready.set()

        async def run() -> None:
            nonlocal finished
            try:
                await self.scan(
                    stream,
                    collect,
                    start_seq=start_seq,
                    start_time=start_time,
                    until_seq=until_seq,
                    until_time=until_time,
                    subjects=subjects,
                )
            finally:
                finished = True
                ready.set()

        task = asyncio.create_task(run())
        try:
            while True:
                await ready.wait()
                ready.clear()
                chunk, batch[:] = batch[:], []
                for record in chunk:
                    yield record
                if finished and not batch:
                    break
            await task
        finally:
            task.cancel()

    async def replay_raw(self, stream: str, *, start_seq: int = 1) -> list[RawRecord]:
        """Every stored message of ``stream`` from ``start_seq``, undecoded (for audit export)."""
        out: list[RawRecord] = []

        def collect(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
            out.append(RawRecord(stream, seq, subject, time_ns, msg_id, data))

        await self.scan(stream, collect, start_seq=start_seq)
        return out

    async def watch(
        self,
        stream: str,
        on_record: Callable[[Recorded[Any]], None],
        *,
        after_seq: int = 0,
        subjects: str | None = None,
        admit: Callable[[str, int, int], bool] | None = None,
    ) -> Watch:
        """Call ``on_record`` for every event above ``after_seq``, stored ones first, then live ones.

        Returns a handle; ``await handle.stop()`` ends the watch. ``on_record`` runs on the event
        loop and must not block. ``admit(subject, seq, time_ns)``, when given, is asked first: a
        message it refuses is not decoded (a projection's budget, :mod:`projections.base`).
        """
        decode_record = self.record_decoder(stream)

        async def deliver(msg: Msg) -> None:
            seq, time_ns, _ = parse_reply(msg.reply)
            if admit is not None and not admit(msg.subject, seq, time_ns):
                return
            headers = msg.headers
            msg_id = headers.get(MSG_ID, "") if headers else ""
            record = decode_record(msg.subject, seq, time_ns, msg_id, msg.data)
            if record is not None:
                on_record(record)

        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
        )
        patience = Patience(WATCH_RETRY_S, first_s=0.025, max_s=WATCH_RETRY_S)
        while True:
            try:
                sub = await self._js.subscribe(
                    subjects or all_subjects(stream),
                    stream=stream,
                    cb=deliver,
                    ordered_consumer=True,
                    config=config,
                    # a consumer whose node died is noticed by missed idle heartbeats: at nats-py's
                    # default of 5 s a live projection stalled ~20 s after a node's SIGKILL, at 1 s 2-7 s
                    idle_heartbeat=WATCH_IDLE_HEARTBEAT_S,
                )
                return Watch(sub)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError):
                # the JetStream API is briefly silent while the server reloads its accounts
                if not await patience.wait():
                    raise

    async def follow(
        self, stream: str, *, after_seq: int = 0, subjects: str | None = None
    ) -> AsyncGenerator[Recorded[Any], None]:
        """Yield events with a sequence above ``after_seq`` as they are stored, forever."""
        queue: asyncio.Queue[Recorded[Any]] = asyncio.Queue()
        handle = await self.watch(stream, queue.put_nowait, after_seq=after_seq, subjects=subjects)
        try:
            while True:
                yield await queue.get()
        finally:
            await handle.stop()


class Watch:
    """A running :meth:`EventLog.watch`."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        """End the watch."""
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()


def _unavailable(stream: str, exc: Exception) -> LogUnavailable:
    return LogUnavailable(
        f"the {stream} stream did not answer ({type(exc).__name__}): its leader may be changing"
    )
