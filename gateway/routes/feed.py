"""``WebSocket /v1/feed``: one client's session (auth, replay, live, ping, close); the protocol is
:data:`gateway.feed.PROTOCOL`.

A session authenticates (the handshake's ``Authorization`` header, or a first ``auth`` message for
browsers), replays what the client missed after its ``after`` cursor straight from the log, then
joins the process's :class:`~gateway.feed.FeedHub` for live events. Joining is what makes resume
exact: the hub reports the sequences it had fanned out at the instant the client joined, the final
replay stops there, and every live event queued after it is above it; a per-stream "sent up to"
check drops anything at or below what was already sent. Replay is paced by the client (each send is
awaited); live delivery goes through the bounded queue, and a client that falls ``feed_queue``
messages behind is closed with 4008. A session's key is watched from the moment it authenticated:
when the gateway applies the key's revocation the hub closes the session (4401 ``key_revoked``)
whatever its traffic, and no event is sent after that.

``GET /v1/feed`` over plain HTTP answers 426 and exists so that the OpenAPI document lists the feed
and its query parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from core.errors import ResontechError
from gateway.api import Call, Router
from gateway.auth import Principal, authenticate, bearer, tenant_of
from gateway.errors import ApiError
from gateway.feed import KEY_REVOKED, TOO_SLOW, Subscriber, control_text, event_text
from gateway.feed_filter import CURSOR_NAMES, FeedClose, FeedFilter, parse_cursor
from gateway.limits import TRY_LATER, key_digest
from schemas.api.feed import FeedAuth, FeedError, FeedQuery
from schemas.envelope import Recorded

if TYPE_CHECKING:
    from gateway.kernel import Kernel

router = Router("feed")
log = logging.getLogger("resontech.gateway.feed")
AUTH_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 10.0
"""How long a closing session waits for a blocked send, and then for its close frame, to go out."""
CATCH_UP_ROUNDS = 3
"""Replays before joining the hub, while the client is more than half a queue behind."""
_GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)
"""How a send to a client that left fails: the session just ends."""
ERROR_CODES = {
    1011: "log_unavailable",
    4400: "invalid_message",
    4401: "unauthenticated",
    TOO_SLOW: "too_slow",
}
_AUTH_HELP = (
    'send \'Authorization: Bearer rt_...\' on the handshake, or {"kind": "auth", "key": "rt_..."} '
    f"as the first message within {AUTH_TIMEOUT_S:.0f} s"
)


@router.get(
    "/v1/feed",
    access="public",
    query=FeedQuery,
    status=101,
    errors={426: "a plain HTTP request: the feed is a WebSocket"},
)
async def feed(call: Call[None, FeedQuery]) -> None:
    """The live feed of your tenant's events: a WebSocket (protocol in the API description)."""
    raise ApiError(
        426,
        "upgrade_required",
        "/v1/feed is a WebSocket: connect with ws:// (or wss://) and 'Upgrade: websocket'",
        {"Upgrade": "websocket"},
    )


async def _receive_text(websocket: WebSocket) -> str:
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    return text if text is not None else bytes(message.get("bytes") or b"").decode(errors="replace")


async def _key(websocket: WebSocket) -> str:
    header = websocket.headers.get("authorization")
    if header is not None:
        return bearer(header)
    try:
        text = await asyncio.wait_for(_receive_text(websocket), AUTH_TIMEOUT_S)
    except TimeoutError:
        raise FeedClose(4401, "unauthenticated", f"no key: {_AUTH_HELP}") from None
    try:
        return msgspec.json.decode(text, type=FeedAuth).key
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FeedClose(
            4401, "unauthenticated", f"the first message is not an auth message ({exc}): {_AUTH_HELP}"
        ) from None


def _query(websocket: WebSocket) -> FeedQuery:
    params = websocket.query_params
    if "key" in params or "token" in params:
        raise FeedClose(4400, "invalid_query", f"never put an API key in a URL: {_AUTH_HELP}")
    raw = {name: value for name, value in reversed(params.multi_items())}
    try:
        return msgspec.convert(raw, FeedQuery, strict=False)
    except msgspec.ValidationError as exc:
        raise FeedClose(4400, "invalid_query", f"query: {exc}") from None


async def _check_after(kernel: Kernel, after: dict[str, int]) -> None:
    """A cursor beyond what this gateway has applied is refused only if the log never had it."""
    positions = kernel.feed.positions()
    for stream, seq in after.items():
        if seq > positions.get(stream, 0):
            last = await kernel.event_log.last_seq(stream)
            if seq > last:
                raise FeedClose(
                    4400,
                    "invalid_query",
                    f"after={CURSOR_NAMES[stream]}:{seq} is beyond the last {stream} sequence {last}: "
                    "resume from a cursor this feed sent you",
                )


async def _refuse(websocket: WebSocket, close: FeedClose) -> None:
    with contextlib.suppress(Exception):
        error = FeedError(code=close.error, message=close.message)
        await asyncio.wait_for(websocket.send_text(control_text("feed.error", error=error)), CLOSE_TIMEOUT_S)
        await asyncio.wait_for(websocket.close(close.code, _reason(close.message)), CLOSE_TIMEOUT_S)


def _reason(message: str) -> str:
    """A close reason within the protocol's 123 bytes."""
    data = message.encode()
    return message if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


async def feed_socket(websocket: WebSocket) -> None:
    """The WebSocket endpoint: refuse with a close code, or run a :class:`FeedSession`."""
    counted: list[str] = []  # the key of a session authenticated by message, counted here
    try:
        await _session(websocket, counted)
    finally:
        for key in counted:
            websocket.app.state.holdings.leave_key("websocket", key)


async def _session(websocket: WebSocket, counted: list[str]) -> None:
    kernel: Kernel = websocket.app.state.kernel
    await websocket.accept()
    try:
        query = _query(websocket)
        key = await _key(websocket)
        if "authorization" not in websocket.headers:  # a header's key was counted by the middleware
            refusal = websocket.app.state.holdings.enter_key("websocket", key_digest(key))
            if refusal is not None:
                raise FeedClose(TRY_LATER, "too_many_connections", f"{refusal}: try again shortly")
            counted.append(key_digest(key))
        principal = authenticate(key, kernel.keys, kernel.gateway.operator_key_sha256)
        if principal.kind == "provider":
            raise FeedClose(4403, "forbidden", "the feed carries tenant events; provider keys have none")
        feed_filter = FeedFilter(
            tenant_of(principal, query.tenant), jobs=query.job, endpoints=query.endpoint, kinds=query.kind
        )
        after = parse_cursor(query.after) if query.after is not None else {}
        await _check_after(kernel, after)
    except ApiError as exc:
        await _refuse(websocket, FeedClose(4000 + exc.status, exc.code, exc.message))
        return
    except FeedClose as exc:
        await _refuse(websocket, exc)
        return
    except ResontechError as exc:
        await _refuse(websocket, FeedClose(1011, "log_unavailable", f"{exc}: try again shortly"))
        return
    except WebSocketDisconnect:
        return
    await FeedSession(websocket, kernel, principal, feed_filter, after).run()


class FeedSession:
    """One connected, authenticated client."""

    def __init__(
        self,
        websocket: WebSocket,
        kernel: Kernel,
        principal: Principal,
        feed_filter: FeedFilter,
        after: dict[str, int],
    ) -> None:
        self.websocket = websocket
        self.kernel = kernel
        self.hub = kernel.feed
        self.principal = principal
        self.filter = feed_filter
        self.after = after
        self.subscriber = Subscriber(feed_filter, self.hub.queue_size, principal.key_id)
        self.ping_s = kernel.gateway.feed_ping_s

    async def run(self) -> None:
        subscriber = self.subscriber
        self.hub.watch_key(subscriber)
        self._check_key()  # revoked while the connection was being set up
        sender = asyncio.create_task(self._send())
        receiver = asyncio.create_task(self._receive())
        closing = asyncio.create_task(self.subscriber.closed.wait())
        try:
            await asyncio.wait({sender, receiver, closing}, return_when=asyncio.FIRST_COMPLETED)
            if subscriber.closing is not None:
                # The sender stops once its current send returns; a client that reads nothing never
                # lets that happen, and is dropped without a close frame. granian sends a close frame
                # only once no receive is pending.
                await asyncio.wait({sender}, timeout=CLOSE_TIMEOUT_S)
                receiver.cancel()
                await asyncio.wait({receiver})
                if sender.done() and not sender.cancelled() and sender.exception() is None:
                    await self._close(*subscriber.closing)
        finally:
            self.hub.unsubscribe(subscriber)
            for task in (sender, receiver, closing):
                task.cancel()
            results = await asyncio.gather(sender, receiver, closing, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, _GONE):
                    log.error("feed session of %s failed", self.filter.tenant, exc_info=result)

    async def _receive(self) -> None:
        """Watch for the client leaving; the feed takes no message after authentication."""
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                await _receive_text(self.websocket)
                self.subscriber.close(4400, "the feed takes no messages after authentication")

    async def _send(self) -> None:
        """Replay, join, deliver until the subscriber is closing (:meth:`run` then closes)."""
        try:
            await self._deliver()
        except ResontechError as exc:  # the log is unreachable: the client retries with its cursor
            self.subscriber.close(1011, f"{exc}: reconnect with after={self.subscriber.cursor()}")

    async def _deliver(self) -> None:
        subscriber = self.subscriber
        await self._replay_and_join()
        if subscriber.closing is None:
            await self.websocket.send_text(control_text("feed.ready", cursor=subscriber.cursor()))
        while subscriber.closing is None:
            if not subscriber.pending:
                subscriber.wake.clear()
                try:
                    async with asyncio.timeout(self.ping_s):  # no task per wait, unlike wait_for
                        await subscriber.wake.wait()
                except TimeoutError:
                    await self._ping()
                continue
            stream, seq, text = subscriber.pending.popleft()
            if stream in CURSOR_NAMES:
                if seq <= subscriber.sent.get(stream, 0):
                    continue
                subscriber.sent[stream] = seq
            await self.websocket.send_text(text)
            self.hub.sent += 1

    def _check_key(self) -> None:
        """Close at once if the key was revoked (the hub closes the feeds of a key revoked later)."""
        record = self.kernel.keys.get(self.principal.key_id)
        if record is not None and record.revoked:
            self.subscriber.close(KEY_REVOKED, f"API key {self.principal.key_id} was revoked", "key_revoked")

    async def _ping(self) -> None:
        """With the queue empty, everything matched up to the hub's positions has been sent."""
        self._check_key()
        if self.subscriber.closing is not None:
            return
        for stream, seq in self.hub.positions().items():
            self.subscriber.sent[stream] = max(self.subscriber.sent.get(stream, 0), seq)
        await self.websocket.send_text(control_text("feed.ping", cursor=self.subscriber.cursor()))

    async def _replay_and_join(self) -> None:
        subscriber = self.subscriber
        subscriber.sent = dict(self.after)
        streams = [stream for stream in self.after if self.filter.replays(stream)]
        for _ in range(CATCH_UP_ROUNDS):
            positions = self.hub.positions()
            if sum(positions[s] - subscriber.sent[s] for s in streams) <= self.hub.queue_size // 2:
                break
            await self._replay(streams, positions)
        positions = self.hub.subscribe(subscriber)
        await self._replay(streams, positions)
        for stream, seq in positions.items():
            subscriber.sent[stream] = max(subscriber.sent.get(stream, 0), seq)

    async def _replay(self, streams: list[str], positions: dict[str, int]) -> None:
        """Send the matching events after ``sent`` up to ``positions``, from the log."""
        subscriber = self.subscriber
        for stream in streams:
            start, end = subscriber.sent[stream] + 1, positions[stream]
            if start > end:
                continue
            records = self.kernel.event_log.replay(
                stream, start_seq=start, until_seq=end, subjects=self.filter.subjects(stream)
            )
            async with contextlib.aclosing(records):  # stops the scan's consumer on an early exit
                await self._send_replayed(stream, records)
            subscriber.sent[stream] = max(subscriber.sent[stream], end)

    async def _send_replayed(self, stream: str, records: AsyncIterator[Recorded[Any]]) -> None:
        subscriber = self.subscriber
        what = "job" if stream == "JOBS" else "endpoint"
        async for record in records:
            if subscriber.closing is not None:
                return
            tenant, ident = record.token(1), record.token(2)
            if tenant == self.filter.tenant and self.filter.wants_event(
                stream, record.event.event_tag(), ident
            ):
                await self.websocket.send_text(event_text(record, tenant, what, ident))
                self.hub.sent += 1
            subscriber.sent[stream] = record.seq

    async def _close(self, code: int, reason: str) -> None:
        error = FeedError(code=self.subscriber.error or ERROR_CODES.get(code, "closed"), message=reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.websocket.send_text(control_text("feed.error", error=error)), CLOSE_TIMEOUT_S
            )
            await asyncio.wait_for(self.websocket.close(code, _reason(reason)), CLOSE_TIMEOUT_S)
        log.info("feed of %s closed with %d: %s", self.filter.tenant, code, reason)


def websocket_routes() -> list[WebSocketRoute]:
    """The feed's WebSocket route, for the app's route list."""
    return [WebSocketRoute("/v1/feed", feed_socket)]
