"""What the kernel refused, for the operator: ``GET /v1/quarantine``."""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.api.common import Request


class QuarantineQuery(Request, frozen=True, kw_only=True):
    """Messages after QUARANTINE sequence ``after`` (0: from the first), at most ``limit``."""

    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class QuarantinedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One refused message.

    Attributes:
        seq / time: its QUARANTINE sequence and when it was quarantined (ISO 8601, UTC).
        stream / origin_seq / subject: where it was (``INTAKE`` and the claim's sequence for a claim
            the intake refused; the canonical stream for a stored event that failed its checks).
        sender: the worker that sent a refused claim (empty for a stored event).
        reason: why the kernel refused it.
        data: the message as sent, as text (at most 4096 characters; ``truncated`` says whether cut).
    """

    seq: int
    time: str
    stream: str
    origin_seq: int
    subject: str
    sender: str
    reason: str
    data: str
    truncated: bool = False


class QuarantinePage(msgspec.Struct, frozen=True, kw_only=True):
    """One page; ``next_after`` is the ``after`` of the next page (absent at the end)."""

    items: list[QuarantinedMessage]
    next_after: int | None = None
