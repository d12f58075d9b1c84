"""Reading events back: the last one on a subject, an ordered replay between two bounds, and
watching a stream (stored events first, then live ones).

Plain functions given what they read with (the JetStream context, the log's
:class:`~core.log.scan.Scanner`, a decoder of :mod:`core.log.decoding`);
:class:`core.log.EventLog`'s read methods delegate to them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from core.clock import ns_of
from core.errors import LogUnavailable
from core.log.connection import UNANSWERED, Patience
from core.log.decoding import DecodeRecord
from core.log.frames import parse_reply
from core.log.scan import Scanner, all_subjects
from core.wire import MSG_ID, RawRecord
from schemas.envelope import Recorded

WATCH_IDLE_HEARTBEAT_S = 1.0
"""How often the server tells a live watch it is still there when no event comes."""
WATCH_RETRY_S = 5.0
"""How long :meth:`EventLog.watch` retries creating its consumer while the JetStream API is silent."""


async def last_msg(js: JetStreamContext, stream: str, subject: str) -> api.RawStreamMsg | None:
    """The newest stored message on exactly ``subject``, or ``None``.

    Raises:
        LogUnavailable: the stream did not answer (its leader may be changing).
    """
    try:
        return await js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    except UNANSWERED as exc:
        raise _unavailable(stream, exc) from None


def decode_last(raw: api.RawStreamMsg, subject: str, decode_record: DecodeRecord) -> Recorded[Any] | None:
    """A message of :func:`last_msg`, decoded (``None``: quarantined)."""
    headers = raw.headers or {}
    return decode_record(
        raw.subject or subject, int(raw.seq or 0), ns_of(raw.time), headers.get(MSG_ID, ""), raw.data or b""
    )


async def replay(
    scanner: Scanner,
    record_decoder: Callable[[str], DecodeRecord],
    stream: str,
    *,
    start_seq: int,
    start_time: datetime | None,
    until_seq: int | None,
    until_time: datetime | None,
    subjects: str | None,
) -> AsyncGenerator[Recorded[Any], None]:
    """:meth:`core.log.EventLog.replay`: the scan runs as a task beside the generator, and what it
    decodes is handed over a chunk at a time (a message quarantined instead is skipped)."""
    batch: list[Recorded[Any]] = []
    ready = asyncio.Event()
    finished = False
    decode_record = record_decoder(stream)

    def collect(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        record = decode_record(subject, seq, time_ns, msg_id, data)
        if record is not None:
            batch.append(record)
            ready.set()

    async def run() -> None:
        nonlocal finished
        try:
            await scanner.scan(
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


async def replay_raw(scanner: Scanner, stream: str, *, start_seq: int) -> list[RawRecord]:
    """Every stored message of ``stream`` from ``start_seq``, undecoded."""
    out: list[RawRecord] = []

    def collect(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        out.append(RawRecord(stream, seq, subject, time_ns, msg_id, data))

    await scanner.scan(stream, collect, start_seq=start_seq)
    return out


def watch_delivery(
    decode_record: DecodeRecord,
    on_record: Callable[[Recorded[Any]], None],
    admit: Callable[[str, int, int], bool] | None,
) -> Callable[[Msg], Awaitable[None]]:
    """A watch's callback: each delivered message admitted (when ``admit`` is given), decoded, and
    handed to ``on_record``."""

    async def deliver(msg: Msg) -> None:
        seq, time_ns, _ = parse_reply(msg.reply)
        if admit is not None and not admit(msg.subject, seq, time_ns):
            return
        headers = msg.headers
        msg_id = headers.get(MSG_ID, "") if headers else ""
        record = decode_record(msg.subject, seq, time_ns, msg_id, msg.data)
        if record is not None:
            on_record(record)

    return deliver


async def watch(
    js: JetStreamContext,
    stream: str,
    deliver: Callable[[Msg], Awaitable[None]],
    *,
    after_seq: int,
    subjects: str | None,
) -> Watch:
    """An ordered push consumer on ``stream`` from ``after_seq + 1`` calling ``deliver``; its creation
    is retried for :data:`WATCH_RETRY_S` while the JetStream API is silent."""
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
    )
    patience = Patience(WATCH_RETRY_S, first_s=0.025, max_s=WATCH_RETRY_S)
    while True:
        try:
            sub = await js.subscribe(
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
