"""The event log: the one module that appends to and reads from NATS JetStream.

Everything that happens is an event appended here; everything that is known is folded from what
this module reads back. It owns the wire details: the ``Nats-Msg-Id`` that makes a retried append
idempotent, the expected-sequence headers that turn a lost race into :class:`ConcurrencyConflict`,
acknowledgement time-outs, ordered replay, and the quarantine of stored bytes that no longer decode.

Appends use the log's own reply inbox and :class:`core.wire.AckTracker` rather than nats-py's
``publish_async`` (see :mod:`core.wire` for why): every append not acknowledged within
``ack_timeout_s`` fails with :class:`AppendTimeout`.

Reads that rebuild projections (:meth:`EventLog.scan`) do not go through nats-py's per-message
machinery either, which cost about 30 us a message here: an acknowledgement-free pull consumer is
read in batches, and :class:`core.wire.RawTap` takes its messages off the connection's parser as
bytes (about 3 us a message, ~250k/s), falling back to nats-py's ordered push consumer where it
cannot. Agents' claims are read off the INTAKE work queue with :meth:`EventLog.pull`; QUARANTINE is
written with its reasons (:meth:`EventLog.quarantine_now`) and read with them
(:meth:`EventLog.quarantined`).

The module is longer than most (~1,100 lines): it is the one place that speaks JetStream (the frame
parsing that does not talk to the server lives in :mod:`core.wire`), and splitting its append and
read halves would spread one protocol, and the connection state both use, over files that must
change together.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import typing
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from core.clock import NS_PER_S, ns_of
from core.errors import InvalidInput, LogUnavailable, NoResponders
from core.settings import Settings
from core.streams import (
    BY_NAME,
    DUPLICATE_WINDOW_S,
    STREAMS,
    StreamSpec,
    command_consumer,
    command_subject,
    quarantine_subject,
    stream_for_subject,
    subject_mismatch,
)
from core.wire import (
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MSG_ID,
    QUARANTINE_REASON,
    QUARANTINE_SENDER,
    QUARANTINE_SEQ,
    QUARANTINE_STREAM,
    QUARANTINE_SUBJECT,
    AckTracker,
    Frame,
    Position,
    Quarantined,
    RawRecord,
    RawTap,
    Sink,
    new_event_id,
    parse_reply,
)
from schemas import Event
from schemas._base import UPCASTERS, upcast
from schemas.catalog import FAMILIES, decoder, encode
from schemas.envelope import Recorded

NO_RESPONDERS_RETRY_S = 1.0
"""How long :meth:`EventLog.append` retries an append that nothing answered. A server reloading its
configuration (``resontech nats-auth`` adding an agent's user) leaves JetStream silent for ~50 ms;
an append in that gap is retried rather than failed. A subject no stream captures fails after it."""
NO_RESPONDERS_FIRST_DELAY_S = 0.025
STREAM_CREATE_ATTEMPTS = 5
STREAM_STORE_ERROR = 10049
"""JetStream's "error creating store for stream"."""
WATCH_RETRY_S = 5.0
"""How long :meth:`EventLog.watch` retries creating its consumer while the JetStream API is silent."""

__all__ = ["EventLog", "Position", "Pulled", "Quarantined", "RawRecord", "Watch", "new_event_id"]

SNAPSHOT_BUCKET = "snapshots"
DEFAULT_MAX_IN_FLIGHT = 8192
CONNECT_TIMEOUT_S = 5.0
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


class EventLog:
    """A connection to the event log.

    Create with :meth:`connect`; call :meth:`ensure_streams` once at start-up of anything that owns
    the deployment (the dev stack, tests, ``resontech streams``).
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self._nc = nc
        self._js = nc.jetstream(
            timeout=settings.ack_timeout_s, prefix=settings.nats_js_api_prefix or api.DEFAULT_PREFIX
        )
        self.settings = settings
        self._acks = AckTracker(settings.ack_timeout_s)
        self._inbox = ""
        self._tokens = itertools.count(1)
        self._background: set[asyncio.Task[Any]] = set()
        self._raw_tap: RawTap | None = None

    @classmethod
    async def connect(cls, settings: Settings, *, name: str = "resontech") -> EventLog:
        """Connect to NATS with the settings' URL and credentials.

        Raises:
            LogUnavailable: the server cannot be reached within a few seconds.
        """
        options: dict[str, Any] = {
            "servers": settings.nats_url.split(","),
            "name": name,
            "connect_timeout": 3,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "allow_reconnect": True,
        }
        if settings.nats_creds:
            options["user_credentials"] = settings.nats_creds
        if settings.nats_user:
            options["user"] = settings.nats_user
            options["password"] = settings.nats_password or ""
        if settings.nats_inbox_prefix:
            options["inbox_prefix"] = settings.nats_inbox_prefix

        async def _quiet(_: Exception) -> None:
            return None

        try:
            # Reconnects are unlimited once connected; the first connection gets a deadline, or
            # nats-py would retry an unreachable server forever.
            nc = await asyncio.wait_for(nats.connect(**options, error_cb=_quiet), timeout=CONNECT_TIMEOUT_S)
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            reason = str(exc) or "no answer"
            raise LogUnavailable(f"cannot reach NATS at {settings.nats_url}: {reason}") from None
        log = cls(nc, settings)
        log._inbox = nc.new_inbox() + "."
        await nc.subscribe(log._inbox + "*", cb=log._on_ack)
        return log

    async def close(self) -> None:
        """Wait for outstanding appends (up to the ack time-out), then disconnect."""
        with contextlib.suppress(Exception):
            await self._wait_pending()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        self._acks.close()
        self._acks.fail_all(LogUnavailable("event log closed"))
        with contextlib.suppress(Exception):
            await self._nc.drain()

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- streams -------------------------------------------------------------------------------

    async def ensure_streams(self, streams: Sequence[StreamSpec] = STREAMS) -> None:
        """Create every stream, or update its configuration to the table in :mod:`core.streams`.

        A stream's persist mode is fixed at its creation (the server refuses to change it): an
        existing stream keeps the one it has."""
        jsm = self._js
        for spec in streams:
            config = _stream_config(spec, self.settings.stream_replicas)
            try:
                await _add_stream(jsm, config)
            except nats.js.errors.BadRequestError:
                existing = await jsm.stream_info(spec.name)
                config.persist_mode = existing.config.persist_mode
                await jsm.update_stream(config)
            except nats.js.errors.ServiceUnavailableError as exc:
                raise LogUnavailable(f"JetStream is not available: {exc}") from None
        with contextlib.suppress(nats.js.errors.BadRequestError):
            await jsm.create_object_store(
                SNAPSHOT_BUCKET, config=api.ObjectStoreConfig(replicas=self.settings.stream_replicas)
            )

    async def last_seq(self, stream: str, subject: str | None = None) -> int:
        """The stream's last sequence, or the last sequence of ``subject`` in it (0 if none)."""
        if subject is None:
            info = await self._js.stream_info(stream)
            return int(info.state.last_seq)
        try:
            msg = await self._js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return 0
        return int(msg.seq or 0)

    async def get_last(self, stream: str, subject: str) -> Recorded[Any] | None:
        """The newest event on exactly ``subject``, decoded, or ``None``."""
        try:
            raw = await self._js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
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

    # -- appends -------------------------------------------------------------------------------

    async def _on_ack(self, msg: Msg) -> None:
        no_responders = bool(msg.headers) and msg.headers.get("Status") == "503"  # type: ignore[union-attr]
        self._acks.resolve(msg.subject[len(self._inbox) :], msg.data, no_responders)

    async def _publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        expected: int | None = None,
    ) -> asyncio.Future[Position]:
        token = str(next(self._tokens))
        future = self._acks.add(token, subject, expected)
        try:
            await self._nc.publish(subject, data, reply=self._inbox + token, headers=headers)
        except nats.errors.Error as exc:
            self._acks.pending.pop(token, None)
            raise LogUnavailable(f"cannot publish to {subject}: {exc}") from None
        return future

    async def append(
        self,
        subject: str,
        event: Event,
        *,
        event_id: str | None = None,
        expected_seq: int | None = None,
        expected_filter: str | None = None,
    ) -> Position:
        """Append one event and wait for the server's acknowledgement.

        Args:
            subject: the full subject (build it with :mod:`core.streams`).
            event: the event.
            event_id: the event's unique id (``Nats-Msg-Id``); generate once and reuse on retry, so
                that a retried append is stored once. Default: a new id.
            expected_seq: append only if the last sequence on ``subject`` (or on
                ``expected_filter``) is exactly this; 0 means "nothing there yet".
            expected_filter: a subject filter, possibly with wildcards, that the expected-sequence
                check spans (``job.acme.j1.>``: "no event of this job since I read it").

        Raises:
            ConcurrencyConflict: the expected sequence did not match; re-read and re-decide.
            AppendTimeout: no acknowledgement within ``ack_timeout_s``; retry with the same id.
            AppendRejected: the server refused the message; :class:`~core.errors.NoResponders` when
                nothing answered for :data:`NO_RESPONDERS_RETRY_S` (no stream captures the subject).
        """
        headers = {MSG_ID: event_id or new_event_id()}
        if expected_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_seq)
            if expected_filter is not None:
                headers[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = expected_filter
        elif expected_filter is not None:
            raise ValueError("expected_filter needs expected_seq")
        _check_subject(subject, event)
        data = encode(event)
        delay = NO_RESPONDERS_FIRST_DELAY_S
        deadline = asyncio.get_running_loop().time() + NO_RESPONDERS_RETRY_S
        while True:
            future = await self._publish(subject, data, headers, expected_seq)
            try:
                return await future
            except NoResponders:
                # Nothing was stored; the same message id makes the retry safe in any case.
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay *= 2

    async def submit(
        self, subject: str, event: Event, *, event_id: str, expected_seq: int | None = None
    ) -> asyncio.Future[Position]:
        """Publish one event and return the future of its acknowledgement, without waiting for it:
        appends submitted one after another are stored in that order (one connection), and their
        acknowledgements overlap. The future fails as :meth:`append` would raise.
        """
        _check_subject(subject, event)
        headers = {MSG_ID: event_id}
        if expected_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_seq)
        return await self._publish(subject, encode(event), headers, expected_seq)

    async def append_many(
        self,
        items: Iterable[tuple[str, Event] | tuple[str, Event, str]],
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> list[Position]:
        """Append many independent events at a high rate, in order, with bounded publishes in flight.

        Each item is ``(subject, event)`` or ``(subject, event, event_id)``. Returns their positions
        in the same order. Every acknowledgement has the log's time-out.

        Raises:
            AppendTimeout / AppendRejected: the first failure; earlier events are stored, later ones
                may or may not be. Retrying the whole batch with the same event ids is safe.
        """
        futures: list[asyncio.Future[Position]] = []
        window: deque[asyncio.Future[Position]] = deque()
        publish = self._publish
        try:
            for item in items:
                event_id = item[2] if len(item) == 3 else new_event_id()
                _check_subject(item[0], item[1])
                future = await publish(item[0], encode(item[1]), {MSG_ID: event_id})
                futures.append(future)
                window.append(future)
                if len(window) >= max_in_flight:
                    await window.popleft()
                    while window and window[0].done():
                        window.popleft().result()
            return [await future for future in futures]
        except BaseException:
            for future in futures:
                # The first failure is raised; the others are consumed so none is "never retrieved".
                future.add_done_callback(_consume)
            raise

    async def _wait_pending(self) -> None:
        for future, *_ in list(self._acks.pending.values()):
            with contextlib.suppress(Exception):
                await future

    # -- reads ---------------------------------------------------------------------------------

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
        """Deliver stored messages in stream order to ``on_message(subject, seq, time_ns, msg_id, data)``.

        Stops at the end of the stream as it was when the scan began (or at ``until_seq`` /
        ``until_time``); every message is delivered once. This is the fast path projections rebuild
        with: an acknowledgement-free pull consumer read in large batches, each message taken off
        the connection before nats-py's per-message work (see :class:`RawTap`); where that is not
        possible, nats-py's ordered push consumer. ``on_message`` may return an awaitable: it is
        awaited before the next message. Returns the number of messages delivered.
        """
        if BY_NAME[stream].retention == "workqueue":
            return await self._scan_work_queue(stream, on_message, start_seq=start_seq, until_seq=until_seq)
        info = await self._js.stream_info(stream)
        end = info.state.last_seq if until_seq is None else min(until_seq, info.state.last_seq)
        if info.state.messages == 0 or end < max(start_seq, info.state.first_seq):
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
            self._raw_tap = RawTap.attach(self._nc)
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
        delivered.
        """
        sink = Sink()
        frames = sink.frames
        last = 0  # the sequence of the last message delivered
        count = 0
        consumer: _PullConsumer | None = None
        try:
            while True:
                if consumer is not None:
                    await consumer.close()
                frames.clear()
                consumer = await _PullConsumer.open(self, tap, read, last, sink)
                if consumer.target == 0:
                    return count
                while True:
                    await consumer.request_ahead()
                    if not frames:
                        sink.arrived.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(sink.arrived.wait(), _SCAN_STALL_S)
                        if not frames:
                            break  # silent: a new consumer
                    chunk = frames[:]
                    frames.clear()
                    outcome, last, delivered = await _deliver_pulled(chunk, read, last, on_message)
                    count += delivered
                    consumer.delivered += delivered
                    if outcome is _Outcome.DONE or consumer.delivered >= consumer.target:
                        return count
                    if outcome is _Outcome.STATUS:
                        break
        finally:
            if consumer is not None:
                await consumer.close()

    async def _scan_ordered(
        self,
        read: _Read,
        on_message: Callable[[str, int, int, str, bytes], Awaitable[None] | None],
    ) -> int:
        """:meth:`scan` through nats-py's ordered push consumer (where :class:`RawTap` cannot attach)."""
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
        sub = await self._js.subscribe(
            read.subjects or _all_subjects(read.stream),
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
        info = await self._js.stream_info(stream)
        last = info.state.last_seq if until_seq is None else min(until_seq, info.state.last_seq)
        count = 0
        for seq in range(max(start_seq, info.state.first_seq), last + 1):
            try:
                raw = await self._js.get_msg(stream, seq=seq, direct=True)
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

    async def pull(
        self, stream: str, durable: str, *, batch: int = 256, wait_s: float = 1.0
    ) -> AsyncGenerator[list[Pulled], None]:
        """Yield batches of undecoded messages from the durable pull consumer ``durable`` on a
        work-queue ``stream`` (created if missing), forever; an empty batch after ``wait_s`` without
        any. Each message leaves the stream once acknowledged (:meth:`Pulled.ack`); one not
        acknowledged within 60 s is delivered again, to this consumer or another instance sharing it.
        """
        sub = await self._js.pull_subscribe(
            _all_subjects(stream),
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
        self, worker_id: str, *, batch: int = 16, wait_s: float = 1.0
    ) -> AsyncGenerator[tuple[Recorded[Any], Callable[[], Awaitable[None]]], None]:
        """Yield the commands addressed to one worker, each with its ``ack``, oldest first, forever.

        Commands wait on the worker's durable consumer (``agent-<worker_id>`` on COMMANDS, a work
        queue): they survive the agent's restarts and reconnects, and a command leaves the queue
        only when acknowledged. A command not acknowledged within 30 s (or handed back when the
        iterator is closed) is delivered again, so
        handlers must be idempotent by command id (``Recorded.msg_id``). A command that fails to
        decode is quarantined and acknowledged.
        """
        subject = command_subject(worker_id)
        decode_record = self.record_decoder("COMMANDS")
        sub = await self._js.pull_subscribe(
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

    async def watch(
        self,
        stream: str,
        on_record: Callable[[Recorded[Any]], None],
        *,
        after_seq: int = 0,
        subjects: str | None = None,
    ) -> Watch:
        """Call ``on_record`` for every event above ``after_seq``, stored ones first, then live ones.

        Returns a handle; ``await handle.stop()`` ends the watch. ``on_record`` runs on the event
        loop and must not block.
        """
        decode_record = self.record_decoder(stream)

        async def deliver(msg: Msg) -> None:
            seq, time_ns, _ = parse_reply(msg.reply)
            headers = msg.headers
            msg_id = headers.get(MSG_ID, "") if headers else ""
            record = decode_record(msg.subject, seq, time_ns, msg_id, msg.data)
            if record is not None:
                on_record(record)

        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
        )
        delay = NO_RESPONDERS_FIRST_DELAY_S
        deadline = asyncio.get_running_loop().time() + WATCH_RETRY_S
        while True:
            try:
                sub = await self._js.subscribe(
                    subjects or _all_subjects(stream),
                    stream=stream,
                    cb=deliver,
                    ordered_consumer=True,
                    config=config,
                )
                return Watch(sub)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError):
                # the JetStream API is briefly silent while the server reloads its accounts
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay *= 2

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

    def record_decoder(self, stream: str) -> Callable[[str, int, int, str, bytes], Recorded[Any] | None]:
        """A function from stored fields to a :class:`Recorded` event, quarantining what fails to decode."""
        family = BY_NAME[stream].family
        if family is None:
            raise ValueError(f"stream {stream} holds raw records; use replay_raw")

        # The hot path of every rebuild: the family's decoder bound once, upcasting only if needed,
        # and the subject check reduced to one dictionary lookup and one comparison.
        spec = BY_NAME[stream]
        decode_event = decoder(family).decode
        names = {cls: cls.event_name() for cls in _members(FAMILIES[family])} if spec.named else {}

        def decode_record(
            subject: str, seq: int, time_ns: int, msg_id: str, data: bytes
        ) -> Recorded[Any] | None:
            try:
                event = decode_event(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.quarantine(stream, seq, subject, data, str(exc))
                return None
            if names and subject[subject.rfind(".") + 1 :] != names[type(event)]:
                mismatch = subject_mismatch(spec, subject, event)
                if mismatch is not None:
                    self.quarantine(stream, seq, subject, data, mismatch)
                    return None
            if UPCASTERS:
                event = upcast(event)
            return Recorded(
                stream=stream, seq=seq, subject=subject, time_ns=time_ns, msg_id=msg_id, event=event
            )

        return decode_record

    def quarantine(self, stream: str, seq: int, subject: str, data: bytes, reason: str) -> None:
        """Copy a stored message that fails to decode (or to match its subject) to
        ``quarantine.<stream>``, once per message.

        Readers skip it and carry on; an operator finds it with ``resontech quarantine``.
        """

        async def store() -> None:
            with contextlib.suppress(Exception):
                await self.quarantine_now(stream, seq, subject, data, reason)

        task = asyncio.get_running_loop().create_task(store())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def quarantine_now(
        self, stream: str, seq: int, subject: str, data: bytes, reason: str, *, sender: str = ""
    ) -> Position:
        """Store a refused message in QUARANTINE with its reason (and the worker that sent it, for
        a claim the intake refused), once per origin message; returns where it landed.

        Raises:
            AppendTimeout / AppendRejected / LogUnavailable: as :meth:`append`.
        """
        headers = {
            MSG_ID: f"quarantine-{stream}-{seq}",
            QUARANTINE_REASON: _header_value(reason),
            QUARANTINE_STREAM: stream,
            QUARANTINE_SEQ: str(seq),
            QUARANTINE_SUBJECT: subject,
        }
        if sender:
            headers[QUARANTINE_SENDER] = sender
        return await (await self._publish(quarantine_subject(stream), data, headers))

    async def quarantined(self, *, after_seq: int = 0, limit: int = 100) -> list[Quarantined]:
        """Up to ``limit`` messages of QUARANTINE after ``after_seq``, oldest first, with their
        reasons and senders (the operator's view: ``resontech quarantine``, ``GET /v1/quarantine``)."""
        info = await self._js.stream_info("QUARANTINE")
        out: list[Quarantined] = []
        seq = max(after_seq + 1, info.state.first_seq)
        while seq <= info.state.last_seq and len(out) < limit:
            try:
                raw = await self._js.get_msg("QUARANTINE", seq=seq, direct=True)
            except nats.js.errors.NotFoundError:
                seq += 1
                continue
            headers = raw.headers or {}
            out.append(
                Quarantined(
                    seq=seq,
                    time_ns=ns_of(raw.time),
                    stream=headers.get(QUARANTINE_STREAM, ""),
                    origin_seq=int(headers.get(QUARANTINE_SEQ, "0") or 0),
                    subject=headers.get(QUARANTINE_SUBJECT, ""),
                    reason=headers.get(QUARANTINE_REASON, ""),
                    sender=headers.get(QUARANTINE_SENDER, ""),
                    data=raw.data or b"",
                )
            )
            seq += 1
        return out

    async def publish_raw(self, subject: str, data: bytes, event_id: str | None = None) -> Position:
        """Store bytes as they are (no encoding): for tools and tests that write foreign messages."""
        return await (await self._publish(subject, data, {MSG_ID: event_id or new_event_id()}))

    # -- snapshots -----------------------------------------------------------------------------

    async def put_snapshot(self, name: str, data: bytes) -> None:
        """Store a projection snapshot (JetStream object store, bucket ``snapshots``)."""
        store = await self._js.object_store(SNAPSHOT_BUCKET)
        await store.put(name, data)

    async def get_snapshot(self, name: str) -> bytes | None:
        """The stored snapshot called ``name``, or ``None``."""
        try:
            store = await self._js.object_store(SNAPSHOT_BUCKET)
            result = await store.get(name)
        except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError):
            return None
        return bytes(result.data or b"")


def _check_subject(subject: str, event: Event) -> None:
    """Refuse an event whose type is not the one its subject names (see :func:`subject_mismatch`).
    A subject no stream of ours captures is left to the server (no responders)."""
    try:
        spec = stream_for_subject(subject)
    except InvalidInput:
        return
    mismatch = subject_mismatch(spec, subject, event)
    if mismatch is not None:
        raise InvalidInput(f"refused: {mismatch}")


def _members(union: Any) -> tuple[type[Event], ...]:
    return typing.get_args(union) or (union,)


def _header_value(text: str) -> str:
    return text[:500].replace("\r", " ").replace("\n", " ")


async def _add_stream(jsm: Any, config: api.StreamConfig) -> None:
    """Create a stream; a store the server cannot create yet (error 10049: the directory of a stream
    deleted a moment ago is still being removed) is tried again, a few times."""
    for attempt in range(STREAM_CREATE_ATTEMPTS):
        try:
            await jsm.add_stream(config)
            return
        except nats.js.errors.ServerError as exc:
            if exc.err_code != STREAM_STORE_ERROR or attempt == STREAM_CREATE_ATTEMPTS - 1:
                raise
        await asyncio.sleep(0.1 * (attempt + 1))


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


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


class Watch:
    """A running :meth:`EventLog.watch`."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        """End the watch."""
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()


def _all_subjects(stream: str) -> str:
    spec = BY_NAME[stream]
    return spec.subjects[0] if len(spec.subjects) == 1 else ">"


def _stream_config(spec: StreamSpec, replicas: int) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.holds,
        subjects=list(spec.subjects) or None,
        retention=api.RetentionPolicy.WORK_QUEUE
        if spec.retention == "workqueue"
        else api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        max_age=float(spec.max_age_s),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=float(DUPLICATE_WINDOW_S),
        sources=[api.StreamSource(name=s) for s in spec.sources] or None,
        allow_direct=True,
        persist_mode=api.PersistMode.ASYNC if spec.persist_async and replicas == 1 else None,
    )


async def _consumer_drained(sub: Any, delivered: int) -> bool:
    """True when the scan's consumer has nothing left to deliver (e.g. a filter that matches nothing)."""
    try:
        info = await sub.consumer_info()
    except Exception:
        return False
    return bool(info.num_pending == 0 and delivered >= (info.delivered.consumer_seq or 0))


# -- the scan's read path ------------------------------------------------------------------------


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
        self, log: EventLog, tap: RawTap, sub: Any, inbox: str, stream: str, name: str, target: int
    ) -> None:
        self._log, self._tap, self._sub, self._inbox = log, tap, sub, inbox
        self._stream, self.name = stream, name
        prefix = log.settings.nats_js_api_prefix or api.DEFAULT_PREFIX
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
        self.target = target
        self.requested = 0
        self.delivered = 0

    @classmethod
    async def open(cls, log: EventLog, tap: RawTap, read: _Read, after: int, sink: Sink) -> _PullConsumer:
        """Create the consumer, starting after sequence ``after`` (0: where the scan starts), its
        inbox tapped into ``sink``."""
        nc = log._nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        tap.add(sub._id, sink)
        config = read.consumer_config(after)
        config.ack_policy = api.AckPolicy.NONE
        config.mem_storage = True
        config.num_replicas = 1
        config.inactive_threshold = _SCAN_CONSUMER_IDLE_S
        try:
            info = await log._js.add_consumer(read.stream, config)
        except BaseException:
            tap.remove(sub._id)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            raise
        target = int(info.num_pending or 0)
        if after or read.start_time is None:  # no more than the sequences up to the scan's end
            target = min(target, read.end - (after + 1 if after else read.start_seq) + 1)
        return cls(log, tap, sub, inbox, read.stream, info.name, max(0, target))

    async def request_ahead(self) -> None:
        """Ask for more messages while fewer than :data:`_SCAN_AHEAD` batches are outstanding."""
        room = (_SCAN_AHEAD - 1) * _SCAN_BATCH
        while self.requested < self.target and self.requested - self.delivered <= room:
            batch = min(_SCAN_BATCH, self.target - self.requested)
            body = b'{"batch":%d,"expires":%d}' % (batch, _SCAN_REQUEST_EXPIRES_NS)
            await self._log._nc.publish(self._next, body, reply=self._inbox)
            self.requested += batch

    async def close(self) -> None:
        """Stop taking its messages and delete it (what is in flight is dropped)."""
        self._tap.remove(self._sub._id)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self._log._js.delete_consumer(self._stream, self.name)


class _Outcome(enum.Enum):
    """How a chunk of a scan ended."""

    MORE = "more"
    DONE = "done"
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
        # a domain and an account hash after ACK and a random token at the end (core.wire.parse_reply)
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
        if seq >= end or left == 0:
            return _Outcome.DONE, last, delivered
    return _Outcome.MORE, last, delivered


_MSG_ID_HEADER = MSG_ID.encode() + b":"
