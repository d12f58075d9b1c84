"""Acknowledgements of appends: JetStream's answers to our publishes, settled on futures.

Appends do not use nats-py's ``publish_async``: in nats-py 2.16 its future never resolves when the
server rejects a message (the reply handler raises instead of setting the exception) and its
in-flight slot is never released. :class:`AckTracker` is the replacement: every outstanding append
has a future and a deadline, and an acknowledgement, a rejection or the deadline settles it. A
wrong expected sequence becomes :class:`~core.errors.ConcurrencyConflict`; an atomic batch the
server would not store whole, :class:`BatchRefused`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec

from core.errors import AppendRejected, AppendTimeout, ConcurrencyConflict, NoResponders
from core.wire import Position

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
