"""Appending events: idempotent by message id, conditional on an expected sequence, one at a time or
many in flight, each acknowledged (or failed) within the log's acknowledgement time-out.

Plain functions given how to publish (:data:`Publish`) and how to check a silent node;
:class:`core.log.EventLog`'s appends delegate to them. An append that nothing answers is retried
with the same message id while its stream elects a leader (:func:`patience`)."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from core.errors import InvalidInput, NoResponders, ResontechError
from core.log.connection import Patience
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


Publish = Callable[[str, bytes, dict[str, str], int | None], Awaitable[asyncio.Future[Position]]]
"""How an append goes out: (subject, data, headers, expected sequence) to the future of its position
(:meth:`core.log.connection.LogConnection._publish`)."""


def append_headers(event_id: str, expected_seq: int | None, expected_filter: str | None) -> dict[str, str]:
    """An append's headers: its message id and, when given, the expected last sequence on its
    subject (or on ``expected_filter``).

    Raises:
        ValueError: ``expected_filter`` without ``expected_seq``.
    """
    headers = {MSG_ID: event_id}
    if expected_seq is not None:
        headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_seq)
        if expected_filter is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = expected_filter
    elif expected_filter is not None:
        raise ValueError("expected_filter needs expected_seq")
    return headers


async def until_answered(
    publish: Publish,
    silent: Callable[[], None],
    message: Message,
    expected_seq: int | None,
) -> Position:
    """Publish one append and wait for its acknowledgement; one that nothing answered is sent again
    (same message id) for as long as :func:`patience` allows.

    Raises:
        AppendTimeout / AppendRejected / ConcurrencyConflict: as :meth:`core.log.EventLog.append`.
    """
    subject, data, headers, ours = message
    waiting: Patience | None = None
    while True:
        future = await publish(subject, data, headers, expected_seq)
        try:
            return await future
        except NoResponders:
            # Nothing was stored; the same message id makes the retry safe in any case.
            waiting = waiting or patience(ours, silent)
            if not await waiting.wait():
                raise


async def append_in_order(
    publish: Publish, silent: Callable[[], None], messages: list[Message], max_in_flight: int
) -> list[Position]:
    """Publish ``messages`` in order with at most ``max_in_flight`` unanswered; from the first that
    nothing answered they are sent again (same ids) for as long as :func:`patience` allows.

    Raises:
        AppendTimeout / AppendRejected: the first failure (see :meth:`core.log.EventLog.append_many`).
    """
    positions: list[Position] = []
    waiting: Patience | None = None
    while True:
        stored, failure = await _in_order(publish, messages, len(positions), max_in_flight)
        positions += stored
        if failure is None:
            return positions
        if not isinstance(failure, NoResponders):
            raise failure
        waiting = waiting or patience(messages[len(positions)][3], silent)
        if not await waiting.wait():
            raise failure


async def _in_order(
    publish: Publish, messages: list[Message], start: int, max_in_flight: int
) -> tuple[list[Position], ResontechError | None]:
    """Publish ``messages[start:]`` with at most ``max_in_flight`` unanswered; the positions of those
    stored before the first failure, and that failure (``None``: all stored)."""
    futures: list[asyncio.Future[Position]] = []
    window: deque[asyncio.Future[Position]] = deque()
    failure: ResontechError | None = None
    try:
        for subject, data, headers, _ in itertools.islice(messages, start, None):
            future = await publish(subject, data, headers, None)
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


def patience(ours: bool, silent: Callable[[], None]) -> Patience:
    """How long an append waits for a stream that nothing answers: :data:`LEADERLESS_RETRY_S` for
    a stream of ours (it is electing a leader, or the node is cut off from it: ``silent`` checks
    the node), :data:`NO_RESPONDERS_RETRY_S` for a subject no stream of ours captures."""
    if ours:
        return Patience(LEADERLESS_RETRY_S, first_s=_FIRST_S, max_s=_MAX_S, silent=silent)
    return Patience(NO_RESPONDERS_RETRY_S, first_s=_FIRST_S, max_s=_MAX_S)


Message = tuple[str, bytes, dict[str, str], bool]
"""One append as it goes on the wire (subject, data, headers), and whether a stream of ours captures
its subject. A plain tuple: a batch makes one per event."""


def message(item: tuple[str, Event] | tuple[str, Event, str]) -> Message:
    """One item of :meth:`core.log.EventLog.append_many` as it goes on the wire (a new id if none).

    Raises:
        InvalidInput: the event is not the one its subject names.
    """
    event_id = item[2] if len(item) == 3 else new_event_id()
    return item[0], encode(item[1]), {MSG_ID: event_id}, check_subject(item[0], item[1])


def check_subject(subject: str, event: Event) -> bool:
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
