"""Wire details of the event log: header names, ids, acknowledgements, delivery reply subjects.

Nothing here talks to the server; :mod:`core.log` does, and uses these. Appends do not use nats-py's
``publish_async``: in nats-py 2.16 its future never resolves when the server rejects a message (the
reply handler raises instead of setting the exception) and its in-flight slot is never released.
:class:`AckTracker` is the replacement: every outstanding append has a future and a deadline, and an
acknowledgement, a rejection or the deadline settles it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import NamedTuple

import msgspec

from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict, NoResponders

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
QUARANTINE_REASON = "Resontech-Quarantine-Reason"
QUARANTINE_STREAM = "Resontech-Quarantine-Stream"
QUARANTINE_SEQ = "Resontech-Quarantine-Seq"
QUARANTINE_SUBJECT = "Resontech-Quarantine-Subject"

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a failed expected-sequence check."""


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


class _AckError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _AckError | None = None


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
    if error.err_code == WRONG_LAST_SEQUENCE:
        return ConcurrencyConflict(
            f"append to {subject} expected last sequence {expected}: {error.description}",
            subject=subject,
            expected=expected or 0,
        )
    return AppendRejected(f"append to {subject} rejected: {error.description} (code {error.err_code})")


class AckTracker:
    """Outstanding appends, by reply token, failed in order once their deadline passes."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.pending: dict[str, tuple[asyncio.Future[Position], float, str, int | None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, token: str, subject: str, expected: int | None) -> asyncio.Future[Position]:
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        self.pending[token] = (future, time.monotonic() + self.timeout_s, subject, expected)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())
        return future

    def resolve(self, token: str, data: bytes, no_responders: bool) -> None:
        entry = self.pending.pop(token, None)
        if entry is None:
            return
        future, _, subject, expected = entry
        if future.done():
            return
        if no_responders:
            future.set_exception(NoResponders(f"no stream captures subject {subject!r}"))
            return
        try:
            ack = _ACK_DECODER.decode(data)
        except msgspec.DecodeError:
            future.set_exception(AppendRejected(f"unreadable acknowledgement for {subject}: {data[:200]!r}"))
            return
        if ack.error is not None:
            future.set_exception(_conflict_or_rejection(subject, expected, ack.error))
        else:
            future.set_result(Position(ack.stream, ack.seq, ack.duplicate))

    def fail_all(self, error: Exception) -> None:
        for future, *_ in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()

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
            for token in expired:
                future, _, subject, _ = self.pending.pop(token)
                if not future.done():
                    future.set_exception(
                        AppendTimeout(f"no acknowledgement for {subject} within {self.timeout_s:g}s")
                    )

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
