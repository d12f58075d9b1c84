"""The event log's one class, :class:`EventLog`: every public method of the log, each a thin
delegation to the module that holds its machinery.

It is a :class:`~core.log.connection.LogConnection` (connecting, the acknowledgement inbox, the
publish path, stream bounds, closing) and holds a :class:`~core.log.scan.Scanner`; the rest are plain
functions given what they use: :mod:`core.log.appending`, :mod:`core.log.reading`,
:mod:`core.log.decoding`, :mod:`core.log.queues`, :mod:`core.log.streams`, :mod:`core.log.snapshots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from core.errors import LogUnavailable
from core.log import appending, decoding, queues, reading, snapshots
from core.log import streams as stream_setup
from core.log.appending import DEFAULT_MAX_IN_FLIGHT
from core.log.connection import LogConnection
from core.log.decoding import DecodeRecord
from core.log.queues import Pulled
from core.log.reading import Watch
from core.log.scan import Scanner
from core.settings import Settings
from core.streams import STREAMS, StreamSpec, quarantine_subject
from core.wire import MSG_ID, Position, Quarantined, RawRecord, new_event_id
from schemas._base import Event
from schemas.catalog import encode
from schemas.envelope import Recorded

log = logging.getLogger("resontech.log")


class EventLog(LogConnection):
    """A connection to the event log.

    Create with :meth:`connect`; call :meth:`ensure_streams` once at start-up of anything that owns
    the deployment (the dev stack, tests, ``resontech streams``).
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        super().__init__(nc, settings)
        self._scanner = Scanner(
            nc,
            self._js,
            api_prefix=settings.nats_js_api_prefix or api.DEFAULT_PREFIX,
            bounds=self.stream_bounds,
            silent=self._silent,
        )

    # Appends (core.log.appending)

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
                nothing answered for :data:`~core.log.appending.NO_RESPONDERS_RETRY_S` (no stream
                captures the subject), or for :data:`~core.log.appending.LEADERLESS_RETRY_S` on a
                stream of ours (it has no leader).
        """
        headers = appending.append_headers(event_id or new_event_id(), expected_seq, expected_filter)
        ours = appending.check_subject(subject, event)
        message = (subject, encode(event), headers, ours)
        return await appending.until_answered(self._publish, self._silent, message, expected_seq)

    async def submit(
        self, subject: str, event: Event, *, event_id: str, expected_seq: int | None = None
    ) -> asyncio.Future[Position]:
        """Publish one event and return the future of its acknowledgement, without waiting for it:
        appends submitted one after another are stored in that order (one connection), and their
        acknowledgements overlap. The future fails as one attempt of :meth:`append` would (a stream
        without a leader is not waited for).
        """
        appending.check_subject(subject, event)
        headers = appending.append_headers(event_id, expected_seq, None)
        return await self._publish(subject, encode(event), headers, expected_seq)

    async def append_many(
        self,
        items: Iterable[tuple[str, Event] | tuple[str, Event, str]],
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> list[Position]:
        """Append many independent events at a high rate, in order, with bounded publishes in flight.

        Each item is ``(subject, event)`` or ``(subject, event, event_id)``. Returns their positions
        in the same order. Every acknowledgement has the log's time-out. A batch waits out a stream
        with no leader as :meth:`append` does (the events from the first one nothing answered are
        sent again, with the same ids); an election in the middle of a batch can store an event
        after a later one that was answered before it.

        Raises:
            AppendTimeout / AppendRejected: the first failure; earlier events are stored, later ones
                may or may not be. Retrying the whole batch with the same event ids is safe.
        """
        messages = [appending.message(item) for item in items]
        return await appending.append_in_order(self._publish, self._silent, messages, max_in_flight)

    async def publish_raw(self, subject: str, data: bytes, event_id: str | None = None) -> Position:
        """Store bytes as they are (no encoding): for tools and tests that write foreign messages."""
        return await (await self._publish(subject, data, {MSG_ID: event_id or new_event_id()}))

    # Reads (core.log.scan, core.log.reading)

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
        the connection before nats-py's per-message work (see :class:`~core.log.frames.RawTap`);
        where that is not possible, nats-py's ordered push consumer. ``on_message`` may return an
        awaitable: it is awaited before the next message. Returns the number of messages delivered.
        """
        return await self._scanner.scan(
            stream,
            on_message,
            start_seq=start_seq,
            start_time=start_time,
            until_seq=until_seq,
            until_time=until_time,
            subjects=subjects,
        )

    async def last_seq(self, stream: str, subject: str | None = None) -> int:
        """The stream's last sequence, or the last sequence of ``subject`` in it (0 if none)."""
        if subject is None:
            return (await self.stream_bounds(stream)).last_seq
        msg = await reading.last_msg(self._js, stream, subject)
        return int(msg.seq or 0) if msg is not None else 0

    async def get_last(self, stream: str, subject: str) -> Recorded[Any] | None:
        """The newest event on exactly ``subject``, decoded, or ``None``."""
        raw = await reading.last_msg(self._js, stream, subject)
        if raw is None:
            return None
        return reading.decode_last(raw, subject, self.record_decoder(stream))

    def replay(
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
        return reading.replay(
            self._scanner,
            self.record_decoder,
            stream,
            start_seq=start_seq,
            start_time=start_time,
            until_seq=until_seq,
            until_time=until_time,
            subjects=subjects,
        )

    async def replay_raw(self, stream: str, *, start_seq: int = 1) -> list[RawRecord]:
        """Every stored message of ``stream`` from ``start_seq``, undecoded (for audit export)."""
        return await reading.replay_raw(self._scanner, stream, start_seq=start_seq)

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
        deliver = reading.watch_delivery(self.record_decoder(stream), on_record, admit)
        return await reading.watch(self._js, stream, deliver, after_seq=after_seq, subjects=subjects)

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

    # Decoding and QUARANTINE (core.log.decoding)

    def record_decoder(self, stream: str) -> DecodeRecord:
        """A function from stored fields to a :class:`Recorded` event, quarantining what fails to decode."""
        return decoding.record_decoder(stream, self.quarantine)

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
        headers = decoding.quarantine_headers(stream, seq, subject, reason, sender)
        return await (await self._publish(quarantine_subject(stream), data, headers))

    async def quarantined(self, *, after_seq: int = 0, limit: int = 100) -> list[Quarantined]:
        """Up to ``limit`` messages of QUARANTINE after ``after_seq``, oldest first, with their
        reasons and senders (the operator's view: ``resontech quarantine``, ``GET /v1/quarantine``).
        What this connection's readers are still quarantining is stored first."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        bounds = await self.stream_bounds("QUARANTINE")
        return await decoding.read_quarantine(self._js, bounds, after_seq=after_seq, limit=limit)

    # Questions and answers (core NATS request/reply, no stream)

    async def ask(self, subject: str, data: bytes = b"", *, timeout_s: float = 5.0) -> bytes:
        """One request on ``subject`` and its one answer (a reply on this connection's inbox).

        Raises:
            LogUnavailable: nobody answered within ``timeout_s`` (no kernel service is up, or this
                connection may not ask that).
        """
        try:
            reply = await self._nc.request(subject, data, timeout=timeout_s)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise LogUnavailable(
                f"no answer on {subject} within {timeout_s:g} s ({type(exc).__name__})"
            ) from None
        return reply.data

    async def answer(
        self, subject: str, respond: Callable[[str, bytes], Awaitable[bytes]], stop: asyncio.Event
    ) -> None:
        """Answer requests on ``subject`` (wildcards allowed; one queue group, so several instances
        share them) with ``respond(subject, data)`` until ``stop`` is set. A request whose answer
        fails is logged and left unanswered: the asker's time-out says so."""

        async def on_request(msg: Msg) -> None:
            if not msg.reply:
                return
            try:
                answer = await respond(msg.subject, msg.data)
            except Exception:
                log.exception("cannot answer %s", msg.subject)
                return
            await self._nc.publish(msg.reply, answer)

        subscription = await self._nc.subscribe(subject, queue="kernel", cb=on_request)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    # Work queues (core.log.queues)

    def pull(
        self, stream: str, durable: str, *, batch: int = 256, wait_s: float = 1.0
    ) -> AsyncGenerator[list[Pulled], None]:
        """Yield batches of undecoded messages from the durable pull consumer ``durable`` on a
        work-queue ``stream`` (created if missing), forever; an empty batch after ``wait_s`` without
        any. Each message leaves the stream once acknowledged (:meth:`Pulled.ack`); one not
        acknowledged within 60 s is delivered again, to this consumer or another instance sharing it.
        """
        return queues.pull(self._js, stream, durable, batch=batch, wait_s=wait_s)

    def commands(
        self, worker_id: str, *, batch: int = 16, wait_s: float = 1.0
    ) -> AsyncGenerator[tuple[Recorded[Any], Callable[[], Awaitable[None]]], None]:
        """Yield the commands addressed to one worker, each with its ``ack``, oldest first, forever.

        Commands wait on the worker's durable consumer (``agent-<worker_id>`` on COMMANDS, a work
        queue): they survive the agent's restarts and reconnects, and a command leaves the queue
        only when acknowledged. A command not acknowledged within 30 s (or handed back when the
        iterator is closed) is delivered again, so handlers must be idempotent by command id
        (``Recorded.msg_id``). A command that fails to decode is quarantined and acknowledged.
        """
        decode_record = self.record_decoder("COMMANDS")
        return queues.commands(self._js, worker_id, decode_record, batch=batch, wait_s=wait_s)

    # The deployment (core.log.streams, core.log.snapshots)

    async def ensure_streams(self, streams: Sequence[StreamSpec] = STREAMS) -> None:
        """Create every stream, or update its configuration to the table in :mod:`core.streams`.

        A stream's persist mode is fixed at its creation (the server refuses to change it): an
        existing stream keeps the one it has."""
        await stream_setup.ensure_streams(self._js, streams, replicas=self.settings.stream_replicas)

    async def put_snapshot(self, name: str, data: bytes) -> None:
        """Store a projection snapshot (JetStream object store, bucket ``snapshots``)."""
        await snapshots.put_snapshot(self._js, name, data)

    async def get_snapshot(self, name: str) -> bytes | None:
        """The stored snapshot called ``name``, or ``None``."""
        return await snapshots.get_snapshot(self._js, name)
