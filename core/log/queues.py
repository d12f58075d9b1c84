"""Taking messages off work-queue streams: agents' claims on INTAKE (:meth:`EventLog.pull`, raw,
for the intake to check) and each worker's commands on COMMANDS (:meth:`EventLog.commands`,
decoded). A message leaves its queue only when acknowledged.

Plain async generators on a JetStream context, which :class:`core.log.EventLog`'s ``pull`` and
``commands`` return; :class:`Pulled` is what ``pull`` hands out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from core.clock import ns_of
from core.log.decoding import DecodeRecord
from core.log.scan import all_subjects
from core.streams import command_consumer, command_subject
from core.wire import MSG_ID
from schemas.envelope import Recorded


async def pull(
    js: JetStreamContext, stream: str, durable: str, *, batch: int, wait_s: float
) -> AsyncGenerator[list[Pulled], None]:
    """:meth:`core.log.EventLog.pull` on ``js``: batches of up to ``batch`` messages, an empty one
    after ``wait_s`` without any (or while disconnected)."""
    sub = await js.pull_subscribe(
        all_subjects(stream),
        durable=durable,
        stream=stream,
        config=api.ConsumerConfig(ack_wait=60.0, max_ack_pending=20_000),
    )
    try:
        while True:
            try:
                messages = await sub.fetch(batch, timeout=wait_s)
            except (TimeoutError, nats.errors.TimeoutError):
                messages = []
            except nats.errors.Error:
                await asyncio.sleep(wait_s)  # disconnected: nats-py reconnects by itself
                messages = []
            yield [Pulled(msg) for msg in messages]
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def commands(
    js: JetStreamContext, worker_id: str, decode_record: DecodeRecord, *, batch: int, wait_s: float
) -> AsyncGenerator[tuple[Recorded[Any], Callable[[], Awaitable[None]]], None]:
    """:meth:`core.log.EventLog.commands` on ``js``, each command decoded with ``decode_record``
    (one it quarantines instead is acknowledged and skipped)."""
    subject = command_subject(worker_id)
    sub = await js.pull_subscribe(
        subject,
        durable=command_consumer(worker_id),
        stream="COMMANDS",
        config=api.ConsumerConfig(ack_wait=30.0, max_ack_pending=1000),
    )
    messages: list[Msg] = []
    try:
        while True:
            try:
                messages = await sub.fetch(batch, timeout=wait_s)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except nats.errors.Error:
                await asyncio.sleep(wait_s)  # disconnected: nats-py reconnects by itself
                continue
            for msg in messages:
                meta = msg.metadata
                time_ns = ns_of(meta.timestamp)
                msg_id = (msg.headers or {}).get(MSG_ID, "")
                record = decode_record(msg.subject, meta.sequence.stream, time_ns, msg_id, msg.data)
                if record is None:
                    await msg.ack()
                    continue
                yield record, msg.ack
    finally:
        # Handed out but not acknowledged (the agent is stopping): back to the queue now rather
        # than after the ack wait.
        for msg in messages:
            if not msg._ackd:
                with contextlib.suppress(Exception):
                    await msg.nak()
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


class Pulled:
    """One message handed out by :meth:`EventLog.pull`: where and when it was stored, by whom (its
    subject), its bytes, and its acknowledgement."""

    __slots__ = ("_msg", "data", "delivered", "msg_id", "seq", "subject", "time_ns")

    def __init__(self, msg: Msg) -> None:
        meta = msg.metadata
        self._msg = msg
        self.subject: str = msg.subject
        self.seq: int = meta.sequence.stream
        self.time_ns: int = ns_of(meta.timestamp)
        self.msg_id: str = (msg.headers or {}).get(MSG_ID, "")
        self.data: bytes = msg.data
        self.delivered: int = meta.num_delivered or 1

    async def ack(self) -> None:
        """Done with it: it leaves the stream."""
        with contextlib.suppress(Exception):
            await self._msg.ack()

    async def retry(self, delay_s: float) -> None:
        """Not done with it (the log could not take what it led to): deliver it again after
        ``delay_s``, rather than after the consumer's ack wait."""
        with contextlib.suppress(Exception):
            await self._msg.nak(delay=delay_s)
