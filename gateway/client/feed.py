"""The live feed (``/v1/feed``) as one endless stream of events: :func:`follow_feed` reconnects after
a drop, to the next gateway when there are several, and resumes from its cursor (stream sequences of
the one log every gateway follows), so nothing is missed or repeated; :func:`_feed_in_thread` hands
the same stream to synchronous code (``Client.feed``) through an event loop in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from gateway.client.errors import ApiError
from gateway.client.gateways import parse_urls
from gateway.client.request import _params
from schemas.api.feed import FeedError, FeedMessage

if TYPE_CHECKING:
    from gateway.wsclient import WebSocket

_FEED_MESSAGE = msgspec.json.Decoder(FeedMessage).decode

FATAL_CLOSES = {4400: "bad_request", 4401: "unauthenticated", 4403: "forbidden", 4404: "not_found"}
"""Close codes after which reconnecting cannot help (4000 + the HTTP status)."""
CURSOR_STREAMS = {"JOBS": "jobs", "ENDPOINTS": "endpoints"}
IDLE_S = 60.0
"""A connection silent this long (the gateway pings every 20 s by default) is taken for dead: a
stopped gateway never closes it."""


class _Cursor:
    """The feed position per stream, advanced by every event and every ready/ping message."""

    def __init__(self, after: str | None) -> None:
        self.positions: dict[str, int] = {}
        if after:
            self.take(after)

    def take(self, cursor: str) -> None:
        for part in cursor.split(","):
            name, _, seq = part.partition(":")
            if seq.isdigit():
                self.positions[name] = max(self.positions.get(name, 0), int(seq))

    def see(self, message: FeedMessage) -> None:
        name = CURSOR_STREAMS.get(message.stream or "")
        if name and message.seq is not None:
            self.positions[name] = max(self.positions.get(name, 0), message.seq)
        if message.cursor is not None:
            self.take(message.cursor)

    def __str__(self) -> str:
        return ",".join(f"{name}:{seq}" for name, seq in sorted(self.positions.items()))


async def follow_feed(
    url: str | Sequence[str],
    key: str | None,
    *,
    job: str | None = None,
    endpoint: str | None = None,
    kind: str | None = None,
    after: str | None = None,
    tenant: str | None = None,
    max_backoff_s: float = 10.0,
    idle_s: float = IDLE_S,
) -> AsyncIterator[FeedMessage]:
    """The caller's events from ``/v1/feed``, forever: after a drop (a restart, a slow consumer
    closed with 4008, a gateway gone) it reconnects with its cursor, to the next gateway when there
    are several, so nothing is missed or repeated. Control messages (``feed.ready``, ``feed.ping``,
    ``feed.error``) only move the cursor.

    Args:
        url: the gateway's URL, or several (comma-separated, or a sequence), tried in turn.
        job / endpoint: only events of these jobs / endpoints (comma-separated ids).
        kind: only these kinds (comma-separated): an event tag, a family (``job``) or ``telemetry``.
        after: resume after this cursor (``jobs:<seq>,endpoints:<seq>``); default: start live.
        tenant: the tenant to watch (the operator only).
        max_backoff_s: the longest wait between two rounds of reconnection attempts, in seconds.
        idle_s: a connection that brings nothing (not even a ping) for this long is dropped.

    Yields:
        Each event as a :class:`FeedMessage` (``kind``, ``seq``, ``time``, ``event``...; ``event``
        is the stored event as JSON builtins).

    Raises:
        ApiError: the gateway refused the key, the filters or the tenant (4400/4401/4403/4404), or
            sent a message that is not a :class:`FeedMessage` (``invalid_response``); a malformed
            URL (``ConfigError``).
    """
    urls = parse_urls(url)
    cursor = _Cursor(after)
    backoff = 0.2
    failures = 0
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for turn in itertools.count():  # each connection goes to the next gateway
        ws_base = "ws" + urls[turn % len(urls)].removeprefix("http")
        query = _params(job=job, endpoint=endpoint, kind=kind, tenant=tenant, after=str(cursor) or None)
        ws = await _open(f"{ws_base}/v1/feed", query, headers)
        served = False
        if ws is not None:
            async with contextlib.aclosing(_session(ws, cursor, idle_s)) as messages:
                async for message in messages:
                    served, backoff = True, 0.2
                    if not message.kind.startswith("feed."):
                        yield message
        failures = 0 if served else failures + 1
        if failures and failures % len(urls):
            continue  # this gateway failed: the next one at once
        await asyncio.sleep(backoff)  # after a drop, or a whole round of failures
        backoff = 0.2 if served else min(max_backoff_s, backoff * 2)


async def _open(url: str, query: Mapping[str, str | int], headers: Mapping[str, str]) -> WebSocket | None:
    """A connection to the feed, or ``None`` when trying again later may help (a 5xx handshake, a
    network error); a 4xx handshake is the gateway's refusal, raised as :class:`ApiError`."""
    from urllib.parse import urlencode

    from gateway.wsclient import HandshakeError, connect

    encoded = urlencode(query)
    try:
        return await connect(url + (f"?{encoded}" if encoded else ""), headers)
    except HandshakeError as exc:
        if 400 <= exc.status < 500:
            raise ApiError(exc.status, "feed_refused", str(exc)) from None
        return None
    except OSError:
        return None


async def _session(ws: WebSocket, cursor: _Cursor, idle_s: float) -> AsyncGenerator[FeedMessage, None]:
    """Every message of one connection, control messages too, each moving ``cursor``. Ends when the
    connection drops or stays silent for ``idle_s``; a close after which reconnecting cannot help
    (:data:`FATAL_CLOSES`) raises :class:`ApiError` with the reason the last ``feed.error`` gave.
    Closes ``ws`` however it ends."""
    from gateway.wsclient import ConnectionClosed

    error: FeedError | None = None
    try:
        while True:  # recv, not ``async for``: that ends quietly on a close, whose code matters here
            message = _feed_message(await asyncio.wait_for(ws.recv(), idle_s))
            cursor.see(message)
            if message.kind == "feed.error":
                error = message.error
            yield message
    except ConnectionClosed as closed:
        if closed.code in FATAL_CLOSES:
            code = (error.code if error else "") or FATAL_CLOSES[closed.code]
            reason = (error.message if error else "") or closed.reason
            raise ApiError(closed.code - 4000, code, reason) from None
    except OSError:
        pass
    finally:
        with contextlib.suppress(Exception):
            await ws.close()


def _feed_message(raw: str | bytes) -> FeedMessage:
    try:
        return _FEED_MESSAGE(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(0, "invalid_response", f"a feed message is not what the API promises: {exc}") from None


def _feed_in_thread(messages: Callable[[], AsyncIterator[FeedMessage]]) -> Iterator[FeedMessage]:
    """The events of ``messages()`` for synchronous code: an event loop in a background thread follows
    the feed and hands each event over through a bounded queue (an error is raised here); closing
    this generator stops the thread."""
    items: queue.Queue[FeedMessage | Exception] = queue.Queue(maxsize=1000)
    stop = threading.Event()
    thread = threading.Thread(
        target=_run_until_stopped, args=(messages, items, stop), name="resontech-feed", daemon=True
    )
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(5)


def _run_until_stopped(
    messages: Callable[[], AsyncIterator[FeedMessage]],
    items: queue.Queue[FeedMessage | Exception],
    stop: threading.Event,
) -> None:
    """The background thread: a new event loop runs :func:`_pump`, cancelled once ``stop`` is set."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(_pump(messages, items, stop))

    def watch_stop() -> None:
        if stop.is_set():
            task.cancel()
        else:
            loop.call_later(0.2, watch_stop)

    loop.call_soon(watch_stop)
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(task)
    loop.close()


async def _pump(
    messages: Callable[[], AsyncIterator[FeedMessage]],
    items: queue.Queue[FeedMessage | Exception],
    stop: threading.Event,
) -> None:
    """Each event into ``items`` (waiting while it is full, until ``stop``), then any error."""
    try:
        async for message in messages():
            while not stop.is_set():
                try:
                    items.put(message, timeout=0.2)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
    except Exception as exc:
        items.put(exc)
