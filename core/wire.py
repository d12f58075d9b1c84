"""The event log's vocabulary, shared by the log and its callers: the header names our messages
carry, where an append landed (:class:`Position`), a stored message before decoding
(:class:`RawRecord`), a quarantined one (:class:`Quarantined`), and fresh event ids.

Nothing here imports nats-py or talks to the server. The NATS protocol itself (acknowledgements,
batch frames, the raw tap of the scan) lives in :mod:`core.log`, the one package that does
(:mod:`core.log.acks`, :mod:`core.log.frames`).
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

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
