"""A small asyncio WebSocket client (RFC 6455), for the SDK's feed iterator, tests and the benchmark.

The pinned environment has no WebSocket client library (httpx speaks HTTP only), and the feed needs
only a little of the protocol: text messages, ping/pong, close with a code. This module does that
over ``asyncio`` streams, with nothing beyond the standard library: client frames masked, server
frames unmasked, fragmented messages reassembled, pings answered, and a close frame surfaced as
:class:`ConnectionClosed` carrying the server's code and reason (the feed's ``4401``, ``4008``...).

Backpressure is the kernel's: a caller that stops calling :meth:`WebSocket.recv` stops reading the
socket once asyncio's stream buffer (``read_limit``, default 64 KiB) is full, and the server sees a
slow reader.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from core.errors import ResontechError

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Messages larger than this end the connection (close 1009): a guard against a runaway peer."""


class HandshakeError(ResontechError):
    """The server did not upgrade the connection; ``status`` is its HTTP status (0 if unreadable)."""

    code = "handshake"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ConnectionClosed(Exception):
    """The connection ended: ``code`` and ``reason`` from the close frame (1006: no close frame)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(
            f"websocket closed with {code}: {reason}" if reason else f"websocket closed with {code}"
        )
        self.code = code
        self.reason = reason


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    # XOR in one big-integer operation: far faster than a per-byte loop for feed-sized messages.
    repeated = (key * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


def _frame(opcode: int, payload: bytes) -> bytes:
    key = os.urandom(4)
    size = len(payload)
    if size < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
    elif size < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    return header + key + _mask(payload, key)


class WebSocket:
    """One client connection. Create it with :func:`connect`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.closed: ConnectionClosed | None = None

    async def recv(self) -> str | bytes:
        """The next message (``str`` for text, ``bytes`` for binary), answering pings on the way.

        Raises:
            ConnectionClosed: the server closed the connection (or the socket dropped: code 1006).
        """
        if self.closed is not None:
            raise self.closed
        parts: list[bytes] = []
        opcode = 0
        try:
            while True:
                fin, op, payload = await self._read_frame()
                if op == PING:
                    await self._send_frame(PONG, payload)
                elif op == PONG:
                    continue
                elif op == CLOSE:
                    await self._closed_by_peer(payload)
                else:
                    if op != CONTINUATION:
                        opcode = op
                    parts.append(payload)
                    if sum(map(len, parts)) > MAX_MESSAGE_BYTES:
                        await self.close(1009, "message too big")
                        raise ConnectionClosed(1009, "message too big")
                    if fin:
                        data = b"".join(parts)
                        return data.decode() if opcode == TEXT else data
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.closed = ConnectionClosed(1006, "connection dropped without a close frame")
            self._writer.close()
            raise self.closed from None

    async def _closed_by_peer(self, payload: bytes) -> None:
        code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        reason = payload[2:].decode(errors="replace")
        with contextlib.suppress(Exception):
            await self._send_frame(CLOSE, payload[:2])
        self.closed = ConnectionClosed(code, reason)
        self._writer.close()
        raise self.closed

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        first, second = await self._reader.readexactly(2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", await self._reader.readexactly(8))
        if size > MAX_MESSAGE_BYTES:
            raise ConnectionError("frame too big")
        key = await self._reader.readexactly(4) if second & 0x80 else b""
        payload = await self._reader.readexactly(size)
        return bool(first & 0x80), first & 0x0F, _mask(payload, key) if key else payload

    async def _send_frame(self, opcode: int, payload: bytes) -> None:
        self._writer.write(_frame(opcode, payload))
        await self._writer.drain()

    async def send(self, message: str | bytes) -> None:
        """Send a text (``str``) or binary (``bytes``) message."""
        if self.closed is not None:
            raise self.closed
        if isinstance(message, str):
            await self._send_frame(TEXT, message.encode())
        else:
            await self._send_frame(BINARY, message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame and drop the connection (without waiting for the server's echo)."""
        if self.closed is None:
            self.closed = ConnectionClosed(code, reason)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._send_frame(CLOSE, struct.pack("!H", code) + reason.encode()), 2.0
                )
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[str | bytes]:
        while True:
            try:
                yield await self.recv()
            except ConnectionClosed:
                return

    async def __aenter__(self) -> WebSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 10.0,
    read_limit: int = 64 * 1024,
    receive_buffer: int | None = None,
) -> WebSocket:
    """Open a WebSocket to ``url`` (``ws://`` or ``wss://``; ``http(s)://`` are accepted as aliases).

    Args:
        headers: extra handshake headers (``Authorization``).
        timeout: seconds for the TCP connection and the handshake.
        read_limit: asyncio's stream buffer limit; reading pauses beyond about twice this.
        receive_buffer: the socket's ``SO_RCVBUF`` in bytes, set before connecting (tests use a
            small one to make a slow reader quickly visible to the server).

    Raises:
        HandshakeError: the server answered without switching protocols (its status and body).
        OSError: the server cannot be reached.
    """
    parts = urlsplit(url)
    secure = parts.scheme in ("wss", "https")
    host = parts.hostname or "localhost"
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sock = None
    if receive_buffer is not None:
        info = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = info[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), timeout)
    context = ssl.create_default_context() if secure else None
    if sock is not None:
        opening = asyncio.open_connection(
            sock=sock, ssl=context, limit=read_limit, server_hostname=host if secure else None
        )
    else:
        opening = asyncio.open_connection(host, port, ssl=context, limit=read_limit)
    reader, writer = await asyncio.wait_for(opening, timeout)
    try:
        await asyncio.wait_for(_handshake(reader, writer, host, port, target, headers or {}), timeout)
    except BaseException:
        writer.close()
        raise
    return WebSocket(reader, writer)


async def _handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    port: int,
    target: str,
    headers: Mapping[str, str],
) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode(errors="replace").split("\r\n")
    fields = status_line.split(" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    received = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        received[name.strip().lower()] = value.strip()
    if status != 101:
        body = b""
        length = received.get("content-length", "")
        if length.isdigit():
            with contextlib.suppress(Exception):
                body = await reader.readexactly(min(int(length), 4096))
        raise HandshakeError(
            status, f"the server answered {status} instead of upgrading: {body.decode(errors='replace')}"
        )
    expected = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    if received.get("sec-websocket-accept") != expected:
        raise HandshakeError(status, "the server's Sec-WebSocket-Accept does not match the key sent")
