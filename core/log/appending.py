"""Appending events: idempotent by message id, conditional on an expected sequence, one at a time or
many in flight, each acknowledged (or failed) within the log's acknowledgement time-out."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterable
from typing import Any

from core.errors import InvalidInput, NoResponders, ResontechError
from core.log.connection import LogConnection, Patience
from core.streams import stream_for_subject, subject_mismatch
from core.wire import (
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MSG_ID,
    Position,
    new_event_id,
)
from schemas._base import Event
from schemas.catalog import encode

NO_RESPONDERS_RETRY_S = 1.0
"""How long :meth:`EventLog.append` retries an append that nothing answered, on a subject no stream
of ours captures: it fails after this (the server has no stream for it)."""
LEADERLESS_RETRY_S = 12.0
"""How long it retries one that a stream of ours captures. Nothing answers while that stream has no
leader: a server reloading its configuration (``resontech nats-auth`` adding an agent's user) leaves
JetStream silent for ~50 ms, and a replicated stream whose leader died elects another in 4-9 s
(nats-server's raft election time-out). An append in that gap waits for the new leader."""
_FIRST_S, _MAX_S = 0.025, 0.5
"""An append's pauses while nothing answers: from 25 ms, doubling up to 0.5 s."""
DEFAULT_MAX_IN_FLIGHT = 8192


class Appending(LogConnection):
    """The appends of :class:`core.log.EventLog`."""

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
                nothing answered for :data:`NO_RESPONDERS_RETRY_S` (no stream captures the subject),
                or for :data:`LEADERLESS_RETRY_S` on a stream of ours (it has no leader).
        """
        headers = {MSG_ID: event_id or new_event_id()}
        if expected_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_seq)
            if expected_filter is not None:
                headers[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = expected_filter
        elif expected_filter is not None:
            raise ValueError("expected_filter needs expected_seq")
        ours = _check_subject(subject, event)
        data = encode(event)
        patience: Patience | None = None
        while True:
            future = await self._publish(subject, data, headers, expected_seq)
            try:
                return await future
            except NoResponders:
                # Nothing was stored; the same message id makes the retry safe in any case.
                patience = patience or self._patience(ours)
                if not await patience.wait():
                    raise

    async def submit(
        self, subject: str, event: Event, *, event_id: str, expected_seq: int | None = None
    ) -> asyncio.Future[Position]:
        """Publish one event and return the future of its acknowledgement, without waiting for it:
        appends submitted one after another are stored in that order (one connection), and their
        acknowledgements overlap. The future fails as one attempt of :meth:`append` would (a stream
        without a leader is not waited for).
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
        in the same order. Every acknowledgement has the log's time-out. A batch waits out a stream
        with no leader as :meth:`append` does (the events from the first one nothing answered are
        sent again, with the same ids); an election in the middle of a batch can store an event
        after a later one that was answered before it.

        Raises:
            AppendTimeout / AppendRejected: the first failure; earlier events are stored, later ones
                may or may not be. Retrying the whole batch with the same event ids is safe.
        """
        messages = [_message(item) for item in items]
        positions: list[Position] = []
        patience: Patience | None = None
        while True:
            stored, failure = await self._in_order(messages, len(positions), max_in_flight)
            positions += stored
            if failure is None:
                return positions
            if not isinstance(failure, NoResponders):
                raise failure
            patience = patience or self._patience(messages[len(positions)][3])
            if not await patience.wait():
                raise failure

    async def _in_order(
        self, messages: list[Message], start: int, max_in_flight: int
    ) -> tuple[list[Position], ResontechError | None]:
        """Publish ``messages[start:]`` with at most ``max_in_flight`` unanswered; the positions of those
        stored before the first failure, and that failure (``None``: all stored)."""
        futures: list[asyncio.Future[Position]] = []
        window: deque[asyncio.Future[Position]] = deque()
        publish = self._publish
        failure: ResontechError | None = None
        try:
            for subject, data, headers, _ in itertools.islice(messages, start, None):
                future = await publish(subject, data, headers)
                futures.append(future)
                window.append(future)
                if len(window) >= max_in_flight:
                    await window.popleft()
                    while window and window[0].done():
                        window.popleft().result()
        except ResontechError as exc:  # publishing stops at a failure; which one came first is below
            failure = exc
        except BaseException:
            for future in futures:
                future.add_done_callback(_consume)
            raise
        stored: list[Position] = []
        for i, future in enumerate(futures):
            try:
                stored.append(await future)
            except ResontechError as exc:
                for later in futures[i + 1 :]:  # consumed, so that none is "never retrieved"
                    later.add_done_callback(_consume)
                return stored, exc
        return stored, failure

    def _patience(self, ours: bool) -> Patience:
        """How long an append waits for a stream that nothing answers: :data:`LEADERLESS_RETRY_S` for
        a stream of ours (it is electing a leader, or the node is cut off from it: the node is
        checked), :data:`NO_RESPONDERS_RETRY_S` for a subject no stream of ours captures."""
        if ours:
            return Patience(LEADERLESS_RETRY_S, first_s=_FIRST_S, max_s=_MAX_S, silent=self._silent)
        return Patience(NO_RESPONDERS_RETRY_S, first_s=_FIRST_S, max_s=_MAX_S)

    async def publish_raw(self, subject: str, data: bytes, event_id: str | None = None) -> Position:
        """Store bytes as they are (no encoding): for tools and tests that write foreign messages."""
        return await (await self._publish(subject, data, {MSG_ID: event_id or new_event_id()}))


Message = tuple[str, bytes, dict[str, str], bool]
"""One append as it goes on the wire (subject, data, headers), and whether a stream of ours captures
its subject. A plain tuple: a batch makes one per event."""


def _message(item: tuple[str, Event] | tuple[str, Event, str]) -> Message:
    event_id = item[2] if len(item) == 3 else new_event_id()
    return item[0], encode(item[1]), {MSG_ID: event_id}, _check_subject(item[0], item[1])


def _check_subject(subject: str, event: Event) -> bool:
    """Refuse an event whose type is not the one its subject names (see :func:`subject_mismatch`);
    whether a stream of ours captures ``subject`` (one that does not is left to the server: no
    responders)."""
    try:
        spec = stream_for_subject(subject)
    except InvalidInput:
        return False
    mismatch = subject_mismatch(spec, subject, event)
    if mismatch is not None:
        raise InvalidInput(f"refused: {mismatch}")
    return True


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
