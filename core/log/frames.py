"""Protocol frames that the log builds and cuts itself, around nats-py's slower general path.

:func:`batch_frames` writes an atomic batch as one ``HPUB`` write; :func:`parse_reply` reads the
stream sequence and store time off a JetStream delivery's reply subject; :class:`RawTap` takes the
messages of the scan's subscriptions off a connection as raw ``(subject, reply, data, headers)``
frames (:func:`cut_frame`), for :mod:`core.log.scan`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any

from nats.aio.client import Client as NATS
from nats.protocol.parser import AWAITING_CONTROL_LINE


def batch_frames(messages: list[tuple[str, bytes, dict[str, str]]], reply: str) -> bytes:
    """The ``HPUB`` frames of an atomic batch, the last one with ``reply``, as one write.

    nats-py's ``publish`` checks every header against a regular expression and encodes each piece
    apart: a third of an append's client time. Our headers are our own (ids, numbers, subjects:
    no line breaks), so the frames are built directly.
    """
    out = bytearray()
    last = len(messages) - 1
    for number, (subject, data, headers) in enumerate(messages):
        block = "NATS/1.0\r\n" + "".join(f"{key}: {value}\r\n" for key, value in headers.items()) + "\r\n"
        head = block.encode()
        route = f"{subject} {reply}" if number == last else subject
        out += f"HPUB {route} {len(head)} {len(head) + len(data)}\r\n".encode()
        out += head
        out += data
        out += b"\r\n"
    return bytes(out)


def parse_reply(reply: str) -> tuple[int, int, int]:
    """(stream seq, store time ns, pending) from a JetStream delivery reply subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>`` or the v2 form with a
    domain and account hash after ``ACK`` and a random token at the end.
    """
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7]), int(tokens[8])
    return int(tokens[7]), int(tokens[9]), int(tokens[10])


# -- frames taken off a connection, for the scan's read path (core.log.EventLog.scan) ---------------

Frame = tuple[bytes, bytes, bytes, "bytes | None"]
"""A message as the tap takes it: ``(subject, reply, data, headers)``."""


class Sink:
    """Where a tap puts the raw messages of one subscription: ``(subject, reply, data, headers)``
    frames in arrival order, and an event set when some arrived."""

    __slots__ = ("arrived", "frames")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.arrived = asyncio.Event()


_PARSER_FIELDS = (("buf", bytearray), ("state", int), ("needed", int))
"""What :class:`RawTap` reads of nats-py's protocol parser (``nats.protocol.parser.Parser``)."""


class RawTap:
    """Takes the messages of chosen subscriptions off a nats-py connection as raw bytes.

    nats-py turns every message into a ``Msg`` with parsed headers, queues it and runs the callback
    as a coroutine of its own: about 30 us a message here, most of a rebuild, and several times what
    the server spends on it. While at least one subscription is tapped, the tap replaces the
    ``parse`` method of the connection's protocol parser (and puts it back after): ``MSG`` and
    ``HMSG`` frames of tapped subscriptions are cut out of its buffer with ``find`` and slices and
    appended to their :class:`Sink` as ``(subject, reply, data, headers)`` bytes. Any other frame
    (another subscription's message, ``PING``, ``INFO``, ``-ERR``...) is handed to nats-py's own
    parser alone, complete, with the rest of the buffer held back, so that nats-py's parser always
    ends between frames and the tap can go on after it. A frame not yet complete stays in the buffer
    until the next read. Nothing here may raise: the connection's read loop would end with it.
    """

    def __init__(self, nc: NATS) -> None:
        self._parser: Any = nc._ps
        self._sinks: dict[int, Sink] = {}

    @staticmethod
    def attach(nc: NATS) -> RawTap | None:
        """A tap for ``nc``, or ``None`` if its nats-py's parser is not the one the tap works with."""
        parser = getattr(nc, "_ps", None)
        if not inspect.iscoroutinefunction(getattr(type(parser), "parse", None)):
            return None
        if not all(isinstance(getattr(parser, name, None), kind) for name, kind in _PARSER_FIELDS):
            return None
        return RawTap(nc)

    def add(self, sid: int, sink: Sink) -> None:
        """Put the messages of subscription ``sid`` in ``sink`` from now on."""
        if not self._sinks:
            self._install()
        self._sinks[sid] = sink

    def remove(self, sid: int) -> None:
        """Stop tapping ``sid`` (nats-py drops its messages once it is unsubscribed)."""
        self._sinks.pop(sid, None)
        if not self._sinks:
            with contextlib.suppress(AttributeError):
                del self._parser.parse

    def _install(self) -> None:
        parser, sinks = self._parser, self._sinks
        original = type(parser).parse.__get__(parser)

        async def alone(size: int) -> None:
            """nats-py's parser on the first ``size`` bytes of the buffer (one whole frame)."""
            buf = parser.buf
            rest = buf[size:]
            del buf[size:]
            await original()
            if parser.buf is buf:  # not reset by a reconnection meanwhile
                buf.extend(rest)

        async def parse(data: bytes = b"") -> None:
            parser.buf.extend(data)
            woken: list[Sink] = []
            while parser.buf:
                if parser.state != AWAITING_CONTROL_LINE:  # inside a frame since before the tap
                    if len(parser.buf) < parser.needed + 2:
                        break
                    await alone(parser.needed + 2)
                    continue
                buf = parser.buf
                data = bytes(buf)  # one copy, so that each frame's parts are sliced once
                at = 0  # the frames before `at` are in their sinks
                foreign = 0  # the end of a run of frames for nats-py, from `at`
                while True:
                    frame = cut_frame(data, foreign or at)
                    if frame is None:
                        break
                    end, sid, parts = frame
                    sink = sinks.get(sid)
                    if parts is None or sink is None:
                        foreign = end
                        continue
                    if foreign:
                        break  # the run for nats-py first
                    sink.frames.append(parts)
                    if not woken or woken[-1] is not sink:
                        woken.append(sink)
                    at = end
                del buf[:at]
                if not foreign:
                    break
                await alone(foreign - at)
            for sink in woken:
                sink.arrived.set()

        parser.parse = parse


def cut_frame(data: bytes, at: int) -> tuple[int, int, Frame | None] | None:
    """The frame starting at ``at``: where it ends, its subscription id and its parts (``None`` for
    a frame other than a message, with sid 0); ``None`` if it is not all in ``data`` yet."""
    eol = data.find(b"\r\n", at)
    if eol < 0:
        return None
    if not (data.startswith(b"HMSG ", at) or data.startswith(b"MSG ", at)):
        return eol + 2, 0, None
    # HMSG <subject> <sid> [reply] <header bytes> <total bytes>
    # MSG <subject> <sid> [reply] <total bytes>
    args = data[at:eol].split()
    with_headers = args[0] == b"HMSG"
    start = eol + 2
    stop = start + int(args[-1])
    if len(data) < stop + 2:
        return None
    header_size = int(args[-2]) if with_headers else 0
    reply = args[3] if len(args) == (6 if with_headers else 5) else b""
    headers = data[start : start + header_size] if header_size else None
    return stop + 2, int(args[2]), (args[1], reply, data[start + header_size : stop], headers)
