"""Scanning a stream: every stored message between two bounds, in order, once, as raw fields.

The fast path projections rebuild with. nats-py's per-message machinery costs about 30 us a message
here, so a scan reads an acknowledgement-free pull consumer in batches, and
:class:`core.log.frames.RawTap` takes its messages off the connection's parser as bytes (about 3 us a
message, ~250k/s); where the tap cannot attach, nats-py's ordered push consumer. A work-queue
stream is read by sequence instead: a consumer would take its messages away.

:class:`Scanner` is a small class, not a mixin: :class:`core.log.EventLog` builds one with what a scan
uses (the NATS client and its JetStream context, the stream bounds, the node check) and its
:meth:`~core.log.EventLog.scan`, ``replay`` and ``replay_raw`` go through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from core.clock import NS_PER_S, ns_of
from core.errors import LogUnavailable
from core.log.connection import ELECTION_S, UNANSWERED, Bounds, Patience
from core.log.frames import Frame, RawTap, Sink, parse_reply
from core.streams import BY_NAME
from core.wire import MSG_ID

_IDLE_CHECK_S = 0.5
_SCAN_BATCH = 4096
"""Messages per pull request of a scan."""
_SCAN_AHEAD = 2
"""Pull requests' worth of messages a scan asks for beyond what it has delivered."""
_SCAN_STALL_S = 5.0
"""A scan's consumer silent this long (messages requested, none arriving) is replaced."""
_SCAN_REQUEST_EXPIRES_NS = 60 * NS_PER_S
"""A scan's pull request not filled within this long ends with a status (the consumer is replaced)."""
_SCAN_CONSUMER_IDLE_S = 60.0
"""The server deletes a scan's consumer by itself this long after its last request (a crashed scan)."""


class Scanner:
    """The scans of one connection (:meth:`core.log.EventLog.scan`), given what they use: the NATS
    client (its parser tapped, inboxes for pull consumers), its JetStream context, the JetStream API
    prefix, the stream bounds a scan ends at (:meth:`~core.log.connection.LogConnection.stream_bounds`)
    and the node check to tell when nothing answers."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        *,
        api_prefix: str,
        bounds: Callable[[str], Awaitable[Bounds]],
        silent: Callable[[], None],
    ) -> None:
        self.nc, self.js, self.api_prefix = nc, js, api_prefix
        self.bounds, self.silent = bounds, silent
        self._raw_tap: RawTap | None = None

    async def scan(
        self,
        stream: str,
        on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
        *,
        start_seq: int = 1,
        start_time: datetime | None = None,
        until_seq: int | None = None,
        until_time: datetime | None = None,
        subjects: str | None = None,
    ) -> int:
        """:meth:`core.log.EventLog.scan`, which says what a scan delivers and when it stops: the
        pull-consumer fast path through :class:`RawTap`, else nats-py's ordered push consumer."""
        if BY_NAME[stream].retention == "workqueue":
            return await self._scan_work_queue(stream, on_message, start_seq=start_seq, until_seq=until_seq)
        bounds = await self.bounds(stream)
        end = bounds.last_seq if until_seq is None else min(until_seq, bounds.last_seq)
        if end < max(start_seq, bounds.first_seq, 1):
            return 0
        read = _Read(
            stream=stream,
            end=end,
            start_seq=start_seq,
            start_time=start_time,
            until_ns=ns_of(until_time) if until_time else None,
            subjects=subjects,
        )
        if self._raw_tap is None:
            self._raw_tap = RawTap.attach(self.nc)
        tap = self._raw_tap
        if tap is None:
            return await self._scan_ordered(read, on_message)
        return await self._scan_pulled(tap, read, on_message)

    async def _scan_pulled(
        self,
        tap: RawTap,
        read: _Read,
        on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
    ) -> int:
        """:meth:`scan` through an acknowledgement-free pull consumer, batches requested ahead.

        The tap only queues each message's raw parts (:class:`Sink`); this loop parses the delivery
        reply subject (stream sequence, store time, pending), skips what was already delivered and calls
        ``on_message``. At most :data:`_SCAN_AHEAD` batches are requested beyond what was delivered,
        which bounds the queue. A consumer that falls silent for :data:`_SCAN_STALL_S` (a lost
        pull request or reconnection: an acknowledgement-free consumer does not deliver a message
        twice) or answers with a status is replaced by one starting after the last message
        delivered; so is one that has nothing more short of the scan's end while the stream's leader
        still holds messages for it (its node's store is behind: :class:`_CatchUp`).
        """
        sink = Sink()
        frames = sink.frames
        last = 0  # the sequence of the last message delivered
        count = 0
        consumer: _PullConsumer | None = None
        catching_up = _CatchUp(self.js, read)
        try:
            while True:
                if consumer is not None:
                    await consumer.close()
                frames.clear()
                consumer = await _PullConsumer.open(self, tap, read, last, sink)
                outcome = _Outcome.DRAINED
                while consumer.delivered < consumer.target:
                    await consumer.request_ahead()
                    if not frames:
                        sink.arrived.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(sink.arrived.wait(), _SCAN_STALL_S)
                        if not frames:
                            outcome = _Outcome.STATUS  # silent: a new consumer
                            break
                    chunk = frames[:]
                    frames.clear()
                    outcome, last, delivered = await _deliver_pulled(chunk, read, last, on_message)
                    count += delivered
                    consumer.delivered += delivered
                    if outcome is not _Outcome.MORE:
                        break
                if outcome is _Outcome.DONE:
                    return count
                if outcome is not _Outcome.STATUS and not await catching_up.behind(last):
                    return count
        finally:
            if consumer is not None:
                await consumer.close()

    async def _scan_ordered(
        self,
        read: _Read,
        on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
    ) -> int:
        """:meth:`scan` through nats-py's ordered push consumer (where :class:`RawTap` cannot attach).

        It ends when its consumer has nothing pending, without :class:`_CatchUp`: on a cluster, a
        consumer on a follower whose store is behind can end it short of the leader's end."""
        done = asyncio.get_running_loop().create_future()
        count = 0
        end, until_ns = read.end, read.until_ns

        async def deliver(msg: Msg) -> None:
            nonlocal count
            if done.done():
                return
            seq, time_ns, pending = parse_reply(msg.reply)
            if seq > end or (until_ns is not None and time_ns > until_ns):
                done.set_result(None)
                return
            headers = msg.headers
            try:
                result = on_message(
                    msg.subject, seq, time_ns, headers.get(MSG_ID, "") if headers else "", msg.data
                )
                if result is not None:
                    await result
            except Exception as exc:  # nats-py would swallow it: end the scan and raise it to the caller
                done.set_exception(exc)
                return
            count += 1
            if seq >= end or pending == 0:
                done.set_result(None)

        config = read.consumer_config(0)
        sub = await self.js.subscribe(
            read.subjects or all_subjects(read.stream),
            stream=read.stream,
            cb=deliver,
            ordered_consumer=True,
            config=config,
            pending_msgs_limit=256 * 1024,
            pending_bytes_limit=256 * 1024 * 1024,
        )
        try:
            while not done.done():
                await asyncio.wait([done], timeout=_IDLE_CHECK_S)
                if not done.done() and await _consumer_drained(sub, count):
                    break
            if done.done():
                done.result()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return count

    async def _scan_work_queue(
        self,
        stream: str,
        on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
        *,
        start_seq: int,
        until_seq: int | None,
    ) -> int:
        """Read a work-queue stream by sequence (direct get): a consumer would take the messages away."""
        bounds = await self.bounds(stream)
        last = bounds.last_seq if until_seq is None else min(until_seq, bounds.last_seq)
        count = 0
        for seq in range(max(start_seq, bounds.first_seq), last + 1):
            try:
                raw = await self.js.get_msg(stream, seq=seq, direct=True)
            except nats.js.errors.NotFoundError:
                continue  # acknowledged by its worker and removed
            time_ns = ns_of(raw.time)
            result = on_message(
                raw.subject or "", seq, time_ns, (raw.headers or {}).get(MSG_ID, ""), raw.data or b""
            )
            if result is not None:
                await result
            count += 1
        return count


def all_subjects(stream: str) -> str:
    """A subject filter for everything ``stream`` holds."""
    spec = BY_NAME[stream]
    return spec.subjects[0] if len(spec.subjects) == 1 else ">"


async def _consumer_drained(sub: Any, delivered: int) -> bool:
    """True when the scan's consumer has nothing left to deliver (e.g. a filter that matches nothing)."""
    try:
        info = await sub.consumer_info()
    except Exception:
        return False
    return bool(info.num_pending == 0 and delivered >= (info.delivered.consumer_seq or 0))


@dataclass(frozen=True, slots=True)
class _Read:
    """What one :meth:`EventLog.scan` reads: its stream, bounds and subject filter."""

    stream: str
    end: int
    start_seq: int
    start_time: datetime | None
    until_ns: int | None
    subjects: str | None

    def consumer_config(self, after: int) -> api.ConsumerConfig:
        """A consumer starting after sequence ``after`` (0: where the scan starts)."""
        config = api.ConsumerConfig(filter_subject=self.subjects or None)
        if after:
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = after + 1
        elif self.start_time is not None:
            config.deliver_policy = api.DeliverPolicy.BY_START_TIME
            config.opt_start_time = self.start_time.astimezone(UTC)
        elif self.start_seq > 1:
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = self.start_seq
        return config


class _PullConsumer:
    """One acknowledgement-free, in-memory pull consumer of a scan, on an inbox of its own.

    Attributes:
        target: the messages it is to deliver: its pending count when it was created, and no more
            than there are sequences up to the scan's end.
        requested / delivered: messages asked for and handed to the scan's callback so far.
    """

    def __init__(
        self, scanner: Scanner, tap: RawTap, sub: Any, inbox: str, stream: str, name: str, target: int
    ) -> None:
        self._scanner, self._tap, self._sub, self._inbox = scanner, tap, sub, inbox
        self._stream, self.name = stream, name
        self._next = f"{scanner.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
        self.target = target
        self.requested = 0
        self.delivered = 0

    @classmethod
    async def open(cls, scanner: Scanner, tap: RawTap, read: _Read, after: int, sink: Sink) -> _PullConsumer:
        """Create the consumer, starting after sequence ``after`` (0: where the scan starts), its
        inbox tapped into ``sink``."""
        nc = scanner.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        tap.add(sub._id, sink)
        config = read.consumer_config(after)
        config.ack_policy = api.AckPolicy.NONE
        config.mem_storage = True
        config.num_replicas = 1
        config.inactive_threshold = _SCAN_CONSUMER_IDLE_S
        try:
            info = await _add_consumer(scanner, read.stream, config)
        except BaseException:
            tap.remove(sub._id)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            raise
        target = int(info.num_pending or 0)
        if after or read.start_time is None:  # no more than the sequences up to the scan's end
            target = min(target, read.end - (after + 1 if after else read.start_seq) + 1)
        return cls(scanner, tap, sub, inbox, read.stream, info.name, max(0, target))

    async def request_ahead(self) -> None:
        """Ask for more messages while fewer than :data:`_SCAN_AHEAD` batches are outstanding."""
        room = (_SCAN_AHEAD - 1) * _SCAN_BATCH
        while self.requested < self.target and self.requested - self.delivered <= room:
            batch = min(_SCAN_BATCH, self.target - self.requested)
            body = b'{"batch":%d,"expires":%d}' % (batch, _SCAN_REQUEST_EXPIRES_NS)
            await self._scanner.nc.publish(self._next, body, reply=self._inbox)
            self.requested += batch

    async def close(self) -> None:
        """Stop taking its messages and delete it (what is in flight is dropped)."""
        self._tap.remove(self._sub._id)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self._scanner.js.delete_consumer(self._stream, self.name)


class _Outcome(enum.Enum):
    """How a chunk of a scan ended."""

    MORE = "more"
    DONE = "done"
    """The scan's end (its last sequence or time) was reached."""
    DRAINED = "drained"
    """The consumer has nothing more: the end, unless its node's store is behind (:class:`_CatchUp`)."""
    STATUS = "status"


async def _deliver_pulled(
    chunk: list[Frame],
    read: _Read,
    last: int,
    on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
) -> tuple[_Outcome, int, int]:
    """Hand a chunk of raw messages to ``on_message`` in order.

    Returns whether the scan is done, needs more, or met a status (a pull request that ended early:
    the consumer is replaced), the sequence of the last message delivered and how many were.
    """
    end, until_ns = read.end, read.until_ns
    delivered = 0
    for subject, reply, data, headers in chunk:
        if not reply:
            return _Outcome.STATUS, last, delivered
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>, or the v2 form with
        # a domain and an account hash after ACK and a random token at the end (core.log.frames.parse_reply)
        tokens = reply.split(b".")
        if len(tokens) == 9:
            seq, time_ns, left = int(tokens[5]), int(tokens[7]), int(tokens[8])
        else:
            seq, time_ns, left = int(tokens[7]), int(tokens[9]), int(tokens[10])
        if seq <= last:
            continue
        if seq > end or (until_ns is not None and time_ns > until_ns):
            return _Outcome.DONE, last, delivered
        msg_id = ""
        if headers:  # the one header a stored message carries is usually its Nats-Msg-Id
            at = headers.find(_MSG_ID_HEADER)
            if at >= 0:
                at += len(_MSG_ID_HEADER)
                msg_id = headers[at : headers.find(b"\r\n", at)].strip().decode()
        result = on_message(subject.decode(), seq, time_ns, msg_id, data)
        if result is not None:
            await result
        last = seq
        delivered += 1
        if seq >= end:
            return _Outcome.DONE, last, delivered
        if left == 0:
            return _Outcome.DRAINED, last, delivered
    return _Outcome.MORE, last, delivered


_MSG_ID_HEADER = MSG_ID.encode() + b":"


_NO_MESSAGE_FOUND = 10037
"""JetStream's error code for a message get that found nothing (a 404, as is "stream not found")."""
_CATCH_UP_S = 30.0
"""How long a scan waits, with no message delivered, for its consumer's node to catch up with the
stream's leader before it gives up (:class:`_CatchUp`)."""


class _CatchUp:
    """Whether a scan whose consumer has nothing more is really at its end.

    A scan's consumer (R1, in memory) reads the store of the node it was placed on. On a cluster that
    may be a follower whose store is behind its raft log (a saturating writer left one 90,000
    messages behind), so its pending count ends the scan short of the end the stream's leader named
    when the scan began. The leader is asked for the next message the scan would take after the last
    it delivered: if there is one within the scan's bounds, the scan goes on, after a pause, with a
    new consumer; one that delivers nothing for :data:`_CATCH_UP_S` raises :class:`LogUnavailable`.
    """

    def __init__(self, js: JetStreamContext, read: _Read) -> None:
        self._js, self._read = js, read
        self._last = -1
        self._waiting_since = 0.0
        self._pause = 0.05

    async def behind(self, last: int) -> bool:
        """True when the stream's leader holds a message the scan should still deliver after ``last``."""
        read = self._read
        if last >= read.end:
            return False
        loop = asyncio.get_running_loop()
        if last != self._last:
            self._last, self._waiting_since, self._pause = last, loop.time(), 0.05
        elif loop.time() - self._waiting_since > _CATCH_UP_S:
            raise LogUnavailable(
                f"the {read.stream} stream's replica did not catch up with its leader within"
                f" {_CATCH_UP_S:.0f} s (the scan delivered up to {last} of {read.end})"
            )
        try:
            more = await self._leader_has_more(last)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == _NO_MESSAGE_FOUND:
                return False
            more = True  # the stream unknown to the server that answered, during a failover: again
        except UNANSWERED:
            more = True  # an election: the next consumer waits for it
        if more:
            await asyncio.sleep(self._pause)
            self._pause = min(self._pause * 2, 1.0)
        return more

    async def _leader_has_more(self, last: int) -> bool:
        read = self._read
        subjects = read.subjects or all_subjects(read.stream)
        if last == 0 and read.start_time is not None:
            # nothing delivered from a start time: is the newest message the scan takes recent enough?
            newest = await self._js.get_msg(read.stream, subject=subjects)
            return ns_of(newest.time) >= ns_of(read.start_time)
        after = last + 1 if last else read.start_seq
        found = await self._js.get_msg(read.stream, seq=after, subject=subjects, next=True)
        seq = found.seq or 0
        return seq <= read.end and (read.until_ns is None or ns_of(found.time) <= read.until_ns)


async def _add_consumer(scanner: Scanner, stream: str, config: api.ConsumerConfig) -> api.ConsumerInfo:
    """Create an (ephemeral, self-expiring) consumer, trying again while nothing answers.

    Raises:
        LogUnavailable: still no answer after :data:`ELECTION_S`.
    """
    patience = Patience(ELECTION_S, first_s=0.1, max_s=1.0, silent=scanner.silent)
    while True:
        try:
            return await scanner.js.add_consumer(stream, config)
        except UNANSWERED as exc:
            if not await patience.wait():
                raise LogUnavailable(f"the {stream} stream did not answer: {type(exc).__name__}") from None
