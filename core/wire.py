"""Wire details of the event log: header names, ids, acknowledgements, delivery reply subjects, and
the frames :class:`RawTap` takes off a connection for the scan's read path.

Nothing here talks to the server; :mod:`core.log` does, and uses these. Appends do not use nats-py's
``publish_async``: in nats-py 2.16 its future never resolves when the server rejects a message (the
reply handler raises instead of setting the exception) and its in-flight slot is never released.
:class:`AckTracker` is the replacement: every outstanding append has a future and a deadline, and an
acknowledgement, a rejection or the deadline settles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from nats.aio.client import Client as NATS
from nats.protocol.parser import AWAITING_CONTROL_LINE

from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict, NoResponders

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
QUARANTINE_REASON = "Resontech-Quarantine-Reason"
QUARANTINE_STREAM = "Resontech-Quarantine-Stream"
QUARANTINE_SEQ = "Resontech-Quarantine-Seq"
QUARANTINE_SUBJECT = "Resontech-Quarantine-Subject"
QUARANTINE_SENDER = "Resontech-Quarantine-Sender"
"""The worker whose claim the intake refused (absent for a stored message that failed to decode)."""

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a failed expected-sequence check."""
WRONG_LAST_SEQUENCE_CONSTANT = 10164
"""The same, as a replicated stream's leader may word it (``JSStreamWrongLastSequenceConstantErr``)."""
ATOMIC_PUBLISH_DISABLED = 10174
"""JetStream's error code for an atomic batch sent to a stream without ``allow_atomic``."""


class BatchRefused(AppendRejected):
    """The server stored nothing of an atomic batch (one of its appends failed a check, or repeated
    a stored id): each append is sent again on its own (:mod:`core.log.group_commit`)."""


class BatchUnsupported(BatchRefused):
    """The stream does not take atomic batches (no ``allow_atomic``, or a server before 2.12 that
    stored the messages one by one): its appends go one by one from now on."""


class Position(NamedTuple):
    """Where an append landed. ``duplicate`` is true when the event id was already stored."""

    stream: str
    seq: int
    duplicate: bool = False


class RawRecord(NamedTuple):
    """A stored message before decoding (audit export reads these)."""

    stream: str
    seq: int
    subject: str
    time_ns: int
    msg_id: str
    data: bytes


class Quarantined(NamedTuple):
    """One message in QUARANTINE: what was refused, where it came from, why, and who sent it.

    Attributes:
        seq / time_ns: its QUARANTINE sequence and store time.
        stream / origin_seq / subject: where the refused message was (``INTAKE`` for a claim).
        reason: why it was refused.
        sender: the worker that sent a refused claim; empty otherwise.
        data: the message as it was sent.
    """

    seq: int
    time_ns: int
    stream: str
    origin_seq: int
    subject: str
    reason: str
    sender: str
    data: bytes


class _AckError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _AckError | None = None
    count: int = 0
    """Messages stored by an atomic batch (its commit's acknowledgement)."""


_ACK_DECODER = msgspec.json.Decoder(_Ack)


class _Ids:
    """Unique ids, cheaply: a random 80-bit prefix per process plus a counter.

    ``uuid4`` costs ~5 us, a third of an append's budget. The prefix is drawn again in a forked
    child, so parent and child never hand out the same id (a repeated id would be dropped as a
    duplicate by the server).
    """

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = os.urandom(10).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):010x}"


_IDS = _Ids()


def new_event_id() -> str:
    """A fresh, unique event id (30 hex characters)."""
    return _IDS.next()


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


def _conflict_or_rejection(subject: str, expected: int | None, error: _AckError) -> Exception:
    if error.err_code in (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT):
        return ConcurrencyConflict(
            f"append to {subject} expected last sequence {expected}: {error.description}",
            subject=subject,
            expected=expected or 0,
        )
    return AppendRejected(f"append to {subject} rejected: {error.description} (code {error.err_code})")


def _batch_outcome(ack: _Ack, size: int) -> Position | Exception:
    """What the commit of an atomic batch of ``size`` says: its last position, or why nothing of it
    was stored."""
    if ack.error is not None:
        refused = BatchUnsupported if ack.error.err_code == ATOMIC_PUBLISH_DISABLED else BatchRefused
        return refused(f"batch refused: {ack.error.description} (code {ack.error.err_code})")
    if ack.count != size:
        # A server that does not know atomic batches stores each message and acknowledges the last.
        return BatchUnsupported(f"batch of {size} acknowledged as {ack.count} on {ack.stream}")
    return Position(ack.stream, ack.seq)


class AckTracker:
    """Outstanding appends, by reply token, failed in order once their deadline passes."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.pending: dict[str, tuple[asyncio.Future[Position], float, str, int | None]] = {}
        self.batches: dict[str, int] = {}
        """Tokens of atomic batch commits, and how many messages each batch holds."""
        self.acked: dict[str, int] = {}
        """The highest sequence acknowledged on each stream: a read of the stream covers at least it."""
        self.on_expired: Callable[[], None] | None = None
        """Called when appends went unacknowledged for the whole time-out (the server may be silent)."""
        self._sweeper: asyncio.Task[None] | None = None

    def add(
        self, token: str, subject: str, expected: int | None, *, batch: int = 0
    ) -> asyncio.Future[Position]:
        """The future of the acknowledgement on ``token``: of one append, or of the commit of an
        atomic batch of ``batch`` messages (its position is the batch's last)."""
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        self.pending[token] = (future, time.monotonic() + self.timeout_s, subject, expected)
        if batch:
            self.batches[token] = batch
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())
        return future

    def resolve(self, token: str, data: bytes, no_responders: bool) -> None:
        entry = self.pending.pop(token, None)
        if entry is None:
            return
        future, _, subject, expected = entry
        size = self.batches.pop(token, 0) if self.batches else 0
        if future.done():
            return
        if no_responders:
            future.set_exception(NoResponders(f"no stream captures subject {subject!r}"))
            return
        try:
            ack = _ACK_DECODER.decode(data)
        except msgspec.DecodeError:
            unreadable = BatchRefused if size else AppendRejected
            future.set_exception(unreadable(f"unreadable acknowledgement for {subject}: {data[:200]!r}"))
            return
        if size:
            outcome = _batch_outcome(ack, size)
        elif ack.error is not None:
            outcome = _conflict_or_rejection(subject, expected, ack.error)
        else:
            outcome = Position(ack.stream, ack.seq, ack.duplicate)
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
            return
        if outcome.seq > self.acked.get(outcome.stream, 0):
            self.acked[outcome.stream] = outcome.seq
        future.set_result(outcome)

    def fail_all(self, error: Exception) -> None:
        for future, *_ in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()
        self.batches.clear()

    async def _sweep(self) -> None:
        # Deadlines are added in increasing order, so expired entries are always at the front.
        while True:
            await asyncio.sleep(min(0.25, self.timeout_s / 4))
            now = time.monotonic()
            expired = []
            for token, (_, deadline, _, _) in self.pending.items():
                if deadline > now:
                    break
                expired.append(token)
            if expired and self.on_expired is not None:
                self.on_expired()
            for token in expired:
                self.batches.pop(token, None)
                future, _, subject, _ = self.pending.pop(token)
                if not future.done():
                    future.set_exception(
                        AppendTimeout(f"no acknowledgement for {subject} within {self.timeout_s:g}s")
                    )

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


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
