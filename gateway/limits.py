"""Connections have limits: what one client (an IP address) or one API key may hold at once.

The server (granian, :mod:`gateway.serve`) bounds what it can before a request reaches Python: a
header read timeout (:attr:`~gateway.settings.GatewaySettings.header_timeout_s`, which also closes
a keep-alive connection idle that long), its backlog and how many connections a worker serves at
once (``backpressure``). It has no limit per client, no body read timeout, and nothing per key; this
ASGI middleware adds them, outermost, before routing, authentication or any read of the log:

* **Per client**: at most ``max_requests_per_client`` HTTP requests in flight and
  ``max_feeds_per_client`` WebSockets open from one IP address.
* **Per key**: the same per API key named in the ``Authorization`` header (``max_requests_per_key``,
  ``max_feeds_per_key``); the key is not checked here, only counted (by a digest: the middleware
  keeps no keys). A feed authenticated by its first message is counted by the feed itself.
* **Refused cheaply**: over a cap, an HTTP request is answered 429 at once (JSON error, code
  ``too_many_connections``, ``Retry-After: 1``) without reading its body; a WebSocket is closed
  before it is accepted (1013, "try again later"; the client sees a refused handshake).
* **Slow bodies**: a request whose next body chunk takes longer than ``body_timeout_s`` is ended
  as if its client had gone (granian has no body timeout), releasing its task and its slot.

Behind a reverse proxy every request comes from the proxy's address: the per-client caps then count
the proxy, and the proxy must hold its own per-client limits (see the README's deployment notes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TRY_LATER = 1013
"""The WebSocket close code for "try again later"."""


@dataclass(frozen=True, slots=True)
class Caps:
    """What one client or key may hold at once; ``body_timeout_s`` between body chunks."""

    requests_per_client: int = 1024
    requests_per_key: int = 512
    feeds_per_client: int = 256
    feeds_per_key: int = 32
    body_timeout_s: float = 30.0


class Holdings:
    """How many requests and WebSockets each client and each key holds now (entries at zero are
    removed, so the tables are as large as what is open)."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self.held: dict[tuple[str, str], int] = {}
        self.refused = 0

    def enter(self, kind: str, client: str, key: str | None) -> str | None:
        """Count one ``kind`` (``http`` or ``websocket``) of ``client`` and ``key``; why not, or
        ``None`` once counted (then :meth:`leave` must follow)."""
        feeds = kind == "websocket"
        per_client = self.caps.feeds_per_client if feeds else self.caps.requests_per_client
        per_key = self.caps.feeds_per_key if feeds else self.caps.requests_per_key
        what = "WebSockets" if feeds else "requests in flight"
        if self.held.get((kind, "ip:" + client), 0) >= per_client:
            self.refused += 1
            return f"more than {per_client} {what} from {client}"
        if key is not None and self.held.get((kind, "key:" + key), 0) >= per_key:
            self.refused += 1
            return f"more than {per_key} {what} for this API key"
        self._add(kind, "ip:" + client, 1)
        if key is not None:
            self._add(kind, "key:" + key, 1)
        return None

    def enter_key(self, kind: str, key: str) -> str | None:
        """Count one ``kind`` of ``key`` alone (a feed authenticated by its first message: its
        client was counted when it connected); why not, or ``None`` (then :meth:`leave_key`)."""
        per_key = self.caps.feeds_per_key if kind == "websocket" else self.caps.requests_per_key
        if self.held.get((kind, "key:" + key), 0) >= per_key:
            self.refused += 1
            what = "WebSockets" if kind == "websocket" else "requests in flight"
            return f"more than {per_key} {what} for this API key"
        self._add(kind, "key:" + key, 1)
        return None

    def leave_key(self, kind: str, key: str) -> None:
        self._add(kind, "key:" + key, -1)

    def leave(self, kind: str, client: str, key: str | None) -> None:
        self._add(kind, "ip:" + client, -1)
        if key is not None:
            self._add(kind, "key:" + key, -1)

    def _add(self, kind: str, who: str, n: int) -> None:
        count = self.held.get((kind, who), 0) + n
        if count > 0:
            self.held[(kind, who)] = count
        else:
            self.held.pop((kind, who), None)


def key_of(scope: Scope) -> str | None:
    """A digest of the bearer key in the request's ``Authorization`` header, or ``None``."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return key_digest(token.strip())
            return None
    return None


def key_digest(key: bytes | str) -> str:
    """What a key is counted by (the tables hold no keys)."""
    data = key.encode() if isinstance(key, str) else key
    return hashlib.blake2b(data[:512], digest_size=16).hexdigest()


class ConnectionLimits:
    """The middleware (see the module docstring); ``holdings`` is shared with the feed."""

    def __init__(self, app: ASGIApp, holdings: Holdings) -> None:
        self.app = app
        self.holdings = holdings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else ""
        key = key_of(scope)
        refusal = self.holdings.enter(kind, client, key)
        if refusal is not None:
            await _refuse(kind, refusal, send)
            return
        try:
            timed = _timed_body(receive, self.holdings.caps.body_timeout_s) if kind == "http" else receive
            await self.app(scope, timed, send)
        finally:
            self.holdings.leave(kind, client, key)


def _timed_body(receive: Receive, timeout_s: float) -> Receive:
    """``receive``, where a body chunk slower than ``timeout_s`` reads as the client's disconnect
    (only while the body lasts: a streaming response waits on ``receive`` for the disconnect)."""
    body_done = False

    async def timed() -> Message:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), timeout_s)
        except TimeoutError:
            body_done = True
            return {"type": "http.disconnect"}
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done = True
        return message

    return timed


async def _refuse(kind: str, reason: str, send: Send) -> None:
    if kind == "websocket":
        await send({"type": "websocket.close", "code": TRY_LATER, "reason": reason[:120]})
        return
    error = {"code": "too_many_connections", "message": f"{reason}: try again shortly"}
    body = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["Caps", "ConnectionLimits", "Holdings", "key_of"]
