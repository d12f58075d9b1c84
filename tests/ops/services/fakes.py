"""Fakes of the intake's explicit dependencies, for unit tests without a server.

* :class:`IntakeLog`: the log an :class:`~ops.services.intake.Intake` is built on. It numbers what is
  stored per stream as JetStream does, stores an event id once (an append of an id already stored
  answers the first one's position, marked ``duplicate``), refuses an append whose expected sequence
  is not the last of its subject (or of its ``expected_filter``) with
  :class:`~core.errors.ConcurrencyConflict`, raises what a test tells it to for a subject, and keeps
  what was quarantined with the reason and the sender. It feeds the intake's real projection runners:
  what is stored on a stream they follow is applied when the intake asks where that stream ends (its
  catch-up), or when the test calls :meth:`IntakeLog.deliver`;
* :class:`Claim`: one message pulled from INTAKE, which records whether it was acknowledged or put back;
* :class:`FakeTime`: the intake's clock (``time_ns``, ``monotonic``), moved by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.errors import ConcurrencyConflict, ResontechError
from core.log import Pulled
from core.streams import intake_subject, stream_for_subject
from core.wire import Position
from projections.runner import ProjectionRunner
from schemas._base import Event
from schemas.catalog import encode
from schemas.envelope import Recorded
from tests.ops.coordinator.fakes import NOW, matches


@dataclass(frozen=True)
class Quarantined:
    """One claim copied to QUARANTINE."""

    stream: str
    seq: int
    subject: str
    reason: str
    sender: str


class IntakeLog:
    """The intake's log (see the module docstring).

    Attributes:
        stored: stream -> its records, in order (sequence ``n`` at index ``n - 1``).
        appended: the records the intake appended (not those the test stored), in order.
        quarantined: what the intake quarantined, in order.
        refuse: subject prefix -> the error every append under it raises (``QUARANTINE``: every
            quarantine).
        asked: how many times the intake asked where a stream ends.
    """

    def __init__(self) -> None:
        self.stored: dict[str, list[Recorded[Any]]] = {}
        self.appended: list[Recorded[Any]] = []
        self.quarantined: list[Quarantined] = []
        self.refuse: dict[str, ResontechError] = {}
        self.asked = 0
        self._runners: list[ProjectionRunner[Any]] = []

    def follow(self, runners: Iterable[ProjectionRunner[Any]]) -> None:
        """The projection runners fed from this log."""
        self._runners = list(runners)

    def store(self, subject: str, event: Event, time_ns: int = NOW, msg_id: str = "") -> Recorded[Any]:
        """Store an event (applied at the next :meth:`deliver`); its record."""
        stream = stream_for_subject(subject).name
        records = self.stored.setdefault(stream, [])
        record = Recorded(
            stream=stream, seq=len(records) + 1, subject=subject, time_ns=time_ns, msg_id=msg_id, event=event
        )
        records.append(record)
        return record

    def deliver(self) -> None:
        """Apply everything stored to the runners that follow its stream (as their watches would)."""
        for runner in self._runners:
            for record in self.stored.get(runner.projection.stream, []):
                runner.apply(record)  # one already applied is ignored

    def events(self, of: type | None = None) -> list[Any]:
        """The events the intake appended (only those of type ``of`` unless ``None``)."""
        return [r.event for r in self.appended if of is None or isinstance(r.event, of)]

    def reasons(self) -> list[str]:
        return [q.reason for q in self.quarantined]

    def _raise_if_refused(self, subject: str) -> None:
        for prefix, error in self.refuse.items():
            if subject.startswith(prefix):
                raise error

    # -- what the intake calls -------------------------------------------------------------------

    async def append(
        self,
        subject: str,
        event: Event,
        *,
        event_id: str | None = None,
        expected_seq: int | None = None,
        expected_filter: str | None = None,
    ) -> Position:
        self._raise_if_refused(subject)
        stream = stream_for_subject(subject).name
        records = self.stored.setdefault(stream, [])
        for old in records:
            if event_id and old.msg_id == event_id:
                return Position(stream, old.seq, duplicate=True)
        if expected_seq is not None:
            scope = expected_filter or subject
            last = max((r.seq for r in records if matches(scope, r.subject)), default=0)
            if last != expected_seq:
                raise ConcurrencyConflict(f"last {last}", subject=subject, expected=expected_seq)
        record = self.store(subject, event, NOW, event_id or "")
        self.appended.append(record)
        return Position(stream, record.seq)

    async def submit(
        self, subject: str, event: Event, *, event_id: str, expected_seq: int | None = None
    ) -> asyncio.Future[Position]:
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(await self.append(subject, event, event_id=event_id, expected_seq=expected_seq))
        except ResontechError as exc:
            future.set_exception(exc)
        return future

    async def quarantine_now(
        self, stream: str, seq: int, subject: str, data: bytes, reason: str, *, sender: str = ""
    ) -> Position:
        self._raise_if_refused("QUARANTINE")
        self.quarantined.append(Quarantined(stream, seq, subject, reason, sender))
        return Position("QUARANTINE", len(self.quarantined))

    async def get_last(self, stream: str, subject: str) -> Recorded[Any] | None:
        found = [r for r in self.stored.get(stream, []) if r.subject == subject]
        return found[-1] if found else None

    async def last_seq(self, stream: str, subject: str | None = None) -> int:
        self.asked += 1
        self.deliver()
        return len(self.stored.get(stream, []))


class Claim(Pulled):
    """One claim pulled from INTAKE: ``event`` (or raw ``data``) that ``sender`` published about
    ``subject``, stored at ``seq`` at ``time_ns``, delivered ``delivered`` times.

    Attributes:
        outcome: ``"acked"``, ``"retried"`` or ``None`` (neither yet).
    """

    def __init__(
        self,
        seq: int,
        sender: str,
        subject: str,
        event: Event | None = None,
        *,
        data: bytes = b"",
        time_ns: int = NOW,
        delivered: int = 1,
        raw_subject: str | None = None,
    ) -> None:
        # Pulled.__init__ is not called: there is no NATS message behind a fake claim
        self.subject = intake_subject(sender, subject) if raw_subject is None else raw_subject
        self.seq = seq
        self.time_ns = time_ns
        self.msg_id = ""
        self.data = encode(event) if event is not None else data
        self.delivered = delivered
        self.outcome: str | None = None
        self.retry_s: float | None = None

    async def ack(self) -> None:
        self.outcome = "acked"

    async def retry(self, delay_s: float) -> None:
        self.outcome, self.retry_s = "retried", delay_s


class FakeTime:
    """The intake's ``time`` module: wall time from :data:`NOW`, monotonic seconds from 1000."""

    def __init__(self) -> None:
        self.wall_ns = NOW
        self.monotonic_s = 1000.0

    def time_ns(self) -> int:
        return self.wall_ns

    def monotonic(self) -> float:
        return self.monotonic_s
