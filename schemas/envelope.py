"""The envelope of a stored event: where and when the log put it."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from schemas._base import Event

E = TypeVar("E", bound=Event)


class Recorded(msgspec.Struct, Generic[E], frozen=True, kw_only=True):
    """One event as the log stored it.

    Attributes:
        stream: the stream name (``JOBS``).
        seq: the stream sequence, 1-based, gap-free per stream except for expired messages.
        subject: the subject, whose tokens carry the identity of the aggregate
            (``job.<tenant>.<job_id>.<event>``).
        time_ns: the server's store time in Unix nanoseconds; reducers take time from here or
            from the event, never from a clock.
        msg_id: the event id (``Nats-Msg-Id``), unique per event.
        event: the decoded, upcast event.
    """

    stream: str
    seq: int
    subject: str
    time_ns: int
    msg_id: str
    event: E

    def token(self, index: int) -> str:
        """The subject token at ``index`` (``token(1)`` of ``job.acme.j1.submitted`` is ``acme``)."""
        return self.subject.split(".")[index]
