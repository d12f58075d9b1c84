"""Stored messages to events, and QUARANTINE: a stored message that fails to decode (or whose
event is not the one its subject names) is copied there with its reason, and readers carry on."""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections.abc import Callable
from typing import Any

import msgspec
import nats.js.errors

from core.clock import ns_of
from core.log.connection import LogConnection
from core.streams import BY_NAME, quarantine_subject, subject_mismatch
from core.wire import (
    MSG_ID,
    QUARANTINE_REASON,
    QUARANTINE_SENDER,
    QUARANTINE_SEQ,
    QUARANTINE_STREAM,
    QUARANTINE_SUBJECT,
    Position,
    Quarantined,
)
from schemas._base import UPCASTERS, Event, upcast
from schemas.catalog import FAMILIES, decoder
from schemas.envelope import Recorded


class Decoding(LogConnection):
    """How :class:`core.log.EventLog` decodes what it reads, and its quarantine."""

    def record_decoder(self, stream: str) -> Callable[[str, int, int, str, bytes], Recorded[Any] | None]:
        """A function from stored fields to a :class:`Recorded` event, quarantining what fails to decode."""
        family = BY_NAME[stream].family
        if family is None:
            raise ValueError(f"stream {stream} holds raw records; use replay_raw")

        # The hot path of every rebuild: the family's decoder bound once, upcasting only if needed,
        # and the subject check reduced to one dictionary lookup and one comparison.
        spec = BY_NAME[stream]
        decode_event = decoder(family).decode
        names = {cls: cls.event_name() for cls in _members(FAMILIES[family])} if spec.named else {}

        def decode_record(
            subject: str, seq: int, time_ns: int, msg_id: str, data: bytes
        ) -> Recorded[Any] | None:
            try:
                event = decode_event(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.quarantine(stream, seq, subject, data, str(exc))
                return None
            if names and subject[subject.rfind(".") + 1 :] != names[type(event)]:
                mismatch = subject_mismatch(spec, subject, event)
                if mismatch is not None:
                    self.quarantine(stream, seq, subject, data, mismatch)
                    return None
            if UPCASTERS:
                event = upcast(event)
            return Recorded(
                stream=stream, seq=seq, subject=subject, time_ns=time_ns, msg_id=msg_id, event=event
            )

        return decode_record

    def quarantine(self, stream: str, seq: int, subject: str, data: bytes, reason: str) -> None:
        """Copy a stored message that fails to decode (or to match its subject) to
        ``quarantine.<stream>``, once per message.

        Readers skip it and carry on; an operator finds it with ``resontech quarantine``.
        """

        async def store() -> None:
            with contextlib.suppress(Exception):
                await self.quarantine_now(stream, seq, subject, data, reason)

        task = asyncio.get_running_loop().create_task(store())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def quarantine_now(
        self, stream: str, seq: int, subject: str, data: bytes, reason: str, *, sender: str = ""
    ) -> Position:
        """Store a refused message in QUARANTINE with its reason (and the worker that sent it, for
        a claim the intake refused), once per origin message; returns where it landed.

        Raises:
            AppendTimeout / AppendRejected / LogUnavailable: as :meth:`EventLog.append`.
        """
        headers = {
            MSG_ID: f"quarantine-{stream}-{seq}",
            QUARANTINE_REASON: _header_value(reason),
            QUARANTINE_STREAM: stream,
            QUARANTINE_SEQ: str(seq),
            QUARANTINE_SUBJECT: subject,
        }
        if sender:
            headers[QUARANTINE_SENDER] = sender
        return await (await self._publish(quarantine_subject(stream), data, headers))

    async def quarantined(self, *, after_seq: int = 0, limit: int = 100) -> list[Quarantined]:
        """Up to ``limit`` messages of QUARANTINE after ``after_seq``, oldest first, with their
        reasons and senders (the operator's view: ``resontech quarantine``, ``GET /v1/quarantine``).
        What this connection's readers are still quarantining is stored first."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        bounds = await self.stream_bounds("QUARANTINE")
        out: list[Quarantined] = []
        seq = max(after_seq + 1, bounds.first_seq)
        while seq <= bounds.last_seq and len(out) < limit:
            try:
                raw = await self._js.get_msg("QUARANTINE", seq=seq, direct=True)
            except nats.js.errors.NotFoundError:
                seq += 1
                continue
            headers = raw.headers or {}
            out.append(
                Quarantined(
                    seq=seq,
                    time_ns=ns_of(raw.time),
                    stream=headers.get(QUARANTINE_STREAM, ""),
                    origin_seq=int(headers.get(QUARANTINE_SEQ, "0") or 0),
                    subject=headers.get(QUARANTINE_SUBJECT, ""),
                    reason=headers.get(QUARANTINE_REASON, ""),
                    sender=headers.get(QUARANTINE_SENDER, ""),
                    data=raw.data or b"",
                )
            )
            seq += 1
        return out


def _members(union: Any) -> tuple[type[Event], ...]:
    return typing.get_args(union) or (union,)


def _header_value(text: str) -> str:
    return text[:500].replace("\r", " ").replace("\n", " ")
