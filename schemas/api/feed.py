"""The live feed (``WebSocket /v1/feed``): its query and the messages it sends.

Every message is one JSON object of the :class:`FeedMessage` shape; ``kind`` says which fields it has.
The protocol (authentication, cursors, close codes) is documented in :mod:`gateway.feed`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas.api.common import Request
from schemas.values import GpuTelemetry


class FeedQuery(Request, frozen=True, kw_only=True):
    """Query parameters of ``/v1/feed``.

    Attributes:
        after: resume after this cursor, ``jobs:<seq>,endpoints:<seq>`` (either part may be left out:
            that stream then starts live). Without it the feed starts live.
        job: only events of these jobs (comma-separated ids).
        endpoint: only events of these endpoints (comma-separated ids). With ``job`` too, events of
            either.
        kind: only these kinds (comma-separated): an event tag (``job.progress``), a family (``job``,
            ``endpoint``) or ``telemetry``.
        tenant: the tenant to watch (the operator only; a tenant key always watches its own).
    """

    after: str | None = None
    job: str | None = None
    endpoint: str | None = None
    kind: str | None = None
    tenant: str | None = None


class FeedAuth(Request, frozen=True, kw_only=True):
    """The first client message, for clients that cannot set headers (browsers)."""

    kind: Literal["auth"]
    key: str


class FeedTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's readings, in a ``telemetry`` message: per-GPU utilisation, memory, temperature."""

    gpus: list[GpuTelemetry] = []
    cpu_pct: float = 0.0
    memory_used_mb: int = 0


class FeedError(msgspec.Struct, frozen=True, kw_only=True):
    """Why the feed is about to close (``code`` as in the API's error bodies)."""

    code: str
    message: str


class FeedMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of the feed.

    Kinds:
        ``job.*`` / ``endpoint.*`` (an event; the tag of the stored event): ``seq``, ``stream``
            (``JOBS`` / ``ENDPOINTS``), ``subject``, ``time``, ``tenant``, ``job`` or ``endpoint``,
            ``event`` (the stored event, its ``type`` being the tag). Resumable by ``seq``.
        ``telemetry``: ``seq`` and ``subject`` of the heartbeat (``stream`` ``HEARTBEATS``),
            ``time``, ``tenant``, ``worker``, ``jobs`` / ``endpoints`` of this tenant that the
            worker runs, ``event`` (:class:`FeedTelemetry`). Live only, never replayed; at most one
            per worker every few seconds.
        ``feed.ready``: replay is over and live events follow; ``cursor`` is the position reached.
        ``feed.ping``: sent after 20 s without a message; ``cursor`` is the position reached
            (every matching event up to it has been sent).
        ``feed.error``: the reason of the close that follows (``error``).

    Attributes:
        time: store time of the event, ISO 8601 UTC with milliseconds (``2025-01-31T12:00:00.123Z``);
            for control messages the gateway's clock.
        cursor: ``jobs:<seq>,endpoints:<seq>``, to pass as ``after`` when reconnecting.
    """

    kind: str
    seq: int | None = None
    stream: str | None = None
    subject: str | None = None
    time: str | None = None
    tenant: str | None = None
    job: str | None = None
    endpoint: str | None = None
    worker: str | None = None
    jobs: list[str] | None = None
    endpoints: list[str] | None = None
    cursor: str | None = None
    error: FeedError | None = None
    event: Any = None
