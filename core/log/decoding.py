"""Stored messages to events, and QUARANTINE: a stored message that fails to decode (or whose
event is not the one its subject names) is copied there with its reason, and readers carry on.

Plain functions: :meth:`core.log.EventLog.record_decoder` binds :func:`record_decoder` to the log's
quarantine, :meth:`~core.log.EventLog.quarantine_now` stores with :func:`quarantine_headers`, and
:meth:`~core.log.EventLog.quarantined` reads back with :func:`read_quarantine`."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import msgspec
import nats.js.errors
from nats.js import JetStreamContext, api

from core.clock import ns_of
from core.log.connection import Bounds
from core.streams import BY_NAME, subject_mismatch
from core.wire import (
    MSG_ID,
    QUARANTINE_REASON,
    QUARANTINE_SENDER,
    QUARANTINE_SEQ,
    QUARANTINE_STREAM,
    QUARANTINE_SUBJECT,
    Quarantined,
)
from schemas._base import UPCASTERS, Event, upcast
from schemas.catalog import FAMILIES, decoder
from schemas.envelope import Recorded

DecodeRecord = Callable[[str, int, int, str, bytes], Recorded[Any] | None]
"""Stored fields (subject, sequence, store time in ns, message id, bytes) to a decoded event, or
``None`` for a message quarantined instead."""
Quarantine = Callable[[str, int, str, bytes, str], None]
"""What a reader calls with a message it cannot decode: (stream, seq, subject, data, reason)."""


def record_decoder(stream: str, quarantine: Quarantine) -> DecodeRecord:
    """A function from ``stream``'s stored fields to a :class:`Recorded` event; what fails to decode, or
    is not the event its subject names, goes to ``quarantine`` and decodes to ``None``.

    Raises:
        ValueError: the stream holds raw records (no event family).
    """
    family = BY_NAME[stream].family
    if family is None:
        raise ValueError(f"stream {stream} holds raw records; use replay_raw")

    # The hot path of every rebuild: the family's decoder bound once, upcasting only if needed,
    # and the subject check reduced to one dictionary lookup and one comparison.
    spec = BY_NAME[stream]
    decode_event = decoder(family).decode
    names = {cls: cls.event_name() for cls in _members(FAMILIES[family])} if spec.named else {}

    def decode_record(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> Recorded[Any] | None:
        try:
            event = decode_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            quarantine(stream, seq, subject, data, str(exc))
            return None
        if names and subject[subject.rfind(".") + 1 :] != names[type(event)]:
            mismatch = subject_mismatch(spec, subject, event)
            if mismatch is not None:
                quarantine(stream, seq, subject, data, mismatch)
                return None
        if UPCASTERS:
            event = upcast(event)
        return Recorded(stream=stream, seq=seq, subject=subject, time_ns=time_ns, msg_id=msg_id, event=event)

    return decode_record


def quarantine_headers(stream: str, seq: int, subject: str, reason: str, sender: str) -> dict[str, str]:
    """The headers a refused message is stored in QUARANTINE with: its origin, its reason (one line of
    at most 500 characters), its sender if known, and a message id that stores it once per origin."""
    headers = {
        MSG_ID: f"quarantine-{stream}-{seq}",
        QUARANTINE_REASON: _header_value(reason),
        QUARANTINE_STREAM: stream,
        QUARANTINE_SEQ: str(seq),
        QUARANTINE_SUBJECT: subject,
    }
    if sender:
        headers[QUARANTINE_SENDER] = sender
    return headers


async def read_quarantine(
    js: JetStreamContext, bounds: Bounds, *, after_seq: int, limit: int
) -> list[Quarantined]:
    """Up to ``limit`` messages of QUARANTINE (whose bounds are ``bounds``) after ``after_seq``, oldest
    first, each with what its headers say; a sequence that is gone is skipped."""
    out: list[Quarantined] = []
    seq = max(after_seq + 1, bounds.first_seq)
    while seq <= bounds.last_seq and len(out) < limit:
        try:
            raw = await js.get_msg("QUARANTINE", seq=seq, direct=True)
        except nats.js.errors.NotFoundError:
            seq += 1
            continue
        out.append(_quarantined(seq, raw))
        seq += 1
    return out


def _quarantined(seq: int, raw: api.RawStreamMsg) -> Quarantined:
    headers = raw.headers or {}
    return Quarantined(
        seq=seq,
        time_ns=ns_of(raw.time),
        stream=headers.get(QUARANTINE_STREAM, ""),
        origin_seq=int(headers.get(QUARANTINE_SEQ, "0") or 0),
        subject=headers.get(QUARANTINE_SUBJECT, ""),
        reason=headers.get(QUARANTINE_REASON, ""),
        sender=headers.get(QUARANTINE_SENDER, ""),
        data=raw.data or b"",
    )


def _members(union: Any) -> tuple[type[Event], ...]:
    return typing.get_args(union) or (union,)


def _header_value(text: str) -> str:
    return text[:500].replace("\r", " ").replace("\n", " ")
