"""What one feed client asked for (:class:`FeedFilter`), its resume cursor, and how a session ends
(:class:`FeedClose`): the parts of the live feed that check a client's words, apart from the fan-out
(:mod:`gateway.feed`) that matches events against them."""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping

from core.errors import InvalidInput
from core.streams import token
from schemas.endpoints import EndpointEvent
from schemas.jobs import JobEvent

CURSOR_NAMES: dict[str, str] = {"JOBS": "jobs", "ENDPOINTS": "endpoints"}
"""Resumable streams and their names in a cursor."""
TELEMETRY = "telemetry"
EVENT_KINDS: frozenset[str] = frozenset(
    t.event_tag() for t in (*typing.get_args(JobEvent), *typing.get_args(EndpointEvent))
)
FAMILIES: frozenset[str] = frozenset({"job", "endpoint", TELEMETRY})


class FeedClose(Exception):
    """End a feed session with a close code, after a ``feed.error`` message saying why."""

    def __init__(self, code: int, error: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.error = error
        self.message = message


def parse_cursor(text: str) -> dict[str, int]:
    """``jobs:120,endpoints:7`` -> ``{"JOBS": 120, "ENDPOINTS": 7}``; 4400 when malformed."""
    by_name = {name: stream for stream, name in CURSOR_NAMES.items()}
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, seq = part.partition(":")
        stream = by_name.get(name)
        if stream is None or not seq.isdigit() or stream in out:
            raise FeedClose(
                4400,
                "invalid_query",
                f"after must read jobs:<seq>,endpoints:<seq> (each at most once), got {text!r}",
            )
        out[stream] = int(seq)
    return out


def format_cursor(positions: Mapping[str, int]) -> str:
    """``{"JOBS": 120, "ENDPOINTS": 7}`` -> ``jobs:120,endpoints:7``."""
    return ",".join(f"{name}:{positions.get(stream, 0)}" for stream, name in CURSOR_NAMES.items())


def _token(value: str, what: str) -> str:
    try:
        return token(value, what)
    except InvalidInput as exc:
        raise FeedClose(4400, "invalid_query", str(exc)) from None


def _ids(text: str | None, what: str) -> frozenset[str] | None:
    if text is None:
        return None
    ids = frozenset(_token(part.strip(), what) for part in text.split(",") if part.strip())
    if not ids:
        raise FeedClose(4400, "invalid_query", f"{what} is empty: name at least one id or leave it out")
    return ids


def _kinds(text: str | None) -> frozenset[str] | None:
    if text is None:
        return None
    kinds = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(kinds - EVENT_KINDS - FAMILIES)
    if unknown or not kinds:
        raise FeedClose(
            4400,
            "invalid_query",
            f"unknown kind {', '.join(unknown) or '(empty)'}: use job, endpoint, telemetry or an event tag "
            "such as job.progress",
        )
    return kinds


class FeedFilter:
    """What one client asked for: its tenant, and optionally jobs, endpoints and kinds."""

    __slots__ = ("endpoints", "jobs", "kinds", "tenant")

    def __init__(
        self,
        tenant: str,
        *,
        jobs: str | None = None,
        endpoints: str | None = None,
        kinds: str | None = None,
    ) -> None:
        self.tenant = _token(tenant, "tenant")  # a subject token, never a wildcard
        self.jobs = _ids(jobs, "job id")
        self.endpoints = _ids(endpoints, "endpoint id")
        self.kinds = _kinds(kinds)

    def wants_kind(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds or kind.split(".", 1)[0] in self.kinds

    def wants_event(self, stream: str, kind: str, ident: str) -> bool:
        """Whether the event ``kind`` about job or endpoint ``ident`` on ``stream`` matches."""
        if not self.wants_kind(kind):
            return False
        if self.jobs is None and self.endpoints is None:
            return True
        wanted = self.jobs if stream == "JOBS" else self.endpoints
        return wanted is not None and ident in wanted

    def wants_telemetry(self, jobs: Iterable[str], endpoints: Iterable[str]) -> bool:
        if not self.wants_kind(TELEMETRY):
            return False
        if self.jobs is None and self.endpoints is None:
            return True
        return bool(self.jobs and self.jobs.intersection(jobs)) or bool(
            self.endpoints and self.endpoints.intersection(endpoints)
        )

    def replays(self, stream: str) -> bool:
        """Whether ``stream`` can hold a matching event at all (else its replay is skipped)."""
        family = "job" if stream == "JOBS" else "endpoint"
        if self.kinds is not None and not any(k == family or k.startswith(family + ".") for k in self.kinds):
            return False
        if self.jobs is None and self.endpoints is None:
            return True
        return (self.jobs if stream == "JOBS" else self.endpoints) is not None

    def subjects(self, stream: str) -> str:
        """The narrowest subject filter a replay of ``stream`` can use."""
        family = "job" if stream == "JOBS" else "endpoint"
        ids = self.jobs if stream == "JOBS" else self.endpoints
        if ids is not None and len(ids) == 1:
            return f"{family}.{self.tenant}.{next(iter(ids))}.>"
        return f"{family}.{self.tenant}.>"
